// The CUDA driver's logic over the thin runtime layer (see cuda_driver.hpp).
#include "devices/cuda/cuda_driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "devices/builtins.hpp"
#include "multidev/cuda.hpp"
#include "multidev/kernels.hpp"

namespace multidev::detail {

namespace {

using cuda::status;
namespace code = cuda::code;

class cuda_driver;
class cuda_stream;

/// The item the calling thread launches (set by `cuda_stream::submit`).
struct launch {
  cuda_stream* stream = nullptr;
  /// Set by the driver's own work (kernels, copies, zeroing); otherwise the
  /// work is a user's closure, which may have selected another device.
  bool driver_work = false;
  /// Done when the item completes (or its stream is quarantined): what
  /// must live until then, like staging buffers. Never a CUDA call.
  std::vector<std::function<void()>> after;
};
thread_local launch* current = nullptr;
/// The stream whose `submit` the calling thread is in (it stays open meanwhile).
thread_local cuda_stream* submitting = nullptr;
/// Set while a host callback runs: no CUDA call may be made there.
thread_local bool in_host_callback = false;

/// Selects a device on the calling thread for its lifetime, then gives the
/// thread back the device it had: a driver call made on a thread of the
/// program (allocate, release, debug info, opening or closing a stream)
/// leaves the thread's current device as it found it.
class device_scope {
public:
  device_scope(cuda::api& api, int ordinal) : api_(api) {
    if (api_.get_device(&saved_) != code::success) {
      (void)api_.get_last_error();
      saved_ = -1;
    }
    status_ = saved_ == ordinal ? code::success : api_.set_device(ordinal);
    changed_ = status_ == code::success && saved_ != ordinal;
  }
  ~device_scope() {
    if (changed_ && saved_ >= 0 && api_.set_device(saved_) != code::success)
      (void)api_.get_last_error();
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  /// `cudaSetDevice`'s status.
  status selected() const noexcept { return status_; }

private:
  cuda::api& api_;
  int saved_ = -1;
  status status_ = code::success;
  bool changed_ = false;
};

/// One device's state in the driver. Guarded by `cuda_driver::mu_` unless
/// atomic.
struct device_slot {
  cuda_stream* stream = nullptr;
  std::atomic<bool> quarantined{false};
  std::string quarantine_cause;   // set once, before `quarantined`
  std::vector<void*> deferred;    // frees asked for in host callbacks
  std::atomic<std::size_t> deferred_count{0}; // deferred.size(), read without mu_
  std::size_t bytes = 0;          // held by allocations
  bool pool_configured = false;
  /// Wakers waiting for this device's next submission (`wakers_` entries);
  /// counted before the waiter looks, so a submission never misses one.
  std::atomic<int> wakers{0};
};

/// One device's stream (see the file comment of cuda_driver.hpp).
class cuda_stream final : public stream {
public:
  cuda_stream(std::shared_ptr<cuda_driver> d, int ordinal, completion_sink& sink,
              cuda::stream_t s);
  ~cuda_stream() override;

  void submit(uint64_t seq, std::function<void()> work) override;
  void closing() override;

  cuda::stream_t handle() const noexcept { return s_; }
  int ordinal() const noexcept { return ordinal_; }

  /// Makes `waiter` wait on the device for item `seq` of this stream;
  /// false when `seq` is neither in flight here nor completed, and then
  /// `later` says whether it may still be submitted.
  bool order_waiter(cuda::api& api, cuda::stream_t waiter, uint64_t seq, bool& later);
  // Host copies (issue 43 point 3): the pageable<->pinned copies run on
  // the stream's staging thread, never in a host function. The stream
  // waits for a staged chunk on a pinned word the staging thread sets
  // (`stream_wait_value`); the staging thread waits for the stream through
  // events. Only the submitting thread calls these; they throw like `check`.
  /// Host bytes to the device, through the ring of pinned chunks: each
  /// chunk filled on the staging thread once the stream's earlier work and
  /// the chunk's previous use are done, copied while the next is filled.
  void stage_in(std::byte* dst, const std::byte* src, std::size_t n);
  /// Device bytes through the ring to `take(chunk, offset, length)`, run on
  /// the staging thread as each chunk arrives; the stream goes on past the
  /// copy only once the last has run (later work sees what it wrote).
  void stage_out(const std::byte* src, std::size_t n,
                 std::function<void(const std::byte*, std::size_t, std::size_t)> take);
  /// `work` (a host-to-host copy) on the staging thread, in stream order.
  void host_job(std::function<void()> work);
  /// The device turned sticky: the watchdog fails what is in flight.
  void quarantine_now();
  /// Wakes the watchdog (frees were deferred).
  void poke() { cv_.notify_all(); }
  /// Counters for debug info.
  std::size_t staging_bytes() const;
  std::size_t in_flight() const;

private:
  /// Reports the front item, whose event has completed (the completion
  /// thread, `lk` held).
  void complete_front(std::unique_lock<std::mutex>& lk);
  void watchdog();
  /// The staging thread: runs `stage_q_`'s jobs in order.
  void stager();
  /// Polls `e` on the staging thread until it completed (true), or the
  /// device failed, is quarantined or was abandoned (false).
  bool stage_wait(cuda::event_t e);
  /// The next chunk of the ring (made when first used).
  std::size_t stage_slot();
  /// `len` (at most a chunk) bytes of the ring: the rest of the current
  /// chunk when they fit, else the next chunk. Small copies share a chunk,
  /// so they seldom wait for one to be free.
  std::byte* stage_piece(std::size_t len);
  /// The pinned word the stream waits on (made when first used).
  uint32_t* signal_word();
  struct stage_job;
  /// Queues `j` with the next ticket, which it returns.
  uint32_t post(stage_job j);
  /// Makes the stream wait until the staging thread finished ticket `t`.
  void wait_ticket(uint32_t t);
  /// Whether the staging thread finished ticket `t` (0: none).
  bool staged(uint32_t t) const noexcept {
    return t == 0 || static_cast<int32_t>(std::atomic_ref<uint32_t>(*signal_).load(
                                            std::memory_order_acquire)
                                          - t)
                       >= 0;
  }
  /// The last ticket posted when the stream does not wait for it, else 0.
  uint32_t out_pending() const noexcept {
    return static_cast<int32_t>(ticket_next_ - stream_waited_) > 0 ? ticket_next_ : 0;
  }
  /// An event recorded on the stream now (from the pool).
  cuda::event_t mark();
  cuda::event_t take_event();
  void fail_in_flight(std::unique_lock<std::mutex>& lk);
  /// Waits until the stream has run everything, as long as it makes
  /// progress; false when no item completed for the drain bound.
  bool drain();
  /// While closing: whether no item completed for the drain bound.
  bool stalled_locked();
  /// Gives up on the stream's work: quarantines the device (its items fail)
  /// and keeps what the work may still use until the process ends.
  void abandon(std::unique_lock<std::mutex>& lk);

  std::shared_ptr<cuda_driver> d_;
  cuda::api& api_;
  int ordinal_;
  completion_sink& sink_;
  cuda::stream_t s_;

