/* Description: src/gpu/cuda.h, libfst's own declarations of the CUDA driver API,
 * checked against the real <cuda.h> of the toolkit: every FSTI_* constant
 * equals the real enumerator or macro of the same name, every function
 * pointer of struct fsti_cuda has the real function's type (up to the two
 * places where src/gpu/cuda.h deliberately writes int for an enum of the same
 * size), and the typedefs we share are the real ones. The checks are static
 * assertions and unevaluated assignments, so a mismatch fails the build;
 * nothing links against libcuda. At run time the test checks that no
 * FSTI_* constant or table entry of src/gpu/cuda.h escaped the lists below,
 * that cuda.c resolves every entry, and that the test double exports it. */

/* The real header first, its CUresult (an enum) renamed so that ours (an
 * int) can sit beside it. */
#define CUresult CUresult_real
#include <cuda.h>
#undef CUresult

/*
 * Ours, by a path that cannot resolve to the real header. Its table entries
 * are written "CUresult (*name)(...)": with CUresult a function-like macro
 * they get the real return type, so each one's whole type can be compared
 * with the real prototype. Where CUresult is not followed by a parenthesis
 * (the typedef, parameters) it stays our int.
 */
#define CUresult(declarator) CUresult_real(declarator)
#include "../../src/gpu/cuda.h"
#undef CUresult

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(CUDA_VERSION) || !defined(FST_CUDA_H)
#error "both headers must be included"
#endif

#define SAME_TYPE(a, b) __builtin_types_compatible_p(a, b)
#define MEMBER(m) __typeof__(((struct fsti_cuda *)0)->m)

/* ---- the typedefs: a conflicting redefinition would not even compile;
 * these say so explicitly */

_Static_assert(SAME_TYPE(CUresult, int), "our CUresult is int");
_Static_assert(sizeof(CUresult_real) == sizeof(int) && _Alignof(CUresult_real) == _Alignof(int),
	       "CUresult: the real enum must have int's size for our int to be ABI-equal");
_Static_assert(CUDA_ERROR_UNKNOWN <= 0x7fffffff, "CUresult values fit an int");
_Static_assert(SAME_TYPE(CUdevice, CUdevice_v1) && sizeof(CUdevice) == sizeof(int), "CUdevice");
_Static_assert(SAME_TYPE(CUdeviceptr, CUdeviceptr_v2), "CUdeviceptr is the real type");
_Static_assert(sizeof(CUdeviceptr) == sizeof(CUdeviceptr_v2) && sizeof(CUdeviceptr) == 8,
	       "sizeof(CUdeviceptr) equals the real one");
_Static_assert(SAME_TYPE(CUcontext, struct CUctx_st *), "CUcontext");
_Static_assert(SAME_TYPE(CUstream, struct CUstream_st *), "CUstream");
_Static_assert(SAME_TYPE(CUevent, struct CUevent_st *), "CUevent");
_Static_assert(sizeof(CUdevice_attribute) == sizeof(int), "CUdevice_attribute is int-sized");

/* ---- constants: FSTI_X equals the real X */

#define CONSTANTS(X)                                                                       \
	X(CUDA_SUCCESS)                                                                    \
	X(CUDA_ERROR_OUT_OF_MEMORY)                                                        \
	X(CUDA_ERROR_STUB_LIBRARY)                                                         \
	X(CUDA_ERROR_NOT_READY)                                                            \
	X(CU_DEVICE_ATTRIBUTE_MAX_PITCH)                                                   \
	X(CU_DEVICE_ATTRIBUTE_INTEGRATED)                                                  \
	X(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)                                         \
	X(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)                                      \
	X(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)                     \
	X(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES)                \
	X(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)                                                  \
	X(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)                                               \
	X(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)                                               \
	X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)                                    \
	X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)                                    \
	X(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)                                   \
	X(CU_STREAM_NON_BLOCKING)                                                          \
	X(CU_EVENT_DISABLE_TIMING)                                                         \
	X(CU_MEMHOSTALLOC_PORTABLE)                                                         \
	X(CU_MEMHOSTALLOC_DEVICEMAP)                                                        \
	X(CU_MEMHOSTREGISTER_PORTABLE)                                                      \
	X(CU_MEMORYTYPE_DEVICE)

