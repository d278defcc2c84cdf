#pragma once
/// \file
/// A device's runner: the thread that takes batches off the device's queue
/// and executes them in seq order (on an asynchronous driver it runs a
/// `stream_runner` instead: stream_runner.hpp), parks at
/// waits on other devices, and, on a synchronous driver, hands the device's
/// execution token over (exec_token.hpp) so that a dependency hop between
/// two devices stays on one thread. Definitions: device_runner.cpp, beside
/// the core's resolving side (`complete`, `drop`, `poison`), which the
/// item loop inlines; the trace records in device_trace.cpp.
///
/// Threads:
/// - The runner thread (`start` .. `join`) runs `run`: the item loop of a
///   synchronous driver, or a `stream_runner`'s (stream_runner.hpp).
/// - On a synchronous driver the device's items, its batch (`batch_`) and
///   `executed_` belong to whoever holds its token: its own runner, or the
///   runner of another device that borrowed it (`try_claim`, `try_help`)
///   and runs its items in `serve`. A serving runner calls, on the device
///   it serves, `serve`'s own loop (`run_item`, `take_batch`,
///   `pending_gate_at_pos`) and, when done, `hand_back` (or `relend`): the
///   token holder's functions. It claims nothing more while serving.
/// - `try_claim` and `try_defer`: the core's `fire`, on this device's own
///   runner running its own items (both check and refuse otherwise).
/// - `trace_done`, `trace_dropped`, `task_name`, `text_of`: whoever
///   resolves (`device_core::complete`, `drop`, `poison`): the token
///   holder, or on an asynchronous driver the window's retire-lock holder.
/// - `running_item`: the runner thread (or its stream's) about itself.
/// - `ring_if_deferred`, `ring_deferred`, `wake_runner`, `runner_cpu`,
///   `hold_after_wake`, `token()`: any thread.
///
/// Hand-over protocol (sync drivers, `hand_over_`): the token (`token_`:
/// states, transitions and their table in exec_token.hpp) says who may run
/// the items; the holder records the pending gate it parks at
/// (`exec_token::park_at`, `mark_parked`) and lends the token (`lend_at`).
/// The opener of that gate, on its own runner, may take the token and open
/// the gate without waking this runner (`try_claim`: kept in `claimed_`
/// until its current item is done, then `serve`d), or open it and leave
/// this runner asleep for the backstop (`try_defer`, `exec_token::defer`).
/// A runner about to park may take a lendable, ready device's token and
/// run the items it waits for (`try_help`). The borrower gives the token
/// back with `hand_back`: lendable again at the device's next pending gate,
/// otherwise returned and the runner rung.
///
/// Invariants:
/// - `executed_` is the seq of the last item started (on a synchronous
///   driver: run, dropped or passed); items run in seq order, one at a time.
/// - `batch_.next()`, while there is one, is the item `executed_ + 1`.
/// - `claimed_` is non-null only between a `try_claim` that took a device's
///   token and the loop that serves it (`run_batch`), on the own runner.
/// - `hand_over_` and `pin_runner_` are set once, before the thread starts.

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
#include "actors/core/item.hpp"
#include "actors/core/spin.hpp"

namespace multidev::detail {

class device_core;
struct gate_waiter;

/// Only while the process has more runners than CPUs (`try_defer`): there
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
  explicit device_runner(device_core& core) noexcept : core_(core) {}

  // -- Life (the core's) -----------------------------------------------------------

  /// Starts the runner thread. `hand_over`: whether the device lends its
  /// token (synchronous drivers only); `pin`: the runner pins itself to a
  /// CPU of its own (`pin_runners`).
  void start(bool hand_over, bool pin);
  bool joinable() const noexcept { return thread_.joinable(); }
  /// Waits for the runner thread to end (it does once the device stops and
  /// it has resolved what it held).
  void join() { thread_.join(); }
  bool hand_over() const noexcept { return hand_over_; }
  /// Who may run this device's items (`state_name()`), and the hand-over's
  /// counters (`run_by_others()`, `deferred_wakes()`). Any thread.
  const exec_token& token() const noexcept { return token_; }

  // -- Any thread --------------------------------------------------------------------