  /// The stream's lock and condition variable; kept with the rest of what
  /// an abandoned stream's work may still touch (see the destructor).
  struct gate {
    std::mutex mu;
    std::condition_variable cv;
    cuda_stream* stream = nullptr;
    bool abandoned = false; // the stream is gone: host functions return at once
  };
  std::shared_ptr<gate> gate_ = std::make_shared<gate>();
  std::mutex& mu_ = gate_->mu;
  std::condition_variable& cv_ = gate_->cv;
  struct flying {
    uint64_t seq;
    cuda::event_t event;
    std::vector<std::function<void()>> after;
    /// The staging job (a copy to the host) that must also have run before
    /// the item completes, or 0: the stream does not wait for those itself.
    uint32_t ticket = 0;
  };
  std::deque<flying> fifo_;           // in submission order
  std::vector<cuda::event_t> events_; // the pool: completed, ready to record
  std::size_t events_made_ = 0;
  uint64_t completed_upto_ = 0;       // the last seq whose callback ran
  int callbacks_running_ = 0;
  bool quarantine_ = false;
  bool abandon_ = false; // closing gave up on the stream: keep what it may still use
  bool closing_ = false; // the device shuts down: in-flight work is bounded
  std::chrono::steady_clock::time_point progress_at_{}; // when closing, the last completion seen
  uint64_t progress_seen_ = 0;
  bool stop_ = false;
  std::array<std::byte*, cuda_staging_chunks> ring_{}; // pinned, made when first used
  std::size_t ring_next_ = 0;
  /// A job of the staging thread: after `waits` (events of this stream,
  /// back to the pool once done), `work`, then the pinned word is set to
  /// `ticket`.
  struct stage_job {
    std::vector<cuda::event_t> waits;
    std::function<void()> work;
    uint32_t ticket = 0;
  };
  std::deque<stage_job> stage_q_; // mu_
  std::condition_variable stage_cv_; // the staging thread waits on it (with mu_)
  bool stage_busy_ = false;       // mu_: the staging thread runs a job's wait or work
  bool watch_ticket_ = false;     // mu_: the completion thread waits for a ticket
  uint32_t* signal_ = nullptr;    // pinned; the stream waits on it
  // The submitting thread's own (no lock): tickets handed out, the one the
  // stream already waits for, and per chunk of the ring the event after the
  // copy that last read it on the device (a fill waits for it) and the
  // ticket of the host job that last used it (the stream waits for it
  // before it writes the chunk).
  uint32_t ticket_next_ = 0;
  uint32_t stream_waited_ = 0;
  /// Whether work that may write host memory was queued on the stream
  /// since the last host copy marked it: a user's launch (the closure
  /// asked `current_cuda_stream`) or a wait on another device's item
  /// (`order_waiter`). Then a copy from the host waits for the stream's
  /// earlier work before it reads the bytes; otherwise the only earlier
  /// writers of host memory are staging jobs, which run in order anyway.
  std::atomic<bool> host_writer_{true};

public:
  /// Work that may write host memory was queued (see `host_writer_`).
  void may_write_host() noexcept { host_writer_.store(true, std::memory_order_relaxed); }
  /// A user's closure launches on the stream: work it queues may read what
  /// copies to the host wrote, so the stream waits for them first.
  void user_launches() noexcept;

private:
  std::array<cuda::event_t, cuda_staging_chunks> slot_read_{};
  std::array<uint32_t, cuda_staging_chunks> slot_host_{};
  // The chunk pieces are taken from (`stage_piece`): its index, how much is
  // used, whether the device read a piece of it, and what its previous use
  // left to wait for: the event after the device's reads (the first fill
  // waits for it) and the last host job's ticket (the stream waits for it
  // before it writes a piece).
  bool in_chunk_ = false;
  std::size_t cur_ = 0;
  std::size_t cur_off_ = 0;
  bool cur_read_ = false;
  cuda::event_t enter_read_ = nullptr;
  uint32_t enter_ticket_ = 0;
  std::vector<std::function<void()>> carry_; // from items that threw at launch
  std::thread watchdog_;
  std::thread stager_;
};

class cuda_driver final : public driver, public std::enable_shared_from_this<cuda_driver> {
public:
  cuda_driver(std::shared_ptr<cuda::api> api, std::optional<int> n, std::string name)
    : api_(std::move(api)), requested_(n), name_(std::move(name)) {}

  ~cuda_driver() override = default;

  const std::string& backend_name() const override { return name_; }

  int device_count() const override {
    probe();
    return count_;
  }

  sexp properties() const override {
    probe();
    auto props = sexp::list({sexp::atom(name_), sexp::field("num_devices", std::to_string(count_))});
    if (!why_none_.empty())
      props.push_back(sexp::field("unavailable", why_none_));
    auto devices = sexp::list({sexp::atom("devices")});
    for (int i = 0; i < count_; ++i) {
      const auto& p = props_[static_cast<std::size_t>(i)];
      devices.push_back(sexp::list(
        {sexp::atom("device"), sexp::field("ordinal", std::to_string(i)),
         sexp::field("kind", "cuda"), sexp::field("name", p.name),
         sexp::field("compute_capability", fmt::format("{}.{}", p.major, p.minor)),
         sexp::field("multiprocessors", std::to_string(p.multiprocessors)),
         sexp::field("memory", std::to_string(p.total_memory)),
         sexp::field("async_engines", std::to_string(p.async_engines))}));
    }
    props.push_back(std::move(devices));
    return props;
  }

  hardware_limits limits() const override {
    probe();
    hardware_limits h;
    for (int i = 0; i < count_; ++i) {
      const auto& p = props_[static_cast<std::size_t>(i)];
      auto low = [](std::optional<int>& v, int x) { v = v ? std::min(*v, x) : x; };
      low(h.max_threads_per_block, p.max_threads_per_block);
      low(h.max_block_dim_x, p.max_block_dims[0]);
      low(h.max_grid_dim_x, p.max_grid_dims[0]);
      low(h.shared_memory_per_block, static_cast<int>(std::min<std::size_t>(
                                         p.shared_memory_per_block, INT32_MAX)));
    }
    return h;
  }

  std::unique_ptr<allocation> allocate(int ordinal, std::size_t size, std::size_t alignment,
                                       std::optional<memory_mode> mode) override;
  void zero(std::byte* p, std::size_t n) override;
  void copy(std::byte* dst, const std::byte* src, std::size_t n) override;
  std::unique_ptr<stream> open_stream(int ordinal, completion_sink& sink) override;
  bool order_after(int ordinal, int other, uint64_t seq,
                   const std::function<void()>& wake) override;
  /// After `ordinal`'s stream took an item: wakes the runners that asked
  /// `order_after` for an item of it not yet submitted.
  void submitted(int ordinal) {
    if (slots_[static_cast<std::size_t>(ordinal)].wakers.load(std::memory_order_seq_cst) == 0)
      [[likely]]
      return;
    std::vector<std::function<void()>> wake;
    {
      std::lock_guard guard{mu_};
      std::erase_if(wakers_, [&](waker& w) {
        if (w.producer != ordinal)
          return false;
        wake.push_back(std::move(w.wake));
        return true;
      });
      slots_[static_cast<std::size_t>(ordinal)].wakers.fetch_sub(static_cast<int>(wake.size()));
    }
    for (auto& w : wake)
      w();
  }
  bool host_kernels() const override { return false; }
  bool has_kernel(std::string_view name) const override;
  void run_kernel(const std::string& name, const kernel_call& call) override;
  sexp debug_info(int ordinal) const override;

  /// Non-null once a device exists (streams are opened on devices only).
  cuda::api& api() const noexcept { return *api_; }
  cuda::api* api_ptr() const noexcept { return api_.get(); }

