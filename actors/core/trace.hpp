#pragma once
/// \file
/// The ring behind a device's runner trace (`multidev/trace.hpp`), and the
/// log of what host threads saw of a device (`host_span`).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/core/spin.hpp"
#include "multidev/sexp.hpp"
#include "multidev/trace.hpp"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace multidev::detail {

/// The trace clock (`trace_clock_ns`). A runner reads it once per item, and
/// `steady_clock::now()` costs ~26 ns on this guest (kvm-clock), more than a
/// bare closure's whole run; the CPU's time-stamp counter costs ~11. So on
/// x86-64 with an invariant TSC (constant rate, synchronized across cores)
/// the clock is the counter scaled to nanoseconds, calibrated once against
/// `steady_clock` (a few ms, on first use; it then runs at steady_clock's
/// rate within ~0.01%, from steady_clock's time at calibration). Elsewhere it
/// is `steady_clock`. Thread-safe; one instance per process.
class trace_clock {
public:
  static const trace_clock& get();

  /// Now, read after every earlier load of this thread has completed: a
  /// time read after observing another thread's write is not earlier than
  /// that thread's reads before its write.
  int64_t now() const noexcept {
#if defined(__x86_64__)
    if (tsc_) {
      _mm_lfence();
      return at(__rdtsc());
    }
#endif
    return steady_ns();
  }

  /// Now, possibly read a few instructions early (no fence): for the end of
  /// an item, where that is noise.
  int64_t now_relaxed() const noexcept {
#if defined(__x86_64__)
    if (tsc_)
      return at(__rdtsc());
#endif
    return steady_ns();
  }

  /// Whether the time-stamp counter backs the clock.
  bool uses_tsc() const noexcept { return tsc_; }

private:
  trace_clock();
  static int64_t steady_ns() noexcept;
  int64_t at(uint64_t tsc) const noexcept {
    auto ticks = static_cast<int64_t>(tsc - base_tsc_);
    return base_ns_ + static_cast<int64_t>((static_cast<__int128>(ticks) * mult_) >> 32);
  }

  bool tsc_ = false;
  uint64_t base_tsc_ = 0;
  int64_t base_ns_ = 0;
  int64_t mult_ = 0; // nanoseconds per tick, times 2^32
};

/// What the trace calls a task without a description, and what its error
/// message says: `task#<seq>`, stable for the life of the device.
std::string nameless_task_name(uint64_t seq);

/// What this process saw of one device from outside its runner
/// (`host_span`: host threads' blocking waits, its node's loss), kept with
/// tracing on: the last `capacity` spans. Written off the hot path (by a
/// thread that blocked, by the link that declared the device lost), under a
/// mutex; copied out by `backend::trace`.
class host_span_log {
public:
  /// `capacity` at least 1.
  explicit host_span_log(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

  /// Appends `s`, dropping the oldest span when full. Never throws: a span
  /// that cannot be stored (out of memory) is left out.
  void add(host_span s) noexcept;
  /// The spans held, in the order they were added.
  std::vector<host_span> read() const;

private:
  mutable std::mutex mu_;
  std::size_t capacity_;
  std::deque<host_span> spans_;
};

/// The last `capacity` records of one runner, kept so that a reader can copy
/// them while the runner goes on (`backend::trace`, `get_debug_info`).
///
/// The problem: the runner must not slow down much for it (a bare closure
/// costs the runner ~15 ns), a record may hold strings, which must not be
/// read while they are written, and a reader must never stop the runner for
/// longer than one record. So each slot is a sequence lock: the one writer (the
/// runner thread; on an asynchronous driver, whichever thread resolves items,
/// one at a time under the device's retire lock) marks the slot busy, stores
/// the fixed fields (atomics, plain stores on x86) and then its index; a reader
/// copies them and checks the index again. The strings are written only under
/// `mu_`, and only for records that have them (a bare closure has none and
/// takes no lock); a reader holds `mu_` while it copies one slot. Readers walk
/// from the newest record back and stop at the first slot the runner has
/// overwritten meanwhile, so a copy is always a contiguous run of records, in
/// order.
/// Slots keep their strings' capacity: once the ring has wrapped, writing a
/// record allocates nothing unless a text is longer than the one it replaces.
///
/// A device's trace is its runner's records and what host threads saw of it
/// (`host_span`): the ring keeps both, the spans in a `host_span_log` of the
/// same capacity, so the device holds one trace object, null when tracing is
/// off.
class trace_ring {
public:
  /// What one record holds besides its description, as the runner passes it.
  struct entry {
    uint64_t seq = 0;
    trace_kind kind = trace_kind::task;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    bool failed = false;
    uint64_t awaited_seq = 0;
  };

