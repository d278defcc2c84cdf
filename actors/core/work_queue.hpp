#pragma once
/// \file
/// A device's work queue: many producers append entries, one runner takes
/// them all at once, and a full queue holds producers back (backpressure,
/// never a drop). The runner's doorbell lives here too, since a push decides
/// under the queue's lock whether to ring it.
///
/// Invariants:
/// - `scheduled()` is the seq of the last entry appended; seqs are dense
///   (1, 2, ...) and an entry's seq is its place in append order.
///   `scheduled() - taken` entries are queued; `taken` only grows.
/// - While `refusing` (stopping, or failed), every push is refused: `push`
///   calls its `refuse` (which throws) and appends nothing. Stopping is for
///   good; failing lasts until `accept_again_locked`.
/// - A producer waits for room only when it asked to (`may_wait`), the queue
///   holds `capacity` entries or more, and `never_waits()` is false (runner
///   threads never wait: a runner waiting for room in a queue parked on its
///   own next event would wait forever). Each `take` and each refusal wakes
///   the producers waiting.
/// - `room_until` never exceeds `taken + capacity` as of some look under
///   the lock: while `scheduled() < room_until` there is room, and
///   `wait_for_room` returns without the lock.
/// - The runner marks itself asleep (`sleeping`: `for_work` or `on_gate`)
///   before it looks at what it waits for, and whoever clears the mark rings
///   the bell (Dekker, both sides seq_cst): no ring is lost. A push rings
///   only a runner asleep `for_work`; one `on_gate` waits for its gate (or a
///   cancel, kill or stop), which rings it itself.
///
/// Threads: `push`, `wait_for_room`, `has_room`, `notify_when_room`,
/// `scheduled`, `ring` and the readers: any thread. `take`, `untaken`,
/// `has_untaken`, `sleep_*` and `settle_idle_runner`: the runner only (the
/// one thread that consumes). The lock (`mutex()`) also guards the owner's
/// failure state, so that a push checks both in one section; `*_locked`
/// members need it held.
///
/// Layout: the first line holds what every push touches (the lock, the
/// entries, the counters, the doorbell); the second what a push reads
/// (capacity, refusals) and a described task's text; the third what the
/// runner writes as it takes (`taken`) and the rarely used room waits.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "actors/core/spin.hpp"

namespace multidev::detail {

/// How many entries ahead a producer prefetches its slot for writing (and a
/// device's runner the entries for reading).
inline constexpr std::size_t queue_prefetch_items = 6;

/// `Item` is built in place from `(work, extra)`; `Item::flags(extra)` says
/// whether the runner must look at the entry before it runs it (a device:
/// an order or a wait), and `take` reports whether a batch has any.
template <class Item>
class work_queue {
public:
  using lock_type = spin_mutex;
  /// Why the runner sleeps: not (`awake`), for work (a push rings it), or at
  /// a gate (only the gate, a cancel, kill or stop rings it).
  enum sleep_state : uint8_t { awake, for_work, on_gate };
  /// What `take` took.
  struct taken {
    bool took = false;       ///< whether there was anything
    bool flagged = false;    ///< whether an entry taken is flagged (`Item::flags`)
    bool wants_room = false; ///< a room callback waits: call `call_room_callback`
  };

  /// `capacity`: entries queued before a producer that may wait does (0
  /// reads as 1). `never_waits`: whether the calling thread must never wait
  /// for room; asked only when the queue is full.
  work_queue(std::size_t capacity, bool (*never_waits)() noexcept)
    : capacity_(capacity == 0 ? 1 : capacity), never_waits_(never_waits) {
    room_until_.store(capacity_, std::memory_order_relaxed);
  }
  work_queue(const work_queue&) = delete;
  work_queue& operator=(const work_queue&) = delete;

  // -- Producers (any thread) ------------------------------------------------