  /// Throws a `cuda_error` for a failed call on `ordinal`; a sticky one
  /// quarantines the device first.
  void check(int ordinal, status s, const char* call) {
    if (s != code::success) [[unlikely]]
      fail(ordinal, s, call);
  }
  [[noreturn]] void fail(int ordinal, status s, const char* call);
  /// For a call whose failure has nobody to report to (a free, a destroy):
  /// clears the thread's error, so no later call reports it, and
  /// quarantines `ordinal` when `s` is sticky. Returns whether it succeeded.
  bool settle(int ordinal, status s, const char* call) {
    if (s == code::success) [[likely]]
      return true;
    if (!in_host_callback)
      (void)api_->get_last_error();
    if (cuda::is_sticky(s))
      quarantine(ordinal, s, call);
    return false;
  }
  /// Before a kernel launch, whose status is `cudaGetLastError` after it:
  /// clears an error an earlier call of this thread left (a user's closure),
  /// so the launch reports its own; a sticky one quarantines and throws.
  void clear_stale_error(int ordinal) {
    auto s = api_->get_last_error();
    if (s != code::success && cuda::is_sticky(s)) [[unlikely]]
      fail(ordinal, s, "an earlier CUDA call of this thread");
  }
  /// Quarantines every device for sticky error `s` that `call` reported
  /// on `ordinal` (a sticky error is the process's, not one device's).
  void quarantine(int ordinal, status s, const char* call);
  /// Quarantines `ordinal` alone, for `cause` (a stream that never drained).
  void quarantine_one(int ordinal, std::string cause);
  /// How long a closing stream may go without completing an item before
  /// its work is abandoned (`set_cuda_drain_bound`).
  std::chrono::milliseconds drain_bound() const noexcept {
    return std::chrono::milliseconds{drain_bound_ms_.load(std::memory_order_relaxed)};
  }
  void set_drain_bound(std::chrono::milliseconds b) noexcept {
    drain_bound_ms_.store(b.count(), std::memory_order_relaxed);
  }
  /// Throws the quarantine's cause when `ordinal` is quarantined.
  void refuse_if_quarantined(int ordinal) const {
    auto& slot = slots_[static_cast<std::size_t>(ordinal)];
    if (slot.quarantined.load(std::memory_order_acquire)) [[unlikely]]
      throw cuda_error(slot.quarantine_cause, code::unknown, true);
  }
  std::string describe(int ordinal, status s, const char* call) const {
    return fmt::format("cuda device {}: {}: {} ({})", ordinal, call, api_->error_name(s),
                       api_->error_string(s));
  }

