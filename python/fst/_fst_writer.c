/*
 * _fst_writer.c - fst._fst.save: a safetensors file written from (name,
 * dtype, shape, bytes) entries, to a path or returned as bytes.
 */
#include "_fst.h"

#include <stdlib.h>
#include <string.h>

PyObject *fstpy_save(PyObject *mod, PyObject *args)
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
	uint64_t *dims = NULL;
	Py_ssize_t n = 0, nviews = 0;
	if (rc)
		goto fail;
	/* a tuple of its own: a shape's __getitem__ or __index__ cannot change
	 * the entries read (the list could shrink under the loop) */
	seq = PySequence_Tuple(entries);
	if (!seq)
		goto out;
	n = PyTuple_GET_SIZE(seq);
	views = calloc((size_t)(n ? n : 1), sizeof *views);
	if (!views) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		const char *name, *dtype;
		PyObject *shape, *data;
		if (!PyArg_ParseTuple(PyTuple_GET_ITEM(seq, i), "ssOO", &name, &dtype,
				      &shape, &data))
			goto out;
		fst_dtype d = fst_dtype_from_name(dtype);
		Py_ssize_t nd = PySequence_Length(shape);
		if (nd < 0)
			goto out;
		/* as many dimensions as the format has (the reference writes any
		 * number); the library copies them */
		if ((size_t)nd > UINT32_MAX) {
			PyErr_SetString(PyExc_ValueError, "more than 2^32 - 1 dimensions");
			goto out;
		}
		free(dims);
		dims = malloc((size_t)(nd ? nd : 1) * sizeof *dims);
		if (!dims) {
			PyErr_NoMemory();
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
		/* {} is written as {}, as the reference writes it */
		if ((rc = fst_writer_metadata(w, NULL, NULL, &err)))
			goto fail;
		while (PyDict_Next(metadata, &pos, &k, &v)) {
			if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
				PyErr_SetString(PyExc_TypeError, "metadata must be a dict of str to str");
				goto out;
			}
			/* a str that cannot be UTF-8 (a lone surrogate) raises its own
			 * UnicodeEncodeError */
			Py_ssize_t kn, vn;
			const char *ks = PyUnicode_AsUTF8AndSize(k, &kn), *vs;
			if (!ks || !(vs = PyUnicode_AsUTF8AndSize(v, &vn)))
				goto out;
			/* the C writer takes C strings: a NUL would cut the key or the
			 * value short (two keys could become one) */
			if (strlen(ks) != (size_t)kn || strlen(vs) != (size_t)vn) {
				PyErr_Format(PyExc_ValueError,
					     "metadata %R: a key or value with a NUL character "
					     "cannot be written",
					     k);
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
	fstpy_raise_at(rc, &err, NULL, pathobj ? PyBytes_AS_STRING(pathobj) : NULL);
out:
	for (Py_ssize_t i = 0; i < nviews; i++)
		PyBuffer_Release(&views[i]);
	free(views);
	free(dims);
	Py_XDECREF(seq);
	Py_XDECREF(pathobj);
	fst_writer_free(w);
	return result;
}
