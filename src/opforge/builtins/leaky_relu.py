"""leaky_relu: y = x if x > 0 else alpha * x.

relu's template with an attribute and CPU-ISA variants: one C++ source,
compiled per dtype (float32, float64) and per instruction set (sse41, avx2,
avx512).  The ISA flags opforge passes (-msse4.1 / -mavx2 -mfma /
-mavx512f ...) define the compiler's ``__SSE4_1__`` / ``__AVX2__`` /
``__AVX512F__`` macros, which pick the intrinsics path inside the one
source; ``OPFORGE_DTYPE_FLOAT32`` / ``OPFORGE_DTYPE_FLOAT64`` pick float or
double.  Dispatch runs the best variant the CPU has and the ISA cap allows
(``OPFORGE_ISA`` / ``opforge.set_isa_cap``).  Other dtypes (integers) fall
through to the NumPy reference.

alpha crosses the ABI as a 32-bit float, so in float64 the kernels multiply
by ``float(alpha)`` rounded to single precision (relative difference from the
reference <= 6e-8).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import opforge
from opforge import infer
from opforge.builtins.common import GPU_FLOATS, gpu_source, same_dtypes

if TYPE_CHECKING:
    import numpy.typing as npt

leaky_relu = opforge.op("leaky_relu(Tensor x, *, float alpha=0.01) -> Tensor y",
                        traits=["no_side_effect", "elementwise"],
                        doc="Leaky rectified linear unit, elementwise: x where x > 0, else alpha * x.")
leaky_relu.def_infer(infer.same_as(0))
leaky_relu.fuse_as("{x} > T(0) ? {x} : T(float({alpha})) * {x}")  # as one C++ expression, for fused graph kernels


@leaky_relu.reference(fallback=True)
def leaky_relu_reference(x: npt.NDArray[Any], alpha: float = 0.01) -> npt.NDArray[Any]:
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 -> nan, overflow -> inf: silent, like the kernels
        y: npt.NDArray[Any] = np.where(x > 0, x, alpha * x)
        return y.astype(x.dtype, copy=False)


LEAKY_RELU_CC = r"""
#include <cstddef>
#include <cstdint>

#include "custom_aot_extra.h"
#include "opforge/parallel.h"

#if defined(__SSE4_1__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(OPFORGE_DTYPE_FLOAT32)
typedef float T;
#elif defined(OPFORGE_DTYPE_FLOAT64)
typedef double T;
#else
#error "leaky_relu: compile with OPFORGE_DTYPE_FLOAT32 or OPFORGE_DTYPE_FLOAT64"
#endif

// Outputs at least this large are written with non-temporal (streaming)
// stores: in + out no longer fit the last-level cache, and streaming skips
// the read-for-ownership of every output line (kernel alone, 64 MiB out:
// ~32 -> ~43 GB/s).  Smaller outputs stay in cache for the next op.  The
// crossover measured on a Zen 4 with 32 MiB L3 lies between 8 and 12 MiB of
// output; sysconf's cache sizes are unreliable in VMs, so it is a constant
// (override with -DLEAKY_RELU_STREAM_BYTES=...).
//
// The loops run from the top of the array down.  On a freshly allocated
// output (every eager call allocates one) the page faults cost much less that
// way: 64 MiB float32 through the call path ~6.3 ms going down against ~9.3 ms
// going up, the same effect that makes glibc's memmove (which copies
// downwards when source and destination alias modulo 4 KiB, as NumPy's large
// allocations do) beat an upward copy into fresh pages.  On warm memory the
// direction makes no difference.
#ifndef LEAKY_RELU_STREAM_BYTES
#define LEAKY_RELU_STREAM_BYTES (10u << 20)
#endif

static inline T scalar(T v, T a) { return v > T(0) ? v : a * v; }

