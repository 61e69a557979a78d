/* dtype.c - the element types of the safetensors format and their sizes. */
#include "format.h"

#include <string.h>

static const struct {
	const char *name;
	unsigned bits;
} dtypes[FST_DTYPE_COUNT] = {
	[FST_DTYPE_INVALID] = {"INVALID", 0},
	[FST_DTYPE_BOOL] = {"BOOL", 8},
	[FST_DTYPE_U8] = {"U8", 8},
	[FST_DTYPE_I8] = {"I8", 8},
	[FST_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
	[FST_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
	[FST_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
	[FST_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
	[FST_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
	[FST_DTYPE_I16] = {"I16", 16},
	[FST_DTYPE_U16] = {"U16", 16},
	[FST_DTYPE_F16] = {"F16", 16},
	[FST_DTYPE_BF16] = {"BF16", 16},
	[FST_DTYPE_I32] = {"I32", 32},
	[FST_DTYPE_U32] = {"U32", 32},
	[FST_DTYPE_F32] = {"F32", 32},
	[FST_DTYPE_I64] = {"I64", 64},
	[FST_DTYPE_U64] = {"U64", 64},
	[FST_DTYPE_F64] = {"F64", 64},
	[FST_DTYPE_C64] = {"C64", 64},
	[FST_DTYPE_F4] = {"F4", 4},
	[FST_DTYPE_F6_E2M3] = {"F6_E2M3", 6},
	[FST_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
};

const char *fst_dtype_name(fst_dtype dtype)
{
	if ((unsigned)dtype >= FST_DTYPE_COUNT)
		return "INVALID";
	return dtypes[dtype].name;
}

unsigned fst_dtype_bits(fst_dtype dtype)
{
	if ((unsigned)dtype >= FST_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].bits;
}

fst_dtype fst_dtype_from_name(const char *name)
{
	if (!name)
		return FST_DTYPE_INVALID;
	for (int i = 1; i < FST_DTYPE_COUNT; i++)
		if (!strcmp(dtypes[i].name, name))
			return (fst_dtype)i;
	return FST_DTYPE_INVALID;
}
