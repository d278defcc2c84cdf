#pragma once
/// \file
/// The thin layer between the CUDA driver and the CUDA runtime: every CUDA
/// call the driver makes goes through `cuda::api`, one virtual per runtime
/// call, with the runtime's own status codes (`cudaError_t` values as `int`).
/// Two implementations: `real_api()` (cuda_runtime.cpp, linked against
/// libcudart; only in builds with the CUDA Toolkit, and only in programs that
/// link the library multidev_cuda, see cuda_runtime_hook.cpp) and `fake_api`
/// (fake_cuda_api.hpp: streams on host threads, for tests without a GPU).
/// No CUDA header is included here, so the driver's logic compiles and is
/// tested without the toolkit.
///
/// Threading follows the runtime: `set_device` selects the device of the
/// calling thread; the calls below act on it (streams and events remember
/// their device). Host functions (`launch_host_func`) must make no call
/// through this layer.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace multidev::detail::cuda {

/// A `cudaError_t` value: 0 is success.
using status = int;

/// The runtime's codes the driver reasons about (values of `cudaError_t`,
/// stable across CUDA releases).
namespace code {
inline constexpr status success = 0;
inline constexpr status invalid_value = 1;
inline constexpr status memory_allocation = 2;
inline constexpr status insufficient_driver = 35;
inline constexpr status no_device = 100;
inline constexpr status invalid_device = 101;
inline constexpr status not_ready = 600;
inline constexpr status illegal_address = 700;
inline constexpr status launch_out_of_resources = 701;
inline constexpr status launch_timeout = 702;
inline constexpr status peer_access_already_enabled = 704;
inline constexpr status assert_failed = 710;
inline constexpr status hardware_stack_error = 714;
inline constexpr status illegal_instruction = 715;
inline constexpr status misaligned_address = 716;
inline constexpr status invalid_address_space = 717;
inline constexpr status invalid_pc = 718;
inline constexpr status launch_failure = 719;
inline constexpr status not_permitted = 800;
inline constexpr status ecc_uncorrectable = 214;
inline constexpr status nvlink_uncorrectable = 220;
inline constexpr status contained = 226;
inline constexpr status external_device = 911;
inline constexpr status unknown = 999;
} // namespace code

/// Whether a call's `s` leaves the process's CUDA state unusable (a
/// "sticky" error: every later call fails with it until the process ends),
/// so the devices must be quarantined rather than merely fail the work that
/// hit it. The codes the CUDA 13 header documents so ("leaves the process in
/// an inconsistent state"). What the stream itself reports asynchronously
/// (`cudaStreamQuery`, `cudaStreamSynchronize`) is judged by
/// `is_async_fatal` instead.
constexpr bool is_sticky(status s) noexcept {
  switch (s) {
    case code::nvlink_uncorrectable:
    case code::contained:
    case code::external_device:
    case code::illegal_address:
    case code::launch_timeout:
    case code::assert_failed:
    case code::hardware_stack_error:
    case code::illegal_instruction:
    case code::misaligned_address:
    case code::invalid_address_space:
    case code::invalid_pc:
    case code::launch_failure:
    case code::ecc_uncorrectable:
    case code::unknown:
      return true;
    default:
      return false;
  }
}

/// Whether `s`, reported by a stream for the work it runs (a query or a
/// synchronize, not a call's own argument check), is fatal to the device:
/// every status but success and not-ready. A stream that hit one runs no
/// more host functions, so nothing of it would ever complete.
constexpr bool is_async_fatal(status s) noexcept {
  return s != code::success && s != code::not_ready;
}

/// Opaque runtime handles (`cudaStream_t`, `cudaEvent_t`).
using stream_t = void*;
using event_t = void*;

/// What `get_device_properties` reports (fields of `cudaDeviceProp`).
struct device_props {
  std::string name;
  int major = 0; ///< Compute capability.
  int minor = 0;
  int multiprocessors = 0;
  std::size_t total_memory = 0;
  int async_engines = 0;
  int max_threads_per_block = 0;
  std::array<int, 3> max_block_dims{};
  std::array<int, 3> max_grid_dims{};
  std::size_t shared_memory_per_block = 0;
  int warp_size = 0;
};

/// The CUDA runtime calls the driver uses (see the file comment). Every
/// method returns the call's status and never throws.
class api {
public:
  virtual ~api() = default;

  // -- Devices ---------------------------------------------------------------
  virtual status get_device_count(int* n) = 0;
  virtual status get_device_properties(device_props* p, int device) = 0;
  virtual status set_device(int device) = 0;
  /// The calling thread's current device (`cudaGetDevice`).
  virtual status get_device(int* device) = 0;
  /// Free and total memory of the current device (`cudaMemGetInfo`).
  virtual status mem_get_info(std::size_t* free, std::size_t* total) = 0;
  /// `cudaDeviceCanAccessPeer(can, device, peer)`.
  virtual status can_access_peer(int* can, int device, int peer) = 0;
  /// `cudaDeviceEnablePeerAccess(peer, 0)` from the current device.
  virtual status enable_peer_access(int peer) = 0;
  /// `cudaGetLastError`: returns and clears the last non-sticky error.
  virtual status get_last_error() = 0;

