#pragma once
/// \file
/// A fake CUDA runtime (`cuda::api`) for tests of the CUDA driver without a
/// GPU. Device memory is host memory; each stream is a host thread that runs
/// its operations (kernels, copies, frees, event records and waits, host
/// functions) in FIFO order, with the built-in kernels' CPU semantics. It
/// mirrors the runtime where the driver depends on it: stream-ordered frees,
/// events whose waits capture the recording of the moment, a per-thread
/// current device and last error (every failed call but `not_ready` sets
/// it), sticky errors that break every device for good, the host functions
/// of all streams serialized (one at a time, each blocking its stream),
/// launch queues of bounded length, freed memory reused. docs/design.md lists where it still differs from CUDA. White-box tests steer it
/// through the test controls below; everything is safe from any thread.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "devices/cuda/cuda_api.hpp"

namespace multidev::detail::cuda {

/// What a `fake_api` has done so far. "Run" counts operations a stream has
/// finished; the others count successful calls.
struct fake_stats {
  std::map<std::string, uint64_t> calls; ///< Calls per api method (C++ name), failed ones too.
  uint64_t streams_created = 0;
  uint64_t streams_destroyed = 0;
  uint64_t events_created = 0;
  uint64_t events_destroyed = 0;
  uint64_t event_records = 0; ///< `event_record` calls.
  uint64_t stream_waits = 0;  ///< `stream_wait_event` calls.
  uint64_t value_waits_run = 0; ///< `stream_wait_value` waits that ended (the word reached its value).
  uint64_t host_signals = 0;    ///< `host_signal` calls.
  uint64_t host_funcs_launched = 0;
  uint64_t host_funcs_run = 0;
  uint64_t kernels_launched = 0;
  uint64_t kernels_run = 0; ///< Not counting the one a `fail_kernel_sticky` fault replaced.
  uint64_t memsets = 0;     ///< Run.
  uint64_t memcpys = 0;     ///< Run.
  uint64_t peer_copies = 0; ///< Run.
  uint64_t mallocs = 0;     ///< `malloc_async` calls.
  uint64_t frees = 0;       ///< Stream-ordered frees run.
  uint64_t host_mallocs = 0;
  uint64_t host_frees = 0;
  uint64_t mem_pools_configured = 0;
  uint64_t ops_discarded = 0;       ///< Queued operations a sticky error dropped.
  uint64_t reused = 0;              ///< `malloc_async` calls given freed memory back.
  uint64_t launches_blocked = 0;    ///< Calls that waited for a full stream (`set_queue_limit`).
  /// Calls made from inside a host function, which the runtime forbids
  /// (each returns `not_permitted`).
  uint64_t calls_in_host_funcs = 0;
  std::size_t bytes_held = 0;       ///< `malloc_async` bytes (as requested) not yet freed, all devices.
  std::size_t pinned_bytes_held = 0; ///< `malloc_host` bytes not yet freed.
};

/// The fake runtime (see the file comment).
class fake_api final : public api {
public:
  /// `devices` devices (0: every call fails with `no_device`).
  explicit fake_api(int devices = 2);
  /// Drains and joins every stream left open (ignoring `pause`), then frees
  /// the memory still allocated.
  ~fake_api() override;
  fake_api(const fake_api&) = delete;
  fake_api& operator=(const fake_api&) = delete;

  // -- api (cuda_api.hpp). Null or unknown handles and pointers give
  // `invalid_value`; a call concerning a sticky device (its stream, event or
  // memory, or the calling thread's current device) gives its sticky error.

