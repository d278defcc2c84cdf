#pragma once
/// \file
/// The gates queued on a device (its waits for other devices' events), as
/// the wait graph, debug info and shutdown see them: which are still
/// pending, how many were pushed and passed, and which one the device is
/// parked at. The runner itself finds its gates in its batch; this list is
/// for everyone else, who must not dereference a gate the runner may have
/// passed and freed (the list holds them weakly).
///
/// Invariants:
/// - `pushed() >= passed()` read in that order (`pending_waits`): a gate is
///   counted pushed before it can be passed.
/// - The list keeps every gate still alive (the queue entry holds one
///   reference until the runner passes it); spent entries are pruned only
///   when the list has doubled since the last pruning (at least 64), so a
///   host running thousands of waits ahead of a chain pays no scan per push.
/// - `parked_on()` is the gate the device is parked at, or null; it is only
///   compared with the list's entries, never dereferenced (the runner may
///   free it as it passes it).
///
/// Threads: the list (`add_locked`, `take_back_locked`, `find_locked`,
/// `size_locked`) is guarded by a lock the owner holds (a device's waiters
/// lock, which its other sections share). `count_passed` and `set_parked_on`:
/// the device's token holder (on an asynchronous driver, one thread at a
/// time: the resolver, the runner). The readers: any thread.
///
/// A hop of a chain passes a wait and parks and unparks two devices: these
/// are one writer each, plain stores where a shared counter or a mutex
/// round trip showed in a hop's cost.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace multidev::detail {

struct gate;

class gate_list {
public:
  // -- Under the owner's lock -----------------------------------------------------

  /// Lists `g` (pending, being queued) and counts it pushed; prunes the
  /// entries of gates gone first when the list has doubled. Throws only on
  /// allocation failure (then nothing changed but a pruning).
  void add_locked(const std::shared_ptr<gate>& g) {
    if (gates_.size() >= prune_at_) {
      // Gates gone only: looking at a live one's state took a reference, two
      // locked instructions for each gate still listed, and a host running
      // ahead of a chain lists thousands. A resolved gate goes as its wait
      // is passed, soon after.
      std::erase_if(gates_, [](const auto& w) { return w.expired(); });
      prune_at_ = std::max<std::size_t>(64, 2 * gates_.size());
    }
    gates_.push_back(g);
    pushed_.store(pushed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  /// Uncounts the gate last added: its queue entry could not be pushed.
  /// (Its entry stays, pruned once the gate is gone.)
  void take_back_locked() noexcept {
    pushed_.store(pushed_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  }
  /// Calls `f(std::shared_ptr<gate>)` for each listed gate still alive, in
  /// the order they were added, until a call returns true; whether one did.
  template <class F>
  bool find_locked(F&& f) const {
    for (const auto& w : gates_)
      if (auto g = w.lock(); g && f(std::move(g)))
        return true;
    return false;
  }
  /// Entries listed, gone gates not yet pruned included.
  std::size_t size_locked() const noexcept { return gates_.size(); }

  // -- The token holder ---------------------------------------------------------

  /// A queued wait was passed (run or dropped).
  void count_passed() noexcept {
    passed_.store(passed_.load(std::memory_order_relaxed) + 1,
                  std::memory_order_release); // after its push, for pending_waits
  }
  /// The device is parked at `g` now (null: not parked).
  void set_parked_on(const gate* g) noexcept { parked_on_.store(g, std::memory_order_release); }

  // -- Any thread ------------------------------------------------------------------

  /// Waits pushed and not yet passed (debug info's `pending_waits`); never
  /// negative.
  uint64_t pending_waits() const noexcept {
    // Passed first: a wait is counted pushed before it can be passed.
    auto passed = passed_.load(std::memory_order_acquire);
    return pushed_.load(std::memory_order_acquire) - passed;
  }
  uint64_t pushed() const noexcept { return pushed_.load(std::memory_order_acquire); }
  uint64_t passed() const noexcept { return passed_.load(std::memory_order_acquire); }
  const gate* parked_on(std::memory_order o = std::memory_order_acquire) const noexcept {
    return parked_on_.load(o);
  }

private:
  // Waits queued and waits passed: two counters, each with one writer at a
  // time, rather than one that both sides change with a locked instruction,
  // which a hop of a chain paid once per wait. `pushed_` is written under
  // the owner's lock; `passed_` by the token holder.
  std::atomic<uint64_t> pushed_{0};
  std::atomic<uint64_t> passed_{0};
  // Atomic, not guarded: a hop of a chain parks and unparks both devices,
  // and four mutex round trips a hop showed in its cost.
  std::atomic<const gate*> parked_on_{nullptr};
  std::vector<std::weak_ptr<gate>> gates_; // guarded by the owner's lock
  std::size_t prune_at_ = 64;              // guarded by the owner's lock
};

} // namespace multidev::detail