  /// On this device's runner thread (or its stream's): the seq of the item
  /// the calling thread runs. Only for that thread.
  uint64_t running_item() const noexcept;
  /// The CPU this device's runner pinned itself to (`pin_runners`), or -1
  /// (not pinned, or not yet started).
  int runner_cpu() const noexcept { return cpu_.load(std::memory_order_relaxed); }
  /// The backstop (and a host that blocks on this device): rings the runner
  /// if its wake-up deferred with `stamp` is still deferred (nobody took its
  /// items up). Whether it rang.
  bool ring_if_deferred(uint64_t stamp) noexcept;
  /// Rings the runner if its wake-up is deferred now, whatever the stamp:
  /// for whoever needs this device's items and will not run them itself.
  void ring_deferred() noexcept {
    if (auto stamp = token_.deferred())
      ring_if_deferred(stamp);
  }
  /// Rings the runner: the resolver of a task's sync on its own runner
  /// thread, which serves the stream while it waits (`sync_until`).
  void wake_runner() noexcept;
  /// For tests: a runner defers a wake-up only while the process has at
  /// least `n` runners (0 restores the default: one more than its CPUs;
  /// see `runners_may_defer`).
  static void set_defer_threshold_for_tests(int n) noexcept;
  /// For tests: while on, this runner, woken at a wait with hand-over on,
  /// holds there before it takes its token back, as a runner the kernel has
  /// not scheduled yet would (see `try_help`). Turning it off releases it.
  void hold_after_wake(bool on) noexcept { token_.hold_after_wake(on); }

  // -- The core's `fire`, on this device's own runner thread ---------------------------

  /// In `fire`, on this device's own runner: if the next item here is a
  /// pending gate on `w`'s device, and that device is parked at `w`'s gate,
  /// takes its token and opens the gate without waking its runner; this
  /// runner then runs its items (`serve`) instead of sleeping. Whether it did.
  bool try_claim(const gate_waiter& w) noexcept;
  /// In `fire`, on this device's own runner, when `try_claim` did not take
  /// `w` and `runners_may_defer()`: if `w`'s device is asleep, parked at
  /// `w`'s gate, and this runner waits for that device within its next few
  /// items (it will `try_help` there), opens the gate without waking it;
  /// the backstop rings it if nobody took its items up a period or two
  /// later. Whether it did.
  bool try_defer(const gate_waiter& w) noexcept;

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
  /// The token holder: records `g` as the wait this device is parked at
  /// (`gate_list::parked_on`, for the wait graph and debug info).
  void mark_parked(const gate* g) noexcept;
  /// The runner, at a pending gate at `batch_.next()`: waits until the gate
  /// ends or the token comes back from a device that ran this one's items.
  /// Returns holding the token.
  void park();
  /// The runner's wait at a pending gate when hand-over is off.
  void wait_at_gate(const gate& g, uint64_t seq);
  /// Token holder, parked at the pending gate `g`: lets a device that opens
  /// it run this one's items (`token_` lendable). Returns the park's number
  /// (`exec_token::park_at`).
  uint32_t release_parked(gate& g) noexcept;
  /// Token holder, at the gate `g` (item `seq`), which the caller keeps
  /// alive: makes the token lendable, and rings the runner if `g` ended
  /// meanwhile.
  void lend_at(const gate& g, uint64_t seq) noexcept;
  /// The runner, about to park at the pending gate `g` (a wait on another
  /// device of this process): if that device is lendable and can run (its
  /// own wait ended, its runner rung but not yet back), takes its token and
  /// runs its items here (`serve`) until `g` ends. Whether it did.
  bool try_help(const gate& g);
  /// On another device's runner (`lender`'s), holding this device's token:
  /// runs its items up to the one `until` (the lender's gate, a wait on this
  /// device) waits for, stopping early if `until` ends, or this device
  /// reaches a pending gate or has nothing queued; then hands the token back.
  void serve(const device_runner& lender, const gate& until, uint64_t until_seq);
  /// A device that ran this one's items gives the token back: lendable when
  /// this one is parked at a pending gate, otherwise to its runner (woken).
  void hand_back() noexcept;
  /// Token holder of a lendable device it found with nothing to run for it
  /// (still parked at a pending gate, or past the awaited item): gives the
  /// token back as it was (its park number unchanged).
  void relend() noexcept;

  // The first line holds what the item loop reads and writes per item (the
  // token holder's): the core, `executed_`, the batch's entries and position.
  device_core& core_;
  uint64_t executed_ = 0; // token holder only: seq of the item it is running
  // Hand-over (sync drivers): whether this device lends its token (see
  // exec_token.hpp). Set before the runner starts.
  bool hand_over_ = true;
  bool pin_runner_ = false; // set before the runner starts
  // The batch being run (the token holder's).
  item_batch batch_;
  // This runner's: a device whose token `try_claim` took, to `serve`.
  std::shared_ptr<device_core> claimed_;
  // The CPU the runner pinned itself to, -1 when not pinned (debug info).
  std::atomic<int> cpu_{-1};
  // Who may run this device's items now, the parked gate and the deferred
  // wake-up: the hand-over state machine.
  exec_token token_;
  std::thread thread_;
};

} // namespace multidev::detail
