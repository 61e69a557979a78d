/*
 * _fst.c - the Python extension over libfst: checkpoints, loads (blocking
 * and streaming, the GIL released while bytes move), buffers and tensors
 * exported zero-copy through DLPack. Framework glue (torch, numpy dtypes)
 * lives in Python (fst/__init__.py); this file only speaks libfst.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fst.h"

/* ---- DLPack (the stable ABI, version 0.x "dltensor" capsules) */

typedef struct {
	int32_t device_type;
	int32_t device_id;
} DLDevice;
typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} DLDataType;
typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* DLPack 1.x: what __dlpack__(max_version=(1, ...)) hands out, so that
 * consumers (numpy >= 2.1) see the read-only flag instead of assuming it. */
typedef struct {
	uint32_t major;
	uint32_t minor;
} DLPackVersion;
typedef struct DLManagedTensorVersioned {
	DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensorVersioned *self);
	uint64_t flags;
	DLTensor dl_tensor;
} DLManagedTensorVersioned;
#define DLPACK_FLAG_BITMASK_READ_ONLY (1ull << 0)

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_COMPLEX = 5, DL_BOOL = 6 };

static PyObject *FstError; /* fst.SafetensorError, until there is an error_factory */
static PyObject *error_factory; /* fst's (message, code, errno, filename) -> exception */

static bool starts_with_path(const char *msg, const char *p, size_t n)
{
	return !strncmp(msg, p, n) && msg[n] == ':' && msg[n + 1] == ' ';
}

/*
 * The file a failure is about, for OSError.filename, or NULL. libfst's
 * messages start with "PATH: "; matching the paths that can stand there,
 * longest first, keeps a ": " inside a path from cutting it short. A shard
 * that failed while its directory or index was being opened is in no
 * handle yet: it lies under `path` (a directory) or next to it (an index),
 * and its name is taken to end at the first ": " after that prefix.
 */
static const char *failed_file(const char *msg, const fst_checkpoint *ck, const char *path,
			       size_t *len)
{
	const char *best = NULL;
	size_t blen = 0;
	const char *cand[3] = {path, ck ? fst_checkpoint_path(ck) : NULL,
			       ck ? fst_checkpoint_index_path(ck) : NULL};
	for (size_t i = 0; i < 3; i++) {
		size_t n = cand[i] ? strlen(cand[i]) : 0;
		if (n > blen && starts_with_path(msg, cand[i], n)) {
			best = msg;
			blen = n;
		}
	}
	for (size_t i = 0; ck && i < fst_checkpoint_file_count(ck); i++) {
		const char *f = fst_file_path(fst_checkpoint_file(ck, i));
		size_t n = strlen(f);
		if (n > blen && starts_with_path(msg, f, n)) {
			best = msg;
			blen = n;
		}
	}
	if (!best && path && *path) {
		size_t n = strlen(path);
		const char *slash = strrchr(path, '/');
		size_t base = 0;
		if (!strncmp(msg, path, n) && (msg[n] == '/' || path[n - 1] == '/'))
			base = n; /* a shard of the directory `path` */
		else if (slash && !strncmp(msg, path, (size_t)(slash - path) + 1))
			base = (size_t)(slash - path) + 1; /* a shard next to the index `path` */
		else if (!slash && !strncmp(msg, "./", 2))
			base = 2; /* next to an index in the working directory */
		const char *end = base ? strstr(msg + base, ": ") : NULL;
		if (end) {
			best = msg;
			blen = (size_t)(end - msg);
		}
	}
	*len = blen;
	return best;
}

/*
 * Raise the fst exception for a libfst failure. fst builds it (its class
 * also depends on errno: a missing file is a FileNotFoundError too), from
 * the message, the status, the errno and, for file errors, the file named
 * (ck and path say which files can be named; both may be NULL).
 */
static PyObject *raise_fst_at(int code, const fst_error *err, const fst_checkpoint *ck,
			      const char *path)
{
	const char *msg = err && err->message[0] ? err->message : fst_strerror(code);
	int sys_errno = err && err->message[0] ? err->sys_errno : 0;
	/* a path in the message need not be UTF-8 */
	PyObject *pmsg = PyUnicode_DecodeFSDefault(msg);
	PyObject *file = NULL;
	if (pmsg && (code == FST_EIO || code == FST_ECHANGED)) {
		size_t n;
		const char *f = failed_file(msg, ck, path, &n);
		file = f ? PyUnicode_DecodeFSDefaultAndSize(f, (Py_ssize_t)n) : Py_NewRef(Py_None);
	} else if (pmsg) {
		file = Py_NewRef(Py_None);
	}
	if (!file) {
		Py_XDECREF(pmsg);
		return NULL;
	}
	PyObject *exc = NULL;
	if (error_factory) {
		exc = PyObject_CallFunction(error_factory, "OiiO", pmsg, code, sys_errno, file);
	} else {
		PyObject *cls = FstError ? FstError : PyExc_RuntimeError;
		exc = PyObject_CallFunction(cls, "Oi", pmsg, code);
	}
	Py_DECREF(pmsg);
	Py_DECREF(file);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

static PyObject *raise_fst(int code, const fst_error *err)
{
	return raise_fst_at(code, err, NULL, NULL);
}

/* ---- Checkpoint */

typedef struct {
	PyObject_HEAD
	fst_checkpoint *ck;
	/* a checkpoint over bytes in memory holds them: libfst reads them in
	 * place for as long as the checkpoint lives */
	Py_buffer mem;
	int has_mem;
} CheckpointObject;

static void Checkpoint_dealloc(CheckpointObject *self)
{
	fst_checkpoint_close(self->ck);
	if (self->has_mem)
		PyBuffer_Release(&self->mem);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Checkpoint_init(CheckpointObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"path", NULL};
	PyObject *pathobj;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&", kwlist, PyUnicode_FSConverter, &pathobj))
		return -1;
	fst_error err;
	int rc;
	const char *path = PyBytes_AS_STRING(pathobj);
	Py_BEGIN_ALLOW_THREADS
	rc = fst_checkpoint_open(path, &self->ck, &err);
	Py_END_ALLOW_THREADS
	if (rc)
		raise_fst_at(rc, &err, NULL, path);
	Py_DECREF(pathobj);
	return rc ? -1 : 0;
}

static PyTypeObject CheckpointType;

/* A checkpoint of one safetensors file held in memory (bytes, bytearray,
 * any contiguous buffer), validated like a file. */
static PyObject *Checkpoint_from_bytes(PyObject *cls, PyObject *args)
{
	(void)cls;
	PyObject *data;
	const char *name = "<bytes>";
	if (!PyArg_ParseTuple(args, "O|s", &data, &name))
		return NULL;
	CheckpointObject *self = PyObject_New(CheckpointObject, &CheckpointType);
	if (!self)
		return NULL;
	self->ck = NULL;
	self->has_mem = 0;
	if (PyObject_GetBuffer(data, &self->mem, PyBUF_C_CONTIGUOUS)) {
		Py_DECREF(self);
		return NULL;
	}
	self->has_mem = 1;
	fst_file *f = NULL;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_file_open_memory(self->mem.buf, (size_t)self->mem.len, name, &f, &err);
	if (!rc)
		rc = fst_checkpoint_from_files(&f, 1, &self->ck, &err);
	Py_END_ALLOW_THREADS
	if (rc) {
		Py_DECREF(self);
		return raise_fst_at(rc, &err, NULL, name);
	}
	return (PyObject *)self;
}

static PyObject *Checkpoint_keys(CheckpointObject *self, PyObject *unused)
{
	(void)unused;
	size_t n = fst_checkpoint_tensor_count(self->ck);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		fst_tensor_info t;
		fst_checkpoint_tensor(self->ck, i, &t, NULL);
		PyList_SET_ITEM(list, (Py_ssize_t)i, PyUnicode_FromString(t.name));
	}
	return list;
}