  /// Appends an entry built in its slot from `work` and `make_extra(text)`
  /// (called under the lock with the queue's text buffer, which moves with
  /// the batch); returns its seq and rings a runner asleep for work. When
  /// the queue is full and `may_wait`, waits for room first (unless
  /// `never_waits()`). While refusing, calls `refuse()` under the lock,
  /// which must throw. Inlined: a bare closure's push is the hot path.
  template <class Work, class MakeExtra, class Refuse>
  [[gnu::always_inline]] uint64_t push(bool may_wait, Work&& work, MakeExtra&& make_extra,
                                       Refuse&& refuse) {
    bool wake;
    uint64_t seq;
    {
      std::lock_guard guard{mu_};
      // The vector's size and capacity are each a division (a device's
      // entry is 40 bytes): read once.
      auto n = entries_.size();
      if (may_wait && n >= capacity_) [[unlikely]]
        n = wait_for_room_held();
      if (failed_ || stopping_) [[unlikely]]
        refuse();
      auto extra = make_extra(text_);
      flagged_ += Item::flags(extra);
      auto cap = entries_.capacity(); // unchanged by this push when n < cap
      // Built in its slot: a closure moved once, not into an item and again.
      entries_.emplace_back(std::forward<Work>(work), std::move(extra));
      // The next entries' lines were last read by the runner (the buffers
      // swap back and forth): ask for them now, so the transfer overlaps
      // this push.
      if (auto ahead = n + 1 + queue_prefetch_items; ahead < cap)
        prefetch_for_write(entries_.data() + ahead);
      seq = scheduled_.load(std::memory_order_relaxed) + 1;
      scheduled_.store(seq, std::memory_order_release);
      // The runner sets sleeping_ for an empty queue under mu_, so a plain
      // load suffices to skip the read-modify-write on the common path. A
      // runner parked on a wait is left asleep (see sleep_state).
      // Compare-and-swap, not exchange: a runner that woke meanwhile and
      // parked on a wait must keep its on_gate, or the wait's ring is lost.
      auto expected = uint8_t{for_work};
      wake = sleeping_.load(std::memory_order_relaxed) == for_work &&
             sleeping_.compare_exchange_strong(expected, awake);
    }
    if (wake)
      ring_bell();
    return seq;
  }

  /// Waits until the queue has room (or refuses); returns at once when
  /// `never_waits()`. Reserves nothing.
  void wait_for_room() {
    // Without the lock while the last look still vouches for room: a host
    // copy checks room before it takes its records' locks and pushes, and
    // taking mu_ twice took the queue's line from the runner (polling
    // scheduled_ beside it) twice.
    if (scheduled_.load(std::memory_order_relaxed) < room_until_.load(std::memory_order_relaxed) ||
        never_waits_())
      return;
    std::unique_lock lk{mu_};
    wait_for_room_locked(lk);
    // Here, not in wait_for_room_locked: a bare push calls that one, and
    // reading taken_ (on the runner's line) there cost every push.
    room_until_.store(taken_ + capacity_, std::memory_order_relaxed);
  }
  /// Whether another entry fits without waiting (or a push fails at once).
  bool has_room() const noexcept {
    std::lock_guard guard{mu_};
    return has_room_locked();
  }
  /// Flow control for producers that must not block: false when
  /// `has_room()`; otherwise stores `cb` (replacing an earlier one) for
  /// `call_room_callback` and returns true.
  bool notify_when_room(std::function<void()> cb) {
    std::lock_guard guard{mu_};
    if (has_room_locked())
      return false;
    room_cb_ = std::move(cb);
    return true;
  }
  /// Calls the stored room callback once, if any, outside the lock; an
  /// exception it throws is swallowed (its producer asks again later).
  void call_room_callback() noexcept {
    std::function<void()> cb;
    {
      std::lock_guard guard{mu_};
      cb.swap(room_cb_);
    }
    if (cb) {
      try {
        cb();
      } catch (...) {
      }
    }
  }
  /// The seq of the last entry appended.
  uint64_t scheduled(std::memory_order o = std::memory_order_acquire) const noexcept {
    return scheduled_.load(o);
  }

  // -- A bulk push (bulk_push.hpp), with `mutex()` held ----------------------
  //
  // A recorded round's replay appends the entries of several devices while
  // it holds all their locks, so that every entry's seq is known before any
  // of them is visible; it publishes them per device at the end.

