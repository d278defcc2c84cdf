#pragma once
/// \file
/// A device's execution token: who may run its items now (hand-over). A
/// device's items run one at a time, in order, by whoever holds its token:
/// its own runner, or, while that runner is parked at a wait on another
/// device, the runner of a device that opens that wait or waits for this
/// one's items. A dependency hop between two devices then stays on one
/// thread, as a message between two CAF actors of one worker does, instead
/// of a wake-up and a sleep. (Synchronous drivers only: an asynchronous
/// driver's items run on its stream.)
///
/// States and transitions, all here (docs/design.md has the table):
///
///   held     --lend-->       lendable   the runner parks at a pending gate
///   lendable --try_borrow*--> lent     a claimer or a helper takes it
///   lendable --try_take_back--> held   the runner's wait ended
///   lent     --lend-->       lendable   the borrower leaves it parked
///   lent     --give_back-->  returned   the borrower is done, device not parked
///   returned --try_take_back--> held
///
/// Every other (state, event) pair fails, changing nothing (`try_*`), or is
/// never taken by the device (`lend` and `give_back` are the holder's).
///
/// - `held`: the device's runner holds the token and runs its items.
/// - `lendable`: the holder left the device parked at a pending gate
///   (`park_at`, then `lend`); any runner may `borrow` it, and its own
///   runner may `take_back`.
/// - `lent`: another device's runner borrowed it and runs the device's items
///   (or opens its gate); the own runner must not take it back, and sleeps
///   until it is rung.
/// - `returned`: the borrower gave it back with the device not parked; the
///   runner takes it back.
///
/// Invariants:
/// - Exactly one thread holds the token: the one whose `try_borrow*` or
///   `try_take_back` won (or the runner, from the start), until it `lend`s
///   or `give_back`s. Only the holder reads or writes the holder's fields
///   (`parked_gate`, `parked_ns`) and the device's batch.
/// - `parks()` counts the parks that made the token lendable. It changes
///   only before a `lend` (published by it), so a runner waiting without the
///   token tells from it whether the device is still parked where it left
///   it (`may_take_back`).
/// - A deferred wake-up's stamp (`deferred`) is non-zero only between a
///   `defer` and whoever takes the token (`take_up_deferral`) or rings the
///   runner for it (`clear_deferral`): one of them, once.
///
/// Threads: `lend`, `park_at`, `give_back` and the holder's fields: the
/// holder. `try_take_back`, `set_spinning`, `wait_if_held_after_wake`: the
/// device's own runner. `try_borrow*`, `defer`, the readers: any runner.
/// Every transition of `state` is seq_cst (a Dekker pairing with the gates'
/// states: see `hand_over::lend_at`); the looks before a compare-and-swap
/// are relaxed hints.

#include <atomic>
#include <cstdint>

namespace multidev::detail {

struct gate;

class exec_token {
public:
  enum state_t : uint8_t { held, lendable, lent, returned };

  // -- Transitions ---------------------------------------------------------------

  /// The holder records that the device is parked at the pending gate `g`
  /// (its runner's, or one a borrower left it at) and counts the park;
  /// returns the park's number. Published by the `lend` that follows.
  uint32_t park_at(gate* g) noexcept {
    parked_gate_ = g;
    auto n = parks_.load(std::memory_order_relaxed) + 1;
    parks_.store(n, std::memory_order_relaxed); // published by the token's release
    return n;
  }
  /// held or lent -> lendable: the holder leaves the device parked.
  void lend() noexcept { state_.store(lendable, std::memory_order_seq_cst); }
  /// lendable -> lent: another runner takes the token; false (nothing
  /// changed) in any other state.
  bool try_borrow() noexcept {
    auto st = uint8_t{lendable};
    return state_.compare_exchange_strong(st, lent, std::memory_order_seq_cst);
  }
  /// `try_borrow` for a runner that helps at its own wait: not while the
  /// device's runner spins at its wait (it takes the token back itself as
  /// soon as the wait ends, and a token lent even briefly would end its spin
  /// and send it to sleep). Looks first, so that a device that is running
  /// costs no write.
  bool try_borrow_unless_spinning() noexcept {
    auto st = uint8_t{lendable};
    return !spinning_.load(std::memory_order_relaxed) &&
           state_.load(std::memory_order_relaxed) == lendable &&
           state_.compare_exchange_strong(st, lent, std::memory_order_seq_cst);
  }
  /// lent -> returned: the borrower gives the token back to the runner,
  /// the device not parked (else it `park_at`s and `lend`s).
  void give_back() noexcept { state_.store(returned, std::memory_order_seq_cst); }
  /// lendable or returned -> held: the device's runner takes the token back
  /// (and with it any deferred wake-up); false while it is lent (or held).
  bool try_take_back() noexcept {
    auto st = state_.load(std::memory_order_seq_cst);
    if (st == lent || !state_.compare_exchange_strong(st, held, std::memory_order_seq_cst))
      return false;
    take_up_deferral();
    return true;
  }

  // -- Looks ---------------------------------------------------------------------