static PyObject *shape_tuple(uint32_t ndim, const uint64_t *shape)
{
	PyObject *t = PyTuple_New(ndim);
	for (uint32_t d = 0; t && d < ndim; d++)
		PyTuple_SET_ITEM(t, d, PyLong_FromUnsignedLongLong(shape[d]));
	return t;
}

/* (dtype, shape, nbytes, file index, file offset) of a tensor, or None */
static PyObject *Checkpoint_info(CheckpointObject *self, PyObject *name)
{
	const char *s = PyUnicode_AsUTF8(name);
	if (!s)
		return NULL;
	long i = fst_checkpoint_find(self->ck, s);
	if (i < 0)
		Py_RETURN_NONE;
	fst_tensor_info t;
	size_t fi;
	fst_checkpoint_tensor(self->ck, (size_t)i, &t, &fi);
	return Py_BuildValue("(sNKnK)", fst_dtype_name(t.dtype), shape_tuple(t.ndim, t.shape),
			     (unsigned long long)t.nbytes, (Py_ssize_t)fi,
			     (unsigned long long)t.file_offset);
}

static PyObject *Checkpoint_files(CheckpointObject *self, PyObject *unused)
{
	(void)unused;
	size_t n = fst_checkpoint_file_count(self->ck);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++)
		PyList_SET_ITEM(list, (Py_ssize_t)i,
				PyUnicode_DecodeFSDefault(fst_file_path(fst_checkpoint_file(self->ck, i))));
	return list;
}

