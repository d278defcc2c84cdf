#pragma once
/// \file
/// Orders' and waits' extras (`item_extra`), recycled between a device's
/// runner and the producers that push orders and waits.
///
/// A producer that allocates what the runner frees contends with it for the
/// allocator's arena lock on every item (half of a 4 KiB host copy's time
/// went there): the runner keeps the extras of the orders and waits it
/// resolved (`recycle`: spent), hands them back to producers a group at a
/// time as it takes its next batch (`hand_back_if_due`: spare), and
/// producers of orders and waits take them one by one (`take`). All of
/// them, however many a burst had in flight: had the runner freed those
/// beyond a limit while a producer ahead of it allocated new ones, the two
/// would again contend for the arena lock on every order (seen as a futex
/// storm that tripled `copy_4KiB` for a whole sample). The runner frees the
/// excess over `spare_extras_max` when it goes idle (`trim_spare_extras`).
///
/// Invariants:
/// - A spare extra holds no pool and no gate (its other fields are stale:
///   the producer that takes it sets them).
/// - A spent extra holds no gate (a wait's gate goes as the wait resolves);
///   an order's pool stays held until its group is handed back, the runner
///   goes idle, a release runs, or the device shuts down
///   (`let_go_of_spent_pools`), so the pool's reference count moves between
///   the host's and the runner's CPUs once a group, not twice a copy.
/// - Nothing here throws but `take` (allocation); out of memory, an extra
///   that cannot be kept is freed instead.
///
/// Threads: `take` and `spare_count`, any thread (under `spare_mu_`). The
/// rest, "runner only": the thread that resolves the device's items (its
/// runner, or whichever runner holds its token), or whoever is left once
/// the runner is gone (shutdown).
///
/// Layout: producers take from `spare_` under its lock; the runner writes
/// `spent_` for every order. Each on a line of its own (the class is
/// 64-aligned), and off the device's hot lines: tasks that are neither
/// orders nor waits never touch them.

#include <cstddef>
#include <memory>
#include <vector>

#include "actors/core/item.hpp"
#include "actors/core/spin.hpp"

namespace multidev::detail {

class extra_cache {
public:
  /// Spare extras kept past an idle point (`trim_spare_extras`).
  static constexpr std::size_t spare_extras_max = 1024;
  /// Spent extras the runner gathers before it hands them back.
  static constexpr std::size_t hand_back_extras = 16;

  // -- Producers (any thread) ---------------------------------------------------

  /// An extra for an order or a wait: one the runner handed back (holding no
  /// pool and no gate, its other fields stale: the caller sets them), or a new one.
  std::unique_ptr<item_extra> take();
  /// Spare extras now (debug info's `spare_extras`).
  std::size_t spare_count() const;

  // -- Runner only --------------------------------------------------------------

  /// Once the order or wait `it` is resolved: keeps its extra for the next
  /// `hand_back_if_due` to hand back (its gate goes now, its pool later).
  void recycle(item& it) noexcept;
  /// As the runner takes a batch: hands the spent extras back once there are
  /// `hand_back_extras` of them. Inlined: `take_batch` asks on every batch.
  void hand_back_if_due() noexcept {
    if (spent_.size() >= hand_back_extras)
      hand_back_extras_to_producers();
  }
  /// Moves spent_ into spare_ (all of it, while memory lasts), letting go of
  /// the pools their orders held.
  void hand_back_extras_to_producers() noexcept;
  /// The spent extras let go of the pools their orders held, and stay spent.
  /// As a group is handed back, at a release, when the runner goes idle (an
  /// idle device holds no pool; its extras are handed back with the next
  /// batch, as ever, so that a host syncing on each copy still finds 16 or
  /// more spare ones), at shutdown.
  void let_go_of_spent_pools() noexcept;
  /// As an item with an extra resolves: lets go of what it held, except an
  /// order on a pool (a copy, a zeroing: `op.dst` set), whose pool stays
  /// held until its extra is handed back. A release (an order without
  /// `dst`) first makes the spent orders let go of theirs, so that its
  /// pool's memory is gone before its event is done.
  void release_hold(item_extra& x) noexcept;
  /// The same for whatever extra `it` has (a described task's `keep_alive`
  /// goes at once).
  void release_hold(item& it) noexcept;
  /// Before the runner sleeps: frees the spare extras beyond
  /// `spare_extras_max`, kept through a burst.
  void trim_spare_extras() noexcept;
  /// Spent extras not yet handed back (for tests).
  std::size_t spent_count() const noexcept { return spent_.size(); }

private:
  // Taken by producers one by one, refilled by the runner a group at a
  // time: its lock and the vector on one line.
  alignas(64) mutable spin_mutex spare_mu_;
  std::vector<std::unique_ptr<item_extra>> spare_; // guarded by spare_mu_
  // Runner only, written for every order: a line of its own.
  alignas(64) std::vector<std::unique_ptr<item_extra>> spent_;
};

} // namespace multidev::detail
