// opforge's XLA FFI handlers: one generic handler per platform that runs any
// opforge kernel inside an XLA program (jax.jit, eager JAX calls alike).
//
// opforge.jax plans each call site when JAX traces it: the kernel dispatch
// picks, its Init state, the workspace it wants.  The plan goes into a table
// here and the custom call carries two attributes:
//
// * `identity`: what the call computes, stable across processes -- the op's
//   name, its attribute values, its inputs' and outputs' dtypes and shapes
//   (JSON, written by opforge.jax);
// * `plans`: where this process put its plans, a hint -- one index per platform,
//   packed in one int64 (the CPU plan's index in the low 32 bits, the GPU plan's
//   in the high 32 bits; 0xffffffff where there is none).
//
// A handler runs the plan at the hinted index only when that plan's identity is
// the call's.  Otherwise (a program serialized with jax.export and run by another
// process, where the indices mean other plans or none) it looks the identity up,
// and failing that asks opforge.jax to plan it (the resolver, a Python callback);
// a call opforge cannot plan (the op is not registered here, its outputs differ)
// is an error naming the op, never another op's kernel.
//
// At run time the handler takes XLA's buffers as they are -- inputs, outputs --
// reads their shapes and dtypes, takes the workspace (host memory on the CPU,
// XLA's scratch allocator on a GPU, on the call's stream) and calls the kernel
// on XLA's stream.  A kernel error is returned as an XLA FFI error whose
// message starts with the opforge error's name.
//
// Built by opforge against the installed jaxlib's FFI headers (jax.ffi.include_dir());
// the FFI API version is checked when it compiles.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <functional>
#include <map>
#include <vector>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#if XLA_FFI_API_MAJOR != 0 || XLA_FFI_API_MINOR < 1
#error "opforge.jax needs jaxlib's XLA FFI API 0.1 or newer (RemainingArgs, ScratchAllocator)"
#endif

namespace ffi = xla::ffi;

namespace {

using KernelFn = int (*)(int, void **, int *, int64_t **, const char **, void *, void *);
using LastErrorFn = int (*)();
using TakeAttrErrorFn = int (*)();
// Plans the call `identity` on a platform (0: cpu, 1: gpu): the new plan's index, or -1 with a message in `error`.
using ResolverFn = int64_t (*)(const char *identity, int platform, char *error, int64_t error_size);

struct Plan {
  std::string op;        // for messages
  std::string identity;  // the call it was planned for (the custom call's `identity`)
  int platform = 0;      // 0: cpu, 1: gpu
  std::string function;  // the kernel's name
  KernelFn kernel = nullptr;
  void *extra = nullptr;
  std::vector<int64_t> workspace;  // byte sizes, multiples of 64
  int64_t workspace_bytes = 0;
  bool skip = false;  // every output is empty: no kernel
  LastErrorFn last_error = nullptr;
  TakeAttrErrorFn take_attr_error = nullptr;
};

// The plan table: chunks of plans, appended under a lock, read without one (a
// handler call only reads an entry published before its program was built).
constexpr int64_t kChunk = 1024, kChunks = 4096;
std::mutex plans_lock;
std::atomic<Plan *> *chunks[kChunks];  // each chunk: kChunk entries, allocated when first needed
int64_t plan_count = 0;
// Per platform: identity -> index (under plans_lock); std::less<> finds a string_view without a copy.
std::map<std::string, int64_t, std::less<>> by_identity[2];
std::atomic<ResolverFn> resolver{nullptr};

const Plan *PlanAt(int64_t index) {
  if (index < 0 || index >= kChunk * kChunks) return nullptr;  // 0xffffffff: no plan
  std::atomic<Plan *> *chunk = chunks[index / kChunk];
  return chunk == nullptr ? nullptr : chunk[index % kChunk].load(std::memory_order_acquire);
}

const char *DTypeName(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::BF16: return "bfloat16";
    default: return nullptr;
  }
}

ffi::Error Failure(const Plan &plan, const std::string &what) {
  return ffi::Error(ffi::ErrorCode::kInternal, what + " (op '" + plan.op + "', kernel '" + plan.function + "')");
}

constexpr size_t kMaxParams = 128;  // inputs, outputs and workspaces of one call