static PyObject *Checkpoint_metadata(CheckpointObject *self, PyObject *args)
{
	Py_ssize_t fi = 0;
	if (!PyArg_ParseTuple(args, "|n", &fi))
		return NULL;
	if (fi < 0 || (size_t)fi >= fst_checkpoint_file_count(self->ck)) {
		PyErr_SetString(PyExc_IndexError, "file index out of range");
		return NULL;
	}
	const fst_file *f = fst_checkpoint_file(self->ck, (size_t)fi);
	if (!fst_file_metadata_count(f))
		Py_RETURN_NONE;
	PyObject *d = PyDict_New();
	for (size_t i = 0; d && i < fst_file_metadata_count(f); i++) {
		const char *k, *v;
		fst_file_metadata(f, i, &k, &v);
		PyObject *pv = PyUnicode_FromString(v);
		if (!pv || PyDict_SetItemString(d, k, pv)) {
			Py_XDECREF(pv);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(pv);
	}
	return d;
}

static PyMethodDef Checkpoint_methods[] = {
	{"keys", (PyCFunction)Checkpoint_keys, METH_NOARGS, "tensor names, file by file"},
	{"info", (PyCFunction)Checkpoint_info, METH_O,
	 "(dtype, shape, nbytes, file_index, file_offset) or None"},
	{"files", (PyCFunction)Checkpoint_files, METH_NOARGS, "the safetensors files"},
	{"metadata", (PyCFunction)Checkpoint_metadata, METH_VARARGS,
	 "__metadata__ of file i (default 0), or None"},
	{"from_bytes", (PyCFunction)Checkpoint_from_bytes, METH_VARARGS | METH_CLASS,
	 "from_bytes(data, name='<bytes>'): a checkpoint of one file held in memory"},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject CheckpointType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Checkpoint",
	.tp_basicsize = sizeof(CheckpointObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Checkpoint_init,
	.tp_dealloc = (destructor)Checkpoint_dealloc,
	.tp_methods = Checkpoint_methods,
	.tp_doc = "A safetensors checkpoint: a file, a directory or an index.",
};

/* ---- Tensor: one loaded tensor; holds a reference on its buffer */

typedef struct {
	PyObject_HEAD
	fst_tensor_view view;
	DLDataType export_type; /* how __dlpack__ describes the bytes */
	int64_t *export_shape;
	int export_ndim;
} TensorObject;

static PyTypeObject TensorType;

static void Tensor_dealloc(TensorObject *self)
{
	fst_view_release(&self->view);
	free(self->export_shape);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The natural DLPack type of a dtype; 0 bits when DLPack has none that
 * frameworks share (the float8/6/4 families: exported as bytes). */
static DLDataType natural_type(fst_dtype d)
{
	switch (d) {
	case FST_DTYPE_BOOL: return (DLDataType){DL_BOOL, 8, 1};
	case FST_DTYPE_U8: return (DLDataType){DL_UINT, 8, 1};
	case FST_DTYPE_I8: return (DLDataType){DL_INT, 8, 1};
	case FST_DTYPE_I16: return (DLDataType){DL_INT, 16, 1};
	case FST_DTYPE_U16: return (DLDataType){DL_UINT, 16, 1};
	case FST_DTYPE_F16: return (DLDataType){DL_FLOAT, 16, 1};
	case FST_DTYPE_BF16: return (DLDataType){DL_BFLOAT, 16, 1};
	case FST_DTYPE_I32: return (DLDataType){DL_INT, 32, 1};
	case FST_DTYPE_U32: return (DLDataType){DL_UINT, 32, 1};
	case FST_DTYPE_F32: return (DLDataType){DL_FLOAT, 32, 1};
	case FST_DTYPE_I64: return (DLDataType){DL_INT, 64, 1};
	case FST_DTYPE_U64: return (DLDataType){DL_UINT, 64, 1};
	case FST_DTYPE_F64: return (DLDataType){DL_FLOAT, 64, 1};
	case FST_DTYPE_C64: return (DLDataType){DL_COMPLEX, 64, 1};
	default: return (DLDataType){DL_UINT, 0, 1};
	}
}

/* Export as `type` (code, bits): the last dimension is rescaled so the
 * bytes stay the same; where it cannot be, the tensor is flat. */
static int set_export(TensorObject *t, DLDataType type)
{
	const fst_tensor_view *v = &t->view;
	free(t->export_shape);
	t->export_shape = NULL;
	t->export_type = type;
	unsigned src_bits = fst_dtype_bits(v->dtype);
	int ndim = (int)v->ndim;
	t->export_shape = malloc(sizeof(int64_t) * (size_t)(ndim ? ndim : 1));
	if (!t->export_shape) {
		PyErr_NoMemory();
		return -1;
	}
	for (int d = 0; d < ndim; d++)
		t->export_shape[d] = (int64_t)v->shape[d];
	t->export_ndim = ndim;
	if (src_bits == type.bits)
		return 0;
	uint64_t last = ndim ? v->shape[ndim - 1] : 1;
	if (ndim && (last * src_bits) % type.bits == 0) {
		t->export_shape[ndim - 1] = (int64_t)(last * src_bits / type.bits);
		return 0;
	}
	if (v->nbytes * 8 % type.bits) {
		PyErr_Format(PyExc_ValueError, "tensor \"%s\": %llu bytes are not a whole number of "
				"%u-bit elements", v->name, (unsigned long long)v->nbytes, type.bits);
		return -1;
	}
	t->export_shape[0] = (int64_t)(v->nbytes * 8 / type.bits);
	t->export_ndim = 1;
	return 0;
}

static PyObject *make_tensor(fst_tensor_view *view)
{
	TensorObject *t = PyObject_New(TensorObject, &TensorType);
	if (!t) {
		fst_view_release(view);
		return NULL;
	}
	t->view = *view; /* takes over the view's reference */
	t->export_shape = NULL;
	DLDataType nat = natural_type(view->dtype);
	if (!nat.bits)
		nat = (DLDataType){DL_UINT, 8, 1};
	if (set_export(t, nat)) {
		Py_DECREF(t);
		return NULL;
	}
	return (PyObject *)t;
}

struct managed {
	DLManagedTensor m;
	fst_tensor_view view;
	int64_t shape[];
};

struct managed_versioned {
	DLManagedTensorVersioned m;
	fst_tensor_view view;
	int64_t shape[];
};

static void managed_deleter(DLManagedTensor *self)
{
	struct managed *mt = (struct managed *)self;
	fst_view_release(&mt->view);
	free(mt);
}

static void managed_versioned_deleter(DLManagedTensorVersioned *self)
{
	struct managed_versioned *mt = (struct managed_versioned *)self;
	fst_view_release(&mt->view);
	free(mt);
}

static void capsule_destructor(PyObject *cap)
{
	/* a consumer renames it "used_dltensor" when it takes ownership */
	if (PyCapsule_IsValid(cap, "dltensor")) {
		DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
		if (m && m->deleter)
			m->deleter(m);
	}
}

static void capsule_versioned_destructor(PyObject *cap)
{
	/* renamed "used_dltensor_versioned" once a consumer owns it */
	if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
		if (m && m->deleter)
			m->deleter(m);
	}
}

/* max_version: None or (major, minor); 1 when the consumer takes DLPack 1.x. */
static int wants_versioned(PyObject *max_version)
{
	if (!max_version || max_version == Py_None)
		return 0;
	if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1) {
		PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple");
		return -1;
	}
	long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
	if (major == -1 && PyErr_Occurred())
		return -1;
	return major >= 1;
}

static PyObject *Tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw)
{
	/* stream is accepted and ignored: a tensor is handed out only once its
	 * bytes have landed, so no stream must wait for it. */
	static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
	PyObject *stream = NULL, *max_version = NULL, *dl_device = NULL, *copy = NULL;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOO", kwlist, &stream, &max_version,
					 &dl_device, &copy))
		return NULL;
	if (copy && copy == Py_True) {
		PyErr_SetString(PyExc_BufferError, "fst tensors are exported without copies");
		return NULL;
	}
	fst_tensor_view *v = &self->view;
	if (dl_device && dl_device != Py_None) {
		int type, id;
		if (!PyArg_ParseTuple(dl_device, "ii;dl_device must be (device_type, device_id)",
				      &type, &id))
			return NULL;
		if (type != v->device_type || id != v->device_id) {
			PyErr_Format(PyExc_BufferError, "tensor \"%s\" is on device (%d, %d), not "
				     "(%d, %d): fst tensors are exported without copies", v->name,
				     v->device_type, v->device_id, type, id);
			return NULL;
		}
	}
	int versioned = wants_versioned(max_version);
	if (versioned < 0)
		return NULL;
	/* read-only file mappings keep the legacy capsule, which numpy
	 * imports read-only and which every torch takes. */
	bool read_only = fst_buffer_read_only(v->buffer);
	if (read_only)
		versioned = 0;
	int nd = self->export_ndim;
	size_t shape_bytes = sizeof(int64_t) * (size_t)(nd ? nd : 1);
	DLTensor *dl;
	fst_tensor_view *held;
	int64_t *shape;
	void *m;
	if (versioned) {
		struct managed_versioned *mt = calloc(1, sizeof *mt + shape_bytes);
		if (!mt)
			return PyErr_NoMemory();
		mt->m.version = (DLPackVersion){1, 0};
		mt->m.manager_ctx = mt;
		mt->m.deleter = managed_versioned_deleter;
		mt->m.flags = 0;
		dl = &mt->m.dl_tensor;
		held = &mt->view;
		shape = mt->shape;
		m = &mt->m;
	} else {
		struct managed *mt = calloc(1, sizeof *mt + shape_bytes);
		if (!mt)
			return PyErr_NoMemory();
		mt->m.manager_ctx = mt;
		mt->m.deleter = managed_deleter;
		dl = &mt->m.dl_tensor;
		held = &mt->view;
		shape = mt->shape;
		m = &mt->m;
	}
	fst_buffer_retain(v->buffer);
	*held = *v;
	memcpy(shape, self->export_shape, sizeof(int64_t) * (size_t)nd);
	dl->data = v->data;
	dl->device.device_type = v->device_type;
	dl->device.device_id = v->device_id;
	dl->ndim = nd;
	dl->dtype = self->export_type;
	dl->shape = shape;
	dl->strides = NULL; /* row-major, compact */
	dl->byte_offset = 0;
	PyObject *cap = versioned
		? PyCapsule_New(m, "dltensor_versioned", capsule_versioned_destructor)
		: PyCapsule_New(m, "dltensor", capsule_destructor);
	if (!cap) {
		if (versioned)
			managed_versioned_deleter(m);
		else
			managed_deleter(m);
	}
	return cap;
}