  /// `capacity` at least 1. Calibrates the trace clock if no one did yet.
  explicit trace_ring(std::size_t capacity);

  std::size_t capacity() const noexcept { return capacity_; }
  const trace_clock& clock() const noexcept { return clock_; }

  /// Appends a record without texts (a nameless task: read back as
  /// `task#<seq>`), overwriting the oldest once the ring is full; the hot
  /// path, a few plain stores. Writer only (the runner thread).
  void write(const entry& e) noexcept {
    auto& s = slots_[next_];
    open_slot(s, e);
    s.bits.store(bits_of(e), std::memory_order_relaxed);
    close_slot(s, e);
  }

  /// The same with texts, copied under the readers' lock; empty texts take
  /// the path above. Never throws: a text that cannot be copied (out of
  /// memory) is left out.
  void write(const entry& e, std::string_view description,
             std::string_view awaited_device) noexcept;

  /// The end time of the last record written; writer only. The runner starts
  /// the next item of a batch there instead of reading the clock again.
  int64_t last_end_ns() const noexcept { return last_end_; }

  /// The item the runner is running, started at `start_ns`, until its record
  /// is written (the ring only keeps the pointer for its owner); writer only.
  /// `end_ns`: when it ended, if known already (an asynchronous driver's
  /// report); 0 to read the clock when the record is written.
  void begin(const void* item, int64_t start_ns, int64_t end_ns = 0) noexcept {
    running_ = item;
    running_start_ = start_ns;
    running_end_ = end_ns;
  }
  /// Notes `text`, the description of item `seq` the runner is about to
  /// run, for a reader that asks what runs now (`running_text`): a
  /// deadline's chain names the task a device is running. Writer only;
  /// described items only (a bare closure has no text and takes no lock).
  /// Never throws: a text that cannot be copied is left out.
  void note_running(uint64_t seq, std::string_view text) noexcept;
  /// The description `note_running` noted for `seq`, if that is the last
  /// item it noted; empty otherwise. Any thread.
  std::string running_text(uint64_t seq) const;

  /// The item `begin` set, which is then forgotten; null when none.
  const void* take_running() noexcept { return std::exchange(running_, nullptr); }
  bool running() const noexcept { return running_ != nullptr; }
  int64_t running_start_ns() const noexcept { return running_start_; }
  /// The end `begin` was given, or now.
  int64_t running_end_ns() const noexcept {
    return std::max(running_start_, running_end_ != 0 ? running_end_ : clock_.now_relaxed());
  }

  /// Records written so far, overwritten ones included. Any thread.
  uint64_t written() const noexcept { return written_.load(std::memory_order_acquire); }

