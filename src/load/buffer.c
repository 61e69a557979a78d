/*
 * buffer.c - the result of a load: one allocation, a table of tensors, a
 * reference count. The table owns copies of names and shapes so a buffer
 * outlives the checkpoint it came from.
 */
#include "engine.h"

#include <inttypes.h>

#include <string.h>

static const char *btensor_name(const void *ctx, size_t i)
{
	return ((const struct fst_buffer *)ctx)->t[i].name;
}

int fsti_buffer_new(const fst_checkpoint *ck, const struct fsti_plan *plan,
		    struct fst_buffer **out, fst_error *err)
{
	struct fst_buffer *b = fsti_calloc(1, sizeof *b);
	if (!b)
		return fsti_err(err, FST_ENOMEM, "out of memory for the buffer");
	atomic_init(&b->refs, 1);
	b->device_type = FST_DEVICE_CPU;
	size_t bytes = 0;
	for (size_t i = 0; i < plan->nt; i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, plan->t[i].entry, &info, NULL);
		bytes += strlen(info.name) + 1 + (info.ndim + 1) * sizeof(uint64_t);
	}
	b->t = fsti_calloc(plan->nt, sizeof *b->t);
	b->arena = fsti_malloc(bytes + 8);
	if (!b->t || !b->arena) {
		fsti_buffer_destroy(b);
		return fsti_err(err, FST_ENOMEM, "out of memory for the buffer's table");
	}
	/* shapes first (8-byte aligned), then names */
	uint64_t *shapes = (uint64_t *)(void *)b->arena;
	size_t words = 0;
	for (size_t i = 0; i < plan->nt; i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, plan->t[i].entry, &info, NULL);
		words += info.ndim;
	}
	char *names = (char *)(shapes + words);
	for (size_t i = 0; i < plan->nt; i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, plan->t[i].entry, &info, NULL);
		struct fsti_btensor *t = &b->t[i];
		size_t len = strlen(info.name) + 1;
		memcpy(names, info.name, len);
		t->name = names;
		names += len;
		if (info.ndim) {
			memcpy(shapes, info.shape, info.ndim * sizeof *shapes);
			t->shape = shapes;
			shapes += info.ndim;
		}
		t->dtype = info.dtype;
		t->ndim = info.ndim;
		t->nbytes = info.nbytes;
		b->tensor_bytes += info.nbytes;
	}
	b->nt = plan->nt;
	size_t x, y;
	if (fsti_names_build(&b->by_name, b->nt, btensor_name, b, &x, &y)) {
		fsti_buffer_destroy(b);
		return fsti_err(err, FST_ENOMEM, "out of memory for the buffer's name table");
	}
	*out = b;
	return 0;
}

int fsti_buffer_new_sharded(const fst_checkpoint *ck, const struct fsti_dist *d,
			    struct fst_buffer **out, fst_error *err)
{
	struct fsti_plan table = {0};
	table.t = fsti_calloc(d->n + 1, sizeof *table.t);
	if (!table.t)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	for (size_t i = 0; i < d->n; i++)
		table.t[i].entry = d->t[i].entry;
	table.nt = d->n;
	int rc = fsti_buffer_new(ck, &table, out, err);
	fsti_free(table.t);
	if (rc)
		return rc;
	/* the shapes are the arena's first words, tensor after tensor */
	struct fst_buffer *b = *out;
	uint64_t *shape = (uint64_t *)(void *)b->arena;
	b->tensor_bytes = 0;
	for (size_t i = 0; i < b->nt; i++) {
		if (d->t[i].dim >= 0)
			shape[d->t[i].dim] = d->t[i].len;
		shape += b->t[i].ndim;
		b->t[i].nbytes = d->t[i].shard_bytes;
		b->tensor_bytes += b->t[i].nbytes;
	}
	return 0;
}

void fsti_buffer_destroy(struct fst_buffer *b)
{
	if (!b)
		return;
	if (b->release_memory)
		b->release_memory(b);
	fsti_names_free(&b->by_name);
	fsti_free(b->t);
	fsti_free(b->arena);
	fsti_free(b);
}

void fst_buffer_retain(fst_buffer *b)
{
	if (b)
		atomic_fetch_add(&b->refs, 1);
}

void fst_buffer_release(fst_buffer *b)
{
	if (b && atomic_fetch_sub(&b->refs, 1) == 1)
		fsti_buffer_destroy(b);
}

size_t fst_buffer_tensor_count(const fst_buffer *b)
{
	return b->nt;
}

int fst_buffer_tensor(fst_buffer *b, size_t i, fst_tensor_view *v)
{
	if (!b || !v || i >= b->nt)
		return FST_EUSAGE;
	const struct fsti_btensor *t = &b->t[i];
	v->name = t->name;
	v->dtype = t->dtype;
	v->ndim = t->ndim;
	v->shape = t->shape;
	v->nbytes = t->nbytes;
	v->data = t->data;
	v->device_type = b->device_type;
	v->device_id = b->device_id;
	v->index = i;
	v->buffer = b;
	fst_buffer_retain(b);
	return 0;
}

void fst_view_release(fst_tensor_view *v)
{
	if (!v || !v->buffer)
		return;
	fst_buffer *b = v->buffer;
	memset(v, 0, sizeof *v);
	fst_buffer_release(b);
}

void *fst_view_host_data(const fst_tensor_view *v)
{
	if (!v || !v->buffer)
		return NULL;
	const fst_buffer *b = v->buffer;
	if (b->device_type == FST_DEVICE_CPU)
		return v->data;
	if (!b->mapped_host)
		return NULL;
	return (char *)b->mapped_host + ((char *)v->data - (char *)b->base);
}

long fst_buffer_find(const fst_buffer *b, const char *name)
{
	return fsti_names_find(&b->by_name, name, btensor_name, b);
}

uint64_t fst_buffer_size(const fst_buffer *b) { return b->size; }
int fst_buffer_read_only(const fst_buffer *b) { return b->read_only; }
uint64_t fst_buffer_tensor_bytes(const fst_buffer *b) { return b->tensor_bytes; }
const char *fst_buffer_describe(const fst_buffer *b) { return b->describe; }

int fsti_buffer_from_allocator(struct fst_buffer *b, const fst_allocator *a, uint64_t size,
			       uint32_t align, void (*release)(struct fst_buffer *b),
			       fst_error *err)
{
	if (!a->free)
		return fsti_err(err, FST_EUSAGE, "allocator: alloc given without free");
	size = size ? size : 1;
	void *p = a->alloc(a->ctx, size, align, b->device_type, b->device_id);
	if (!p) {
		if (b->device_type == FST_DEVICE_CUDA)
			return fsti_err(err, FST_EDEVICE,
					"allocator: could not allocate %" PRIu64 " bytes on cuda:%d",
					size, b->device_id);
		return fsti_err(err, FST_ENOMEM, "allocator: could not allocate %" PRIu64 " bytes",
				size);
	}
	b->allocator = *a;
	b->base = p;
	b->size = size;
	b->release_memory = release;
	if ((uintptr_t)p % align)
		return fsti_err(err, FST_EUSAGE, "allocator: returned %p, not aligned to %u bytes", p,
				align);
	return 0;
}