// One vector type per ISA and dtype.  V: register; W: elements per register;
// load (unaligned), op, store (unaligned), stream (aligned, non-temporal),
// store_aligned.
#if defined(__AVX512F__)
#define LR_ALIGN 64
#if defined(OPFORGE_DTYPE_FLOAT32)
typedef __m512 V;
static inline V vset1(T a) { return _mm512_set1_ps(a); }
static inline V vload(const T *p) { return _mm512_loadu_ps(p); }
static inline void vstore(T *p, V v) { _mm512_storeu_ps(p, v); }
static inline void vstream(T *p, V v) { _mm512_stream_ps(p, v); }
static inline void vstore_aligned(T *p, V v) { _mm512_store_ps(p, v); }
static inline V vop(V x, V a) {  // alpha * x where !(x > 0) (NaN included), x elsewhere
  return _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NGT_UQ), x, a);
}
#else
typedef __m512d V;
static inline V vset1(T a) { return _mm512_set1_pd(a); }
static inline V vload(const T *p) { return _mm512_loadu_pd(p); }
static inline void vstore(T *p, V v) { _mm512_storeu_pd(p, v); }
static inline void vstream(T *p, V v) { _mm512_stream_pd(p, v); }
static inline void vstore_aligned(T *p, V v) { _mm512_store_pd(p, v); }
static inline V vop(V x, V a) {
  return _mm512_mask_mul_pd(x, _mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_NGT_UQ), x, a);
}
#endif
#elif defined(__AVX2__)
#define LR_ALIGN 32
#if defined(OPFORGE_DTYPE_FLOAT32)
typedef __m256 V;
static inline V vset1(T a) { return _mm256_set1_ps(a); }
static inline V vload(const T *p) { return _mm256_loadu_ps(p); }
static inline void vstore(T *p, V v) { _mm256_storeu_ps(p, v); }
static inline void vstream(T *p, V v) { _mm256_stream_ps(p, v); }
static inline void vstore_aligned(T *p, V v) { _mm256_store_ps(p, v); }
static inline V vop(V x, V a) {  // blend: x where x > 0, else alpha * x
  return _mm256_blendv_ps(_mm256_mul_ps(x, a), x, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ));
}
#else
typedef __m256d V;
static inline V vset1(T a) { return _mm256_set1_pd(a); }
static inline V vload(const T *p) { return _mm256_loadu_pd(p); }
static inline void vstore(T *p, V v) { _mm256_storeu_pd(p, v); }
static inline void vstream(T *p, V v) { _mm256_stream_pd(p, v); }
static inline void vstore_aligned(T *p, V v) { _mm256_store_pd(p, v); }
static inline V vop(V x, V a) {
  return _mm256_blendv_pd(_mm256_mul_pd(x, a), x, _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_GT_OQ));
}
#endif
#elif defined(__SSE4_1__)
#define LR_ALIGN 16
#if defined(OPFORGE_DTYPE_FLOAT32)
typedef __m128 V;
static inline V vset1(T a) { return _mm_set1_ps(a); }
static inline V vload(const T *p) { return _mm_loadu_ps(p); }
static inline void vstore(T *p, V v) { _mm_storeu_ps(p, v); }
static inline void vstream(T *p, V v) { _mm_stream_ps(p, v); }
static inline void vstore_aligned(T *p, V v) { _mm_store_ps(p, v); }
static inline V vop(V x, V a) {
  return _mm_blendv_ps(_mm_mul_ps(x, a), x, _mm_cmpgt_ps(x, _mm_setzero_ps()));
}
#else
typedef __m128d V;
static inline V vset1(T a) { return _mm_set1_pd(a); }
static inline V vload(const T *p) { return _mm_loadu_pd(p); }
static inline void vstore(T *p, V v) { _mm_storeu_pd(p, v); }
static inline void vstream(T *p, V v) { _mm_stream_pd(p, v); }
static inline void vstore_aligned(T *p, V v) { _mm_store_pd(p, v); }
static inline V vop(V x, V a) {
  return _mm_blendv_pd(_mm_mul_pd(x, a), x, _mm_cmpgt_pd(x, _mm_setzero_pd()));
}
#endif
#endif

#if defined(LR_ALIGN)
static const int64_t W = static_cast<int64_t>(sizeof(V) / sizeof(T));

enum Store { kUnaligned, kAligned, kStream };

template <Store S>
static inline void put(T *p, V v) {
  if (S == kStream) vstream(p, v);
  else if (S == kAligned) vstore_aligned(p, v);
  else vstore(p, v);
}

// y[0:i] from x[0:i], from the top down (see the note on direction above).
template <Store S>
static void leaky_relu_down(const T *x, T *y, int64_t i, V va, T a) {
  for (; i >= 4 * W; i -= 4 * W) {
    V v0 = vload(x + i - W), v1 = vload(x + i - 2 * W), v2 = vload(x + i - 3 * W), v3 = vload(x + i - 4 * W);
    put<S>(y + i - W, vop(v0, va));
    put<S>(y + i - 2 * W, vop(v1, va));
    put<S>(y + i - 3 * W, vop(v2, va));
    put<S>(y + i - 4 * W, vop(v3, va));
  }
  for (; i >= W; i -= W) put<S>(y + i - W, vop(vload(x + i - W), va));
  while (i > 0) {  // scalar remainder (the head of the array)
    --i;
    y[i] = scalar(x[i], a);
  }
}

