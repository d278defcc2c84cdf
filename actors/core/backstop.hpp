#pragma once
/// \file
/// The backstop for deferred wake-ups. A runner that opens the wait of a
/// sleeping device, in a process with more runners than CPUs, when it
/// waits for that device itself a few items later, may leave the sleeper
/// asleep (`hand_over::try_defer`): the opener runs the device's items
/// itself when it gets to its wait (`try_help`), and the context switches
/// of a wake-up are saved. Should the opener not get there soon (one of its
/// tasks blocks on that very device's work, say), the backstop rings the
/// device a period or two later: a deferred wake-up is late, never lost.
///
/// One per process, never destroyed. Its thread runs only while wake-ups
/// are being deferred: it looks once a period, and ends once nothing was
/// deferred for a while (`linger`), so idle devices cost no CPU and a
/// backend that is gone leaves no thread behind.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

namespace multidev::detail {

class device_core;

class wake_backstop {
public:
  using clock = std::chrono::steady_clock;

  /// The process's backstop.
  static wake_backstop& instance();

  /// `core`'s wake-up was deferred, stamped `stamp` (see
  /// `hand_over::ring_if_deferred`): rings it a period or two from now
  /// unless the deferral has been taken up (or rung) by then. False when
  /// the backstop's thread could not be started: the caller rings now.
  bool deferred(device_core* core, uint64_t stamp) noexcept;
  /// `core` is going away: its deferrals are forgotten (its destructor).
  /// The backstop holds no reference to a device, so a device is never
  /// destroyed on the backstop's thread.
  void forget(const device_core* core) noexcept;
  /// A stamp no deferral of this process had before (never 0).
  static uint64_t next_stamp() noexcept;

  /// How long a deferred wake-up may wait before the backstop rings it (at
  /// most twice that, as it looks once a period).
  static clock::duration period() noexcept;
  /// For tests: sets the period (zero restores the default).
  static void set_period_for_tests(clock::duration p) noexcept;
  /// How long its thread waits for another deferral, once none is left,
  /// before it ends.
  static clock::duration linger() noexcept;
  /// For tests: sets the linger (zero restores the default); a thread
  /// lingering now looks again at once.
  static void set_linger_for_tests(clock::duration l) noexcept;

  /// Deferred wake-ups this process's backstop rang (nobody took them up in
  /// time); for tests and diagnostics.
  uint64_t rang() const noexcept;
  /// Whether its thread runs now; for tests.
  bool running() const noexcept;
  /// Whether its thread runs and waits for a deferral, with none left to
  /// ring; for tests.
  bool lingering() const noexcept;
  /// The Linux thread id of its thread while it runs (0 when none ran
  /// yet, or it could not say); for tests.
  int thread_id() const noexcept;

private:
  wake_backstop() = default;
  void loop() noexcept;

  struct entry {
    device_core* core; // null once forgotten
    uint64_t stamp;
    clock::time_point at;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<entry> entries_; // guarded by mu_, oldest first
  bool running_ = false;      // guarded by mu_: its thread runs
  bool lingering_ = false;    // guarded by mu_: it waits with nothing to ring
  uint64_t rang_ = 0;         // guarded by mu_
  int tid_ = 0;               // guarded by mu_: its thread's, once it runs
};

} // namespace multidev::detail
