// cast: y = x converted to y's dtype, elementwise.  One library for every
// pair of ABI dtypes: the pair is read from the dtype names at run time.
#include <cstdint>
#include <cstring>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OPFORGE_CAST_F16C 1
#endif

// bfloat16 (the top half of a float32), converted through float with
// round-to-nearest-even, as ml_dtypes does.
struct BFloat16 {
  uint16_t bits;
  BFloat16(float value) {  // NOLINT: implicit, so static_cast<BFloat16>(any number) works
    uint32_t u;
    std::memcpy(&u, &value, 4);
    bits = value != value ? static_cast<uint16_t>((u >> 16) | 0x40)  // NaN stays (quiet) NaN
                          : static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &u, 4);
    return value;
  }
};

template <typename In, typename Out>
static void Convert(const void *x, void *y, int64_t n) {
  const In *in = static_cast<const In *>(x);
  Out *out = static_cast<Out *>(y);
  // 64K elements and more: ranges on opforge's threads.
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) out[i] = static_cast<Out>(in[i]);
  });
}

// float32 -> bfloat16 without a branch per element (the NaN test is a select), so the loop vectorizes;
// the same rounding as BFloat16(float).  Compiled twice: for the baseline ISA and, chosen at run time
// as F16C is below, for AVX2 (twice as fast again).
#define OPFORGE_FLOAT_TO_BFLOAT16_LOOP                                                   \
  for (int64_t i = lo; i < hi; i++) {                                                    \
    uint32_t u;                                                                          \
    std::memcpy(&u, in + 4 * i, 4);                                                      \
    const uint32_t rounded = (u + 0x7fff + ((u >> 16) & 1)) >> 16;                       \
    const uint32_t quiet_nan = (u >> 16) | 0x40;                                         \
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded); \
  }

static void FloatToBFloat16(const char *in, uint16_t *out, int64_t lo, int64_t hi) {
  OPFORGE_FLOAT_TO_BFLOAT16_LOOP
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) static void FloatToBFloat16Avx2(const char *in, uint16_t *out, int64_t lo,
                                                                 int64_t hi) {
  OPFORGE_FLOAT_TO_BFLOAT16_LOOP
}
static const bool kHasAvx2 = __builtin_cpu_supports("avx2");
#endif
#undef OPFORGE_FLOAT_TO_BFLOAT16_LOOP

template <>
void Convert<float, BFloat16>(const void *x, void *y, int64_t n) {
  const char *in = static_cast<const char *>(x);
  auto *out = static_cast<uint16_t *>(y);
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
#if defined(__x86_64__) || defined(__i386__)
    if (kHasAvx2) return FloatToBFloat16Avx2(in, out, lo, hi);
#endif
    FloatToBFloat16(in, out, lo, hi);
  });
}

#ifdef OPFORGE_CAST_F16C
// float16 <-> float32 with F16C, 8 lanes a step, when the CPU has it (every x86 CPU with AVX2 does):
// without -mf16c, _Float16's conversions are a library call per element, 15-30x slower.  F16C rounds
// to nearest even and keeps infinities, NaNs and subnormals, as the scalar conversions do.
__attribute__((target("avx,f16c"))) static void HalfToFloat(const uint16_t *in, float *out, int64_t lo,
                                                            int64_t hi) {
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i))));
  for (; i < hi; i++) out[i] = _cvtsh_ss(in[i]);
}

__attribute__((target("avx,f16c"))) static void FloatToHalf(const float *in, uint16_t *out, int64_t lo,
                                                            int64_t hi) {
  int64_t i = lo;
  for (; i + 8 <= hi; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < hi; i++) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static const bool kHasF16C = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");

template <>
void Convert<_Float16, float>(const void *x, void *y, int64_t n) {
  const auto *in = static_cast<const uint16_t *>(x);
  auto *out = static_cast<float *>(y);
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    if (kHasF16C) {
      HalfToFloat(in, out, lo, hi);
    } else {
      const auto *half = static_cast<const _Float16 *>(x);
      for (int64_t i = lo; i < hi; i++) out[i] = static_cast<float>(half[i]);
    }
  });
}

template <>
void Convert<float, _Float16>(const void *x, void *y, int64_t n) {
  const auto *in = static_cast<const float *>(x);
  auto *out = static_cast<uint16_t *>(y);
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    if (kHasF16C) {
      FloatToHalf(in, out, lo, hi);
    } else {
      auto *half = static_cast<_Float16 *>(y);
      for (int64_t i = lo; i < hi; i++) half[i] = static_cast<_Float16>(in[i]);
    }
  });
}
#endif

// CALL(T) for the C type T named by dtype; returns 1 for a dtype not listed.
#define OPFORGE_FOR_DTYPE(dtype, CALL)                          \
  if (!std::strcmp(dtype, "bool")) { CALL(bool); }             \
  else if (!std::strcmp(dtype, "int8")) { CALL(int8_t); }      \
  else if (!std::strcmp(dtype, "int16")) { CALL(int16_t); }    \
  else if (!std::strcmp(dtype, "int32")) { CALL(int32_t); }    \
  else if (!std::strcmp(dtype, "int64")) { CALL(int64_t); }    \
  else if (!std::strcmp(dtype, "uint8")) { CALL(uint8_t); }    \
  else if (!std::strcmp(dtype, "uint16")) { CALL(uint16_t); }  \
  else if (!std::strcmp(dtype, "uint32")) { CALL(uint32_t); }  \
  else if (!std::strcmp(dtype, "uint64")) { CALL(uint64_t); }  \
  else if (!std::strcmp(dtype, "float16")) { CALL(_Float16); } \
  else if (!std::strcmp(dtype, "bfloat16")) { CALL(BFloat16); } \
  else if (!std::strcmp(dtype, "float32")) { CALL(float); }    \
  else if (!std::strcmp(dtype, "float64")) { CALL(double); }   \
  else return 1;

template <typename In>
static int ConvertFrom(const char *out_dtype, const void *x, void *y, int64_t n) {
#define OPFORGE_CONVERT_TO(Out) Convert<In, Out>(x, y, n)
  OPFORGE_FOR_DTYPE(out_dtype, OPFORGE_CONVERT_TO)
#undef OPFORGE_CONVERT_TO
  return 0;
}

extern "C" int Cast(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
#define OPFORGE_CONVERT_FROM(In) return ConvertFrom<In>(dtypes[1], params[0], params[1], n)
  OPFORGE_FOR_DTYPE(dtypes[0], OPFORGE_CONVERT_FROM)
#undef OPFORGE_CONVERT_FROM
}