  /// The last seq published (the next entry appended gets this plus the
  /// entries appended since, plus one).
  uint64_t scheduled_locked() const noexcept { return scheduled_.load(std::memory_order_relaxed); }
  /// The queue's text, for a described entry's (`extra_ptr::text`).
  std::string& text_locked() noexcept { return text_; }
  /// Appends an entry, not yet published (`publish_locked`). May throw
  /// `std::bad_alloc` (the vector grows); then nothing was appended.
  template <class Work, class Extra>
  void append_locked(Work&& work, Extra&& extra) {
    bool flags = Item::flags(extra);
    entries_.emplace_back(std::forward<Work>(work), std::forward<Extra>(extra));
    flagged_ += flags;
  }
  /// Publishes the `n` entries appended since the last publish; whether the
  /// runner must be rung (`ring_bell`, after the lock is let go), as `push`.
  bool publish_locked(uint64_t n) noexcept {
    scheduled_.store(scheduled_.load(std::memory_order_relaxed) + n, std::memory_order_release);
    auto expected = uint8_t{for_work};
    return sleeping_.load(std::memory_order_relaxed) == for_work &&
           sleeping_.compare_exchange_strong(expected, awake);
  }
  /// Takes back the last entry appended and not published (a bulk push
  /// that could not finish).
  void unappend_locked() noexcept {
    flagged_ -= Item::flags(entries_.back().extra);
    entries_.pop_back();
  }

  // -- Refusals (under the lock, shared with the owner's failure state) --------

  lock_type& mutex() const noexcept { return mu_; }
  bool stopping_locked() const noexcept { return stopping_; }
  bool failed_locked() const noexcept { return failed_; }
  /// Refuses pushes from now on: for good (`stop`), and/or until
  /// `accept_again_locked` (`fail`); wakes the producers waiting for room,
  /// which then refuse too.
  void refuse_locked(bool stop, bool fail) {
    stopping_ = stopping_ || stop;
    failed_ = failed_ || fail;
    room_.notify_all();
  }
  /// Accepts pushes again after a failure (not after a stop).
  void accept_again_locked() noexcept { failed_ = false; }
  /// Room for another entry, or refusing (a push then fails at once).
  bool has_room_locked() const noexcept {
    return entries_.size() < capacity_ || failed_ || stopping_;
  }
  bool empty_locked() const noexcept { return entries_.empty(); }

  // -- The runner --------------------------------------------------------------

  /// Moves every entry into `batch` (empty) and the text into `text` (the
  /// last batch's, dropped), and wakes the producers waiting for room.
  taken take(std::vector<Item>& batch, std::string& text) {
    taken t;
    std::lock_guard guard{mu_};
    if (entries_.empty())
      return t;
    batch.swap(entries_);
    text.swap(text_);
    text_.clear(); // the last batch's, done with
    taken_ += batch.size();
    t.took = true;
    t.flagged = flagged_ != 0;
    flagged_ = 0;
    if (producers_waiting_ > 0)
      room_.notify_all();
    t.wants_room = static_cast<bool>(room_cb_);
    return t;
  }
  /// Entries queued and not taken. Runner only.
  uint64_t untaken() const noexcept {
    return scheduled_.load(std::memory_order_acquire) - taken_;
  }
  bool has_untaken() const noexcept {
    return scheduled_.load(std::memory_order_acquire) != taken_;
  }
  /// Sleeps until something is queued; false when nothing is and the queue
  /// is stopping. Polls a little (and yields) before it sleeps, so that a
  /// producer in a burst rarely pays a futex wake-up.
  bool sleep_until_work() {
    std::unique_lock lk{mu_};
    while (entries_.empty()) {
      if (stopping_)
        return false;
      auto b = bell_.load();
      sleeping_.store(for_work, std::memory_order_seq_cst);
      lk.unlock();
      {
        runner_asleep asleep;
        bell_sleep_polled(bell_, b);
      }
      sleeping_.store(awake, std::memory_order_relaxed);
      lk.lock();
    }
    return true;
  }
  /// Parked at a gate: sleeps, marked `on_gate`, until `ready()` holds
  /// (checked after each ring). Never yields: see `bell_sleep`.
  template <class Pred>
  void sleep_on_gate_until(Pred ready) {
    for (;;) {
      auto b = bell_.load();
      sleeping_.store(on_gate, std::memory_order_seq_cst);
      if (ready())
        break;
      runner_asleep asleep;
      bell_sleep(bell_, b);
    }
    sleeping_.store(awake, std::memory_order_relaxed);
  }
  /// Once, unless `ready()`: sleeps marked `for_work` (a push, a gate, a
  /// completion or a cancel rings) by `sleep(bell, seen)`. An asynchronous
  /// runner's wait for anything to do.
  template <class Pred, class Sleep>
  void sleep_for_work_unless(Pred ready, Sleep sleep) {
    auto b = bell_.load();
    {
      std::lock_guard guard{mu_};
      sleeping_.store(for_work, std::memory_order_seq_cst);
    }
    if (!ready()) {
      runner_asleep asleep;
      sleep(bell_, b);
    }
    sleeping_.store(awake, std::memory_order_relaxed);
  }
  /// Under the lock, calls `under_lock()`; then, when nothing is queued
  /// and the queue is not stopping, turns a runner asleep at a gate into
  /// one asleep for work (the next push rings it) and returns true: the
  /// caller must not ring. False otherwise: the caller rings.
  template <class F>
  bool settle_idle_runner(F&& under_lock) {
    std::lock_guard guard{mu_};
    under_lock();
    if (!entries_.empty() || stopping_)
      return false;
    auto expected = uint8_t{on_gate};
    sleeping_.compare_exchange_strong(expected, for_work, std::memory_order_seq_cst);
    return true;
  }

