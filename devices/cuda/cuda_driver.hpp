#pragma once
/// \file
/// The CUDA driver (`multidev_cuda`): one non-blocking stream per device,
/// stream-ordered pools, CUDA events for cross-device waits and for
/// completion, a staging thread per stream for copies with host memory. Every runtime call goes through `cuda::api`, so its logic
/// runs in CI against `cuda::fake_api` and on a GPU against `real_api()`.
///
/// - **Items**: the runner submits an item on its own thread; its work
///   *launches* device work on the device's stream (a kernel, a memset, a
///   copy; a closure may launch its own on `current_cuda_stream()`). Then
///   the driver records a CUDA event (taken from a per-device pool); the
///   stream's completion thread asks the oldest item's event
///   (`cudaEventQuery`) and reports the item to the device core once it
///   completed, so items complete in seq order and no completion waits for
///   a host function (CUDA may run those of all streams one at a time).
///   The driver launches no host function: the host side of copies and
///   checksums runs on the stream's staging thread (docs/design.md,
///   "Staging memory").
/// - **Waits**: between two CUDA devices of one driver, `order_after` makes
///   the waiting stream wait for the producer item's event on the device
///   (`cudaStreamWaitEvent`); an event is recorded once and any number of
///   streams may wait on it (fan-out), and it returns to the pool when its
///   item has completed (a recorded wait keeps what it captured). Waits on
///   anything else (a CPU device of another backend, a node) are resolved
///   on the host, by the runner's gate.
/// - **Errors**: every status is checked. A failed call fails the item that
///   made it, naming the call, `cudaGetErrorName` and `cudaGetErrorString`
///   (the device core then poisons the device). A sticky error (the
///   process's CUDA state is lost) quarantines every device: the items in
///   flight fail with it, and every later submission or allocation is
///   refused with the cause. Any status but success and not-ready that the
///   completion thread's event query gets quarantines (the stream's work is
///   lost); an idle device has no thread awake. A
///   device that shuts down with work that never completes is quarantined
///   after the drain bound (`set_cuda_drain_bound`), and its stream's
///   resources are kept rather than freed under that work.
/// - **Memory**: pools come from `cudaMallocAsync` on the device's stream
///   (the device's default memory pool, which keeps freed memory); copies
///   with host memory go through a bounded ring of page-locked staging
///   chunks (`cuda_staging_chunk`), filled and drained on the staging
///   thread while the stream waits on a page-locked word for each piece
///   (`stream_wait_value`), and copies between devices through
///   `cudaMemcpyPeerAsync`.
/// - **No GPU**: with no runtime, no driver or no device, `device_count()`
///   is 0 and `properties()` says why. Nothing is enumerated until asked.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "devices/cuda/cuda_api.hpp"
#include "devices/driver.hpp"

namespace multidev::detail {

/// A CUDA call failed: `what()` names the device, the call, the error's
/// name and its description.
class cuda_error : public std::runtime_error {
public:
  cuda_error(const std::string& what, cuda::status code, bool sticky)
    : std::runtime_error(what), code_(code), sticky_(sticky) {}
  cuda::status code() const noexcept { return code_; }
  /// Whether the device is quarantined for it.
  bool sticky() const noexcept { return sticky_; }

private:
  cuda::status code_;
  bool sticky_;
};

/// The CUDA driver over `api` (null: no runtime, `cuda::no_runtime_reason()`),
/// exposing at most `num_devices` of the devices the runtime reports.
/// `backend` is its backend name.
std::shared_ptr<driver> make_cuda_driver(std::shared_ptr<cuda::api> api,
                                         std::optional<int> num_devices,
                                         std::string backend = "multidev_cuda");

/// The runtime layer of a CUDA driver made by `make_cuda_driver` (tests
/// steer a fake through it); null for another driver.
cuda::api* api_of(driver& d) noexcept;

/// Copies between host and device memory go through page-locked (pinned)
/// staging memory: a ring of `cuda_staging_chunks` chunks of
/// `cuda_staging_chunk` bytes per device, reused in stream order, so a
/// device never pins more than their product (16 MiB), whatever is in flight.
inline constexpr std::size_t cuda_staging_chunk = std::size_t{8} << 20;
inline constexpr std::size_t cuda_staging_chunks = 2;

/// How long a CUDA stream being closed may complete no item before its
/// work is abandoned (default 60 s; see docs/design.md). Tests shorten it.
void set_cuda_drain_bound(driver& d, std::chrono::milliseconds bound);

/// The stream (`cudaStream_t`) of the item the calling thread is
/// launching, or null outside a CUDA item's work.
void* current_cuda_stream() noexcept;

} // namespace multidev::detail
