// The short convolution on AVX-512 with AVX512-BF16: as conv_avx512.cpp, but fp32 rounds to bf16
// with vcvtneps2bf16. Compiled with those target flags; only called after the CPU has been
// checked.
#include <immintrin.h>

#include <cstring>

#include "conv/conv_kernels.h"
#include "cpu/bf16.h"
#include "cpu/vector_math_avx512.h"

#define FLAT_CONV_ISA avx512_bf16
#define FLAT_CONV_NAME "avx512_bf16"
#define FLAT_CONV_NATIVE_BF16 1

#include "conv/conv_avx512.inc"
#include "conv/conv_leaf.inc"