  // -- The doorbell (any thread) ----------------------------------------------

  /// Wakes the runner if it sleeps. Looks before it writes: a runner that
  /// is awake costs no locked instruction here. Safe against a runner going
  /// to sleep: it stores sleeping_ (seq_cst) before it looks at what it
  /// waits for, and whoever rings stored that (seq_cst) before this load.
  void ring() noexcept {
    if (sleeping_.load(std::memory_order_seq_cst) != awake &&
        sleeping_.exchange(awake, std::memory_order_seq_cst) != awake)
      ring_bell();
  }
  /// Rings whether or not the runner is marked asleep (its sleep checks
  /// what it waits for after each ring).
  void ring_bell() noexcept { bell_ring(bell_); }
  /// Why the runner sleeps now.
  sleep_state sleeping(std::memory_order o = std::memory_order_seq_cst) const noexcept {
    return static_cast<sleep_state>(sleeping_.load(o));
  }
  /// How many times the bell rang.
  uint32_t rings() const noexcept { return bell_.load(std::memory_order_relaxed); }

private:
  /// Waits on room_ until `has_room_locked()`; returns at once when
  /// `never_waits()`. Call with mu_ held in `lk`.
  void wait_for_room_locked(std::unique_lock<spin_mutex>& lk) {
    // Backpressure: wait for room, never drop. Runner threads (of any
    // device) and actor handlers never wait: a runner waiting for room in a
    // queue parked on its own next event, or an actor that must first
    // process the reply opening that queue's gate, would wait forever.
    if (has_room_locked() || never_waits_()) // the common case first
      return;
    while (!has_room_locked()) {
      ++producers_waiting_;
      room_.wait(lk);
      --producers_waiting_;
    }
  }
  /// A push's way out of line (cold, so that the push itself stays small):
  /// waits for room with mu_ held (and still held after); returns the
  /// number of entries then.
  [[gnu::noinline, gnu::cold]] std::size_t wait_for_room_held() {
    std::unique_lock lk{mu_, std::adopt_lock};
    try {
      wait_for_room_locked(lk);
    } catch (...) {
      lk.release(); // still held: the caller's guard unlocks it
      throw;
    }
    lk.release();
    return entries_.size();
  }

  // Line 1, what every push touches: append under mu_; the runner swaps the
  // whole vector out.
  alignas(64) mutable spin_mutex mu_;
  std::vector<Item> entries_;
  std::size_t flagged_ = 0; // entries in entries_ that `Item::flags`
  std::atomic<uint64_t> scheduled_{0};
  std::atomic<uint8_t> sleeping_{awake};
  std::atomic<uint32_t> bell_{0};
  // While scheduled_ is below it, the queue has room (`wait_for_room`
  // without mu_): `taken_ + capacity_` as of the last look under mu_, a
  // bound that only grows. Written under mu_, read without it.
  std::atomic<uint64_t> room_until_{0};

  // Line 2, read by every push; written rarely (and the text by described
  // tasks' pushes).
  int producers_waiting_ = 0; // guarded by mu_
  bool stopping_ = false;     // guarded by mu_
  bool failed_ = false;       // guarded by mu_
  std::size_t capacity_;
  // The descriptions of the described tasks queued (the device's
  // extra_ptr); swapped with the batch's as the runner takes it.
  std::string text_;

  // Line 3: the runner's, and the rare room waits.
  alignas(64) uint64_t taken_ = 0; // entries taken: written by the runner under mu_
  bool (*never_waits_)() noexcept;
  std::condition_variable_any room_; // producers waiting for room (rare)
  std::function<void()> room_cb_;    // guarded by mu_; see notify_when_room
};

} // namespace multidev::detail
