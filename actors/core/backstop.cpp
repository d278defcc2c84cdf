// The backstop for deferred wake-ups (see backstop.hpp).
#include "actors/core/backstop.hpp"

#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "actors/core/device_core.hpp"

namespace multidev::detail {

namespace {
/// 50 µs: a fan-out round of `multidev bench` on this project's machine
/// takes a few µs, a futex wake-up with its context switch several: a
/// backstop that looks once every 50 µs costs one context switch a period
/// while wake-ups are being deferred.
constexpr wake_backstop::clock::duration default_period = std::chrono::microseconds{50};
std::atomic<wake_backstop::clock::rep> period_ticks{default_period.count()};
/// 20 ms: a thread started and ended for every burst of deferrals would
/// cost more than the deferrals save; idle for longer, it ends.
constexpr wake_backstop::clock::duration default_linger = std::chrono::milliseconds{20};
std::atomic<wake_backstop::clock::rep> linger_ticks{default_linger.count()};
} // namespace

wake_backstop& wake_backstop::instance() {
  // Never destroyed: a device of a static backend may defer, or be
  // forgotten, while the process exits.
  static auto* b = new wake_backstop;
  return *b;
}

wake_backstop::clock::duration wake_backstop::period() noexcept {
  return clock::duration{period_ticks.load(std::memory_order_relaxed)};
}

namespace {
/// Sets `ticks` to `d`, or to `fallback` when `d` is zero, and has a
/// waiting backstop thread look again at once (the tests' setters).
void set_ticks_for_tests(std::atomic<wake_backstop::clock::rep>& ticks,
                         wake_backstop::clock::duration d,
                         wake_backstop::clock::duration fallback, std::mutex& mu,
                         std::condition_variable& cv) noexcept {
  ticks.store(d > wake_backstop::clock::duration::zero() ? d.count() : fallback.count(),
              std::memory_order_relaxed);
  {
    std::lock_guard guard{mu}; // a thread about to wait sees the new value
  }
  cv.notify_all();
}
} // namespace

void wake_backstop::set_period_for_tests(clock::duration p) noexcept {
  auto& b = instance();
  set_ticks_for_tests(period_ticks, p, default_period, b.mu_, b.cv_);
}

wake_backstop::clock::duration wake_backstop::linger() noexcept {
  return clock::duration{linger_ticks.load(std::memory_order_relaxed)};
}

void wake_backstop::set_linger_for_tests(clock::duration l) noexcept {
  auto& b = instance();
  set_ticks_for_tests(linger_ticks, l, default_linger, b.mu_, b.cv_);
}

bool wake_backstop::deferred(device_core* core, uint64_t stamp) noexcept {
  std::unique_lock guard{mu_};
  try {
    entries_.push_back(entry{core, stamp, clock::now()});
  } catch (...) {
    return false;
  }
  if (running_) {
    // Its thread lingering with nothing to ring would otherwise see this
    // one only when the linger ends: 20 ms, not a period.
    if (lingering_) {
      lingering_ = false;
      guard.unlock();
      cv_.notify_one();
    }
    return true;
  }
  try {
    std::thread([this] { loop(); }).detach();
  } catch (...) {
    entries_.pop_back();
    return false;
  }
  running_ = true;
  return true;
}

void wake_backstop::forget(const device_core* core) noexcept {
  std::lock_guard guard{mu_};
  for (auto& e : entries_)
    if (e.core == core)
      e.core = nullptr;
}

uint64_t wake_backstop::next_stamp() noexcept {
  static std::atomic<uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed) + 1;
}

uint64_t wake_backstop::rang() const noexcept {
  std::lock_guard guard{mu_};
  return rang_;
}

bool wake_backstop::running() const noexcept {
  std::lock_guard guard{mu_};
  return running_;
}

int wake_backstop::thread_id() const noexcept {
  std::lock_guard guard{mu_};
  return tid_;
}

bool wake_backstop::lingering() const noexcept {
  std::lock_guard guard{mu_};
  return running_ && lingering_;
}

void wake_backstop::loop() noexcept {
  // The default timer slack (50 µs) would stretch each period by as much.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  // Never ahead of a runner: a thread of the batch policy does not preempt
  // the one running on its CPU when its timer wakes it, so it looks once
  // that thread sleeps or its time slice ends (a few ms at most), or at
  // once where a CPU is idle. Woken with the normal policy, it took the CPU
  // from the runner that had deferred, every period, on the CPU where it
  // had slept: here the kernel does not move a woken thread to the other,
  // idle CPU. `fan_dag_8dev_prebuilt` took 10.4 µs a round then, 6.1
  // since (docs/design.md, "Deferred wake-ups"). A deferral that nobody
  // takes up is one whose opener is held up: blocked, and its CPU then
  // free, or busy with a task, and the deferred runner then needs a CPU
  // anyway. Best effort: the normal policy stays where the batch one is
  // refused.
  sched_param none{};
  (void)sched_setscheduler(0, SCHED_BATCH, &none);
  std::unique_lock lk{mu_};
  tid_ = static_cast<int>(gettid());
  for (;;) {
    if (entries_.empty()) {
      // Nothing deferred: ends unless a deferral comes soon (which notifies
      // a lingering thread). Its linger is read again on every wake-up, for
      // tests that change it.
      auto since = clock::now();
      lingering_ = true;
      while (entries_.empty()) {
        auto until = since + linger();
        if (clock::now() >= until) {
          lingering_ = false;
          running_ = false;
          tid_ = 0;
          return;
        }
        cv_.wait_until(lk, until);
      }
      lingering_ = false;
    }
    auto p = period();
    auto now = clock::now();
    // Rung under the lock, so that a device's destructor (`forget`) cannot
    // free it meanwhile: a compare-and-swap, and a futex wake only for a
    // runner that still sleeps.
    while (!entries_.empty() && entries_.front().at + p <= now) {
      auto e = entries_.front();
      entries_.pop_front();
      if (e.core && e.core->runner().handover().ring_if_deferred(e.stamp))
        ++rang_;
    }
    // Once a period, however many were deferred meanwhile: a deferral
    // waits one to two periods.
    cv_.wait_until(lk, now + p);
  }
}

} // namespace multidev::detail