static PyObject *Tensor_dlpack_device(TensorObject *self, PyObject *unused)
{
	(void)unused;
	return Py_BuildValue("(ii)", self->view.device_type, self->view.device_id);
}

/* A tensor over the same bytes exported as another (code, bits) type. */
static PyObject *Tensor_reinterpret(TensorObject *self, PyObject *args)
{
	int code, bits;
	if (!PyArg_ParseTuple(args, "ii", &code, &bits))
		return NULL;
	if (bits <= 0 || bits > 128 || bits % 8) {
		PyErr_SetString(PyExc_ValueError, "bits must be a multiple of 8");
		return NULL;
	}
	fst_tensor_view v;
	if (fst_buffer_tensor(self->view.buffer, self->view.index, &v))
		return PyErr_Format(PyExc_RuntimeError, "tensor vanished");
	TensorObject *t = (TensorObject *)make_tensor(&v);
	if (t && set_export(t, (DLDataType){(uint8_t)code, (uint8_t)bits, 1})) {
		Py_DECREF(t);
		return NULL;
	}
	return (PyObject *)t;
}

/* Bytes [offset, offset + length) copied to a new bytes object. */
static PyObject *Tensor_tobytes(TensorObject *self, PyObject *unused)
{
	(void)unused;
	PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)self->view.nbytes);
	if (!b)
		return NULL;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_copy_to_host(&self->view, 0, PyBytes_AS_STRING(b), self->view.nbytes, &err);
	Py_END_ALLOW_THREADS
	if (rc) {
		Py_DECREF(b);
		return raise_fst(rc, &err);
	}
	return b;
}

static PyObject *Tensor_get_name(TensorObject *self, void *c)
{
	(void)c;
	return PyUnicode_FromString(self->view.name);
}
static PyObject *Tensor_get_dtype(TensorObject *self, void *c)
{
	(void)c;
	return PyUnicode_FromString(fst_dtype_name(self->view.dtype));
}
static PyObject *Tensor_get_shape(TensorObject *self, void *c)
{
	(void)c;
	return shape_tuple(self->view.ndim, self->view.shape);
}
static PyObject *Tensor_get_nbytes(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(self->view.nbytes);
}
static PyObject *Tensor_get_device(TensorObject *self, void *c)
{
	(void)c;
	if (self->view.device_type == FST_DEVICE_CPU)
		return PyUnicode_FromString("cpu");
	return PyUnicode_FromFormat("cuda:%d", self->view.device_id);
}
static PyObject *Tensor_get_ptr(TensorObject *self, void *c)
{
	(void)c;
	return PyLong_FromVoidPtr(self->view.data);
}

