/*
 * _fst_tensor.c - fst._fst.Tensor: one loaded tensor, holding a reference on
 * its buffer, exported zero-copy through DLPack (0.x and 1.x capsules).
 */
#include "_fst.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

typedef struct {
	PyObject_HEAD
	fst_tensor_view view;
	DLDataType export_type; /* how __dlpack__ describes the bytes */
	int64_t *export_shape;
	int export_ndim;
} TensorObject;

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

PyObject *fstpy_make_tensor(fst_tensor_view *view)
{
	TensorObject *t = PyObject_New(TensorObject, &fstpy_TensorType);
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
		if (!PyTuple_Check(dl_device)) {
			PyErr_Format(PyExc_TypeError,
				     "dl_device must be a tuple (device_type, device_id), not %.100s",
				     Py_TYPE(dl_device)->tp_name);
			return NULL;
		}
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
	/* the same view (a host view stays one), with its own reference */
	fst_tensor_view v = self->view;
	fst_buffer_retain(v.buffer);
	TensorObject *t = (TensorObject *)fstpy_make_tensor(&v);
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
		return fstpy_raise(rc, &err);
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
	return fstpy_shape_tuple(self->view.ndim, self->view.shape);
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

/* The same bytes as a CPU tensor, where the CPU can use them (a
 * unified-memory load's mapped host memory); it holds its own reference on
 * the buffer, so the memory lives while either does. */
static PyObject *Tensor_host_view(TensorObject *self, PyObject *unused)
{
	(void)unused;
	void *host = fst_view_host_data(&self->view);
	if (!host) {
		fst_error err = {0};
		err.code = FST_EUSAGE;
		snprintf(err.message, sizeof err.message,
			 "tensor \"%s\" is in device memory of cuda:%d: the CPU has no view of it",
			 self->view.name, self->view.device_id);
		return fstpy_raise(FST_EUSAGE, &err);
	}
	fst_tensor_view v = self->view;
	v.data = host;
	v.device_type = FST_DEVICE_CPU;
	v.device_id = 0;
	fst_buffer_retain(v.buffer);
	return fstpy_make_tensor(&v);
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
	{"host_view", (PyCFunction)Tensor_host_view, METH_NOARGS,
	 "the same bytes as a CPU tensor where the CPU can use them (unified memory)"},
	{NULL, NULL, 0, NULL},
};

PyTypeObject fstpy_TensorType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Tensor",
	.tp_basicsize = sizeof(TensorObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Tensor_dealloc,
	.tp_methods = Tensor_methods,
	.tp_getset = Tensor_getset,
	.tp_doc = "A loaded tensor (zero-copy, DLPack).",
};
