/*
 * _fst_comm.c - tensor parallelism: fst._fst.Comm (an NCCL communicator),
 * comm_unique_id, and load_sharded, each byte read once in the group (or,
 * with a node's Comm, once in each node).
 */
#include "_fst.h"

#include <limits.h>
#include <stdlib.h>

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
	/* a second __init__ would leak the communicator it replaced */
	if (self->comm) {
		PyErr_SetString(PyExc_RuntimeError, "the Comm is already initialized");
		return -1;
	}
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
	fst_comm *comm = NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_comm_init(world, rank, id.buf, device, timeout_ms, &comm, &err);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&id);
	if (rc) {
		fstpy_raise(rc, &err);
		return -1;
	}
	/* another thread's __init__ may have set one meanwhile: keep that one */
	if (self->comm) {
		Py_BEGIN_ALLOW_THREADS
		fst_comm_destroy(comm);
		Py_END_ALLOW_THREADS
		PyErr_SetString(PyExc_RuntimeError, "the Comm is already initialized");
		return -1;
	}
	self->comm = comm;
	return 0;
}

PyTypeObject fstpy_CommType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Comm",
	.tp_basicsize = sizeof(CommObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Comm_init,
	.tp_dealloc = (destructor)Comm_dealloc,
	.tp_doc = "Comm(world, rank, unique_id, device, timeout_ms=0): an NCCL communicator.",
};

PyObject *fstpy_comm_unique_id(PyObject *mod, PyObject *unused)
{
	(void)mod;
	(void)unused;
	unsigned char id[FST_COMM_ID_BYTES];
	fst_error err;
	int rc = fst_comm_unique_id(id, &err);
	if (rc)
		return fstpy_raise(rc, &err);
	return PyBytes_FromStringAndSize((const char *)id, FST_COMM_ID_BYTES);
}

/* load_sharded(checkpoint, comm, dims, io=0, threads=0, staging_bytes=0,
 * node=None) */
PyObject *fstpy_load_sharded(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	static char *kwlist[] = {"checkpoint", "comm", "dims", "io", "threads", "staging_bytes",
				 "node", NULL};
	CheckpointObject *ck;
	CommObject *comm;
	PyObject *dims_obj, *node_obj = Py_None;
	int io = 0;
	unsigned threads = 0;
	unsigned long long staging = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!O|iIKO", kwlist,
					 &fstpy_CheckpointType, &ck, &fstpy_CommType, &comm,
					 &dims_obj, &io, &threads, &staging, &node_obj) ||
	    fstpy_checkpoint_ready(ck))
		return NULL;
	if (node_obj != Py_None && !PyObject_TypeCheck(node_obj, &fstpy_CommType))
		return PyErr_Format(PyExc_TypeError, "node must be a Comm or None, not %s",
				    Py_TYPE(node_obj)->tp_name);
	fst_comm *node = node_obj == Py_None ? NULL : ((CommObject *)node_obj)->comm;
	/* a Comm whose __init__ never ran, or failed, has no communicator: a
	 * NULL node would load as one node while the other ranks do not */
	if (!comm->comm || (node_obj != Py_None && !node))
		return PyErr_Format(PyExc_ValueError, "%s is a Comm without a communicator "
				    "(not initialized, or its initialization failed)",
				    comm->comm ? "node" : "comm");
	size_t n = fst_checkpoint_tensor_count(ck->ck);
	/* a tuple of its own: an item's __index__ cannot change what is read */
	PyObject *seq = PySequence_Tuple(dims_obj);
	if (!seq)
		return NULL;
	if ((size_t)PyTuple_GET_SIZE(seq) != n) {
		Py_ssize_t got = PyTuple_GET_SIZE(seq);
		Py_DECREF(seq);
		return PyErr_Format(PyExc_ValueError, "dims has %zd entries for %zu tensors", got,
				    n);
	}
	int *dims = malloc(sizeof(int) * (n ? n : 1));
	if (!dims) {
		Py_DECREF(seq);
		return PyErr_NoMemory();
	}
	for (size_t i = 0; i < n; i++) {
		long v = PyLong_AsLong(PyTuple_GET_ITEM(seq, (Py_ssize_t)i));
		if (!PyErr_Occurred() && (v < FST_REPLICATE || v > INT_MAX))
			PyErr_Format(PyExc_ValueError, "dims[%zu]=%ld: expected %d (replicate) or a "
				     "dimension >= 0", i, v, FST_REPLICATE);
		if (PyErr_Occurred()) {
			free(dims);
			Py_DECREF(seq);
			return NULL;
		}
		dims[i] = (int)v;
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
	rc = fst_load_sharded_nodes(ck->ck, &o, comm->comm, node, dims, &buf, &err);
	Py_END_ALLOW_THREADS
	free(dims);
	if (rc)
		return fstpy_raise_at(rc, &err, ck->ck, NULL);
	return fstpy_wrap_buffer(buf);
}
