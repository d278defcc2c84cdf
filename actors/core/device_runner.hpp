#pragma once
/// \file
/// A device's runner: the thread that takes batches off the device's queue
/// and executes them in seq order (on an asynchronous driver it runs a
/// `stream_runner` instead: stream_runner.hpp), and parks at waits on other
/// devices. On a synchronous driver its `hand_over` (hand_over.hpp: the
/// token and the protocol around it) lets another device's runner run its
/// items while it is parked, and lets it run theirs, so that a dependency
/// hop between two devices stays on one thread. Definitions:
/// device_runner.cpp, beside the hand-over's and the core's resolving side
/// (`complete`, `drop`, `poison`), which the item loop inlines; the trace
/// records in device_trace.cpp.
///
/// Threads:
/// - The runner thread (`start` .. `join`) runs `run`: the item loop of a
///   synchronous driver, or a `stream_runner`'s (stream_runner.hpp).
/// - On a synchronous driver the device's items, its batch (`batch_`) and
///   `executed_` belong to whoever holds its token (hand_over.hpp): its own
///   runner, or the runner of another device that borrowed it and runs its
///   items in `hand_over::serve`, through `run_item`, `take_batch` and
///   `pending_gate_at_pos` here.
/// - `trace_done`, `trace_dropped`, `task_name`, `text_of`: whoever
///   resolves (`device_core::complete`, `drop`, `poison`): the token
///   holder, or on an asynchronous driver the window's retire-lock holder.
/// - `running_item`: the runner thread (or its stream's) about itself.
/// - `wake_runner`, `runner_cpu`, `handover()`'s any-thread members: any
///   thread.
///
/// Invariants:
/// - `executed_` is the seq of the last item started (on a synchronous
///   driver: run, dropped or passed); items run in seq order, one at a time.
/// - `batch_.next()`, while there is one, is the item `executed_ + 1`.
/// - `pin_runner_` and the hand-over's `enabled()` are set once, before the
///   thread starts.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "actors/core/batch.hpp"
#include "actors/core/exec_token.hpp"
#include "actors/core/hand_over.hpp"
#include "actors/core/item.hpp"
#include "actors/core/spin.hpp"

namespace multidev::detail {

class device_core;
struct gate_waiter;

/// Only while the process has more runners than CPUs (`hand_over::try_defer`): there
/// a woken runner mostly queues for a CPU that other runners keep busy,
/// and its wake-up and context switches cost more than its items (the
/// fan-out/fan-in DAG of `multidev bench` on 4 and 8 devices). With a CPU
/// for each runner, a woken one runs at once, beside this one. Inline: a
/// hop of a two-device chain asks on every firing.
inline bool runners_may_defer() noexcept {
  return live_runners.load(std::memory_order_relaxed) >=
         defer_min_runners.load(std::memory_order_relaxed);
}

class device_runner {
public:
  /// The runner of `core`, not started (`start`).
  explicit device_runner(device_core& core) noexcept : core_(core), handover_(core) {}

  // -- Life (the core's) -----------------------------------------------------------

  /// Starts the runner thread. `hand_over`: whether the device lends its
  /// token (synchronous drivers only); `pin`: the runner pins itself to a
  /// CPU of its own (`pin_runners`).
  void start(bool hand_over, bool pin);
  bool joinable() const noexcept { return thread_.joinable(); }
  /// Waits for the runner thread to end (it does once the device stops and
  /// it has resolved what it held).
  void join() { thread_.join(); }
  /// The hand-over protocol and its token (hand_over.hpp, which says which
  /// thread may call what): `enabled()`, `token()`, `try_claim`,
  /// `try_defer`, `ring_if_deferred`, `ring_deferred`, `hold_after_wake`.
  hand_over& handover() noexcept { return handover_; }
  const hand_over& handover() const noexcept { return handover_; }

  // -- Any thread --------------------------------------------------------------------

  /// On this device's runner thread (or its stream's): the seq of the item
  /// the calling thread runs. Only for that thread.
  uint64_t running_item() const noexcept;
  /// The CPU this device's runner pinned itself to (`pin_runners`), or -1
  /// (not pinned, or not yet started).
  int runner_cpu() const noexcept { return cpu_.load(std::memory_order_relaxed); }
  /// Rings the runner: the resolver of a task's sync on its own runner
  /// thread, which serves the stream while it waits (`sync_until`).
  void wake_runner() noexcept;
  // -- The core's resolving side (the token holder, or the retire-lock holder) ------