  state_t state(std::memory_order o = std::memory_order_seq_cst) const noexcept {
    return static_cast<state_t>(state_.load(o));
  }
  /// `"runner"`, `"lendable"`, `"lent"` or `"returned"`.
  const char* state_name() const noexcept {
    switch (state(std::memory_order_acquire)) {
    case lendable:
      return "lendable";
    case lent:
      return "lent";
    case returned:
      return "returned";
    default:
      return "runner";
    }
  }
  /// The runner, waiting without the token after its park number `mine`:
  /// whether to take it back now: it was returned, or it is lendable and
  /// either this runner's wait ended (`wait_ended()`) or someone that ran
  /// items here parked the device at another wait (which only the token
  /// holder may look at).
  template <class Ended>
  bool may_take_back(uint32_t mine, Ended&& wait_ended) const noexcept {
    auto st = state_.load(std::memory_order_seq_cst);
    return st == returned ||
           (st == lendable && (parks_.load(std::memory_order_seq_cst) != mine || wait_ended()));
  }
  /// A hint, relaxed: lent now (the runner stops spinning: the holder rings
  /// it when it must act).
  bool lent_now() const noexcept { return state_.load(std::memory_order_relaxed) == lent; }
  uint32_t parks() const noexcept { return parks_.load(std::memory_order_relaxed); }

  // -- The holder's ------------------------------------------------------------

  /// The gate the holder last parked the device at (`park_at`); compared
  /// only (a borrower checks it is the gate it opens).
  const gate* parked_gate() const noexcept { return parked_gate_; }
  /// When the device parked at its gate, for the trace (0: not tracing).
  int64_t& parked_ns() noexcept { return parked_ns_; }

  // -- The runner's hints --------------------------------------------------------

  /// The runner spins at its wait (before it lends the token) or stopped.
  void set_spinning(bool on) noexcept { spinning_.store(on, std::memory_order_relaxed); }
  bool spinning() const noexcept { return spinning_.load(std::memory_order_relaxed); }
  /// For tests: while on, the runner woken at a wait holds before it takes
  /// the token back (`wait_if_held_after_wake`), as a runner the kernel has
  /// not scheduled yet would. Turning it off releases it.
  void hold_after_wake(bool on) noexcept {
    hold_after_wake_.store(on, std::memory_order_release);
    if (!on)
      hold_after_wake_.notify_all();
  }
  void wait_if_held_after_wake() noexcept {
    if (hold_after_wake_.load(std::memory_order_relaxed)) [[unlikely]]
      hold_after_wake_.wait(true, std::memory_order_acquire);
  }

  // -- Deferred wake-ups ---------------------------------------------------------

  /// Another runner opened the wait this device's sleeping runner is parked
  /// at, and leaves it asleep for now with this `stamp` (non-zero).
  void defer(uint64_t stamp) noexcept { deferred_.store(stamp, std::memory_order_seq_cst); }
  /// The stamp of the deferred wake-up now (0: none).
  uint64_t deferred() const noexcept { return deferred_.load(std::memory_order_relaxed); }
  /// Whoever takes the token: a deferred wake-up is taken up, no longer
  /// anyone's to ring. Looks first: no write when there is none.
  void take_up_deferral() noexcept {
    if (deferred_.load(std::memory_order_relaxed) != 0)
      deferred_.store(0, std::memory_order_relaxed);
  }
  /// Clears the deferred wake-up if it is still `stamp`'s; whether it did
  /// (then the caller rings the runner).
  bool clear_deferral(uint64_t stamp) noexcept {
    return deferred_.compare_exchange_strong(stamp, 0, std::memory_order_seq_cst);
  }

  // -- Counters, for tests and diagnostics ---------------------------------------

  /// A borrower ran `n` more of this device's items (one writer at a time:
  /// the holder).
  void count_run_by_others(uint64_t n) noexcept {
    run_by_others_.store(run_by_others_.load(std::memory_order_relaxed) + n,
                         std::memory_order_relaxed);
  }
  uint64_t run_by_others() const noexcept { return run_by_others_.load(std::memory_order_relaxed); }
  void count_deferred_wake() noexcept { deferred_wakes_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t deferred_wakes() const noexcept {
    return deferred_wakes_.load(std::memory_order_relaxed);
  }

private:
  // One line: a borrower takes the token and reads the parked gate, and
  // the runner parks (spinning_, parked_gate_, parks_, state_) in a row.
  alignas(64) std::atomic<uint8_t> state_{held};
  // The runner's, a hint for `try_borrow_unless_spinning`: it spins at a
  // wait, and will take the token back itself once the wait ends.
  std::atomic<bool> spinning_{false};
  std::atomic<bool> hold_after_wake_{false};
  // The stamp of the deferred wake-up of this device's runner (0: none):
  // set by the runner that deferred it, cleared by whoever takes the token
  // up or rings it.
  std::atomic<uint64_t> deferred_{0};
  // The holder's: the gate it left the device parked at, and when.
  gate* parked_gate_ = nullptr;
  int64_t parked_ns_ = 0;
  std::atomic<uint32_t> parks_{0};
  std::atomic<uint64_t> run_by_others_{0};
  std::atomic<uint64_t> deferred_wakes_{0};
};

} // namespace multidev::detail