// One call: `workspace` points at plan.workspace_bytes bytes (or is null when none are needed).
ffi::Error Run(const Plan &plan, ffi::RemainingArgs args, ffi::RemainingRets rets, void *stream, char *workspace,
               bool gpu) {
  const size_t n_in = args.size(), n_out = rets.size();
  const size_t n = n_in + n_out + plan.workspace.size();
  if (n > kMaxParams) return Failure(plan, "opforge.ArityError: more than 128 inputs, outputs and workspaces");
  void *params[kMaxParams];
  int ndims[kMaxParams];
  int64_t *shapes[kMaxParams];
  const char *names[kMaxParams];
  int64_t workspace_dims[kMaxParams];
  const char *bad_dtype = nullptr;
  auto take = [&](size_t k, const ffi::AnyBuffer &buffer) {
    const char *name = DTypeName(buffer.element_type());
    if (name == nullptr) {
      bad_dtype = k < n_in ? "an input" : "an output";
      return false;
    }
    auto dims = buffer.dimensions();
    params[k] = buffer.untyped_data();
    ndims[k] = static_cast<int>(dims.size());
    shapes[k] = const_cast<int64_t *>(dims.begin());
    names[k] = name;
    return true;
  };
  for (size_t k = 0; k < n_in; ++k) {
    auto buffer = args.get<ffi::AnyBuffer>(k);
    if (!buffer.has_value()) return Failure(plan, "opforge.KernelError: input " + std::to_string(k) + " is not a buffer");
    if (!take(k, *buffer)) break;
  }
  for (size_t k = 0; k < n_out && bad_dtype == nullptr; ++k) {
    auto result = rets.get<ffi::AnyBuffer>(k);
    if (!result.has_value()) return Failure(plan, "opforge.KernelError: output " + std::to_string(k) + " is not a buffer");
    if (!take(n_in + k, **result)) break;
  }
  if (bad_dtype != nullptr)
    return Failure(plan, std::string("opforge.DTypeError: ") + bad_dtype + " has a dtype opforge kernels do not take");
  if (plan.skip) return ffi::Error::Success();
  for (size_t k = 0; k < plan.workspace.size(); ++k) {
    const size_t at = n_in + n_out + k;
    params[at] = workspace;
    workspace += plan.workspace[k];
    workspace_dims[k] = plan.workspace[k];
    ndims[at] = 1;
    shapes[at] = &workspace_dims[k];
    names[at] = "uint8";
  }
  int rc;  // (the attribute-error slot is clear: whoever saw an error cleared it)
  std::string thrown;
  try {
    rc = plan.kernel(static_cast<int>(n), params, ndims, shapes, names, stream, plan.extra);
  } catch (const std::exception &error) {
    rc = -1;
    thrown = error.what();
  } catch (...) {
    rc = -1;
    thrown = "unknown C++ exception";
  }
  if (plan.take_attr_error != nullptr && plan.take_attr_error())
    return Failure(plan, "opforge.AttrError: the kernel read an attribute the op does not have, or with the wrong "
                         "type");
  if (!thrown.empty()) return Failure(plan, "opforge.KernelError: the kernel threw: " + thrown);
  if (rc != 0) return Failure(plan, "opforge.KernelError: the kernel returned error code " + std::to_string(rc));
  if (gpu && plan.last_error != nullptr) {
    int code = plan.last_error();
    if (code != 0) return Failure(plan, "opforge.CudaError: the launch failed with cudaError " + std::to_string(code));
  }
  return ffi::Error::Success();
}

ffi::Error Unplanned(std::string_view identity, const std::string &why) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, why + " (custom call " + std::string(identity) + ")");
}

// The plan for `identity` on `platform`: the one at the hinted `index` where it is that call's (the fast path),
// else the one planned for it before, else a new one from the resolver; null with `error` set if there is none.
const Plan *Find(int64_t index, std::string_view identity, int platform, ffi::Error *error) {
  const Plan *plan = PlanAt(index);
  if (plan != nullptr && plan->platform == platform && plan->identity == identity) return plan;
  {
    std::lock_guard<std::mutex> hold(plans_lock);
    auto found = by_identity[platform].find(identity);
    if (found != by_identity[platform].end()) return PlanAt(found->second);
  }
  const ResolverFn resolve = resolver.load(std::memory_order_acquire);  // (set before the handlers are registered)
  const std::string key(identity);                                      // (the resolver reads a C string)
  char message[2048] = "";
  const int64_t made = resolve != nullptr ? resolve(key.c_str(), platform, message, sizeof message) : -1;
  plan = made < 0 ? nullptr : PlanAt(made);
  if (plan == nullptr || plan->identity != identity || plan->platform != platform) {
    *error = Unplanned(identity, message[0] != '\0' ? std::string(message) : "opforge.OpforgeError: no plan");
    return nullptr;
  }
  return plan;
}