static PyGetSetDef Tensor_getset[] = {
	{"name", (getter)Tensor_get_name, NULL, "tensor name", NULL},
	{"dtype", (getter)Tensor_get_dtype, NULL, "safetensors dtype, e.g. 'BF16'", NULL},
	{"shape", (getter)Tensor_get_shape, NULL, "shape as in the file", NULL},
	{"nbytes", (getter)Tensor_get_nbytes, NULL, "bytes", NULL},
	{"device", (getter)Tensor_get_device, NULL, "'cpu' or 'cuda:N'", NULL},
	{"data_ptr", (getter)Tensor_get_ptr, NULL, "address of the first byte", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Tensor_methods[] = {
	{"__dlpack__", (PyCFunction)(void (*)(void))Tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
	 "DLPack capsule (zero-copy; holds a reference on the buffer)"},
	{"__dlpack_device__", (PyCFunction)Tensor_dlpack_device, METH_NOARGS,
	 "(device_type, device_id)"},
	{"reinterpret", (PyCFunction)Tensor_reinterpret, METH_VARARGS,
	 "the same bytes exported as DLPack (code, bits)"},
	{"tobytes", (PyCFunction)Tensor_tobytes, METH_NOARGS, "a host copy of the bytes"},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject TensorType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Tensor",
	.tp_basicsize = sizeof(TensorObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Tensor_dealloc,
	.tp_methods = Tensor_methods,
	.tp_getset = Tensor_getset,
	.tp_doc = "A loaded tensor (zero-copy, DLPack).",
};

/* ---- load options and the allocator bridge */

/* The bridge to a Python (alloc, free) pair. Reference-counted under the
 * GIL: one reference for the load that was given it (dropped by
 * free_load_args) and one per allocation alive (taken by py_alloc, dropped
 * by py_free), so it outlives every buffer that uses it whether the load
 * succeeds or fails after allocating. */
struct pyalloc {
	PyObject *alloc, *free;
	long refs;
};

static void pyalloc_unref(struct pyalloc *pa)
{
	/* the GIL is held */
	if (--pa->refs > 0)
		return;
	Py_DECREF(pa->alloc);
	Py_DECREF(pa->free);
	free(pa);
}

static void *py_alloc(void *ctx, uint64_t size, uint32_t align, int device_type, int device_id)
{
	struct pyalloc *pa = ctx;
	PyGILState_STATE g = PyGILState_Ensure();
	void *p = NULL;
	PyObject *r = PyObject_CallFunction(pa->alloc, "KIii", (unsigned long long)size, align,
					    device_type, device_id);
	if (r) {
		p = PyLong_AsVoidPtr(r);
		Py_DECREF(r);
	}
	if (PyErr_Occurred()) {
		PyErr_WriteUnraisable(pa->alloc);
		p = NULL;
	}
	if (p)
		pa->refs++; /* dropped by py_free */
	PyGILState_Release(g);
	return p;
}

static void py_free(void *ctx, void *ptr, uint64_t size, int device_type, int device_id)
{
	struct pyalloc *pa = ctx;
	if (!Py_IsInitialized())
		return; /* interpreter gone: the framework's memory went with it */
	/* The last reference may be dropped on any thread, with or without the
	 * GIL: take it for the call and for the reference counts. */
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *r = PyObject_CallFunction(pa->free, "NKii", PyLong_FromVoidPtr(ptr),
					    (unsigned long long)size, device_type, device_id);
	if (!r)
		PyErr_WriteUnraisable(pa->free);
	Py_XDECREF(r);
	pyalloc_unref(pa);
	PyGILState_Release(g);
}

struct names {
	PyObject *set; /* a frozenset of names, or NULL */
};

static int filter_names(void *ctx, const char *name)
{
	/* Called from the thread that starts the load; it holds no GIL. */
	struct names *n = ctx;
	PyGILState_STATE g = PyGILState_Ensure();
	PyObject *s = PyUnicode_FromString(name);
	int keep = s ? PySet_Contains(n->set, s) == 1 : 0;
	Py_XDECREF(s);
	PyErr_Clear();
	PyGILState_Release(g);
	return keep;
}

struct load_args {
	fst_load_opts opts;
	struct names names;
	fst_allocator allocator;
	struct pyalloc *pa;
	char device[32];
};

static int parse_load_args(PyObject *args, PyObject *kw, CheckpointObject **ck,
			   struct load_args *la)
{
	static char *kwlist[] = {"checkpoint", "device", "io", "threads", "chunk_bytes",
				 "staging_bytes", "gds", "align", "names", "allocator",
				 "mmap_private", NULL};
	const char *device = "cpu";
	int io = 0, gds = 0;
	unsigned threads = 0, align = 0;
	unsigned long long chunk = 0, staging = 0;
	PyObject *names = Py_None, *allocator = Py_None;
	int mmap_private = 0;
	memset(la, 0, sizeof *la); /* free_load_args must find it clean on every failure */
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|siIKKiIOOp", kwlist, &CheckpointType, ck,
					 &device, &io, &threads, &chunk, &staging, &gds, &align,
					 &names, &allocator, &mmap_private))
		return -1;
	fst_load_opts_init(&la->opts);
	snprintf(la->device, sizeof la->device, "%s", device);
	la->opts.device = la->device;
	la->opts.io = io;
	la->opts.gds = gds;
	la->opts.threads = threads;
	la->opts.chunk_bytes = chunk;
	la->opts.staging_bytes = staging;
	la->opts.align = align;
	la->opts.mmap_private = mmap_private;
	if (names != Py_None) {
		la->names.set = PyFrozenSet_New(names);
		if (!la->names.set)
			return -1;
		la->opts.filter = filter_names;
		la->opts.filter_ctx = &la->names;
	}
	if (allocator != Py_None) {
		PyObject *a = NULL, *f = NULL;
		if (!PyTuple_Check(allocator)) {
			PyErr_SetString(PyExc_TypeError, "allocator must be (alloc, free)");
			return -1;
		}
		if (!PyArg_ParseTuple(allocator, "OO;allocator must be (alloc, free)", &a, &f))
			return -1;
		la->pa = malloc(sizeof *la->pa);
		if (!la->pa) {
			PyErr_NoMemory();
			return -1;
		}
		Py_INCREF(a);
		Py_INCREF(f);
		la->pa->alloc = a;
		la->pa->free = f;
		la->pa->refs = 1; /* the load's own; see struct pyalloc */
		la->allocator = (fst_allocator){py_alloc, py_free, la->pa};
		la->opts.allocator = &la->allocator;
	}
	return 0;
}

static void free_load_args(struct load_args *la)
{
	Py_CLEAR(la->names.set);
	if (la->pa) {
		pyalloc_unref(la->pa); /* buffers that allocated hold their own */
		la->pa = NULL;
	}
}

/* ---- Buffer */

typedef struct {
	PyObject_HEAD
	fst_buffer *buf;
} BufferObject;

static void Buffer_dealloc(BufferObject *self)
{
	fst_buffer *b = self->buf;
	self->buf = NULL;
	/* the allocator bridge may need the GIL: release without holding it
	 * is not needed, PyGILState_Ensure nests */
	fst_buffer_release(b);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Buffer_len(BufferObject *self)
{
	return (Py_ssize_t)fst_buffer_tensor_count(self->buf);
}

static PyObject *Buffer_names(BufferObject *self, PyObject *unused)
{
	(void)unused;
	size_t n = fst_buffer_tensor_count(self->buf);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		fst_tensor_view v;
		fst_buffer_tensor(self->buf, i, &v);
		PyList_SET_ITEM(list, (Py_ssize_t)i, PyUnicode_FromString(v.name));
		fst_view_release(&v);
	}
	return list;
}

static PyObject *Buffer_tensor(BufferObject *self, PyObject *name)
{
	const char *s = PyUnicode_AsUTF8(name);
	if (!s)
		return NULL;
	long i = fst_buffer_find(self->buf, s);
	if (i < 0) {
		PyErr_SetObject(PyExc_KeyError, name);
		return NULL;
	}
	fst_tensor_view v;
	fst_buffer_tensor(self->buf, (size_t)i, &v);
	return make_tensor(&v);
}

static PyObject *Buffer_describe(BufferObject *self, PyObject *unused)
{
	(void)unused;
	return PyUnicode_FromString(fst_buffer_describe(self->buf));
}

static PyObject *Buffer_nbytes(BufferObject *self, PyObject *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLongLong(fst_buffer_tensor_bytes(self->buf));
}

static PyMethodDef Buffer_methods[] = {
	{"names", (PyCFunction)Buffer_names, METH_NOARGS, "tensor names"},
	{"tensor", (PyCFunction)Buffer_tensor, METH_O, "the Tensor called name"},
	{"describe", (PyCFunction)Buffer_describe, METH_NOARGS, "how the load ran and why"},
	{"nbytes", (PyCFunction)Buffer_nbytes, METH_NOARGS, "tensor bytes"},
	{NULL, NULL, 0, NULL},
};

static PySequenceMethods Buffer_seq = {.sq_length = (lenfunc)Buffer_len};

static PyTypeObject BufferType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Buffer",
	.tp_basicsize = sizeof(BufferObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Buffer_dealloc,
	.tp_methods = Buffer_methods,
	.tp_as_sequence = &Buffer_seq,
	.tp_doc = "The result of a load.",
};

static PyObject *wrap_buffer(fst_buffer *b)
{
	BufferObject *o = PyObject_New(BufferObject, &BufferType);
	if (!o) {
		fst_buffer_release(b);
		return NULL;
	}
	o->buf = b;
	return (PyObject *)o;
}

static PyObject *mod_load(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	CheckpointObject *ck;
	struct load_args la;
	if (parse_load_args(args, kw, &ck, &la)) {
		free_load_args(&la);
		return NULL;
	}
	fst_buffer *buf = NULL;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_load(ck->ck, &la.opts, &buf, &err);
	Py_END_ALLOW_THREADS
	free_load_args(&la);
	if (rc)
		return raise_fst_at(rc, &err, ck->ck, NULL);
	return wrap_buffer(buf);
}

/* ---- Loader: streaming */

typedef struct {
	PyObject_HEAD
	fst_loader *ld;
	PyObject *checkpoint; /* kept alive while the loader runs */
	struct load_args la;
} LoaderObject;

static void Loader_dealloc(LoaderObject *self)
{
	if (self->ld) {
		fst_loader *ld = self->ld;
		self->ld = NULL;
		Py_BEGIN_ALLOW_THREADS
		fst_loader_free(ld);
		Py_END_ALLOW_THREADS
	}
	free_load_args(&self->la);
	Py_XDECREF(self->checkpoint);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LoaderType;

static PyObject *mod_start(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	LoaderObject *self = PyObject_New(LoaderObject, &LoaderType);
	if (!self)
		return NULL;
	self->ld = NULL;
	self->checkpoint = NULL;
	CheckpointObject *ck;
	if (parse_load_args(args, kw, &ck, &self->la)) {
		Py_DECREF(self); /* Loader_dealloc frees what parse_load_args made */
		return NULL;
	}
	Py_INCREF(ck);
	self->checkpoint = (PyObject *)ck;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_load_start(ck->ck, &self->la.opts, &self->ld, &err);
	Py_END_ALLOW_THREADS
	if (rc) {
		Py_DECREF(self);
		return raise_fst_at(rc, &err, ck->ck, NULL);
	}
	return (PyObject *)self;
}

static const fst_checkpoint *loader_checkpoint(LoaderObject *self)
{
	return self->checkpoint ? ((CheckpointObject *)self->checkpoint)->ck : NULL;
}

/* The next ready tensor, or None when all were handed out. */
static PyObject *Loader_next(LoaderObject *self, PyObject *unused)
{
	(void)unused;
	if (!self->ld) {
		PyErr_SetString(PyExc_RuntimeError, "loader already finished");
		return NULL;
	}
	fst_tensor_view v;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_loader_next(self->ld, &v, &err);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_fst_at(rc, &err, loader_checkpoint(self), NULL);
	if (rc == 0)
		Py_RETURN_NONE;
	return make_tensor(&v);
}

static PyObject *Loader_progress(LoaderObject *self, PyObject *unused)
{
	(void)unused;
	uint64_t done = 0, total = 0;
	if (self->ld)
		fst_loader_progress(self->ld, &done, &total);
	return Py_BuildValue("(KK)", (unsigned long long)done, (unsigned long long)total);
}

static PyObject *Loader_cancel(LoaderObject *self, PyObject *unused)
{
	(void)unused;
	if (self->ld)
		fst_loader_cancel(self->ld);
	Py_RETURN_NONE;
}

static PyObject *Loader_finish(LoaderObject *self, PyObject *unused)
{
	(void)unused;
	if (!self->ld) {
		PyErr_SetString(PyExc_RuntimeError, "loader already finished");
		return NULL;
	}
	fst_loader *ld = self->ld;
	self->ld = NULL;
	fst_buffer *buf = NULL;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_loader_finish(ld, &buf, &err);
	Py_END_ALLOW_THREADS
	if (rc)
		return raise_fst_at(rc, &err, loader_checkpoint(self), NULL);
	return wrap_buffer(buf);
}

static PyMethodDef Loader_methods[] = {
	{"next", (PyCFunction)Loader_next, METH_NOARGS, "next ready Tensor, or None at the end"},
	{"progress", (PyCFunction)Loader_progress, METH_NOARGS, "(bytes done, bytes total)"},
	{"cancel", (PyCFunction)Loader_cancel, METH_NOARGS, "stop the readers"},
	{"finish", (PyCFunction)Loader_finish, METH_NOARGS, "wait for the end; the Buffer"},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject LoaderType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Loader",
	.tp_basicsize = sizeof(LoaderObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Loader_dealloc,
	.tp_methods = Loader_methods,
	.tp_doc = "A streaming load: tensors as they become ready.",
};

/* ---- Comm: an NCCL communicator for tensor-parallel loads */

typedef struct {
	PyObject_HEAD
	fst_comm *comm;
} CommObject;

static void Comm_dealloc(CommObject *self)
{
	fst_comm *c = self->comm;
	self->comm = NULL;
	if (c) {
		Py_BEGIN_ALLOW_THREADS
		fst_comm_destroy(c);
		Py_END_ALLOW_THREADS
	}
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Comm_init(CommObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"world", "rank", "unique_id", "device", "timeout_ms", NULL};
	int world, rank, device, timeout_ms = 0;
	Py_buffer id;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "iiy*i|i", kwlist, &world, &rank, &id, &device,
					 &timeout_ms))
		return -1;
	if (id.len != FST_COMM_ID_BYTES) {
		PyBuffer_Release(&id);
		PyErr_Format(PyExc_ValueError, "unique_id must be %d bytes", FST_COMM_ID_BYTES);
		return -1;
	}
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_comm_init(world, rank, id.buf, device, timeout_ms, &self->comm, &err);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&id);
	if (rc) {
		raise_fst(rc, &err);
		return -1;
	}
	return 0;
}