// `streaming`: whether the whole output (not this range of it) is large enough to stream.
static void leaky_relu_simd(const T *x, T *y, int64_t n, T a, bool streaming) {
  const V va = vset1(a);
  if (reinterpret_cast<uintptr_t>(y) % sizeof(T) != 0) {  // not even element-aligned: plain unaligned stores
    leaky_relu_down<kUnaligned>(x, y, n, va, a);
    return;
  }
  // Peel the top until y + i is vector-aligned: aligned stores never split a
  // cache line (NumPy's large allocations sit 16 bytes past a page boundary),
  // and streaming stores need the alignment.  x is loaded unaligned.
  int64_t i = n;
  while (i > 0 && reinterpret_cast<uintptr_t>(y + i) % LR_ALIGN != 0) {
    --i;
    y[i] = scalar(x[i], a);
  }
  if (streaming) {
    leaky_relu_down<kStream>(x, y, i, va, a);
    _mm_sfence();  // order the streaming stores before whatever reads y next
  } else {
    leaky_relu_down<kAligned>(x, y, i, va, a);
  }
}
#endif

extern "C" int LeakyRelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                         void *stream, void *extra) {
  const T *x = static_cast<const T *>(params[0]);
  T *y = static_cast<T *>(params[1]);
  int64_t n = 1;  // a 0-d tensor (ndims 0) has one element
#ifdef OPFORGE_LAYOUT_NCHW16C
  // Channel-blocked: elementwise over the buffer, channel padding included.
  if (ndims[0] != 4) return 3;
  n = shapes[0][0] * ((shapes[0][1] + 15) / 16 * 16) * shapes[0][2] * shapes[0][3];
#else
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
#endif
  if (n <= 0) return 0;
  const T a = static_cast<T>(static_cast<AotExtra *>(extra)->Attr<float>("alpha"));
  // Blocks of 4096 elements (whole cache lines apart, so threads rarely share
  // one), in ranges of 16 blocks and more on opforge's threads; each range
  // runs the same top-down loop over its own part.
  const int64_t block = 4096, blocks = (n + block - 1) / block;
#if defined(LR_ALIGN)
  const bool streaming =
      static_cast<uint64_t>(n) * sizeof(T) >= static_cast<uint64_t>(LEAKY_RELU_STREAM_BYTES);
#endif
  opforge::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    const int64_t lo = b0 * block, hi = b1 * block < n ? b1 * block : n;
#if defined(LR_ALIGN)
    leaky_relu_simd(x + lo, y + lo, hi - lo, a, streaming);
#else
    for (int64_t i = lo; i < hi; i++) y[i] = scalar(x[i], a);
#endif
  });
  return 0;
}
"""

for _isa in ("sse41", "avx2", "avx512"):
    for _layout in ("ndarray", "nchw16c"):
        leaky_relu.kernel(function="LeakyRelu", dtypes={"x": ["float32", "float64"]}, isa=_isa, layout=_layout,
                          code=LEAKY_RELU_CC)
del _isa, _layout
leaky_relu.kernel(source=gpu_source("elementwise.cu", "LeakyReluGpu"), device="gpu", dtypes=same_dtypes(GPU_FLOATS))


# The gradient is an op too (OneFlow's leaky_relu / leaky_relu_grad pair).
@leaky_relu.grad(save=["x"])
def leaky_relu_grad_rule(saved: Any, dy: Any, *, alpha: float) -> Any:
    return opforge.ops.leaky_relu_grad(dy, saved.x, alpha=alpha)


leaky_relu_grad = opforge.op("leaky_relu_grad(Tensor dy, Tensor x, *, float alpha=0.01) -> Tensor dx",
                             traits=["no_side_effect", "elementwise"],
                             doc="Gradient of leaky_relu: dy where x > 0, else alpha * dy.")
leaky_relu_grad.def_infer(infer.same_as(0))


@leaky_relu_grad.reference(fallback=True)
def leaky_relu_grad_reference(dy: npt.NDArray[Any], x: npt.NDArray[Any], alpha: float = 0.01) -> npt.NDArray[Any]:
    return np.where(x > 0, dy, np.float32(alpha) * dy).astype(dy.dtype, copy=False)


@leaky_relu_grad.grad(save=["x"])
def _(saved: Any, ddx: Any, *, alpha: float) -> tuple[Any, None]:
    return opforge.ops.leaky_relu_grad(ddx, saved.x, alpha=alpha), None


leaky_relu_grad.kernel(function="LeakyReluGrad", dtypes={"dy": ["float32", "float64"], "x": ["float32", "float64"]},
                       cflags=["-fno-trapping-math"], code=r"""
#include "custom_aot_extra.h"
#include "opforge/parallel.h"

extern "C" int LeakyReluGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  const OPFORGE_T *dy = static_cast<const OPFORGE_T *>(params[0]);
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[1]);
  OPFORGE_T *dx = static_cast<OPFORGE_T *>(params[2]);
  const OPFORGE_T alpha = static_cast<AotExtra *>(extra)->Attr<float>("alpha");
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  opforge::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {  // 64K elements and more: on opforge's threads
    for (int64_t i = lo; i < hi; i++) {
      const OPFORGE_T g = dy[i], scaled = alpha * g;  // both computed: a blend, not a mispredicted branch
      dx[i] = x[i] > OPFORGE_T(0) ? g : scaled;
    }
  });
  return 0;
}
""")
