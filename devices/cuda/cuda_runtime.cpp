// `cuda::api` on the CUDA runtime (libcudart): one runtime call per method.
// Only in builds with the CUDA Toolkit, and not in the core library: this file
// and the kernels are the library multidev_cuda (multidev::cuda once
// installed), which cuda_runtime_hook.cpp finds when a program links it.
// No CUDA call is made before the first method call, and none aborts when no
// driver or device is present: the runtime then answers
// `cudaErrorInsufficientDriver` or `cudaErrorNoDevice`.
#include "devices/cuda/cuda_api.hpp"
#include "devices/cuda/cuda_kernels.hpp"

#include <cuda.h> // cuStreamWaitValue32's declaration only: found at run time
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

#include <cstdint>

namespace multidev::detail::cuda {

namespace {

status st(cudaError_t e) noexcept {
  return static_cast<status>(e);
}

cudaStream_t as_stream(stream_t s) noexcept {
  return static_cast<cudaStream_t>(s);
}

cudaEvent_t as_event(event_t e) noexcept {
  return static_cast<cudaEvent_t>(e);
}

class runtime_api final : public api {
public:
  // -- Devices ---------------------------------------------------------------
  status get_device_count(int* n) override {
    return st(cudaGetDeviceCount(n));
  }

  status get_device_properties(device_props* p, int device) override {
    if (p == nullptr)
      return code::invalid_value;
    cudaDeviceProp prop{};
    auto e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
      return st(e);
    prop.name[sizeof(prop.name) - 1] = '\0';
    p->name = prop.name;
    p->major = prop.major;
    p->minor = prop.minor;
    p->multiprocessors = prop.multiProcessorCount;
    p->total_memory = prop.totalGlobalMem;
    p->async_engines = prop.asyncEngineCount;
    p->max_threads_per_block = prop.maxThreadsPerBlock;
    for (int i = 0; i < 3; ++i) {
      p->max_block_dims[static_cast<std::size_t>(i)] = prop.maxThreadsDim[i];
      p->max_grid_dims[static_cast<std::size_t>(i)] = prop.maxGridSize[i];
    }
    p->shared_memory_per_block = prop.sharedMemPerBlock;
    p->warp_size = prop.warpSize;
    return code::success;
  }

  status set_device(int device) override {
    return st(cudaSetDevice(device));
  }

  status get_device(int* device) override {
    return st(cudaGetDevice(device));
  }

  status mem_get_info(std::size_t* free, std::size_t* total) override {
    return st(cudaMemGetInfo(free, total));
  }

  status can_access_peer(int* can, int device, int peer) override {
    return st(cudaDeviceCanAccessPeer(can, device, peer));
  }

  status enable_peer_access(int peer) override {
    return st(cudaDeviceEnablePeerAccess(peer, 0));
  }

  status get_last_error() override {
    return st(cudaGetLastError());
  }

  // -- Streams and events ------------------------------------------------------
  status stream_create(stream_t* s) override {
    if (s == nullptr)
      return code::invalid_value;
    cudaStream_t stream = nullptr;
    auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    *s = e == cudaSuccess ? static_cast<stream_t>(stream) : nullptr;
    return st(e);
  }

  status stream_destroy(stream_t s) override {
    return st(cudaStreamDestroy(as_stream(s)));
  }

  status stream_query(stream_t s) override {
    return st(cudaStreamQuery(as_stream(s)));
  }

  status stream_synchronize(stream_t s) override {
    return st(cudaStreamSynchronize(as_stream(s)));
  }

  status stream_wait_event(stream_t s, event_t e) override {
    return st(cudaStreamWaitEvent(as_stream(s), as_event(e), 0));
  }

  status event_create(event_t* e) override {
    if (e == nullptr)
      return code::invalid_value;
    cudaEvent_t event = nullptr;
    auto r = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    *e = r == cudaSuccess ? static_cast<event_t>(event) : nullptr;
    return st(r);
  }

  status event_destroy(event_t e) override {
    return st(cudaEventDestroy(as_event(e)));
  }

  status event_record(event_t e, stream_t s) override {
    return st(cudaEventRecord(as_event(e), as_stream(s)));
  }

  status event_query(event_t e) override {
    return st(cudaEventQuery(as_event(e)));
  }

  status stream_wait_value(stream_t s, const uint32_t* addr, uint32_t value) override {
    // A runtime stream is a driver stream; page-locked memory from
    // cudaMallocHost is mapped at the same address (unified addressing).
    // Through the runtime's entry point lookup, not by linking libcuda: the
    // tool still starts where no GPU driver is installed.
    using fn_t = decltype(&cuStreamWaitValue32);
    static fn_t fn = nullptr;
    static cudaError_t found = cudaSuccess;
    static std::once_flag once;
    std::call_once(once, [] {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
      found = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000,
                                               cudaEnableDefault, &q);
#else
      found = cudaGetDriverEntryPoint("cuStreamWaitValue32", &p, cudaEnableDefault, &q);
#endif
      if (found == cudaSuccess && (q != cudaDriverEntryPointSuccess || p == nullptr))
        found = cudaErrorNotSupported;
      fn = reinterpret_cast<fn_t>(p);
    });
    if (found != cudaSuccess)
      return st(found);
    auto r = fn(static_cast<CUstream>(s),
                                 reinterpret_cast<CUdeviceptr>(addr), value,
                                 CU_STREAM_WAIT_VALUE_GEQ);
    // The driver API's codes are the runtime's for what can happen here
    // (invalid value, not supported, a sticky context error).
    return r == CUDA_SUCCESS ? code::success : static_cast<status>(r);
  }