static PyTypeObject CommType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Comm",
	.tp_basicsize = sizeof(CommObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Comm_init,
	.tp_dealloc = (destructor)Comm_dealloc,
	.tp_doc = "Comm(world, rank, unique_id, device, timeout_ms=0): an NCCL communicator.",
};

static PyObject *mod_comm_unique_id(PyObject *mod, PyObject *unused)
{
	(void)mod;
	(void)unused;
	unsigned char id[FST_COMM_ID_BYTES];
	fst_error err;
	int rc = fst_comm_unique_id(id, &err);
	if (rc)
		return raise_fst(rc, &err);
	return PyBytes_FromStringAndSize((const char *)id, FST_COMM_ID_BYTES);
}

/* load_sharded(checkpoint, comm, dims, io=0, threads=0, staging_bytes=0) */
static PyObject *mod_load_sharded(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {"checkpoint", "comm", "dims", "io", "threads", "staging_bytes",
				 NULL};
	CheckpointObject *ck;
	CommObject *comm;
	PyObject *dims_obj;
	int io = 0;
	unsigned threads = 0;
	unsigned long long staging = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!O|iIK", kwlist, &CheckpointType, &ck,
					 &CommType, &comm, &dims_obj, &io, &threads, &staging))
		return NULL;
	size_t n = fst_checkpoint_tensor_count(ck->ck);
	PyObject *seq = PySequence_Fast(dims_obj, "dims must be a sequence of ints");
	if (!seq)
		return NULL;
	if ((size_t)PySequence_Fast_GET_SIZE(seq) != n) {
		Py_DECREF(seq);
		return PyErr_Format(PyExc_ValueError, "dims has %zd entries for %zu tensors",
				    PySequence_Fast_GET_SIZE(seq), n);
	}
	int *dims = malloc(sizeof(int) * (n ? n : 1));
	if (!dims) {
		Py_DECREF(seq);
		return PyErr_NoMemory();
	}
	for (size_t i = 0; i < n; i++) {
		dims[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i));
		if (PyErr_Occurred()) {
			free(dims);
			Py_DECREF(seq);
			return NULL;
		}
	}
	Py_DECREF(seq);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = io;
	o.threads = threads;
	o.staging_bytes = staging;
	fst_buffer *buf = NULL;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_load_sharded(ck->ck, &o, comm->comm, dims, &buf, &err);
	Py_END_ALLOW_THREADS
	free(dims);
	if (rc)
		return raise_fst_at(rc, &err, ck->ck, NULL);
	return wrap_buffer(buf);
}

