// A hand-written, typed XLA FFI handler for `y = a + b` on float32 (the loop
// of add.cc): the baseline benchmarks/jax_bridge.py compares opforge's
// generic handler with -- what a JAX user writes by hand for one kernel.
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error Add(ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b, ffi::ResultBuffer<ffi::F32> y) {
  const float *pa = a.typed_data(), *pb = b.typed_data();
  float *py = y->typed_data();
  for (size_t i = 0; i < a.element_count(); ++i) py[i] = pa[i] + pb[i];
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(BenchAdd, Add,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
