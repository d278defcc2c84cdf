#pragma once
/// \file
/// Busy-waiting for the hot path: a pause instruction, a bounded poll, and a
/// test-and-test-and-set lock. A poll is far cheaper for both sides than a
/// futex sleep and wake-up when the other side comes back within microseconds.

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <limits>
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

/// Whether this CPU has PREFETCHW (CPUID 0x80000001, ECX bit 8).
inline const bool cpu_has_prefetchw = [] {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(0x80000001, &a, &b, &c, &d) != 0 && (c & (1u << 8)) != 0;
#else
  return false;
#endif
}();

/// Asks for the line at `p` in a state this core may write, so that a write
/// soon after does not wait for another core to give it up. Without
/// `-mprfchw`, `__builtin_prefetch(p, 1)` emits a read prefetch: the line
/// then arrives shared and the write still waits for the other core.
inline void prefetch_for_write(const void* p) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if (cpu_has_prefetchw) {
    asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
    return;
  }
#endif
  __builtin_prefetch(p, 1, 3);
}

/// A runner's doorbell. A runner parked at a wait sleeps on it while `bell`
/// still reads `seen` (a futex wait, which may also return early: callers
/// look again); a ring wakes it. Not `std::atomic::wait`: libstdc++ 12's
/// polls first and calls `sched_yield` four times, and a runner pinned to a
/// CPU that a busy thread shares (the host, scheduling) gave that CPU away
/// for a whole scheduler tick per yield (4 ms on this project's guest: of
/// 2,000 yields beside a thread spinning on the same CPU, 1,266 and 1,330
/// took over 1 ms in two runs, the median 3.99 ms): the device it was rung
/// for, and every device waiting on it, sat out the tick. Private futexes, which `std::atomic::wait` does not use here
/// (libstdc++ 12 was built without them): every wait on a bell and every
/// ring go through these functions, or a ring would miss its sleeper.
inline void bell_sleep(const std::atomic<uint32_t>& bell, uint32_t seen) noexcept {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                std::atomic<uint32_t>::is_always_lock_free);
  syscall(SYS_futex, &bell, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}
/// `bell_sleep` that returns after `timeout` at the latest.
inline void bell_sleep_for(const std::atomic<uint32_t>& bell, uint32_t seen,
                           std::chrono::nanoseconds timeout) noexcept {
  auto ns = std::max<int64_t>(timeout.count(), 0);
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, &bell, FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
}
/// `bell_sleep` after the poll `std::atomic::wait` makes (12 pauses, then 4
/// yields): an idle runner's, which saves a producer in a burst the futex
/// wake-ups (with `bell_sleep` alone, `copy_4KiB` took 194 against 161 ns
/// a copy, 12 alternating runs of `multidev bench --only copy_4KiB`).
inline void bell_sleep_polled(const std::atomic<uint32_t>& bell, uint32_t seen) noexcept {
  for (int i = 0; i < 16; ++i) {
    if (bell.load(std::memory_order_seq_cst) != seen)
      return;
    if (i < 12)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  bell_sleep(bell, seen);
}
/// Rings `bell`: wakes the runner sleeping on it, if any. Callers ring only
/// a runner marked asleep.
inline void bell_ring(std::atomic<uint32_t>& bell) noexcept {
  bell.fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, &bell, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
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
/// futex wake-up several µs: so it polls with pauses for ~`gate_spin_pauses`
/// x 19 ns. It never yields: it used to, once every 256 pauses, in case the
/// device it waits for (or the host scheduling it) shared its CPU, but a
/// pinned runner whose CPU a busy thread shares (the host, scheduling) then
/// gave that CPU away for a whole scheduler tick (see `bell_sleep`).
/// Without the yields here and in its doorbell's wait, `fan_dag_2dev` took
/// 6.0 µs a round against 24.7 (medians of 10 alternating `bench --only`
/// runs with the build before, on the guest's slow days; 4.2 against 3.1
/// on its fast ones: docs/design.md, "Runners pinned to CPUs").
inline constexpr int gate_spin_pauses = 1024;
/// The same when more runners are awake than there are CPUs (for a pinned
/// runner: another runner pinned to its CPU is awake): then a runner
/// polling a wait takes CPU time from the runners it waits for (8 devices
/// on this project's 2 vCPUs: the fan-out/fan-in DAG of `multidev bench`
/// took 59.5 µs a round with the long poll, 31.7 with a poll of 64 pauses
/// yielding every 16). It does not poll at all now: asleep at once, its
/// wake-up can be deferred to a runner that runs its items itself
/// (`hand_over::try_defer`), which with a polling runner, awake, almost
/// never happened (the same DAG, alternating: 14.3-16.5 against 22.5-27.0
/// µs a round at 8 devices, 7.1-9.0 against 11.3-11.6 at 4).
inline constexpr int gate_spin_pauses_crowded = 0;

/// Runner threads of this process that are not asleep on their doorbell
/// (`runner_awake` counts one in for its life, `runner_asleep` out while it
/// sleeps). Read, not exact, by `spin_on_gate`.
inline std::atomic<int> awake_runners{0};

/// Runner threads of this process, asleep or not.
inline std::atomic<int> live_runners{0};

/// How many runners the process must have for a runner to defer another's
/// wake-up (`hand_over::try_defer`): one more than its CPUs, set by the
/// first runner (`runner_awake`); tests lower it. Until then, none defers.
inline std::atomic<int> defer_min_runners{std::numeric_limits<int>::max()};

inline int process_cpus() noexcept;

/// Awake runners pinned to each CPU (`pin_to_next_cpu`), the CPU's number
/// modulo `tracked_cpus`: what `runners_crowd_cpus` asks a pinned runner.
/// A line each: runners on different CPUs count themselves in and out.
struct alignas(64) cpu_awake_count {
  std::atomic<int> n{0};
};
inline constexpr int tracked_cpus = 256;
inline cpu_awake_count awake_on_cpu[tracked_cpus];
/// The CPU the calling runner pinned itself to, or -1.
inline thread_local int pinned_cpu = -1;
/// The awake count of the calling runner's CPU (it pinned itself).
inline std::atomic<int>& awake_on_my_cpu() noexcept {
  return awake_on_cpu[pinned_cpu % tracked_cpus].n;
}
/// Adds `delta` to the awake count of the calling runner's CPU, if it
/// pinned itself.
inline void count_awake_on_my_cpu(int delta) noexcept {
  if (pinned_cpu >= 0)
    awake_on_my_cpu().fetch_add(delta, std::memory_order_relaxed);
}

/// Counts the calling runner in `awake_runners` and `live_runners` for the
/// scope's life (and in `awake_on_cpu` once it pins itself).
struct runner_awake {
  runner_awake() noexcept {
    if (defer_min_runners.load(std::memory_order_relaxed) == std::numeric_limits<int>::max())
      defer_min_runners.store(process_cpus() + 1, std::memory_order_relaxed);
    live_runners.fetch_add(1, std::memory_order_relaxed);
    awake_runners.fetch_add(1, std::memory_order_relaxed);
  }
  ~runner_awake() {
    count_awake_on_my_cpu(-1);
    awake_runners.fetch_sub(1, std::memory_order_relaxed);
    live_runners.fetch_sub(1, std::memory_order_relaxed);
  }
  runner_awake(const runner_awake&) = delete;
  runner_awake& operator=(const runner_awake&) = delete;
};
/// Counts the calling runner out of `awake_runners` while it sleeps.
struct runner_asleep {
  runner_asleep() noexcept {
    count_awake_on_my_cpu(-1);
    awake_runners.fetch_sub(1, std::memory_order_relaxed);
  }
  ~runner_asleep() {
    awake_runners.fetch_add(1, std::memory_order_relaxed);
    count_awake_on_my_cpu(1);
  }
  runner_asleep(const runner_asleep&) = delete;
  runner_asleep& operator=(const runner_asleep&) = delete;
};

/// The CPUs in `set`, or the machine's when it is empty (an affinity mask
/// the kernel would not give); at least 1.
inline int cpus_in(const cpu_set_t& set) noexcept {
  if (int n = CPU_COUNT(&set); n > 0)
    return n;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// The CPUs the calling thread may run on (its affinity mask: `taskset`, a
/// container's cpuset, or the one CPU a pinned runner has), which can be
/// fewer than the machine has.
inline int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    CPU_ZERO(&set);
  return cpus_in(set);
}

/// The process's affinity mask as of the first call: made before any
/// runner pins itself (`pin_to_next_cpu` asks for it first), so a pinned
/// runner does not take its own single CPU for the process's.
inline const cpu_set_t& process_cpu_mask() noexcept {
  static const cpu_set_t mask = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0)
      CPU_ZERO(&set);
    return set;
  }();
  return mask;
}