  /// `insufficient_driver` (and *n = 0) after `set_no_driver(true)`.
  status get_device_count(int* n) override;
  /// "fake H200 <i>", sm_90, 132 SMs, 141 GiB; device 1 allows only 512
  /// threads and 32 KiB of shared memory per block.
  status get_device_properties(device_props* p, int device) override;
  /// Selects the calling thread's device (default 0), even a sticky one.
  status set_device(int device) override;
  /// The calling thread's device (default 0).
  status get_device(int* device) override;
  /// Free: 141 GiB less what `malloc_async` holds on the current device.
  status mem_get_info(std::size_t* free, std::size_t* total) override;
  /// 1 for two distinct devices.
  status can_access_peer(int* can, int device, int peer) override;
  /// `peer_access_already_enabled` after the first time per pair.
  status enable_peer_access(int peer) override;
  /// The thread's last error (cleared), or the current device's sticky one.
  status get_last_error() override;
  /// A stream on the current device: a thread that runs its ops in order.
  status stream_create(stream_t* s) override;
  /// Runs what is queued (even while paused), then joins the thread; a
  /// sticky device's stream is released too (returning its error).
  status stream_destroy(stream_t s) override;
  /// `not_ready` while an op is queued or running.
  status stream_query(stream_t s) override;
  /// Waits until no op is queued or running (a paused device's: until resumed).
  status stream_synchronize(stream_t s) override;
  /// Blocks `s` until the recording of `e` made before this call has run
  /// (at once if none is pending); later recordings do not affect it.
  status stream_wait_event(stream_t s, event_t e) override;
  /// An event on the current device.
  status event_create(event_t* e) override;
  /// Pending recordings and waits keep what they need.
  status event_destroy(event_t e) override;
  /// `e` and `s` must be on the same device.
  status event_record(event_t e, stream_t s) override;
  /// `not_ready` until its last recording has run; a never-recorded event is ready.
  status event_query(event_t e) override;
  /// Blocks `s` until the word reaches `value` (wrapping compare) or the
  /// device turns sticky; `invalid_value` unless `addr` is 4-aligned
  /// `malloc_host` memory.
  status stream_wait_value(stream_t s, const uint32_t* addr, uint32_t value) override;
  /// Stores the word and wakes the streams waiting on it.
  void host_signal(uint32_t* addr, uint32_t value) noexcept override;
  /// `fn(user)` runs on the stream's thread when the stream reaches it,
  /// one host function at a time across all streams (the stream waits).
  status launch_host_func(stream_t s, void (*fn)(void*), void* user) override;
  /// Counts per device (`mem_pools_configured`).
  status configure_mem_pool() override;
  /// 256-aligned host memory, at once; held by the stream's device (the
  /// current one for the null stream) until the free runs.
  /// `memory_allocation` beyond the device's 141 GiB.
  status malloc_async(void** p, std::size_t n, stream_t s) override;
  /// Queues the free on `s` (the null stream frees at once); `invalid_value`
  /// for a pointer not from `malloc_async` or already being freed.
  status free_async(void* p, stream_t s) override;
  /// 256-aligned host memory (`pinned_bytes_held`).
  status malloc_host(void** p, std::size_t n) override;
  /// Frees at once; null is a no-op.
  status free_host(void* p) override;
  /// `std::memset` in stream order.
  status memset_async(void* p, int value, std::size_t n, stream_t s) override;
  /// `std::memcpy` in stream order (all memory is host memory).
  status memcpy_async(void* dst, const void* src, std::size_t n, stream_t s) override;
  /// `std::memcpy` in stream order; both ranges must lie in `malloc_async`
  /// memory of the devices named.
  status memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                           std::size_t n, stream_t s) override;
  /// The kernels below run devices/kernels.cpp's loops on the stream's
  /// thread. A launch fails (`invalid_value`, also the thread's last error)
  /// for a null buffer with n > 0, or a stream not on the current device.
  status launch_fill(float* dst, std::size_t n, float value, stream_t s) override;
  /// `dst[i] = float(start + double(i))`.
  status launch_iota(float* dst, std::size_t n, double start, stream_t s) override;
  /// `dst[i] *= factor`.
  status launch_scale(float* dst, std::size_t n, float factor, stream_t s) override;
  /// `y[i] += a * x[i]`.
  status launch_axpy(float* y, float a, const float* x, std::size_t n, stream_t s) override;
  /// `dst[i] += src[i]`.
  status launch_add(float* dst, const float* src, std::size_t n, stream_t s) override;
  /// Busy-waits `ns` (>= 0) nanoseconds.
  status launch_spin(int64_t ns, stream_t s) override;
  /// "cudaErrorIllegalAddress" etc. for the codes of `code`, else "cudaError<N>".
  std::string error_name(status s) override;
  /// The runtime's sentence for the codes of `code`.
  std::string error_string(status s) override;

  // -- Test controls (a bad device ordinal throws std::invalid_argument).