/* ---- writer */

static PyObject *mod_save(PyObject *mod, PyObject *args)
{
	(void)mod;
	/* entries: list of (name, dtype, shape, bytes-like); metadata: dict or
	 * None; path None: the file's bytes are returned instead of written */
	PyObject *entries, *metadata, *patharg, *pathobj = NULL;
	unsigned data_align = 8;
	if (!PyArg_ParseTuple(args, "OOO|I", &entries, &metadata, &patharg, &data_align))
		return NULL;
	if (patharg != Py_None && !PyUnicode_FSConverter(patharg, &pathobj))
		return NULL;
	fst_writer_opts wo;
	fst_writer_opts_init(&wo);
	wo.data_align = data_align;
	fst_writer *w = NULL;
	fst_error err;
	int rc = fst_writer_new(&wo, &w, &err);
	PyObject *seq = NULL, *result = NULL;
	Py_buffer *views = NULL;
	Py_ssize_t n = 0, nviews = 0;
	if (rc)
		goto fail;
	seq = PySequence_Fast(entries, "entries must be a sequence");
	if (!seq)
		goto out;
	n = PySequence_Fast_GET_SIZE(seq);
	views = calloc((size_t)(n ? n : 1), sizeof *views);
	if (!views) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		const char *name, *dtype;
		PyObject *shape, *data;
		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ssOO", &name, &dtype,
				      &shape, &data))
			goto out;
		fst_dtype d = fst_dtype_from_name(dtype);
		Py_ssize_t nd = PySequence_Length(shape);
		if (nd < 0)
			goto out;
		uint64_t dims[64];
		if (nd > 64) {
			PyErr_SetString(PyExc_ValueError, "more than 64 dimensions");
			goto out;
		}
		for (Py_ssize_t k = 0; k < nd; k++) {
			PyObject *it = PySequence_GetItem(shape, k);
			dims[k] = it ? PyLong_AsUnsignedLongLong(it) : 0;
			Py_XDECREF(it);
			if (PyErr_Occurred())
				goto out;
		}
		if (PyObject_GetBuffer(data, &views[nviews], PyBUF_C_CONTIGUOUS))
			goto out;
		nviews++;
		rc = fst_writer_add(w, name, d, (uint32_t)nd, dims, views[nviews - 1].buf,
				    (uint64_t)views[nviews - 1].len, &err);
		if (rc)
			goto fail;
	}
	if (metadata != Py_None) {
		PyObject *k, *v;
		Py_ssize_t pos = 0;
		if (!PyDict_Check(metadata)) {
			PyErr_SetString(PyExc_TypeError, "metadata must be a dict of str to str");
			goto out;
		}
		while (PyDict_Next(metadata, &pos, &k, &v)) {
			const char *ks = PyUnicode_AsUTF8(k), *vs = PyUnicode_AsUTF8(v);
			if (!ks || !vs) {
				PyErr_SetString(PyExc_TypeError, "metadata must be a dict of str to str");
				goto out;
			}
			if ((rc = fst_writer_metadata(w, ks, vs, &err)))
				goto fail;
		}
	}
	if (!pathobj) {
		uint64_t size = 0;
		if ((rc = fst_writer_size(w, &size, &err)))
			goto fail;
		if (size > (uint64_t)PY_SSIZE_T_MAX) {
			PyErr_NoMemory();
			goto out;
		}
		PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
		if (!bytes)
			goto out;
		char *dst = PyBytes_AS_STRING(bytes);
		Py_BEGIN_ALLOW_THREADS
		rc = fst_writer_finish_memory(w, dst, size, &err);
		Py_END_ALLOW_THREADS
		if (rc) {
			Py_DECREF(bytes);
			goto fail;
		}
		result = bytes;
		goto out;
	}
	{
		const char *path = PyBytes_AS_STRING(pathobj);
		Py_BEGIN_ALLOW_THREADS
		rc = fst_writer_finish(w, path, &err);
		Py_END_ALLOW_THREADS
	}
	if (rc)
		goto fail;
	Py_INCREF(Py_None);
	result = Py_None;
	goto out;
