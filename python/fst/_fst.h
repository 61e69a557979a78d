/*
 * _fst.h - what the files of the extension fst._fst share; private to them.
 * Each Python-visible type and module function is defined in the file of its
 * concern and registered by _fst.c (PyInit__fst). The shared names start
 * with fstpy_; they stay inside the extension (-fvisibility=hidden).
 */
#ifndef FST_PY_EXT_H
#define FST_PY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "fst.h"

/* ---- _fst.c: libfst failures as fst's exceptions, shared helpers */

/* Raise the fst exception for a libfst failure and return NULL; ck and path
 * say which files the message may name (either may be NULL). */
PyObject *fstpy_raise_at(int code, const fst_error *err, const fst_checkpoint *ck,
			 const char *path);
PyObject *fstpy_raise(int code, const fst_error *err);
/* shape as a tuple of ints */
/* seq (a new list or tuple) with item i set to item; where item is NULL
 * (its exception set), seq let go and NULL: fill with
 * `for (...; seq && ...; ...) seq = fstpy_put(seq, i, make());` */
PyObject *fstpy_put(PyObject *seq, Py_ssize_t i, PyObject *item);
PyObject *fstpy_shape_tuple(uint32_t ndim, const uint64_t *shape);

/* ---- _fst_checkpoint.c */

typedef struct {
	PyObject_HEAD
	fst_checkpoint *ck;
	/* a checkpoint over bytes in memory holds them: libfst reads them in
	 * place for as long as the checkpoint lives */
	Py_buffer mem;
	int has_mem;
} CheckpointObject;

extern PyTypeObject fstpy_CheckpointType;
/* 0 where ck holds an open checkpoint, else -1 with ValueError set (an
 * object made by __new__ whose __init__ never ran, or failed). */
int fstpy_checkpoint_ready(const CheckpointObject *ck);
/* name's UTF-8, or NULL with an exception set; *nul: it holds a NUL
 * character, so no tensor has that name (names are C strings). */
const char *fstpy_tensor_name(PyObject *name, int *nul);

/* ---- _fst_tensor.c */

extern PyTypeObject fstpy_TensorType;
/* A Tensor over view, which it takes over (released on failure too). */
PyObject *fstpy_make_tensor(fst_tensor_view *view);

/* ---- _fst_load.c */

extern PyTypeObject fstpy_BufferType;
extern PyTypeObject fstpy_LoaderType;
/* A Buffer owning b (released on failure too). */
PyObject *fstpy_wrap_buffer(fst_buffer *b);
PyObject *fstpy_load(PyObject *mod, PyObject *args, PyObject *kw);
PyObject *fstpy_start(PyObject *mod, PyObject *args, PyObject *kw);

/* ---- _fst_comm.c */

extern PyTypeObject fstpy_CommType;
PyObject *fstpy_comm_unique_id(PyObject *mod, PyObject *unused);
PyObject *fstpy_load_sharded(PyObject *mod, PyObject *args, PyObject *kw);

/* ---- _fst_writer.c */

PyObject *fstpy_save(PyObject *mod, PyObject *args);

#endif
