// opforge's AotExtra for kernels built with -D_GLIBCXX_USE_CXX11_ABI=0
// (MindSpore's default).  The macro must precede every standard header.
#define _GLIBCXX_USE_CXX11_ABI 0
#define OPFORGE_EXTRA_NAMESPACE opforge_extra_abi0
#include "extra_impl.inc"

AotExtra *opforge_native::NewExtraAbi0(ExtraState *state) { return new opforge_extra_abi0::HostExtra(state); }