  /// Copies the newest `last` records still held (all by default), oldest
  /// first, as of the call; `dropped` counts the records older than those
  /// that the ring no longer holds. Any thread; the runner waits at most for
  /// the copy of one record.
  device_trace read(std::size_t last = SIZE_MAX) const;
  /// `read()` with the host spans, as the trace of `device`. Any thread.
  device_trace snapshot(std::string device) const;
  /// `(trace (capacity ..) (recorded ..) (dropped ..) (last <record>...))`
  /// with the newest `last` records, for debug info. Any thread.
  sexp info(std::size_t last) const;
  /// The host threads' blocking waits on this device (`host_wait_scope`).
  /// Any thread.
  host_span_log& host_spans() noexcept { return host_; }

private:
  /// `index` while a slot is written (and before its first record).
  static constexpr uint64_t busy = UINT64_MAX;
  static constexpr uint32_t failed_bit = 1u << 8;
  static constexpr uint32_t text_bit = 1u << 9; // the strings belong to this record

  static uint32_t bits_of(const entry& e) noexcept {
    return static_cast<uint32_t>(e.kind) | (e.failed ? failed_bit : 0u);
  }

  struct alignas(64) slot {
    std::atomic<uint64_t> index{busy}; // which record this is (written_ before it)
    std::atomic<uint64_t> seq{0};
    std::atomic<int64_t> start_ns{0};
    std::atomic<int64_t> end_ns{0};
    std::atomic<uint64_t> awaited_seq{0};
    std::atomic<uint32_t> bits{0}; // kind, failed_bit, text_bit
    // Written under mu_ only.
    std::string description;
    std::string awaited_device;
  };

  /// Marks `s` busy and stores `e`'s fields (Boehm's sequence lock: a
  /// reader that saw any of these stores sees `busy` when it loads the
  /// index again).
  void open_slot(slot& s, const entry& e) noexcept {
    s.index.store(busy, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.seq.store(e.seq, std::memory_order_relaxed);
    s.start_ns.store(e.start_ns, std::memory_order_relaxed);
    s.end_ns.store(e.end_ns, std::memory_order_relaxed);
    s.awaited_seq.store(e.awaited_seq, std::memory_order_relaxed);
  }
  /// Publishes the record in `s` and moves on.
  void close_slot(slot& s, const entry& e) noexcept {
    s.index.store(count_, std::memory_order_release);
    written_.store(++count_, std::memory_order_release);
    if (++next_ == capacity_)
      next_ = 0;
    last_end_ = e.end_ns;
  }

  const trace_clock& clock_;
  std::size_t capacity_;
  std::unique_ptr<slot[]> slots_;
  // Writer only.
  uint64_t count_ = 0;   // records written
  std::size_t next_ = 0; // the slot the next record goes to
  int64_t last_end_ = 0;
  const void* running_ = nullptr;
  int64_t running_start_ = 0;
  int64_t running_end_ = 0;
  // Shared with readers.
  alignas(64) mutable spin_mutex mu_;
  // The last described item the runner began, and its text; under mu_.
  uint64_t running_seq_ = 0;
  std::string running_text_;
  std::atomic<uint64_t> written_{0};
  // Written by host threads, off the runner's lines.
  alignas(64) host_span_log host_;
};

/// The calling thread's number in host spans: 1, 2, ... in the order
/// threads first ask, for the life of the process.
uint64_t host_thread_number() noexcept;

/// Records, in `log`, the blocking wait of the calling thread for `seq` of
/// the device named `device`, from construction to destruction; a wait left
/// by an exception is marked failed. A null `log` (tracing off, or the
/// thread is a device's runner, whose item's slice shows the wait already)
/// records nothing and costs nothing else.
class host_wait_scope {
public:
  host_wait_scope(host_span_log* log, const char* what, const std::string& device,
                  uint64_t seq) noexcept
    : log_(log), what_(what), device_(device), seq_(seq),
      start_ns_(log ? trace_clock::get().now() : 0),
      exceptions_(log ? std::uncaught_exceptions() : 0) {}
  ~host_wait_scope();
  host_wait_scope(const host_wait_scope&) = delete;
  host_wait_scope& operator=(const host_wait_scope&) = delete;

private:
  host_span_log* log_;
  const char* what_;
  const std::string& device_;
  uint64_t seq_;
  int64_t start_ns_;
  int exceptions_;
};

} // namespace multidev::detail