int64_t CpuPlan(int64_t plans) { return static_cast<int64_t>(static_cast<uint32_t>(plans)); }
int64_t GpuPlan(int64_t plans) { return static_cast<int64_t>(static_cast<uint64_t>(plans) >> 32); }

ffi::Error CallCpu(int64_t plans, std::string_view identity, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  ffi::Error missing = ffi::Error::Success();
  const Plan *plan = Find(CpuPlan(plans), identity, 0, &missing);
  if (plan == nullptr) return missing;
  std::unique_ptr<char, decltype(&std::free)> workspace(nullptr, &std::free);
  if (plan->workspace_bytes) {
    workspace.reset(static_cast<char *>(std::aligned_alloc(64, static_cast<size_t>(plan->workspace_bytes))));
    if (workspace == nullptr) return Failure(*plan, "opforge.AllocationError: no host memory for the workspace");
  }
  return Run(*plan, args, rets, nullptr, workspace.get(), false);
}

ffi::Error CallGpu(void *stream, ffi::ScratchAllocator scratch, int64_t plans, std::string_view identity,
                   ffi::RemainingArgs args, ffi::RemainingRets rets) {
  ffi::Error missing = ffi::Error::Success();
  const Plan *plan = Find(GpuPlan(plans), identity, 1, &missing);
  if (plan == nullptr) return missing;
  char *workspace = nullptr;
  if (plan->workspace_bytes) {
    auto memory = scratch.Allocate(static_cast<size_t>(plan->workspace_bytes), 256);
    if (!memory.has_value()) return Failure(*plan, "opforge.AllocationError: XLA's scratch allocator failed");
    workspace = static_cast<char *>(*memory);
  }
  return Run(*plan, args, rets, stream, workspace, true);
}

}  // namespace

// Both handlers take both plans: one custom call serves whichever platform runs it.
XLA_FFI_DEFINE_HANDLER_SYMBOL(OpforgeCallCpu, CallCpu,
                              ffi::Ffi::Bind()
                                  .Attr<int64_t>("plans")
                                  .Attr<std::string_view>("identity")
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(OpforgeCallGpu, CallGpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Attr<int64_t>("plans")
                                  .Attr<std::string_view>("identity")
                                  .RemainingArgs()
                                  .RemainingRets());

extern "C" {

// Adds the plan of call `identity` on `platform` (0: cpu, 1: gpu); returns its index (for the `plans`
// attribute), -1 when the table is full.
int64_t opforge_jax_add_plan(const char *identity, int platform, const char *op, const char *function, void *kernel,
                             void *extra, int n_workspace, const int64_t *workspace, int skip, void *last_error,
                             void *take_attr_error) {
  if (platform != 0 && platform != 1) return -1;
  auto plan = std::make_unique<Plan>();
  plan->identity = identity;
  plan->platform = platform;
  plan->op = op;
  plan->function = function;
  plan->kernel = reinterpret_cast<KernelFn>(kernel);
  plan->extra = extra;
  plan->workspace.assign(workspace, workspace + n_workspace);
  for (int64_t size : plan->workspace) plan->workspace_bytes += size;
  plan->skip = skip != 0;
  plan->last_error = reinterpret_cast<LastErrorFn>(last_error);
  plan->take_attr_error = reinterpret_cast<TakeAttrErrorFn>(take_attr_error);
  std::lock_guard<std::mutex> hold(plans_lock);
  const int64_t index = plan_count;
  if (index >= kChunk * kChunks) return -1;
  if (chunks[index / kChunk] == nullptr) chunks[index / kChunk] = new std::atomic<Plan *>[kChunk]();
  by_identity[platform][plan->identity] = index;  // the newest plan of a call: the one a lookup finds
  chunks[index / kChunk][index % kChunk].store(plan.release(), std::memory_order_release);
  plan_count = index + 1;
  return index;
}

// Sets the callback that plans a call no plan in this process was made for.
void opforge_jax_set_resolver(void *resolve) {
  resolver.store(reinterpret_cast<ResolverFn>(resolve), std::memory_order_release);
}

int opforge_jax_ffi_api_version() { return XLA_FFI_API_MAJOR * 1000 + XLA_FFI_API_MINOR; }

}  // extern "C"