  /// Records the item `execute_traced` (or `retire`) is resolving, if any,
  /// as `seq`, ended now (or at the end `trace_ring::begin` was given);
  /// `complete` and `poison` call it before the item's event resolves.
  /// Trace on only.
  void trace_done(uint64_t seq, bool failed) noexcept;
  /// Records an item the runner resolved without running it (cancelled,
  /// killed, behind a failure) as kind `cancel`, instead of its own record.
  /// Trace on only.
  void trace_dropped(const item& it, uint64_t seq) noexcept;
  /// A described task's description in the batch's text (`item_batch::text_of`).
  std::string_view text_of(const item& it) const noexcept { return batch_.text_of(it); }
  /// The same without quotes, as a failure's `task` records it, or
  /// `task#<seq>` for a nameless closure.
  std::string task_name(const item& it, uint64_t seq) const;

private:
  /// An asynchronous driver's loop takes its batches here (`take_batch`)
  /// and reads their text (`text_of`).
  friend class stream_runner;
  /// The hand-over runs the items of the device it serves (`run_item`,
  /// `take_batch`, `pending_gate_at_pos`) and parks it (`batch_`).
  friend class hand_over;
  void run();
  /// Runner only (sync drivers): runs `batch_` from its position until it
  /// is spent or reaches a pending gate; `first`: the batch was just taken
  /// (trace).
  void run_batch(bool first);
  /// The token holder (sync drivers): runs `batch_.next()`, a task, or a
  /// gate that ended, and moves past it.
  void run_item(bool first_in_batch);
  /// The own runner, in a batch without extras and with the trace off: runs
  /// its bare closures while the batch stays so.
  void run_bare_items();
  /// `run_bare_items` with the trace on: `first`, whether the batch's first
  /// item is next (its start is read from the clock, the others' is the
  /// previous end).
  void run_bare_items_traced(bool first);
  /// Moves the whole queue into `batch` (empty) and its text into
  /// `batch_.text()` (the last batch's, dropped), and makes room; false,
  /// taking nothing, when the queue is empty.
  bool take_batch(std::vector<item>& batch);
  void execute(item& it);
  /// `execute` for an item without an order's or a wait's extra (a bare
  /// closure, or a described task).
  void execute_bare(item& it);
  /// `execute_bare`'s end for a described task that ran: lets go of its
  /// closure and what it held, and completes it.
  void complete_described(item& it, uint64_t seq);
  /// Runs the item's closure, if any; false when it threw (the device is
  /// then poisoned at `seq`).
  bool call_work(item& it, uint64_t seq);
  /// `execute` timed into the trace; `first_in_batch`: the runner did other
  /// things since the last item, so the start needs a clock read of its own.
  /// `start_ns`, when not 0: when the item's record starts (a gate's: when
  /// the device parked at it). `bare`: the item has no extra
  /// (`execute_bare`, inlined for the short loop of bare closures).
  template <bool bare = false>
  void execute_traced(item& it, bool first_in_batch, int64_t start_ns = 0);
  /// Notes `it`'s text (a described task's) as running at `seq` in the
  /// trace (`device_inspector::running_description`); trace on only.
  void note_running_text(const item& it, uint64_t seq) noexcept;

  /// Whether the gate `g`, item `seq` here, no longer holds this device:
  /// opened, failed, or dropped.
  bool gate_ended(const gate& g, uint64_t seq) const noexcept;
  /// The pending gate at `batch_.next()`, if that is one. Token holder only.
  gate* pending_gate_at_pos() const noexcept;
  /// The runner, at a pending gate at `batch_.next()`: waits until the gate
  /// ends or the token comes back from a device that ran this one's items
  /// (`hand_over::wait_lendable`). Returns holding the token.
  void park();
  /// The runner's wait at a pending gate when hand-over is off.
  void wait_at_gate(const gate& g, uint64_t seq);

  // The first line holds what the item loop reads and writes per item (the
  // token holder's): the core, `executed_`, the batch's entries and position.
  device_core& core_;
  uint64_t executed_ = 0; // token holder only: seq of the item it is running
  bool pin_runner_ = false; // set before the runner starts
  // The batch being run (the token holder's).
  item_batch batch_;
  // The CPU the runner pinned itself to, -1 when not pinned (debug info).
  std::atomic<int> cpu_{-1};
  // The hand-over protocol, the token and this runner's claim (hand_over.hpp).
  hand_over handover_;
  std::thread thread_;
};

} // namespace multidev::detail
