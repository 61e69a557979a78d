/*
 * _fst.c - the Python extension over libfst, fst._fst: the module (its
 * functions and types, registered here), libfst failures raised as fst's
 * exceptions, and the helpers the other files share (_fst.h). The rest, by
 * concern: _fst_checkpoint.c, _fst_tensor.c (DLPack), _fst_load.c (loads,
 * buffers, the streaming loader), _fst_comm.c (NCCL), _fst_writer.c.
 * Framework glue (torch, numpy dtypes) lives in Python (fst/_tensors.py);
 * these files only speak libfst.
 */
#include "_fst.h"

#include <stdbool.h>
#include <string.h>

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
PyObject *fstpy_raise_at(int code, const fst_error *err, const fst_checkpoint *ck,
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

PyObject *fstpy_raise(int code, const fst_error *err)
{
	return fstpy_raise_at(code, err, NULL, NULL);
}

PyObject *fstpy_put(PyObject *seq, Py_ssize_t i, PyObject *item)
{
	if (!item) {
		Py_DECREF(seq);
		return NULL;
	}
	if (PyTuple_Check(seq))
		PyTuple_SET_ITEM(seq, i, item);
	else
		PyList_SET_ITEM(seq, i, item);
	return seq;
}

PyObject *fstpy_shape_tuple(uint32_t ndim, const uint64_t *shape)
{
	PyObject *t = PyTuple_New(ndim);
	for (uint32_t d = 0; t && d < ndim; d++)
		t = fstpy_put(t, d, PyLong_FromUnsignedLongLong(shape[d]));
	return t;
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

/* unified_by_default(index) -> bool: unified=auto loads in one copy on
 * that device (an integrated GPU); False where it cannot be told. */
static PyObject *mod_unified_by_default(PyObject *mod, PyObject *args)
{
	(void)mod;
	int index = 0;
	if (!PyArg_ParseTuple(args, "i", &index))
		return NULL;
	fst_platform_report r;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_platform_probe(index, &r, &err);
	Py_END_ALLOW_THREADS
	return PyBool_FromLong(!rc && r.unified_by_default);
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
		return fstpy_raise(rc, &err);
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
	{"load", (PyCFunction)(void (*)(void))fstpy_load, METH_VARARGS | METH_KEYWORDS,
	 "load(checkpoint, device='cpu', io=0, threads=0, chunk_bytes=0, staging_bytes=0, "
	 "gds=0, align=0, names=None, allocator=None, mmap_private=False, unified=0) -> Buffer"},
	{"start", (PyCFunction)(void (*)(void))fstpy_start, METH_VARARGS | METH_KEYWORDS,
	 "start(...) -> Loader: the streaming form of load"},
	{"save", (PyCFunction)fstpy_save, METH_VARARGS,
	 "save(entries, metadata, path[, data_align]): entries of (name, dtype, shape, bytes); "
	 "path None returns the file's bytes"},
	{"_set_errors", (PyCFunction)mod_set_errors, METH_VARARGS, "internal"},
	{"comm_unique_id", (PyCFunction)fstpy_comm_unique_id, METH_NOARGS,
	 "a new NCCL unique id (bytes) for Comm"},
	{"load_sharded", (PyCFunction)(void (*)(void))fstpy_load_sharded,
	 METH_VARARGS | METH_KEYWORDS,
	 "load_sharded(checkpoint, comm, dims, io=0, threads=0, staging_bytes=0) -> Buffer"},
	{"version", (PyCFunction)mod_version, METH_NOARGS, "libfst version"},
	{"unified_by_default", (PyCFunction)mod_unified_by_default, METH_VARARGS,
	 "unified_by_default(index) -> bool: unified=auto loads in one copy there"},
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
	if (PyType_Ready(&fstpy_CheckpointType) || PyType_Ready(&fstpy_TensorType) ||
	    PyType_Ready(&fstpy_BufferType) || PyType_Ready(&fstpy_LoaderType) ||
	    PyType_Ready(&fstpy_CommType))
		return NULL;
	PyObject *m = PyModule_Create(&moduledef);
	if (!m)
		return NULL;
	Py_INCREF(&fstpy_CheckpointType);
	PyModule_AddObject(m, "Checkpoint", (PyObject *)&fstpy_CheckpointType);
	Py_INCREF(&fstpy_TensorType);
	PyModule_AddObject(m, "Tensor", (PyObject *)&fstpy_TensorType);
	Py_INCREF(&fstpy_BufferType);
	PyModule_AddObject(m, "Buffer", (PyObject *)&fstpy_BufferType);
	Py_INCREF(&fstpy_LoaderType);
	PyModule_AddObject(m, "Loader", (PyObject *)&fstpy_LoaderType);
	Py_INCREF(&fstpy_CommType);
	PyModule_AddObject(m, "Comm", (PyObject *)&fstpy_CommType);
	return m;
}