  // -- Streams and events ------------------------------------------------------
  /// A stream that does not synchronize with the legacy default stream
  /// (`cudaStreamNonBlocking`), on the current device.
  virtual status stream_create(stream_t* s) = 0;
  virtual status stream_destroy(stream_t s) = 0;
  /// `cudaSuccess` when all its work is done, `not_ready` while some runs.
  virtual status stream_query(stream_t s) = 0;
  virtual status stream_synchronize(stream_t s) = 0;
  /// Work submitted to `s` after this waits for `e`'s last recording.
  virtual status stream_wait_event(stream_t s, event_t e) = 0;
  /// An event without timing (`cudaEventDisableTiming`), current device.
  virtual status event_create(event_t* e) = 0;
  virtual status event_destroy(event_t e) = 0;
  virtual status event_record(event_t e, stream_t s) = 0;
  /// `cudaSuccess` once the work before its last recording is done.
  virtual status event_query(event_t e) = 0;
  /// Work submitted to `s` after this waits until the 32-bit word at `addr`
  /// (in `malloc_host` memory) reaches `value`: `(int32_t)(*addr - value) >= 0`
  /// (`cuStreamWaitValue32` with `CU_STREAM_WAIT_VALUE_GEQ`). The host sets
  /// the word with `host_signal`.
  virtual status stream_wait_value(stream_t s, const uint32_t* addr, uint32_t value) = 0;
  /// The host stores `value` into the word at `addr` (release order), which
  /// `stream_wait_value` waits on. Not a runtime call: no status, no error.
  virtual void host_signal(uint32_t* addr, uint32_t value) noexcept = 0;
  /// Runs `fn(user)` on a runtime thread once the work before it in `s` is
  /// done (`cudaLaunchHostFunc`). `fn` must not call this layer.
  virtual status launch_host_func(stream_t s, void (*fn)(void*), void* user) = 0;

  // -- Memory ------------------------------------------------------------------
  /// Makes the current device's default memory pool keep freed memory
  /// (release threshold: all of it), so stream-ordered allocation reuses it.
  virtual status configure_mem_pool() = 0;
  /// `cudaMallocAsync` / `cudaFreeAsync` on `s` (the current device's pool).
  virtual status malloc_async(void** p, std::size_t n, stream_t s) = 0;
  virtual status free_async(void* p, stream_t s) = 0;
  /// Page-locked host memory (`cudaMallocHost` / `cudaFreeHost`).
  virtual status malloc_host(void** p, std::size_t n) = 0;
  virtual status free_host(void* p) = 0;
  /// `cudaMemsetAsync(p, value, n, s)`.
  virtual status memset_async(void* p, int value, std::size_t n, stream_t s) = 0;
  /// `cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s)`.
  virtual status memcpy_async(void* dst, const void* src, std::size_t n, stream_t s) = 0;
  /// `cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, s)`.
  virtual status memcpy_peer_async(void* dst, int dst_device, const void* src,
                                   int src_device, std::size_t n, stream_t s) = 0;

  // -- The built-in kernels (docs/kernels.md), on float32 buffers of `n`
  // elements, launched on `s`. Bit-identical to the CPU's (no fused
  // multiply-add; `iota` in double). Each returns the launch's status.
  virtual status launch_fill(float* dst, std::size_t n, float value, stream_t s) = 0;
  virtual status launch_iota(float* dst, std::size_t n, double start, stream_t s) = 0;
  virtual status launch_scale(float* dst, std::size_t n, float factor, stream_t s) = 0;
  /// `y[i] += a * x[i]`.
  virtual status launch_axpy(float* y, float a, const float* x, std::size_t n, stream_t s) = 0;
  /// `dst[i] += src[i]` (`add_from_merge`).
  virtual status launch_add(float* dst, const float* src, std::size_t n, stream_t s) = 0;
  /// Busy work on the device for `ns` nanoseconds (`spin_ns`).
  virtual status launch_spin(int64_t ns, stream_t s) = 0;

  // -- Errors --------------------------------------------------------------------
  /// `cudaGetErrorName(s)` / `cudaGetErrorString(s)`.
  virtual std::string error_name(status s) = 0;
  virtual std::string error_string(status s) = 0;
};

/// The CUDA runtime, or null in a build without the CUDA Toolkit or in a
/// program that does not link multidev_cuda (`multidev::cuda`).
std::shared_ptr<api> real_api();

/// Whether this program has the real runtime (`real_api()` is not null).
bool built_with_cuda() noexcept;

/// Why `real_api()` is null, in one sentence (the CUDA driver's `unavailable`).
std::string no_runtime_reason();

} // namespace multidev::detail::cuda
