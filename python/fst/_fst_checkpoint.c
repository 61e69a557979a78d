/*
 * _fst_checkpoint.c - fst._fst.Checkpoint: a checkpoint opened (a file, a
 * directory, an index, a URL of one, or one file's bytes in memory) and validated; its
 * names, dtypes, shapes and metadata, without reading any tensor data.
 */
#include "_fst.h"

static void Checkpoint_dealloc(CheckpointObject *self)
{
	fst_checkpoint_close(self->ck);
	if (self->has_mem)
		PyBuffer_Release(&self->mem);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

int fstpy_checkpoint_ready(const CheckpointObject *ck)
{
	if (ck->ck)
		return 0;
	PyErr_SetString(PyExc_ValueError, "the Checkpoint is not open (its __init__ did not run "
					  "or failed)");
	return -1;
}

const char *fstpy_tensor_name(PyObject *name, int *nul)
{
	if (!PyUnicode_Check(name)) {
		PyErr_Format(PyExc_TypeError, "a tensor name is a str, not %.100s",
			     Py_TYPE(name)->tp_name);
		return NULL;
	}
	Py_ssize_t len;
	const char *s = PyUnicode_AsUTF8AndSize(name, &len);
	*nul = s && strlen(s) != (size_t)len;
	return s;
}

static int Checkpoint_init(CheckpointObject *self, PyObject *args, PyObject *kw)
{
	/* a second __init__ would drop the open checkpoint while another
	 * thread's load may be reading it */
	if (self->ck) {
		PyErr_SetString(PyExc_RuntimeError, "the Checkpoint is already open");
		return -1;
	}
	static char *kwlist[] = {"path", "endpoint", "region", "profile", "unsigned", NULL};
	PyObject *pathobj;
	fst_open_opts o;
	fst_open_opts_init(&o);
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$zzzp", kwlist, PyUnicode_FSConverter,
					 &pathobj, &o.endpoint, &o.region, &o.profile,
					 &o.unsigned_requests))
		return -1;
	fst_error err;
	int rc;
	const char *path = PyBytes_AS_STRING(pathobj);
	fst_checkpoint *ck = NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_checkpoint_open_ex(path, &o, &ck, &err);
	Py_END_ALLOW_THREADS
	/* another thread's __init__ may have opened it meanwhile: one wins,
	 * the other's checkpoint is closed, not leaked */
	if (!rc && self->ck) {
		Py_BEGIN_ALLOW_THREADS
		fst_checkpoint_close(ck);
		Py_END_ALLOW_THREADS
		Py_DECREF(pathobj);
		PyErr_SetString(PyExc_RuntimeError, "the Checkpoint is already open");
		return -1;
	}
	if (rc)
		fstpy_raise_at(rc, &err, NULL, path);
	else
		self->ck = ck;
	Py_DECREF(pathobj);
	return rc ? -1 : 0;
}

/* A checkpoint of one safetensors file held in memory (bytes, bytearray,
 * any contiguous buffer), validated like a file. */
static PyObject *Checkpoint_from_bytes(PyObject *cls, PyObject *args)
{
	(void)cls;
	PyObject *data;
	const char *name = "<bytes>";
	if (!PyArg_ParseTuple(args, "O|s", &data, &name))
		return NULL;
	CheckpointObject *self = PyObject_New(CheckpointObject, &fstpy_CheckpointType);
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
		return fstpy_raise_at(rc, &err, NULL, name);
	}
	return (PyObject *)self;
}

static PyObject *Checkpoint_keys(CheckpointObject *self, PyObject *unused)
{
	(void)unused;
	if (fstpy_checkpoint_ready(self))
		return NULL;
	size_t n = fst_checkpoint_tensor_count(self->ck);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		fst_tensor_info t;
		fst_checkpoint_tensor(self->ck, i, &t, NULL);
		list = fstpy_put(list, (Py_ssize_t)i, PyUnicode_FromString(t.name));
	}
	return list;
}

/* (dtype, shape, nbytes, file index, file offset) of a tensor, or None */
static PyObject *Checkpoint_info(CheckpointObject *self, PyObject *name)
{
	if (fstpy_checkpoint_ready(self))
		return NULL;
	int nul;
	const char *s = fstpy_tensor_name(name, &nul);
	if (!s)
		return NULL;
	if (nul)
		Py_RETURN_NONE;
	long i = fst_checkpoint_find(self->ck, s);
	if (i < 0)
		Py_RETURN_NONE;
	fst_tensor_info t;
	size_t fi;
	fst_checkpoint_tensor(self->ck, (size_t)i, &t, &fi);
	return Py_BuildValue("(sNKnK)", fst_dtype_name(t.dtype),
			     fstpy_shape_tuple(t.ndim, t.shape), (unsigned long long)t.nbytes,
			     (Py_ssize_t)fi, (unsigned long long)t.file_offset);
}

static PyObject *Checkpoint_files(CheckpointObject *self, PyObject *unused)
{
	(void)unused;
	if (fstpy_checkpoint_ready(self))
		return NULL;
	size_t n = fst_checkpoint_file_count(self->ck);
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++)
		list = fstpy_put(list, (Py_ssize_t)i,
				 PyUnicode_DecodeFSDefault(fst_file_path(fst_checkpoint_file(self->ck, i))));
	return list;
}

static PyObject *Checkpoint_metadata(CheckpointObject *self, PyObject *args)
{
	Py_ssize_t fi = 0;
	if (fstpy_checkpoint_ready(self) || !PyArg_ParseTuple(args, "|n", &fi))
		return NULL;
	if (fi < 0 || (size_t)fi >= fst_checkpoint_file_count(self->ck)) {
		PyErr_SetString(PyExc_IndexError, "file index out of range");
		return NULL;
	}
	const fst_file *f = fst_checkpoint_file(self->ck, (size_t)fi);
	if (!fst_file_has_metadata(f))
		Py_RETURN_NONE; /* as the reference: {} only for a __metadata__ of no entries */
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

/* The checkpoint's name as libfst shows it (a URL's secrets as ***) */
static PyObject *Checkpoint_path(CheckpointObject *self, PyObject *unused)
{
	(void)unused;
	if (fstpy_checkpoint_ready(self))
		return NULL;
	return PyUnicode_DecodeFSDefault(fst_checkpoint_path(self->ck));
}

static PyMethodDef Checkpoint_methods[] = {
	{"keys", (PyCFunction)Checkpoint_keys, METH_NOARGS, "tensor names, file by file"},
	{"path", (PyCFunction)Checkpoint_path, METH_NOARGS,
	 "the path or URL as messages show it (a URL's password and query as ***)"},
	{"info", (PyCFunction)Checkpoint_info, METH_O,
	 "(dtype, shape, nbytes, file_index, file_offset) or None"},
	{"files", (PyCFunction)Checkpoint_files, METH_NOARGS, "the safetensors files"},
	{"metadata", (PyCFunction)Checkpoint_metadata, METH_VARARGS,
	 "__metadata__ of file i (default 0), or None"},
	{"from_bytes", (PyCFunction)Checkpoint_from_bytes, METH_VARARGS | METH_CLASS,
	 "from_bytes(data, name='<bytes>'): a checkpoint of one file held in memory"},
	{NULL, NULL, 0, NULL},
};

PyTypeObject fstpy_CheckpointType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Checkpoint",
	.tp_basicsize = sizeof(CheckpointObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Checkpoint_init,
	.tp_dealloc = (destructor)Checkpoint_dealloc,
	.tp_methods = Checkpoint_methods,
	.tp_doc = "A safetensors checkpoint: a file, a directory or an index.",
};