  void stream_closed(int ordinal) {
    std::lock_guard guard{mu_};
    slots_[static_cast<std::size_t>(ordinal)].stream = nullptr;
    // Its runner asks no more, and nobody waits for it to submit (their
    // gates resolve on the host).
    std::erase_if(wakers_, [&](const waker& w) {
      if (w.waiter != ordinal && w.producer != ordinal)
        return false;
      slots_[static_cast<std::size_t>(w.producer)].wakers.fetch_sub(1);
      return true;
    });
  }
  /// Frees `p` of `ordinal`; deferred when called in a host callback.
  void release(int ordinal, void* p, std::size_t bytes);
  /// Frees what host callbacks deferred (on a thread that may call CUDA,
  /// with `ordinal` current).
  void flush_deferred(int ordinal, cuda::stream_t s);
  /// Read without locks (a stream's watchdog asks holding its own).
  bool has_deferred(int ordinal) const {
    return slots_[static_cast<std::size_t>(ordinal)].deferred_count.load(
             std::memory_order_acquire) > 0;
  }

private:
  /// Enumerates the devices once (first asked).
  void probe() const;
  void quarantine_locked(int ordinal, std::string cause);
  std::atomic<int64_t> drain_bound_ms_{60'000};
  void check_ordinal(int ordinal, const char* what) const {
    if (ordinal < 0 || ordinal >= device_count())
      throw std::invalid_argument(fmt::format("{}: cuda device {} does not exist ({} device(s))",
                                              what, ordinal, count_));
  }
  /// The device of `p` (an allocation of this driver), or -1 for host memory.
  int owner_of(const void* p) const;
  launch& launching(const char* what) const {
    if (!current || !current->stream)
      throw std::logic_error(fmt::format("{}: not inside a CUDA item's work", what));
    return *current;
  }

  std::shared_ptr<cuda::api> api_;
  std::optional<int> requested_;
  std::string name_;
  mutable std::once_flag probed_;
  mutable int count_ = 0;
  mutable std::string why_none_;
  mutable std::vector<cuda::device_props> props_;
  mutable std::unique_ptr<device_slot[]> slots_;

  mutable std::mutex mu_; // slots_' guarded members, allocs_
  struct alloc_info {
    std::size_t size;
    int ordinal;
  };
  std::map<uintptr_t, alloc_info> allocs_; // by base address
  /// Runners to wake when `producer` submits (see `order_after`).
  struct waker {
    int waiter;
    int producer;
    std::function<void()> wake;
  };
  std::vector<waker> wakers_;
};

class cuda_allocation final : public allocation {
public:
  cuda_allocation(std::shared_ptr<cuda_driver> d, int ordinal, void* raw, std::byte* base,
                  std::size_t bytes)
    : d_(std::move(d)), ordinal_(ordinal), raw_(raw), base_(base), bytes_(bytes) {}
  ~cuda_allocation() override { d_->release(ordinal_, raw_, bytes_); }
  std::byte* base() const noexcept override { return base_; }

private:
  std::shared_ptr<cuda_driver> d_;
  int ordinal_;
  void* raw_;
  std::byte* base_;
  std::size_t bytes_;
};

// -- cuda_driver ------------------------------------------------------------------

void cuda_driver::probe() const {
  std::call_once(probed_, [this] {
    if (!api_) {
      why_none_ = cuda::no_runtime_reason();
    } else {
      int n = 0;
      auto s = api_->get_device_count(&n);
      if (s != code::success) {
        why_none_ = fmt::format("the CUDA runtime reports no usable device: {} ({})",
                                api_->error_name(s), api_->error_string(s));
        n = 0;
      } else if (n <= 0) {
        why_none_ = "the CUDA runtime reports no device";
        n = 0;
      }
      if (requested_)
        n = std::min(n, *requested_);
      for (int i = 0; i < n; ++i) {
        cuda::device_props p;
        if (auto s = api_->get_device_properties(&p, i); s != code::success) {
          why_none_ = fmt::format("cudaGetDeviceProperties({}) failed: {} ({})", i,
                                  api_->error_name(s), api_->error_string(s));
          n = i;
          break;
        }
        props_.push_back(std::move(p));
      }
      count_ = n;
    }
    slots_ = std::make_unique<device_slot[]>(static_cast<std::size_t>(std::max(count_, 1)));
  });
}

void cuda_driver::fail(int ordinal, status s, const char* call) {
  bool sticky = cuda::is_sticky(s);
  if (!sticky && !in_host_callback) {
    (void)api_->get_last_error(); // clear a non-sticky error: it is reported here
    // A code this build does not list may still be the context's end: the
    // device's stream says so (any status but success and not-ready). Asked
    // only from that stream's `submit`, which keeps it open.
    cuda::stream_t st = nullptr;
    if (submitting && submitting->ordinal() == ordinal)
      st = submitting->handle();
    if (st) {
      auto q = api_->stream_query(st);
      if (cuda::is_async_fatal(q)) {
        (void)api_->get_last_error();
        s = q;
        call = "cudaStreamQuery";
        sticky = true;
      }
    }
  }
  if (sticky) {
    quarantine(ordinal, s, call);
    refuse_if_quarantined(ordinal); // throws the quarantine's cause
  }
  throw cuda_error(describe(ordinal, s, call), s, sticky);
}

void cuda_driver::quarantine(int ordinal, status s, const char* call) {
  // CUDA's sticky errors leave the process's CUDA state inconsistent: every
  // device of the driver goes, not only the one whose call reported it.
  auto what = fmt::format("{} reported the sticky error {} ({})", call, api_->error_name(s),
                          api_->error_string(s));
  std::lock_guard guard{mu_};
  for (int i = 0; i < count_; ++i)
    quarantine_locked(i, i == ordinal
                           ? fmt::format("cuda device {} is quarantined: {}; no more work runs "
                                         "on it",
                                         i, what)
                           : fmt::format("cuda device {} is quarantined: on cuda device {}, {}, "
                                         "which ends every device of the process; no more work "
                                         "runs on it",
                                         i, ordinal, what));
}

void cuda_driver::quarantine_one(int ordinal, std::string cause) {
  std::lock_guard guard{mu_};
  quarantine_locked(ordinal, std::move(cause));
}

void cuda_driver::quarantine_locked(int ordinal, std::string cause) {
  auto& slot = slots_[static_cast<std::size_t>(ordinal)];
  if (slot.quarantined.load())
    return;
  slot.quarantine_cause = std::move(cause);
  slot.quarantined.store(true, std::memory_order_release);
  if (slot.stream)
    slot.stream->quarantine_now();
}

std::unique_ptr<allocation> cuda_driver::allocate(int ordinal, std::size_t size,
                                                  std::size_t alignment,
                                                  std::optional<memory_mode>) {
  check_ordinal(ordinal, "allocate");
  // cudaMallocAsync aligns to 256 bytes; more is made by over-allocating.
  // No block may exceed PTRDIFF_MAX bytes: a size that would (or whose sum
  // would wrap around to a few bytes) is out of memory, before any call.
  constexpr std::size_t most = PTRDIFF_MAX;
  const std::size_t extra = alignment > 256 ? alignment : 0;
  if (extra > most || std::max<std::size_t>(size, 1) > most - extra)
    throw std::bad_alloc{};
  refuse_if_quarantined(ordinal);
  device_scope scope{*api_, ordinal};
  check(ordinal, scope.selected(), "cudaSetDevice");
  cuda::stream_t s = nullptr;
  bool configure = false;
  {
    std::lock_guard guard{mu_};
    auto& slot = slots_[static_cast<std::size_t>(ordinal)];
    s = slot.stream ? slot.stream->handle() : nullptr;
    configure = !std::exchange(slot.pool_configured, true);
  }
  // Outside mu_: a failed check may quarantine, which takes it.
  if (configure)
    check(ordinal, api_->configure_mem_pool(), "cudaMemPoolSetAttribute");
  std::size_t bytes = std::max<std::size_t>(size, 1) + extra;
  void* raw = nullptr;
  auto st = api_->malloc_async(&raw, bytes, s);
  if (st == code::memory_allocation) {
    (void)api_->get_last_error();
    throw std::bad_alloc{};
  }
  check(ordinal, st, "cudaMallocAsync");
  auto addr = reinterpret_cast<uintptr_t>(raw);
  auto aligned = (addr + (alignment - 1)) & ~(uintptr_t{alignment} - 1);
  auto* base = reinterpret_cast<std::byte*>(aligned);
  {
    std::lock_guard guard{mu_};
    allocs_[reinterpret_cast<uintptr_t>(base)] = {std::max<std::size_t>(size, 1), ordinal};
    slots_[static_cast<std::size_t>(ordinal)].bytes += bytes;
  }
  try {
    return std::make_unique<cuda_allocation>(shared_from_this(), ordinal, raw, base, bytes);
  } catch (...) {
    release(ordinal, raw, bytes);
    throw;
  }
}

void cuda_driver::release(int ordinal, void* raw, std::size_t bytes) {
  cuda::stream_t s = nullptr;
  {
    std::lock_guard guard{mu_};
    // The base is at or after raw, within `bytes`.
    auto it = allocs_.lower_bound(reinterpret_cast<uintptr_t>(raw));
    if (it != allocs_.end() && it->first < reinterpret_cast<uintptr_t>(raw) + bytes)
      allocs_.erase(it);
    auto& slot = slots_[static_cast<std::size_t>(ordinal)];
    slot.bytes -= std::min(slot.bytes, bytes);
    if (in_host_callback) {
      slot.deferred.push_back(raw);
      slot.deferred_count.store(slot.deferred.size(), std::memory_order_release);
      if (slot.stream)
        slot.stream->poke();
      return; // the next submission or the watchdog frees it
    }
    s = slot.stream ? slot.stream->handle() : nullptr;
    // A quarantined device's work may still use it (an abandoned stream),
    // and its context is lost: the runtime frees it at exit.
    if (slot.quarantined.load())
      return;
  }
  // Nothing to report to from a destructor: a failed free (a lost
  // context) leaves the memory to the runtime, which frees it at exit; its
  // error is cleared, so that no later call of this thread reports it.
  device_scope scope{*api_, ordinal};
  if (settle(ordinal, scope.selected(), "cudaSetDevice"))
    settle(ordinal, api_->free_async(raw, s), "cudaFreeAsync");
}

void cuda_driver::flush_deferred(int ordinal, cuda::stream_t s) {
  std::vector<void*> frees;
  {
    std::lock_guard guard{mu_};
    auto& slot = slots_[static_cast<std::size_t>(ordinal)];
    frees.swap(slot.deferred);
    slot.deferred_count.store(0, std::memory_order_release);
  }
  for (void* p : frees)
    settle(ordinal, api_->free_async(p, s), "cudaFreeAsync");
}

int cuda_driver::owner_of(const void* p) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard guard{mu_};
  auto it = allocs_.upper_bound(a);
  if (it == allocs_.begin())
    return -1;
  --it;
  return a < it->first + it->second.size ? it->second.ordinal : -1;
}

void cuda_driver::zero(std::byte* p, std::size_t n) {
  if (n == 0)
    return;
  auto& l = launching("zero");
  l.driver_work = true;
  auto ord = l.stream->ordinal();
  check(ord, api_->memset_async(p, 0, n, l.stream->handle()), "cudaMemsetAsync");
}

void cuda_driver::copy(std::byte* dst, const std::byte* src, std::size_t n) {
  if (n == 0)
    return;
  auto& l = launching("copy");
  l.driver_work = true;
  auto ord = l.stream->ordinal();
  auto s = l.stream->handle();
  int dd = owner_of(dst);
  int sd = owner_of(src);
  if (dd >= 0 && sd >= 0) {
    if (dd == sd)
      check(ord, api_->memcpy_async(dst, src, n, s), "cudaMemcpyAsync");
    else
      check(ord, api_->memcpy_peer_async(dst, dd, src, sd, n, s), "cudaMemcpyPeerAsync");
  } else if (dd >= 0) {
    // Host to device through the ring of pinned chunks, filled on the
    // staging thread in stream order (the host bytes may be written by
    // work ordered before this copy).
    l.stream->stage_in(dst, src, n);
  } else if (sd >= 0) {
    l.stream->stage_out(src, n, [dst](const std::byte* chunk, std::size_t off,
                                      std::size_t len) { std::memcpy(dst + off, chunk, len); });
  } else {
    l.stream->host_job([dst, src, n] { std::memcpy(dst, src, n); });
  }
}

std::unique_ptr<stream> cuda_driver::open_stream(int ordinal, completion_sink& sink) {
  check_ordinal(ordinal, "open_stream");
  refuse_if_quarantined(ordinal);
  device_scope scope{*api_, ordinal};
  check(ordinal, scope.selected(), "cudaSetDevice");
  cuda::stream_t s = nullptr;
  check(ordinal, api_->stream_create(&s), "cudaStreamCreateWithFlags");
  auto st = std::make_unique<cuda_stream>(shared_from_this(), ordinal, sink, s);
  std::lock_guard guard{mu_};
  auto& slot = slots_[static_cast<std::size_t>(ordinal)];
  if (slot.stream)
    throw std::logic_error(fmt::format("cuda device {} already has a stream open", ordinal));
  slot.stream = st.get();
  return st;
}

bool cuda_driver::order_after(int ordinal, int other, uint64_t seq,
                              const std::function<void()>& wake) {
  std::lock_guard guard{mu_}; // the streams stay open meanwhile
  if (ordinal < 0 || other < 0 || ordinal >= count_ || other >= count_ || ordinal == other)
    return false;
  auto* mine = slots_[static_cast<std::size_t>(ordinal)].stream;
  auto* theirs = slots_[static_cast<std::size_t>(other)].stream;
  if (!mine || !theirs || slots_[static_cast<std::size_t>(ordinal)].quarantined.load())
    return false;
  // Counted before looking: a submission after the look sees the count and
  // waits for mu_, under which the waker is registered below (Dekker with
  // `submitted`, which pushes before it reads the count).
  auto& count = slots_[static_cast<std::size_t>(other)].wakers;
  count.fetch_add(1, std::memory_order_seq_cst);
  bool later = false;
  bool ok = theirs->order_waiter(*api_, mine->handle(), seq, later);
  if (ok)
    mine->may_write_host(); // the other device's copies to the host
  if (ok || !later || !wake) {
    count.fetch_sub(1, std::memory_order_seq_cst);
    return ok;
  }
  wakers_.push_back({ordinal, other, wake});
  return false;
}

bool cuda_driver::has_kernel(std::string_view name) const {
  static constexpr std::string_view known[] = {"fill",     "iota",   "scale", "axpy",
                                               "add_from_merge", "checksum", "spin_ns",
                                               "fail"};
  return std::find(std::begin(known), std::end(known), name) != std::end(known);
}

namespace {
/// A checksum summed on the host as the buffer's chunks arrive.
struct checksum_job {
  const kernel_call* call;
  std::string name;
  checksum_state state;
};
} // namespace

void cuda_driver::run_kernel(const std::string& name, const kernel_call& c) {
  auto& l = launching(name.c_str());
  l.driver_work = true;
  auto ord = l.stream->ordinal();
  auto s = l.stream->handle();
  clear_stale_error(ord);
  if (name == "fill") {
    auto xs = c.floats(0);
    check(ord, api_->launch_fill(xs.data(), xs.size(), static_cast<float>(c.real(1)), s),
          "fill kernel launch");
  } else if (name == "iota") {
    auto xs = c.floats(0);
    check(ord, api_->launch_iota(xs.data(), xs.size(), c.real(1), s), "iota kernel launch");
  } else if (name == "scale") {
    auto xs = c.floats(0);
    check(ord, api_->launch_scale(xs.data(), xs.size(), static_cast<float>(c.real(1)), s),
          "scale kernel launch");
  } else if (name == "axpy") {
    auto y = c.floats(0);
    auto x = c.floats(2);
    if (x.size() != y.size()) // refused by the kernel's check; defensive
      throw std::invalid_argument(
        fmt::format("axpy: Y has {} elements but X has {}", y.size(), x.size()));
    check(ord, api_->launch_axpy(y.data(), static_cast<float>(c.real(1)), x.data(), y.size(), s),
          "axpy kernel launch");
  } else if (name == "add_from_merge") {
    check_add_from_merge(c);
    auto dst = c.floats(0);
    auto mb = c.merge_buffer();
    check(ord,
          api_->launch_add(dst.data(), reinterpret_cast<const float*>(mb.data()), dst.size(), s),
          "add_from_merge kernel launch");
  } else if (name == "checksum") {
    auto src = c.buffer(0);
    (void)c.floats(0);
    // The bytes come to the host in stream order, a chunk of the staging
    // ring at a time; the staging thread sums and hashes each, and
    // publishes after the last, before the item completes.
    auto job = std::make_shared<checksum_job>(checksum_job{&c, c.string(1), {}});
    l.after.push_back([job] {});
    const auto total = src.size();
    auto take = [job, total](const std::byte* chunk, std::size_t off, std::size_t len) {
      job->state.add({chunk, len});
      if (off + len < total)
        return;
      try {
        auto r = job->state.result();
        job->call->publish(job->name, r.sum, r.hash, r.count);
      } catch (...) {
        // Publishing only allocates; out of memory loses this one result.
      }
    };
    if (total == 0)
      l.stream->host_job([take] { take(nullptr, 0, 0); });
    else
      l.stream->stage_out(src.data(), total, std::move(take));
  } else if (name == "spin_ns") {
    check(ord, api_->launch_spin(c.integer(0), s), "spin_ns kernel launch");
  } else if (name == "fail") {
    throw std::runtime_error(c.string(0));
  } else {
    driver::run_kernel(name, c);
  }
}

sexp cuda_driver::debug_info(int ordinal) const {
  auto info = sexp::list({sexp::atom("cuda")});
  if (ordinal < 0 || ordinal >= device_count())
    return info;
  std::size_t held = 0;
  std::size_t staging = 0;
  std::size_t flying = 0;
  std::string cause;
  {
    std::lock_guard guard{mu_};
    auto& slot = slots_[static_cast<std::size_t>(ordinal)];
    held = slot.bytes;
    if (slot.quarantined.load())
      cause = slot.quarantine_cause;
    if (slot.stream) {
      staging = slot.stream->staging_bytes();
      flying = slot.stream->in_flight();
    }
  }
  info.push_back(sexp::field("pool_bytes", std::to_string(held)));
  info.push_back(sexp::field("staging_bytes", std::to_string(staging)));
  info.push_back(sexp::field("in_flight", std::to_string(flying)));
  if (!in_host_callback) {
    std::size_t free = 0;
    std::size_t total = 0;
    device_scope scope{*api_, ordinal};
    if (scope.selected() == code::success &&
        api_->mem_get_info(&free, &total) == code::success) {
      info.push_back(sexp::field("memory_free", std::to_string(free)));
      info.push_back(sexp::field("memory_total", std::to_string(total)));
    }
  }
  info.push_back(sexp::field("quarantined", cause.empty() ? std::string{"no"} : cause));
  return info;
}

// -- cuda_stream ------------------------------------------------------------------

cuda_stream::cuda_stream(std::shared_ptr<cuda_driver> d, int ordinal, completion_sink& sink,
                         cuda::stream_t s)
  : d_(std::move(d)), api_(d_->api()), ordinal_(ordinal), sink_(sink), s_(s) {
  gate_->stream = this;
  watchdog_ = std::thread([this] { watchdog(); });
  try {
    stager_ = std::thread([this] { stager(); });
  } catch (...) {
    {
      std::lock_guard guard{mu_};
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    throw;
  }
}

/// What an abandoned stream may still use: kept, reachable, until the
/// process ends (the runtime may yet run the stream's work).
void keep_forever(std::shared_ptr<void> p) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<void>>* kept = new std::vector<std::shared_ptr<void>>;
  std::lock_guard guard{mu};
  kept->push_back(std::move(p));
}

bool cuda_stream::drain() {
  using clock = std::chrono::steady_clock;
  auto bound = d_->drain_bound();
  auto last_progress = clock::now();
  uint64_t seen = 0;
  {
    std::lock_guard guard{mu_};
    seen = completed_upto_;
  }
  for (;;) {
    auto st = api_.stream_query(s_);
    if (st == code::success)
      return true;
    if (cuda::is_async_fatal(st)) {
      // A lost context runs nothing more: its items fail (the watchdog).
      (void)api_.get_last_error();
      d_->quarantine(ordinal_, st, "cudaStreamQuery");
      return true;
    }
    std::unique_lock lk{mu_};
    if (completed_upto_ != seen) {
      seen = completed_upto_;
      last_progress = clock::now();
    }
    if (clock::now() - last_progress >= bound)
      return false;
    cv_.wait_for(lk, std::chrono::milliseconds{10}, [&] { return completed_upto_ != seen; });
  }
}

void cuda_stream::closing() {
  {
    std::lock_guard guard{mu_};
    closing_ = true;
    progress_seen_ = completed_upto_;
    progress_at_ = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
}

bool cuda_stream::stalled_locked() {
  auto now = std::chrono::steady_clock::now();
  if (completed_upto_ != progress_seen_) {
    progress_seen_ = completed_upto_;
    progress_at_ = now;
    return false;
  }
  return now - progress_at_ >= d_->drain_bound();
}

void cuda_stream::abandon(std::unique_lock<std::mutex>& lk) {
  abandon_ = true;
  stage_cv_.notify_all(); // the staging thread drops its jobs
  lk.unlock();
  d_->quarantine_one(
    ordinal_, fmt::format("cuda device {} is quarantined: its stream completed nothing for {} ms "
                          "while the device shut down; the work left on it was abandoned",
                          ordinal_, d_->drain_bound().count()));
  lk.lock();
}

cuda_stream::~cuda_stream() {
  // Everything submitted completes (or fails, on a lost device) and is
  // reported before the stream goes; a stream that completes nothing for
  // the drain bound (a kernel that never ends, a wait on an event that is
  // never recorded) is abandoned: its device is quarantined, its items fail,
  // and what its work may still use (the stream, its events, staging
  // buffers, the items' host-side jobs) is kept until the process ends.
  device_scope scope{api_, ordinal_};
  bool drained = false;
  {
    std::unique_lock lk{mu_};
    drained = !abandon_;
  }
  if (drained) {
    if (scope.selected() != code::success)
      (void)api_.get_last_error(); // a stream query needs no current device
    drained = drain();
  }
  if (!drained) {
    std::unique_lock lk{mu_};
    if (!abandon_)
      abandon(lk);
  }
  d_->stream_closed(ordinal_);
  {
    std::unique_lock lk{mu_};
    cv_.wait(lk, [&] { return fifo_.empty() && callbacks_running_ == 0; });
    stop_ = true;
    gate_->abandoned = !drained;
  }
  cv_.notify_all();
  stage_cv_.notify_all();
  watchdog_.join();
  stager_.join();
  if (!drained) {
    keep_forever(std::make_shared<std::vector<std::function<void()>>>(std::move(carry_)));
    keep_forever(gate_);
    d_->flush_deferred(ordinal_, s_); // stream-ordered: behind the work left
    return;
  }
  for (auto& f : carry_)
    f();
  carry_.clear();
  d_->flush_deferred(ordinal_, s_);
  for (auto* e : slot_read_)
    if (e)
      events_.push_back(e);
  if (enter_read_)
    events_.push_back(enter_read_);
  for (auto* e : events_)
    d_->settle(ordinal_, api_.event_destroy(e), "cudaEventDestroy");
  d_->settle(ordinal_, api_.stream_synchronize(s_), "cudaStreamSynchronize"); // the frees above
  for (auto* p : ring_)
    if (p)
      d_->settle(ordinal_, api_.free_host(p), "cudaFreeHost");
  if (signal_)
    d_->settle(ordinal_, api_.free_host(signal_), "cudaFreeHost");
  d_->settle(ordinal_, api_.stream_destroy(s_), "cudaStreamDestroy");
}

cuda::event_t cuda_stream::take_event() {
  {
    std::lock_guard guard{mu_};
    if (!events_.empty()) {
      auto e = events_.back();
      events_.pop_back();
      return e;
    }
  }
  cuda::event_t e = nullptr;
  d_->check(ordinal_, api_.event_create(&e), "cudaEventCreateWithFlags");
  std::lock_guard guard{mu_};
  ++events_made_;
  return e;
}

std::size_t cuda_stream::stage_slot() {
  std::size_t i = 0;
  {
    std::lock_guard guard{mu_};
    i = ring_next_;
    ring_next_ = (ring_next_ + 1) % ring_.size();
    if (ring_[i])
      return i;
  }
  void* raw = nullptr;
  auto st = api_.malloc_host(&raw, cuda_staging_chunk);
  if (st == code::memory_allocation) {
    (void)api_.get_last_error();
    throw std::bad_alloc{};
  }
  d_->check(ordinal_, st, "cudaMallocHost");
  std::lock_guard guard{mu_};
  ring_[i] = static_cast<std::byte*>(raw);
  return i;
}

std::byte* cuda_stream::stage_piece(std::size_t len) {
  constexpr std::size_t align = 256;
  if (in_chunk_ && cur_off_ + len <= cuda_staging_chunk) {
    auto* at = ring_[cur_] + cur_off_;
    cur_off_ += (len + align - 1) & ~(align - 1);
    return at;
  }
  auto next = stage_slot(); // may throw: the current chunk stays
  if (in_chunk_) {
    // Leaving the chunk: a fill that reuses it waits for the device's reads
    // of it (recorded now, after all of them).
    if (enter_read_) {
      std::lock_guard guard{mu_};
      events_.push_back(std::exchange(enter_read_, nullptr));
    }
    if (cur_read_)
      slot_read_[cur_] = mark();
  }
  in_chunk_ = true;
  cur_ = next;
  cur_read_ = false;
  enter_read_ = std::exchange(slot_read_[next], nullptr);
  enter_ticket_ = slot_host_[next];
  cur_off_ = (len + align - 1) & ~(align - 1);
  return ring_[next];
}

uint32_t* cuda_stream::signal_word() {
  if (signal_) [[likely]]
    return signal_;
  void* raw = nullptr;
  auto st = api_.malloc_host(&raw, sizeof(uint32_t));
  if (st == code::memory_allocation) {
    (void)api_.get_last_error();
    throw std::bad_alloc{};
  }
  d_->check(ordinal_, st, "cudaMallocHost");
  signal_ = static_cast<uint32_t*>(raw);
  api_.host_signal(signal_, 0);
  return signal_;
}

cuda::event_t cuda_stream::mark() {
  auto e = take_event();
  auto st = api_.event_record(e, s_);
  if (st != code::success) [[unlikely]] {
    // Not trusted again (see `submit`).
    d_->settle(ordinal_, api_.event_destroy(e), "cudaEventDestroy");
    d_->fail(ordinal_, st, "cudaEventRecord");
  }
  return e;
}

uint32_t cuda_stream::post(stage_job j) {
  j.ticket = ++ticket_next_;
  auto t = j.ticket;
  {
    std::lock_guard guard{mu_};
    stage_q_.push_back(std::move(j));
  }
  stage_cv_.notify_one();
  return t;
}

void cuda_stream::wait_ticket(uint32_t t) {
  if (static_cast<int32_t>(t - stream_waited_) <= 0)
    return; // the stream already waits for it (or a later one)
  d_->check(ordinal_, api_.stream_wait_value(s_, signal_word(), t), "cuStreamWaitValue32");
  stream_waited_ = t;
}

void cuda_stream::stage_in(std::byte* dst, const std::byte* src, std::size_t n) {
  (void)signal_word(); // before anything is queued: a failure leaves nothing behind
  // The host bytes are read once the stream's earlier work that may
  // write them is done.
  cuda::event_t earlier = nullptr;
  if (host_writer_.exchange(false, std::memory_order_relaxed))
    earlier = mark();
  for (std::size_t off = 0; off < n; off += cuda_staging_chunk) {
    auto len = std::min(cuda_staging_chunk, n - off);
    stage_job j;
    if (earlier)
      j.waits.push_back(std::exchange(earlier, nullptr));
    auto* buf = stage_piece(len);
    if (enter_read_) // the device's reads of the chunk's previous use
      j.waits.push_back(std::exchange(enter_read_, nullptr));
    j.work = [buf, from = src + off, len] { std::memcpy(buf, from, len); };
    auto t = post(std::move(j));
    slot_host_[cur_] = t;
    cur_read_ = true;
    wait_ticket(t);
    d_->check(ordinal_, api_.memcpy_async(dst + off, buf, len, s_), "cudaMemcpyAsync");
  }
}

void cuda_stream::stage_out(const std::byte* src, std::size_t n,
                            std::function<void(const std::byte*, std::size_t, std::size_t)> take) {
  (void)signal_word();
  auto shared = std::make_shared<decltype(take)>(std::move(take));
  uint32_t last = 0;
  for (std::size_t off = 0; off < n; off += cuda_staging_chunk) {
    auto len = std::min(cuda_staging_chunk, n - off);
    auto* buf = stage_piece(len);
    wait_ticket(enter_ticket_); // the host is done with the chunk's previous use
    d_->check(ordinal_, api_.memcpy_async(buf, src + off, len, s_), "cudaMemcpyAsync");
    stage_job j;
    j.waits.push_back(mark());
    j.work = [shared, buf, off, len] { (*shared)(buf, off, len); };
    last = post(std::move(j));
    slot_host_[cur_] = last;
  }
  // The stream goes on: the item completes once the last job ran (its
  // ticket), a device that waits for the item waits for the ticket too,
  // and so does a user's launch on this stream (`user_launches`); later
  // staging jobs run after it anyway.
  (void)last;
}

void cuda_stream::host_job(std::function<void()> work) {
  (void)signal_word();
  stage_job j;
  if (host_writer_.exchange(false, std::memory_order_relaxed))
    j.waits.push_back(mark());
  j.work = std::move(work);
  (void)post(std::move(j)); // as `stage_out`
}

void cuda_stream::user_launches() noexcept {
  may_write_host();
  auto t = out_pending();
  if (t == 0)
    return;
  auto st = api_.stream_wait_value(s_, signal_, t);
  if (st == code::success) {
    stream_waited_ = t;
    return;
  }
  // The stream cannot wait: the caller does, until the jobs ran (they
  // need only work already queued) or the stream failed.
  d_->settle(ordinal_, st, "cuStreamWaitValue32");
  std::unique_lock lk{mu_};
  while (!staged(t) && !quarantine_ && !abandon_)
    cv_.wait_for(lk, std::chrono::microseconds{100});
}

/// Event queries the staging thread makes, yielding between them, before
/// it sleeps between them.
constexpr unsigned stage_spins = 16;

bool cuda_stream::stage_wait(cuda::event_t e) {
  unsigned polls = 0;
  for (;;) {
    auto st = api_.event_query(e);
    if (st == code::success)
      return true;
    if (st != code::not_ready) {
      (void)api_.get_last_error();
      d_->quarantine(ordinal_, st, "cudaEventQuery");
      return false;
    }
    std::unique_lock lk{mu_};
    if (quarantine_ || abandon_)
      return false;
    // Not yet: the stream is usually about to get there (the job was
    // queued with the work before it), so the first queries only yield;
    // then, as the completion thread, sleeps of 20 us growing to 1 ms.
    if (++polls <= stage_spins) {
      lk.unlock();
      std::this_thread::yield();
      continue;
    }
    auto nap = std::chrono::microseconds{std::min(1000u, 20u * (polls - stage_spins))};
    stage_cv_.wait_for(lk, nap, [&] { return quarantine_ || abandon_; });
  }
}

void cuda_stream::stager() {
  std::unique_lock lk{mu_};
  for (;;) {
    stage_cv_.wait(lk, [&] { return stop_ || !stage_q_.empty(); });
    if (stage_q_.empty())
      return; // stopping, nothing left
    auto j = std::move(stage_q_.front());
    stage_q_.pop_front();
    // A failed or abandoned stream's jobs are dropped: the items they
    // serve fail, and their buffers may go (`fail_in_flight` waits while
    // a job runs).
    bool ok = !quarantine_ && !abandon_;
    stage_busy_ = ok;
    lk.unlock();
    for (auto* e : j.waits)
      ok = ok && stage_wait(e);
    if (ok) {
      j.work();
      api_.host_signal(signal_, j.ticket);
    }
    j.work = nullptr;
    lk.lock();
    for (auto* e : j.waits)
      events_.push_back(e);
    stage_busy_ = false;
    if (quarantine_ || watch_ticket_)
      cv_.notify_all(); // `fail_in_flight` or the completion thread waits for it
  }
}

void cuda_stream::submit(uint64_t seq, std::function<void()> work) {
  struct in_submit {
    cuda_stream* outer = std::exchange(submitting, nullptr);
    explicit in_submit(cuda_stream* s) { submitting = s; }
    ~in_submit() { submitting = outer; }
  } scope{this};
  d_->refuse_if_quarantined(ordinal_);
  d_->check(ordinal_, api_.set_device(ordinal_), "cudaSetDevice");
  if (d_->has_deferred(ordinal_))
    d_->flush_deferred(ordinal_, s_);
  launch l{this, false, {}};
  current = &l;
  try {
    work();
  } catch (...) {
    current = nullptr;
    // What it launched before it threw still runs: its buffers stay until
    // a later item completes.
    std::lock_guard guard{mu_};
    for (auto& f : l.after)
      carry_.push_back(std::move(f));
    throw;
  }
  current = nullptr;
  // A closure may have selected another device: the event below and the
  // host function must go to this one (an event made on another device
  // fails its record, and the item would retire before its work ran).
  if (!l.driver_work)
    d_->check(ordinal_, api_.set_device(ordinal_), "cudaSetDevice");
  auto keep_after = [&] {
    std::lock_guard guard{mu_};
    for (auto& f : l.after)
      carry_.push_back(std::move(f));
  };
  cuda::event_t ev = nullptr;
  try {
    ev = take_event();
    d_->check(ordinal_, api_.event_record(ev, s_), "cudaEventRecord");
  } catch (...) {
    // An event whose record failed is not trusted again: destroyed, not
    // pooled (it may belong to another device).
    if (ev)
      d_->settle(ordinal_, api_.event_destroy(ev), "cudaEventDestroy");
    keep_after();
    throw;
  }
  {
    std::lock_guard guard{mu_};
    for (auto& f : carry_)
      l.after.push_back(std::move(f));
    carry_.clear();
    fifo_.push_back({seq, ev, std::move(l.after), out_pending()});
  }
  d_->submitted(ordinal_);
  cv_.notify_all(); // the completion thread watches what is in flight
}

bool cuda_stream::order_waiter(cuda::api& api, cuda::stream_t waiter, uint64_t seq,
                               bool& later) {
  std::lock_guard guard{mu_};
  if (quarantine_)
    return false; // the host fails the wait
  for (auto& f : fifo_)
    if (f.seq == seq) {
      if (api.stream_wait_event(waiter, f.event) != code::success
          || (!staged(f.ticket) && api.stream_wait_value(waiter, signal_, f.ticket) != code::success)) {
        (void)api.get_last_error();
        return false; // the host waits instead
      }
      return true;
    }
  if (seq <= completed_upto_)
    return true;
  // Not taken yet, unless something after it was (then it is not an item
  // the stream runs: a wait, or dropped; the host resolves it).
  later = fifo_.empty() || fifo_.back().seq < seq;
  return false;
}

void cuda_stream::quarantine_now() {
  {
    std::lock_guard guard{mu_};
    quarantine_ = true;
  }
  cv_.notify_all();
  stage_cv_.notify_all();
}

void cuda_stream::fail_in_flight(std::unique_lock<std::mutex>& lk) {
  // A staging job may be copying into an item's buffers: it ends (its
  // waits see the quarantine) before the items fail.
  cv_.wait(lk, [&] { return !stage_busy_; });
  std::deque<flying> lost;
  lost.swap(fifo_);
  ++callbacks_running_;
  const bool keep = abandon_;
  lk.unlock();
  std::exception_ptr err;
  try {
    throw cuda_error(d_->describe(ordinal_, code::unknown, "the stream"), code::unknown, true);
  } catch (...) {
    err = std::current_exception();
  }
  try {
    d_->refuse_if_quarantined(ordinal_);
  } catch (...) {
    err = std::current_exception(); // the quarantine's own cause
  }
  for (auto& f : lost) {
    if (keep) // the stream may still run the item's host functions
      keep_forever(std::make_shared<std::vector<std::function<void()>>>(std::move(f.after)));
    else
      for (auto& a : f.after)
        a();
    sink_.completed(f.seq, err);
  }
  lk.lock();
  for (auto& f : lost)
    events_.push_back(f.event); // destroyed with the stream
  --callbacks_running_;
  cv_.notify_all();
}

void cuda_stream::complete_front(std::unique_lock<std::mutex>& lk) {
  auto f = std::move(fifo_.front());
  fifo_.pop_front();
  // Waits recorded on it keep what they captured: it may be recorded again.
  events_.push_back(f.event);
  completed_upto_ = f.seq;
  ++callbacks_running_;
  lk.unlock();
  for (auto& a : f.after)
    a();
  f.after.clear();
  sink_.completed(f.seq, nullptr);
  lk.lock();
  --callbacks_running_;
  cv_.notify_all();
}

void cuda_stream::watchdog() {
  // The stream's completion thread: it asks the items' events
  // (`cudaEventQuery`) and reports the items that completed, in seq order,
  // so no completion waits for a host function (CUDA may run the host
  // functions of all streams one at a time). It polls while items are in
  // flight, sleeping 20 us growing to 1 ms between queries; an idle stream
  // sleeps on the condition variable.
  using namespace std::chrono_literals;
  std::unique_lock lk{mu_};
  unsigned polls = 0;
  for (;;) {
    cv_.wait(lk, [&] {
      return stop_ || !fifo_.empty() || d_->has_deferred(ordinal_);
    });
    if (quarantine_ && !fifo_.empty()) {
      fail_in_flight(lk);
      continue;
    }
    if (d_->has_deferred(ordinal_) && !stop_) {
      lk.unlock();
      // On failure the frees fail too: dropped (the runtime frees at exit).
      if (d_->settle(ordinal_, api_.set_device(ordinal_), "cudaSetDevice"))
        d_->flush_deferred(ordinal_, s_);
      lk.lock();
      continue;
    }
    if (stop_)
      return;
    if (fifo_.empty()) {
      polls = 0;
      continue;
    }
    if (closing_ && !abandon_ && stalled_locked()) {
      abandon(lk);
      continue;
    }
    // The newest item first: once it completed, so did every item before
    // it (one stream, in order), and all are reported at one query; else
    // the oldest.
    auto ev = fifo_.back().event;
    auto seq = fifo_.back().seq;
    bool newest = fifo_.size() > 1;
    lk.unlock();
    auto st = api_.event_query(ev);
    if (newest && st == code::not_ready) {
      lk.lock();
      if (fifo_.empty())
        continue;
      ev = fifo_.front().event;
      seq = fifo_.front().seq;
      lk.unlock();
      st = api_.event_query(ev);
    }
    lk.lock();
    if (st == code::success) {
      polls = 0;
      while (!quarantine_ && !fifo_.empty() && fifo_.front().seq <= seq) {
        if (auto t = fifo_.front().ticket; !staged(t)) {
          // Its copy to the host is still on the staging thread.
          watch_ticket_ = true;
          cv_.wait(lk, [&] { return stop_ || quarantine_ || staged(t); });
          watch_ticket_ = false;
          break;
        }
        complete_front(lk);
      }
      continue;
    }
    if (st != code::not_ready) {
      // Whatever the event reports but success and not-ready is fatal: the
      // stream's work is lost (whether this build lists the code or not).
      lk.unlock();
      (void)api_.get_last_error();
      d_->quarantine(ordinal_, st, "cudaEventQuery");
      lk.lock();
      continue;
    }
    // Not yet: sleep, longer each time (20 us, 40 us, ... up to 1 ms).
    ++polls;
    auto nap = std::chrono::microseconds{std::min(1000u, 20u * polls)};
    cv_.wait_for(lk, nap, [&] { return stop_ || quarantine_ || fifo_.empty(); });
  }
}

std::size_t cuda_stream::staging_bytes() const {
  std::lock_guard guard{mu_};
  return cuda_staging_chunk
         * static_cast<std::size_t>(std::count_if(ring_.begin(), ring_.end(),
                                                  [](std::byte* p) { return p != nullptr; }));
}

std::size_t cuda_stream::in_flight() const {
  std::lock_guard guard{mu_};
  return fifo_.size();
}

} // namespace

std::shared_ptr<driver> make_cuda_driver(std::shared_ptr<cuda::api> api,
                                         std::optional<int> num_devices, std::string backend) {
  return std::make_shared<cuda_driver>(std::move(api), num_devices, std::move(backend));
}

void set_cuda_drain_bound(driver& d, std::chrono::milliseconds bound) {
  if (auto* c = dynamic_cast<cuda_driver*>(&d))
    c->set_drain_bound(bound);
}

cuda::api* api_of(driver& d) noexcept {
  auto* c = dynamic_cast<cuda_driver*>(&d);
  return c ? c->api_ptr() : nullptr;
}

void* current_cuda_stream() noexcept {
  if (!current || !current->stream)
    return nullptr;
  current->stream->user_launches(); // the caller launches its own work
  return current->stream->handle();
}

} // namespace multidev::detail

namespace multidev {

void* current_cuda_stream() noexcept {
  return detail::current_cuda_stream();
}

} // namespace multidev
