#pragma once
/// \file
/// Busy-waiting for the hot path: a pause instruction, a bounded poll, and a
/// test-and-test-and-set lock. A poll is far cheaper for both sides than a
/// futex sleep and wake-up when the other side comes back within microseconds.

#include <atomic>
#include <thread>

namespace multidev::detail {

/// How a runner polls before it sleeps: a producer in a burst or a device
/// about to resolve a wait usually comes back within microseconds. The poll
/// pauses first, then yields, so a producer sharing this CPU gets to run.
inline constexpr int spin_pauses = 64;
inline constexpr int spin_yields = 8;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

/// Polls `ready` for a while, every `stride` pauses; true as soon as it
/// holds. A poll of a line another core keeps writing (the producer's
/// counter) costs that core a cache miss on its next write, so such polls
/// use a longer stride.
template <class Pred>
bool spin_until(Pred ready, int stride = 1) {
  for (int i = 0; i < spin_pauses + spin_yields; ++i) {
    if ((i % stride == 0 || i >= spin_pauses) && ready())
      return true;
    if (i < spin_pauses)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  return ready();
}

/// How a runner parked on a wait polls before it sleeps: the awaited device
/// is usually running the awaited item right now. A pause costs ~19 ns and a
/// `sched_yield` ~1.2 µs (a system call) on this project's guest, and a
/// futex wake-up several µs: so it polls with pauses for ~`gate_spin_pauses`
/// x 19 ns, giving the CPU away once every `gate_yield_every` pauses in case
/// the device it waits for (or the host scheduling it) shares this CPU.
inline constexpr int gate_spin_pauses = 1024;
inline constexpr int gate_yield_every = 256;

template <class Pred>
bool spin_on_gate(Pred ready) {
  for (int i = 1; i <= gate_spin_pauses; ++i) {
    if (ready())
      return true;
    if (i % gate_yield_every == 0)
      std::this_thread::yield();
    else
      cpu_relax();
  }
  return ready();
}

/// A test-and-test-and-set lock for the queue's few-instruction critical
/// sections: under contention a std::mutex sleeps in the kernel at once,
/// which costs more than the whole push it protects.
class spin_mutex {
public:
  void lock() noexcept {
    for (int i = 0;; ++i) {
      if (!locked_.load(std::memory_order_relaxed) && try_lock())
        return;
      if (i < 64)
        cpu_relax();
      else
        std::this_thread::yield(); // the holder may have been preempted
    }
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

private:
  std::atomic<bool> locked_{false};
};

} // namespace multidev::detail