  /// While on, every call fails with `insufficient_driver`.
  void set_no_driver(bool on);
  /// The next call of the method named `call` (e.g. "memcpy_async") returns
  /// `s` and does nothing else; several queue up per name.
  void fail_next(std::string call, status s);
  /// Breaks `device` for good with `s` (non-zero; the first one stays), as
  /// an illegal address would, and with it every device of the process (CUDA's
  /// sticky errors are the process's): all queued ops are dropped (host
  /// functions too), the ops running finish, every call concerning a device
  /// returns `s`, and waits on events unblock.
  void make_sticky(int device, status s);
  /// The next kernel that runs on `device` does not: the device turns sticky
  /// with `s` when its stream reaches it (the launch succeeded).
  void fail_kernel_sticky(int device, status s);
  /// How many operations a stream queues before a call that queues one
  /// more blocks until it drains (default 1024, as the runtime's launch
  /// queue; the calling thread waits, even while the device is paused).
  void set_queue_limit(std::size_t ops);
  /// `device`'s streams start no op until `resume` (queued ops wait).
  void pause(int device);
  /// Lets `device`'s streams run again.
  void resume(int device);
  /// A snapshot of the counters.
  fake_stats stats() const;
  /// `malloc_async` bytes held by `device`.
  std::size_t bytes_held(int device) const;
  /// How often `configure_mem_pool` succeeded on `device`.
  uint64_t mem_pools_configured(int device) const;
  /// Waits until `pred` holds for the counters, at most `limit`; returns
  /// whether it held. `pred` runs under the fake's lock: it must not call it.
  bool wait_until(std::function<bool(const fake_stats&)> pred,
                  std::chrono::milliseconds limit = std::chrono::seconds{30}) const;

  struct op;           // a queued stream operation (fake_cuda_api.cpp)
  struct stream_state; // one stream: its queue and thread
  struct event_state;  // one event: its recordings

private:
  struct device_state {
    status sticky = code::success;
    status fail_kernel = code::success; // `fail_kernel_sticky`, not yet hit
    bool paused = false;
    std::size_t held = 0;
    uint64_t pools_configured = 0;
    std::vector<bool> peer_enabled;
  };
  struct thread_state {
    int device = 0;
    status last_error = code::success;
  };
  struct allocation {
    int device = 0;
    std::size_t size = 0; // as requested
    bool freeing = false; // a free is queued
  };

  template <class F>
  status call(const char* name, F&& body);
  status enter(const char* name);
  thread_state& me();
  status sticky(int device) const { return devs_[static_cast<std::size_t>(device)].sticky; }
  status current_sticky();
  status ptr_sticky(const void* p) const;
  const std::pair<void* const, allocation>* find_allocation(const void* p) const;
  status find_stream(stream_t s, stream_state*& out);
  status find_event(event_t e, std::shared_ptr<event_state>& out);
  void enqueue(stream_state& st, op o, std::unique_lock<std::mutex>& lk);
  status launch(const char* name, stream_t s, std::initializer_list<const void*> buffers,
                std::size_t n, std::function<void()> work);
  void make_sticky_locked(int device, status s);
  void run(stream_state& st, op& o, std::unique_lock<std::mutex>& lk);
  void serve(stream_state& st);
  device_state& dev(int device);
  void check_device(int device, const char* what) const;

  int devices_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_; // every change of state or counters
  bool no_driver_ = false;
  bool ending_ = false; // the destructor runs: value waits end
  std::vector<device_state> devs_;
  std::map<uint64_t, thread_state> threads_; // by thread token (never reused)
  std::map<std::string, std::deque<status>> fail_next_;
  std::map<void*, std::unique_ptr<stream_state>> streams_;
  std::map<void*, std::shared_ptr<event_state>> events_;
  std::map<void*, allocation> allocations_; // malloc_async
  std::map<void*, std::size_t> pinned_;     // malloc_host
  std::map<int, std::multimap<std::size_t, void*>> reusable_; // freed, by device and size
  std::size_t queue_limit_ = 1024; // ops a stream queues before a launch blocks
  std::mutex host_func_mu_;        // one host function at a time, all streams
  std::uintptr_t next_handle_ = 0xfa000;
  fake_stats st_;
};

} // namespace multidev::detail::cuda
