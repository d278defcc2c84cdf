#pragma once
/// \file
/// A device's hand-over protocol (synchronous drivers): when a runner other
/// than the device's own may run its items, so that a dependency hop
/// between two devices stays on one thread. The token (`exec_token`,
/// exec_token.hpp: its states, transitions and their table) says who may
/// run the items; this class decides when to take each transition, and owns
/// the token and the device this runner claimed (`claimed_`). The runner
/// (`device_runner`: its thread, its batch, its item loop) calls in at its
/// two points: at a pending gate (`wait_lendable`, `try_help`) and after an
/// item whose firing claimed another device (`claimed`, `serve_claimed`).
/// Definitions: device_runner.cpp, in the item loop's translation unit, so
/// that `serve` inlines `run_item` and `execute` inlines `mark_parked` as
/// before the split.
///
/// The protocol:
/// - Park: the holder at a pending gate records it (`mark_parked`,
///   `exec_token::park_at`) and lends the token (`release_parked`,
///   `lend_at`); its runner then waits without it (`wait_lendable`).
/// - Claim: the opener of that gate, on its own runner, whose next item
///   waits for this device, takes the token and opens the gate without
///   waking this runner (`try_claim`: kept in the opener's `claimed_` until
///   its current item is done, then `serve_claimed`).
/// - Defer: or it opens the gate and leaves this runner asleep for the
///   backstop (`try_defer`, `exec_token::defer`; rung by `ring_if_deferred`
///   if nobody took its items up).
/// - Help: a runner about to park may take a lendable, ready device's token
///   and run the items it waits for (`try_help`).
/// - Serve and hand back: the borrower runs the items (`serve`) and gives
///   the token back (`hand_back`): lendable again at the device's next
///   pending gate, otherwise returned and the runner rung; or, having found
///   nothing to run, as it was (`relend`).
///
/// Threads (a device's `hand_over` is reached by its own runner and by
/// other devices' runners):
/// - `try_claim`, `try_defer`: the core's `fire`, on this device's own
///   runner running its own items (both check and refuse otherwise: they
///   return false, changing nothing). They act on the waiter's device.
/// - `wait_lendable`, `try_help`, `claimed`, `serve_claimed`: this
///   device's own runner (`device_runner::park`, `run_batch`).
/// - `serve`, `hand_back`, `relend`, `mark_parked`, `release_parked`,
///   `lend_at`: whoever holds this device's token: its own runner, or the
///   runner of a device that borrowed it (which claims nothing more while it
///   serves: `serving_other`).
/// - `ring_if_deferred`, `ring_deferred`, `hold_after_wake`, `token()`,
///   `enabled()`: any thread.
///
/// Invariants:
/// - Only the token's holder touches the device's batch and `executed_`
///   (device_runner.hpp), and it holds the token from a won `try_borrow*`
///   or `try_take_back` until its `lend` or `give_back`.
/// - `claimed_` is non-null only between a `try_claim` that took a device's
///   token and the runner loop that serves it (`serve_claimed`), on the own
///   runner; a runner holding a claim claims and defers nothing more.
/// - A deferred wake-up is taken up or rung once (`exec_token::deferred`).
/// - `enabled_` is set once, before the runner starts; when it is off the
///   token stays `held` and none of the above is taken.

#include <cstdint>
#include <memory>

#include "actors/core/exec_token.hpp"

namespace multidev::detail {

class device_core;
class device_runner;
struct gate;
struct gate_waiter;

class hand_over {
public:
  /// `core`'s hand-over, off until its runner starts (`device_runner::start`).
  explicit hand_over(device_core& core) noexcept : core_(core) {}

  // -- Any thread --------------------------------------------------------------------

  /// Whether the device lends its token (synchronous drivers, and
  /// `backend_options::hand_over`). Set before the runner starts.
  bool enabled() const noexcept { return enabled_; }
  /// Who may run this device's items (`state_name()`), and the hand-over's
  /// counters (`run_by_others()`, `deferred_wakes()`).
  const exec_token& token() const noexcept { return token_; }
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
  /// For tests: while on, this runner, woken at a wait with hand-over on,
  /// holds there before it takes its token back, as a runner the kernel has
  /// not scheduled yet would (see `try_help`). Turning it off releases it.
  void hold_after_wake(bool on) noexcept { token_.hold_after_wake(on); }
  /// For tests: a runner defers a wake-up only while the process has at
  /// least `n` runners (0 restores the default: one more than its CPUs;
  /// see `runners_may_defer`).
  static void set_defer_threshold_for_tests(int n) noexcept;

  // -- The core's `fire`, on this device's own runner thread ---------------------------

  /// If the next item here is a pending gate on `w`'s device, and that
  /// device is parked at `w`'s gate, takes its token and opens the gate
  /// without waking its runner; this runner then runs its items
  /// (`serve_claimed`) instead of sleeping. Whether it did.
  bool try_claim(const gate_waiter& w) noexcept;
  /// When `try_claim` did not take `w` and `runners_may_defer()`: if `w`'s
  /// device is asleep, parked at `w`'s gate, and this runner waits for that
  /// device within its next few items (it will `try_help` there), opens the
  /// gate without waking it; the backstop rings it if nobody took its items
  /// up a period or two later. Whether it did.
  bool try_defer(const gate_waiter& w) noexcept;

private:
  friend class device_runner;

  /// This device's runner (the core's member, at a fixed place in it).
  device_runner& runner() const noexcept;

  // -- The own runner (device_runner::park, run_batch) -----------------------------

  /// A firing of the last item claimed a device (`try_claim`) to serve.
  bool claimed() const noexcept { return claimed_ != nullptr; }
  /// Serves the claimed device up to this device's next pending gate (a
  /// wait on it), or, when there is none any more, hands its token back.
  void serve_claimed();
  /// The runner, parked at the pending gate `g` (item `seq`, marked): lends
  /// the token and waits, spinning and then asleep, until the wait ended or
  /// a borrower left the device elsewhere; returns holding the token.
  void wait_lendable(gate& g, uint64_t seq);
  /// The runner, about to park at the pending gate `g` (a wait on another
  /// device of this process): if that device is lendable and can run (its
  /// own wait ended, its runner rung but not yet back), takes its token and
  /// runs its items here (`serve`) until `g` ends. Whether it did.
  bool try_help(const gate& g);

  // -- The token holder --------------------------------------------------------------

  /// Records `g` as the wait this device is parked at (`gate_list::parked_on`,
  /// for the wait graph and debug info; with the trace on, since when).
  void mark_parked(const gate* g) noexcept;
  /// Parked at the pending gate `g`: lets a device that opens it run this
  /// one's items (`token_` lendable). Returns the park's number
  /// (`exec_token::park_at`).
  uint32_t release_parked(gate& g) noexcept;
  /// At the gate `g` (item `seq`), which the caller keeps alive: makes the
  /// token lendable, and rings the runner if `g` ended meanwhile.
  void lend_at(const gate& g, uint64_t seq) noexcept;
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

  device_core& core_;
  // Set before the runner starts (`device_runner::start`).
  bool enabled_ = true;
  // This runner's: a device whose token `try_claim` took, to serve. Read
  // per item by the runner's loop of bare closures.
  std::shared_ptr<device_core> claimed_;
  // Who may run this device's items now, the parked gate and the deferred
  // wake-up: the state machine (a line of its own: other runners write it).
  exec_token token_;
};

} // namespace multidev::detail
