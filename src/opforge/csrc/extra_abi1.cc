// opforge's AotExtra for kernels built with the default new string ABI
// (-D_GLIBCXX_USE_CXX11_ABI=1).  The macro must precede every standard header.
#define _GLIBCXX_USE_CXX11_ABI 1
#define OPFORGE_EXTRA_NAMESPACE opforge_extra_abi1
#include "extra_impl.inc"

AotExtra *opforge_native::NewExtraAbi1(ExtraState *state) { return new opforge_extra_abi1::HostExtra(state); }