#define CHECK_CONSTANT(name) \
	_Static_assert(FSTI_##name == (name), "src/gpu/cuda.h: FSTI_" #name " differs from cuda.h");
CONSTANTS(CHECK_CONSTANT)

/* ---- the table: each entry's type is the real function's */

/* Entries whose parameters are exactly the real ones. */
#define EXACT(X)                                                                           \
	X(cuInit)                                                                          \
	X(cuDriverGetVersion)                                                              \
	X(cuDeviceGetCount)                                                                \
	X(cuDeviceGet)                                                                     \
	X(cuDeviceGetName)                                                                 \
	X(cuDeviceTotalMem_v2)                                                             \
	X(cuDevicePrimaryCtxRetain)                                                        \
	X(cuCtxSetCurrent)                                                                 \
	X(cuCtxGetCurrent)                                                                 \
	X(cuMemAlloc_v2)                                                                   \
	X(cuMemFree_v2)                                                                    \
	X(cuMemGetInfo_v2)                                                                 \
	X(cuMemHostAlloc)                                                                  \
	X(cuMemFreeHost)                                                                   \
	X(cuMemHostRegister_v2)                                                            \
	X(cuMemHostUnregister)                                                             \
	X(cuMemHostGetDevicePointer_v2)                                                    \
	X(cuMemcpyHtoDAsync_v2)                                                            \
	X(cuMemcpyDtoH_v2)                                                                 \
	X(cuMemcpyDtoDAsync_v2)                                                            \
	X(cuStreamCreate)                                                                  \
	X(cuStreamDestroy_v2)                                                              \
	X(cuStreamSynchronize)                                                             \
	X(cuStreamQuery)                                                                   \
	X(cuEventCreate)                                                                   \
	X(cuEventRecord)                                                                   \
	X(cuEventQuery)                                                                    \
	X(cuEventSynchronize)                                                              \
	X(cuEventDestroy_v2)

/* Entries where src/gpu/cuda.h writes int for an int-sized enum parameter
 * (CUresult, CUdevice_attribute); name, the real parameter list, ours. */
#define INT_FOR_ENUM(X)                                                                    \
	X(cuGetErrorName, (CUresult_real, const char **), (int, const char **))            \
	X(cuGetErrorString, (CUresult_real, const char **), (int, const char **))          \
	X(cuDeviceGetAttribute, (int *, CUdevice_attribute, CUdevice), (int *, int, CUdevice))

#define CHECK_EXACT(m)                                                                     \
	_Static_assert(SAME_TYPE(MEMBER(m), __typeof__(&m)),                               \
		       "struct fsti_cuda: " #m " does not have the real " #m "'s type");
EXACT(CHECK_EXACT)

#define CHECK_INT_FOR_ENUM(m, real_params, our_params)                                     \
	_Static_assert(SAME_TYPE(__typeof__(&m), CUresult_real(*) real_params),            \
		       "cuda.h: " #m " is not " #real_params);                             \
	_Static_assert(SAME_TYPE(MEMBER(m), CUresult_real(*) our_params),                  \
		       "struct fsti_cuda: " #m " is not " #our_params);
INT_FOR_ENUM(CHECK_INT_FOR_ENUM)

/* cuMemcpy2DAsync_v2 takes our own copy of CUDA_MEMCPY2D: same layout. */
#define SAME_FIELD(f)                                                                      \
	_Static_assert(offsetof(fsti_memcpy2d, f) == offsetof(CUDA_MEMCPY2D, f),           \
		       "fsti_memcpy2d." #f " moved");
SAME_FIELD(srcXInBytes) SAME_FIELD(srcY) SAME_FIELD(srcMemoryType) SAME_FIELD(srcHost)
SAME_FIELD(srcDevice) SAME_FIELD(srcArray) SAME_FIELD(srcPitch) SAME_FIELD(dstXInBytes)
SAME_FIELD(dstY) SAME_FIELD(dstMemoryType) SAME_FIELD(dstHost) SAME_FIELD(dstDevice)
SAME_FIELD(dstArray) SAME_FIELD(dstPitch) SAME_FIELD(WidthInBytes) SAME_FIELD(Height)
_Static_assert(sizeof(fsti_memcpy2d) == sizeof(CUDA_MEMCPY2D), "CUDA_MEMCPY2D size");
_Static_assert(sizeof(CUmemorytype) == sizeof(int), "CUmemorytype is int-sized");
_Static_assert(SAME_TYPE(__typeof__(&cuMemcpy2DAsync_v2),
			 CUresult_real (*)(const CUDA_MEMCPY2D *, CUstream)),
	       "cuda.h: cuMemcpy2DAsync_v2's parameters");
_Static_assert(SAME_TYPE(MEMBER(cuMemcpy2DAsync_v2), CUresult_real (*)(const fsti_memcpy2d *, CUstream)),
	       "struct fsti_cuda: cuMemcpy2DAsync_v2");

/* The same as assignments, so that -Werror's incompatible-pointer-types
 * check speaks too. sizeof does not evaluate its operand: no symbol of
 * libcuda is referenced. */
void fst_test_cuda_decls_assign(struct fsti_cuda *t);
void fst_test_cuda_decls_assign(struct fsti_cuda *t)
{
#define ASSIGN(m) (void)sizeof(t->m = m);
	EXACT(ASSIGN)
#undef ASSIGN
}

/* ---- run time: the lists above are complete */

#define STRING(name) #name,
static const char *const constant_names[] = {CONSTANTS(STRING)};
static const char *const entry_names[] = {
	EXACT(STRING)
#define FIRST_STRING(m, a, b) #m,
	INT_FOR_ENUM(FIRST_STRING)
	"cuMemcpy2DAsync_v2", /* checked with its struct above */
};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		fail_msg("cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *s = malloc((size_t)n + 1);
	if (fread(s, 1, (size_t)n, f) != (size_t)n)
		fail_msg("cannot read %s", path);
	s[n] = '\0';
	fclose(f);
	return s;
}

static int listed(const char *const *names, size_t n, const char *name, size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (strlen(names[i]) == len && !strncmp(names[i], name, len))
			return 1;
	return 0;
}

static size_t ident_len(const char *s)
{
	size_t n = 0;
	while ((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') ||
	       (s[n] >= '0' && s[n] <= '9') || s[n] == '_')
		n++;
	return n;
}

/* Every "#define FSTI_X" of src/gpu/cuda.h is checked above. */
static void test_every_constant_checked(void **state)
{
	(void)state;
	char *text = slurp(FST_SRC_CUDA_H);
	size_t found = 0;
	for (const char *p = text; (p = strstr(p, "#define FSTI_")); p++) {
		const char *name = p + strlen("#define FSTI_");
		size_t len = ident_len(name);
		if (!listed(constant_names, COUNT(constant_names), name, len))
			fail_msg("src/gpu/cuda.h defines FSTI_%.*s, which this test does not check "
				 "against cuda.h", (int)len, name);
		found++;
	}
	assert_int_equal(found, COUNT(constant_names));
	free(text);
}

/* Every "(*name)(" entry of struct fsti_cuda is checked above, resolved by
 * cuda.c (SYM(name)), and exported by the test double. */
static void test_every_entry_checked(void **state)
{
	(void)state;
	char *text = slurp(FST_SRC_CUDA_H);
	const char *body = strstr(text, "struct fsti_cuda {");
	assert_non_null(body);
	const char *end = strstr(body, "};");
	assert_non_null(end);
	char cuda_c[1024];
	snprintf(cuda_c, sizeof cuda_c, "%.*s/cuda.c",
		 (int)(strlen(FST_SRC_CUDA_H) - strlen("/cuda.h")), FST_SRC_CUDA_H);
	char *impl = slurp(cuda_c);
	const char *dbl_path = getenv("FST_CUDA_LIBRARY");
	void *dbl = dbl_path && *dbl_path ? dlopen(dbl_path, RTLD_NOW | RTLD_LOCAL) : NULL;
	if (dbl_path && *dbl_path && !dbl)
		fail_msg("cannot open the double %s: %s", dbl_path, dlerror());
	size_t found = 0;
	for (const char *p = body; (p = strstr(p, "(*")) && p < end; p++) {
		const char *name = p + 2;
		size_t len = ident_len(name);
		if (!listed(entry_names, COUNT(entry_names), name, len))
			fail_msg("struct fsti_cuda has %.*s, which this test does not check against "
				 "cuda.h", (int)len, name);
		char sym[128];
		snprintf(sym, sizeof sym, "SYM(%.*s)", (int)len, name);
		if (!strstr(impl, sym))
			fail_msg("src/cuda.c never resolves %.*s", (int)len, name);
		snprintf(sym, sizeof sym, "%.*s", (int)len, name);
		if (dbl && !dlsym(dbl, sym))
			fail_msg("the test double lacks %s", sym);
		found++;
	}
	assert_int_equal(found, COUNT(entry_names));
	if (dbl)
		dlclose(dbl);
	free(impl);
	free(text);
}

/* The same values at run time, for the record. */
static void test_values(void **state)
{
	(void)state;
	assert_int_equal(FSTI_CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
	assert_int_equal(FSTI_CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
	assert_int_equal(FSTI_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
			 CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
	assert_int_equal(sizeof(CUdeviceptr), sizeof(CUdeviceptr_v2));
	assert_true(CUDA_VERSION >= 11000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_constant_checked),
		cmocka_unit_test(test_every_entry_checked),
		cmocka_unit_test(test_values),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