  void host_signal(uint32_t* addr, uint32_t value) noexcept override {
    std::atomic_ref<uint32_t>(*addr).store(value, std::memory_order_release);
  }

  status launch_host_func(stream_t s, void (*fn)(void*), void* user) override {
    return st(cudaLaunchHostFunc(as_stream(s), fn, user));
  }

  // -- Memory ------------------------------------------------------------------
  status configure_mem_pool() override {
    int device = 0;
    auto e = cudaGetDevice(&device);
    if (e != cudaSuccess)
      return st(e);
    cudaMemPool_t pool = nullptr;
    e = cudaDeviceGetDefaultMemPool(&pool, device);
    if (e != cudaSuccess)
      return st(e);
    std::uint64_t threshold = UINT64_MAX; // a cuuint64_t: keep all freed memory
    e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (e != cudaSuccess)
      return st(e);
    // Pool memory is not reached through cudaDeviceEnablePeerAccess: grant
    // every device that can reach this one access to its pool, so peer
    // copies and kernels of other devices may read it directly.
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess)
      return st(cudaGetLastError());
    for (int peer = 0; peer < count; ++peer) {
      int can = 0;
      if (peer == device || cudaDeviceCanAccessPeer(&can, peer, device) != cudaSuccess || !can)
        continue;
      cudaMemAccessDesc desc{};
      desc.location.type = cudaMemLocationTypeDevice;
      desc.location.id = peer;
      desc.flags = cudaMemAccessFlagsProtReadWrite;
      if ((e = cudaMemPoolSetAccess(pool, &desc, 1)) != cudaSuccess)
        return st(e);
    }
    return st(cudaSuccess);
  }

  status malloc_async(void** p, std::size_t n, stream_t s) override {
    return st(cudaMallocAsync(p, n, as_stream(s)));
  }

  status free_async(void* p, stream_t s) override {
    return st(cudaFreeAsync(p, as_stream(s)));
  }

  status malloc_host(void** p, std::size_t n) override {
    return st(cudaMallocHost(p, n));
  }

  status free_host(void* p) override {
    return st(cudaFreeHost(p));
  }

  status memset_async(void* p, int value, std::size_t n, stream_t s) override {
    return st(cudaMemsetAsync(p, value, n, as_stream(s)));
  }

  status memcpy_async(void* dst, const void* src, std::size_t n, stream_t s) override {
    return st(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, as_stream(s)));
  }

  status memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                           std::size_t n, stream_t s) override {
    return st(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, as_stream(s)));
  }

  // -- Kernels -------------------------------------------------------------------
  status launch_fill(float* dst, std::size_t n, float value, stream_t s) override {
    return kernels::fill(dst, n, value, s);
  }

  status launch_iota(float* dst, std::size_t n, double start, stream_t s) override {
    return kernels::iota(dst, n, start, s);
  }

  status launch_scale(float* dst, std::size_t n, float factor, stream_t s) override {
    return kernels::scale(dst, n, factor, s);
  }

  status launch_axpy(float* y, float a, const float* x, std::size_t n,
                     stream_t s) override {
    return kernels::axpy(y, a, x, n, s);
  }

  status launch_add(float* dst, const float* src, std::size_t n, stream_t s) override {
    return kernels::add(dst, src, n, s);
  }

  status launch_spin(int64_t ns, stream_t s) override {
    return kernels::spin(ns, s);
  }

  // -- Errors --------------------------------------------------------------------
  std::string error_name(status s) override {
    const char* r = cudaGetErrorName(static_cast<cudaError_t>(s));
    return r != nullptr ? std::string(r) : "cudaError " + std::to_string(s);
  }

  std::string error_string(status s) override {
    const char* r = cudaGetErrorString(static_cast<cudaError_t>(s));
    return r != nullptr ? std::string(r) : "unknown CUDA error " + std::to_string(s);
  }
};

} // namespace

/// What `real_api()` returns when this file is linked (cuda_runtime_hook.cpp).
std::shared_ptr<api> linked_runtime_api() {
  static const std::shared_ptr<api> instance = std::make_shared<runtime_api>();
  return instance;
}

} // namespace multidev::detail::cuda

/// Named by multidev_cuda's link option (`--undefined=multidev_cuda_runtime_linked`):
/// nothing calls this file by name, so without it the linker would leave it
/// out of a program that links multidev_cuda.
extern "C" const char multidev_cuda_runtime_linked = 1;
