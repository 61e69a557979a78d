/*
 * _fst_load.c - loads: the load options, the bridge to a Python allocator,
 * fst._fst.load (blocking, the GIL released while bytes move) and its
 * Buffer, and fst._fst.start, the streaming Loader.
 */
#include "_fst.h"

#include <stdlib.h>
#include <string.h>

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

/* The exception set, taken (its traceback on it), or NULL: held while
 * other Python code runs, then put back with put_exception. */
static PyObject *take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
	return PyErr_GetRaisedException();
#else
	PyObject *type, *value, *trace;
	PyErr_Fetch(&type, &value, &trace);
	if (!type)
		return NULL;
	PyErr_NormalizeException(&type, &value, &trace);
	if (trace)
		PyException_SetTraceback(value, trace);
	Py_DECREF(type);
	Py_XDECREF(trace);
	return value;
#endif
}

/* e (taken from take_exception; NULL: none) set again, its reference
 * given up. */
static void put_exception(PyObject *e)
{
#if PY_VERSION_HEX >= 0x030C0000
	PyErr_SetRaisedException(e);
#else
	if (e)
		PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(e)), e, PyException_GetTraceback(e));
#endif
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
	/* An exception on its way up (the reference dropped as a frame
	 * unwinds) is set aside for the call, and put back: else the call
	 * fails, and the caller's exception is lost to a SystemError. */
	PyObject *pending = take_exception();
	PyObject *r = PyObject_CallFunction(pa->free, "NKii", PyLong_FromVoidPtr(ptr),
					    (unsigned long long)size, device_type, device_id);
	if (!r)
		PyErr_WriteUnraisable(pa->free);
	Py_XDECREF(r);
	pyalloc_unref(pa);
	put_exception(pending);
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
				 "mmap_private", "unified", "readahead_bytes", "stream_bytes", NULL};
	const char *device = "cpu";
	int io = 0, gds = 0;
	unsigned threads = 0, align = 0;
	unsigned long long chunk = 0, staging = 0, readahead = 0, stream = 0;
	PyObject *names = Py_None, *allocator = Py_None;
	int mmap_private = 0, unified = 0;
	memset(la, 0, sizeof *la); /* free_load_args must find it clean on every failure */
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|siIKKiIOOpiKK", kwlist,
					 &fstpy_CheckpointType, ck, &device, &io, &threads, &chunk,
					 &staging, &gds, &align, &names, &allocator, &mmap_private,
					 &unified, &readahead, &stream) ||
	    fstpy_checkpoint_ready(*ck))
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
	la->opts.unified = unified;
	la->opts.readahead_bytes = readahead;
	la->opts.stream_bytes = stream;
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
		list = fstpy_put(list, (Py_ssize_t)i, PyUnicode_FromString(v.name));
		fst_view_release(&v);
	}
	return list;
}

static PyObject *Buffer_tensor(BufferObject *self, PyObject *name)
{
	int nul;
	const char *s = fstpy_tensor_name(name, &nul);
	if (!s)
		return NULL;
	long i = nul ? -1 : fst_buffer_find(self->buf, s);
	if (i < 0) {
		PyErr_SetObject(PyExc_KeyError, name);
		return NULL;
	}
	fst_tensor_view v;
	fst_buffer_tensor(self->buf, (size_t)i, &v);
	return fstpy_make_tensor(&v);
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

PyTypeObject fstpy_BufferType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Buffer",
	.tp_basicsize = sizeof(BufferObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Buffer_dealloc,
	.tp_methods = Buffer_methods,
	.tp_as_sequence = &Buffer_seq,
	.tp_doc = "The result of a load.",
};

PyObject *fstpy_wrap_buffer(fst_buffer *b)
{
	BufferObject *o = PyObject_New(BufferObject, &fstpy_BufferType);
	if (!o) {
		fst_buffer_release(b);
		return NULL;
	}
	o->buf = b;
	return (PyObject *)o;
}

/* A load's wait, every 100 ms (the progress callback's beat): Python's
 * signal handlers run, and one that raises (Ctrl-C's KeyboardInterrupt)
 * cancels the load, its exception kept for the caller. Handlers run on the
 * main thread only: elsewhere this does nothing. */
struct interruptible {
	fst_loader *ld;
	PyObject *raised; /* the handler's exception, or NULL */
};

static void check_signals(void *ctx, uint64_t done, uint64_t total)
{
	(void)done, (void)total;
	struct interruptible *in = ctx;
	if (in->raised)
		return;
	PyGILState_STATE g = PyGILState_Ensure();
	if (PyErr_CheckSignals() < 0) {
		in->raised = take_exception();
		fst_loader_cancel(in->ld);
	}
	PyGILState_Release(g);
}

PyObject *fstpy_load(PyObject *mod, PyObject *args, PyObject *kw)
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
	struct interruptible in = {NULL, NULL};
	la.opts.progress = check_signals;
	la.opts.progress_ctx = &in;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_load_start(ck->ck, &la.opts, &in.ld, &err);
	if (!rc)
		rc = fst_loader_finish(in.ld, &buf, &err);
	Py_END_ALLOW_THREADS
	free_load_args(&la);
	if (in.raised) {
		fst_buffer_release(buf); /* a cancel that came after the last byte */
		put_exception(in.raised);
		return NULL;
	}
	if (rc)
		return fstpy_raise_at(rc, &err, ck->ck, NULL);
	return fstpy_wrap_buffer(buf);
}

/* ---- Loader: streaming */