/// How many CPUs the process may use (`process_cpu_mask`; at least 1).
inline int process_cpus() noexcept {
  static const int n = cpus_in(process_cpu_mask());
  return n;
}

/// Pins the calling thread to one CPU of the process's affinity mask (as of
/// the first call), taking them in turn across the process: the first
/// runner gets the mask's first CPU, the next one the second, and so on,
/// round. Returns that CPU, or -1 when the mask has a single CPU (nothing
/// to spread) or the kernel refuses.
inline int pin_to_next_cpu() noexcept {
  const cpu_set_t& mask = process_cpu_mask();
  static std::atomic<unsigned> next{0};
  const int n = CPU_COUNT(&mask);
  if (n < 2)
    return -1;
  auto k = static_cast<int>(next.fetch_add(1, std::memory_order_relaxed) % static_cast<unsigned>(n));
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask) || k-- > 0)
      continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
      return -1;
    if (pinned_cpu < 0) { // a runner pins itself once, awake (`runner_awake`)
      pinned_cpu = cpu;
      count_awake_on_my_cpu(1);
    }
    return cpu;
  }
  return -1;
}

/// The CPUs the calling runner may run on, as of its first look: the
/// process's (`process_cpus`), or one for a runner that pinned itself.
inline int runner_cpus() noexcept {
  thread_local const int n = usable_cpus();
  return n;
}

/// Whether more runners are awake than the calling runner has CPUs: for a
/// pinned runner (backends of two devices or more, see `pin_to_next_cpu`),
/// whether another runner pinned to its CPU is awake. It used to be whether
/// any other runner was awake, anywhere: then with two devices on two CPUs,
/// each runner alone on its own, a runner at a wait never polled and slept
/// on its futex at once. 4,500 rounds of `fan_dag_2dev_prebuilt` (`multidev
/// bench`) made 855 and 907 context switches (two runs), against 170 with
/// 8aa6710's runners, which polled in `std::atomic::wait` first, and 110-115
/// now; `fan_dag_2dev` took 2.6 against 4.0 µs a round (medians of 6
/// alternating runs). Runners not pinned, which may be anywhere, count all
/// awake runners.
inline bool runners_crowd_cpus() noexcept {
  if (pinned_cpu >= 0)
    return awake_on_my_cpu().load(std::memory_order_relaxed) > 1;
  return awake_runners.load(std::memory_order_relaxed) > runner_cpus();
}

template <class Pred>
bool spin_on_gate(Pred ready) {
  const int pauses = runners_crowd_cpus() ? gate_spin_pauses_crowded : gate_spin_pauses;
  for (int i = 0; i < pauses; ++i) {
    if (ready())
      return true;
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