fail:
	raise_fst_at(rc, &err, NULL, pathobj ? PyBytes_AS_STRING(pathobj) : NULL);
out:
	for (Py_ssize_t i = 0; i < nviews; i++)
		PyBuffer_Release(&views[i]);
	free(views);
	Py_XDECREF(seq);
	Py_XDECREF(pathobj);
	fst_writer_free(w);
	return result;
}

static PyObject *mod_set_errors(PyObject *mod, PyObject *args)
{
	(void)mod;
	PyObject *base, *factory;
	if (!PyArg_ParseTuple(args, "OO", &base, &factory))
		return NULL;
	if (!PyCallable_Check(factory)) {
		PyErr_SetString(PyExc_TypeError, "_set_errors(base, factory): factory must be callable");
		return NULL;
	}
	Py_XSETREF(FstError, Py_NewRef(base));
	Py_XSETREF(error_factory, Py_NewRef(factory));
	Py_RETURN_NONE;
}

static PyObject *mod_fault_set(PyObject *mod, PyObject *args)
{
	(void)mod;
	const char *spec = NULL;
	if (!PyArg_ParseTuple(args, "z", &spec))
		return NULL;
	fst_error err;
	int rc = fst_fault_set(spec, &err);
	if (rc)
		return raise_fst(rc, &err);
	Py_RETURN_NONE;
}

static PyObject *mod_version(PyObject *mod, PyObject *unused)
{
	(void)mod;
	(void)unused;
	return PyUnicode_FromString(fst_version());
}

static PyObject *mod_trim(PyObject *mod, PyObject *unused)
{
	(void)mod;
	(void)unused;
	fst_trim();
	Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
	{"load", (PyCFunction)(void (*)(void))mod_load, METH_VARARGS | METH_KEYWORDS,
	 "load(checkpoint, device='cpu', io=0, threads=0, chunk_bytes=0, staging_bytes=0, "
	 "gds=0, align=0, names=None, allocator=None, mmap_private=False) -> Buffer"},
	{"start", (PyCFunction)(void (*)(void))mod_start, METH_VARARGS | METH_KEYWORDS,
	 "start(...) -> Loader: the streaming form of load"},
	{"save", (PyCFunction)mod_save, METH_VARARGS,
	 "save(entries, metadata, path[, data_align]): entries of (name, dtype, shape, bytes); "
	 "path None returns the file's bytes"},
	{"_set_errors", (PyCFunction)mod_set_errors, METH_VARARGS, "internal"},
	{"comm_unique_id", (PyCFunction)mod_comm_unique_id, METH_NOARGS,
	 "a new NCCL unique id (bytes) for Comm"},
	{"load_sharded", (PyCFunction)(void (*)(void))mod_load_sharded, METH_VARARGS | METH_KEYWORDS,
	 "load_sharded(checkpoint, comm, dims, io=0, threads=0, staging_bytes=0) -> Buffer"},
	{"version", (PyCFunction)mod_version, METH_NOARGS, "libfst version"},
	{"fault_set", (PyCFunction)mod_fault_set, METH_VARARGS,
	 "arm fault injection for tests: fault_set('read:1') (see fst_fault_set)"},
	{"trim", (PyCFunction)mod_trim, METH_NOARGS, "free pinned staging kept between loads"},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
	PyModuleDef_HEAD_INIT, "fst._fst", "libfst bindings", -1, module_methods,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fst(void)
{
	if (PyType_Ready(&CheckpointType) || PyType_Ready(&TensorType) ||
	    PyType_Ready(&BufferType) || PyType_Ready(&LoaderType) || PyType_Ready(&CommType))
		return NULL;
	PyObject *m = PyModule_Create(&moduledef);
	if (!m)
		return NULL;
	Py_INCREF(&CheckpointType);
	PyModule_AddObject(m, "Checkpoint", (PyObject *)&CheckpointType);
	Py_INCREF(&TensorType);
	PyModule_AddObject(m, "Tensor", (PyObject *)&TensorType);
	Py_INCREF(&BufferType);
	PyModule_AddObject(m, "Buffer", (PyObject *)&BufferType);
	Py_INCREF(&LoaderType);
	PyModule_AddObject(m, "Loader", (PyObject *)&LoaderType);
	Py_INCREF(&CommType);
	PyModule_AddObject(m, "Comm", (PyObject *)&CommType);
	return m;
}
