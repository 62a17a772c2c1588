// torch's graph-safe Philox state for sampling under CUDA-graph capture (jit/torch_rng.py).
//
// While a stream captures, a CUDA generator hands its kernels the addresses of the graph's seed
// and offset (which torch sets before each replay) and an offset within the graph, never values:
// only its C++ API says them (`philox_cuda_state`, as torch's own dropout takes them). This op
// returns them as two one-element int64 device tensors aliasing torch's storage (the kernels read
// `seed[0]` and `offset[0] + intragraph`), so a captured sampling op draws anew on every replay
// with no extra node in the graph. Outside capture the Python side reads the generator's state
// itself. Built against the installed torch (its version is in the module's key), never into
// the jit-cache wheel.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/from_blob.h>
#include <torch/library.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <tuple>

namespace {

std::tuple<at::Tensor, at::Tensor, int64_t> graph_philox(const at::Generator& gen,
                                                          int64_t increment) {
  TORCH_CHECK_VALUE(increment >= 0 && increment % 4 == 0,
                    "increment must be a non-negative multiple of 4, got ", increment);
  auto* impl = at::check_generator<at::CUDAGeneratorImpl>(gen);
  at::PhiloxCudaState state;
  {
    std::lock_guard<std::mutex> lock(impl->mutex_);
    state = impl->philox_cuda_state(static_cast<uint64_t>(increment));
  }
  TORCH_CHECK(state.captured_, "graph_philox: the generator's device is not capturing a graph");
  const at::Device device = impl->device();
  const auto options = at::TensorOptions().dtype(at::kLong).device(device);
  auto alias = [&](int64_t* ptr) {
    // target_device: no pointer query (a driver call) during capture
    return at::for_blob(ptr, {1}).options(options).target_device(device).make_tensor();
  };
  return {alias(state.seed_.ptr), alias(state.offset_.ptr),
          static_cast<int64_t>(state.offset_intragraph_)};
}

/// Registers torch.ops.flashinfer_rng.graph_philox (idempotent). Not a static initializer: a
/// registration that fails (a torch whose checks differ) raises here, which Python catches and
/// falls back from, instead of aborting the process inside dlopen.
void register_ops() {
  static std::mutex mutex;
  static std::unique_ptr<torch::Library> lib;
  std::lock_guard<std::mutex> lock(mutex);
  if (lib) return;
  try {
    auto fresh = std::make_unique<torch::Library>(torch::Library::FRAGMENT, "flashinfer_rng",
                                                  std::nullopt, __FILE__, __LINE__);
    // torch infers `Generator?` from a C++ at::Generator argument
    fresh->def("graph_philox(Generator? gen, int increment) -> (Tensor, Tensor, int)",
               &graph_philox);
    lib = std::move(fresh);
  } catch (const std::exception& e) {
    TVM_FFI_THROW(RuntimeError) << "registering flashinfer_rng::graph_philox: " << e.what();
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(register_ops, register_ops);