typedef struct {
	PyObject_HEAD
	fst_loader *ld;
	PyObject *checkpoint; /* kept alive while the loader runs */
	struct load_args la;
	/* a next() runs with the GIL released: no other next() or finish()
	 * may use the loader meanwhile (finish would free it under next) */
	int busy;
	/* next()'s and finish()'s waits run the signal handlers, as fst.load's */
	struct interruptible in;
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
	Py_XDECREF(self->in.raised);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A signal handler's exception from the last wait (Ctrl-C: the load was
 * cancelled), raised here: 1; else 0. */
static int raise_interrupt(LoaderObject *self)
{
	if (!self->in.raised)
		return 0;
	PyObject *e = self->in.raised;
	self->in.raised = NULL;
	put_exception(e);
	return 1;
}

PyObject *fstpy_start(PyObject *mod, PyObject *args, PyObject *kw)
{
	(void)mod;
	LoaderObject *self = PyObject_New(LoaderObject, &fstpy_LoaderType);
	if (!self)
		return NULL;
	self->ld = NULL;
	self->checkpoint = NULL;
	self->busy = 0;
	self->in.ld = NULL;
	self->in.raised = NULL;
	CheckpointObject *ck;
	if (parse_load_args(args, kw, &ck, &self->la)) {
		Py_DECREF(self); /* Loader_dealloc frees what parse_load_args made */
		return NULL;
	}
	Py_INCREF(ck);
	self->checkpoint = (PyObject *)ck;
	self->la.opts.progress = check_signals;
	self->la.opts.progress_ctx = &self->in;
	fst_error err;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_load_start(ck->ck, &self->la.opts, &self->ld, &err);
	Py_END_ALLOW_THREADS
	if (rc) {
		Py_DECREF(self);
		return fstpy_raise_at(rc, &err, ck->ck, NULL);
	}
	/* no wait has begun: nothing reports before this */
	self->in.ld = self->ld;
	return (PyObject *)self;
}

static const fst_checkpoint *loader_checkpoint(LoaderObject *self)
{
	return self->checkpoint ? ((CheckpointObject *)self->checkpoint)->ck : NULL;
}

/* self->busy: what holds the loader while the GIL is released */
enum { LOADER_FREE, LOADER_IN_NEXT, LOADER_FINISHING };

/* Whether another thread's next() has the loader (RuntimeError set,
 * saying what to do instead). */
static int loader_busy(const LoaderObject *self, const char *what, const char *instead)
{
	if (self->busy != LOADER_IN_NEXT)
		return 0;
	PyErr_Format(PyExc_RuntimeError,
		     "%s: another thread's next() is waiting on this loader; %s", what, instead);
	return 1;
}

/* The next ready tensor, or None when all were handed out. */
static PyObject *Loader_next(LoaderObject *self, PyObject *unused)
{
	(void)unused;
	if (!self->ld || self->busy == LOADER_FINISHING) {
		PyErr_SetString(PyExc_RuntimeError, "loader already finished");
		return NULL;
	}
	if (loader_busy(self, "next()", "one next() at a time"))
		return NULL;
	fst_tensor_view v;
	fst_error err;
	int rc;
	self->busy = LOADER_IN_NEXT;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_loader_next(self->ld, &v, &err);
	Py_END_ALLOW_THREADS
	self->busy = LOADER_FREE;
	if (raise_interrupt(self)) {
		if (rc == 1)
			fst_view_release(&v);
		return NULL;
	}
	if (rc < 0)
		return fstpy_raise_at(rc, &err, loader_checkpoint(self), NULL);
	if (rc == 0)
		Py_RETURN_NONE;
	return fstpy_make_tensor(&v);
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
	if (!self->ld || self->busy == LOADER_FINISHING) {
		PyErr_SetString(PyExc_RuntimeError, "loader already finished");
		return NULL;
	}
	if (loader_busy(self, "finish()",
			"cancel() it, and finish() once that next() has returned"))
		return NULL;
	fst_loader *ld = self->ld;
	fst_buffer *buf = NULL;
	fst_error err;
	int rc;
	/* The wait is the rest of the tensors, taken and let go here while the
	 * loader stays reachable: progress() and cancel() from other threads
	 * still reach it. Only then is it taken from them and freed. */
	self->busy = LOADER_FINISHING;
	Py_BEGIN_ALLOW_THREADS
	fst_tensor_view v;
	while (fst_loader_next(ld, &v, &err) == 1)
		fst_view_release(&v);
	Py_END_ALLOW_THREADS
	self->ld = NULL;
	self->busy = LOADER_FREE;
	Py_BEGIN_ALLOW_THREADS
	rc = fst_loader_finish(ld, &buf, &err);
	Py_END_ALLOW_THREADS
	self->in.ld = NULL; /* freed by the finish */
	if (raise_interrupt(self)) {
		fst_buffer_release(buf); /* a cancel that came after the last byte */
		return NULL;
	}
	if (rc)
		return fstpy_raise_at(rc, &err, loader_checkpoint(self), NULL);
	return fstpy_wrap_buffer(buf);
}

static PyMethodDef Loader_methods[] = {
	{"next", (PyCFunction)Loader_next, METH_NOARGS, "next ready Tensor, or None at the end"},
	{"progress", (PyCFunction)Loader_progress, METH_NOARGS, "(bytes done, bytes total)"},
	{"cancel", (PyCFunction)Loader_cancel, METH_NOARGS, "stop the readers"},
	{"finish", (PyCFunction)Loader_finish, METH_NOARGS, "wait for the end; the Buffer"},
	{NULL, NULL, 0, NULL},
};

PyTypeObject fstpy_LoaderType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fst._fst.Loader",
	.tp_basicsize = sizeof(LoaderObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Loader_dealloc,
	.tp_methods = Loader_methods,
	.tp_doc = "A streaming load: tensors as they become ready.",
};
