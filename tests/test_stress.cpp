// Stress (issue 12): 8 devices, a million tasks, random waits between the
// devices, injected failures, cancellations and recoveries, all drawn from one
// seeded generator. Every event must resolve (done, failed or cancelled), no
// task may be lost or run twice, and nothing may hang.
//
// MULTIDEV_STRESS_SEED replays a run's draws (the seed is printed; the
// interleaving with the runners still varies), MULTIDEV_STRESS_TASKS sets the
// number of tasks. CTest runs this binary a second time as test_stress_soak
// (label soak, not in the default test presets) with 200 million tasks.
#define BOOST_TEST_MODULE stress
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace multidev;
using test_support::latch_gate;
using test_support::watchdog;

namespace {

constexpr int num_devices = 8;
constexpr uint64_t default_seed = 0x12'5eed'2024;
constexpr uint64_t default_tasks = 1'000'000;
/// Tasks checked at once: the per-task records are kept for one round.
constexpr uint64_t round_tasks = uint64_t{1} << 20;
/// Steps under one watchdog: each must finish within its 30 s.
constexpr uint64_t steps_per_watch = uint64_t{1} << 14;
/// Tasks queued behind a blocked runner, then cancelled, per episode.
constexpr int episode_tasks = 32;

/// What a step does: the chances are out of 2^20, drawn per step.
constexpr uint32_t draw_range = uint32_t{1} << 20;
constexpr uint32_t one_in(uint32_t n) { return draw_range / n; }
constexpr uint32_t chance_episode = one_in(50'000); // block, queue, cancel, release
constexpr uint32_t chance_cancel = one_in(40'000);  // cancel whatever is queued
constexpr uint32_t chance_sync = one_in(8'192);     // the host syncs on an earlier event
constexpr uint32_t chance_throw = one_in(25'000);   // the task throws
constexpr uint32_t chance_wait = one_in(256);       // will_wait_for an earlier event

uint64_t env_number(const char* name, uint64_t fallback) {
  auto* text = std::getenv(name);
  if (!text || !*text)
    return fallback;
  return std::stoull(text, nullptr, 0);
}

/// What a task does besides counting its run.
enum class task_kind : uint8_t {
  plain,
  thrower, ///< Throws: its device fails.
  blocker, ///< Holds its runner until the host releases it (an episode).
  held,    ///< Queued behind a blocker, then cancelled: must never run.
};

/// A runner held by a blocker task, which opens `started`, then waits for
/// `release` (bounded: 30 s).
struct hold {
  latch_gate started;
  latch_gate release;
};

const char* kind_name(task_kind k) {
  switch (k) {
    case task_kind::plain:
      return "plain";
    case task_kind::thrower:
      return "thrower";
    case task_kind::blocker:
      return "blocker";
    case task_kind::held:
      return "held";
  }
  return "?";
}

/// One scheduled task: where it went and what it is.
struct task_record {
  uint64_t seq = 0;
  uint8_t device = 0;
  task_kind kind = task_kind::plain;
};

/// What a run did and how its tasks ended.
struct tally {
  uint64_t scheduled = 0;
  uint64_t done = 0;
  uint64_t threw = 0;   ///< failed, having run (an injected failure)
  uint64_t dropped = 0; ///< failed without running (behind a failure)
  uint64_t cancelled = 0;
  uint64_t refused = 0; ///< schedule_task or will_wait_for on a failed device
  uint64_t recoveries = 0;
  uint64_t waits = 0;
  uint64_t cancels = 0;
  uint64_t episodes = 0;
  uint64_t host_syncs = 0;
  uint64_t mismatches = 0; ///< checks that failed (the first few are reported)
};

/// Drives its backend through rounds of random steps, then checks each
/// round's tasks one by one. Runs on the test's thread only.
class stress_run {
public:
  explicit stress_run(uint64_t seed)
    : b_(test_support::make_backend(num_devices)), rng_(seed), seed_(seed) {
    for (int i = 0; i < num_devices; ++i) {
      devices_.push_back(b_.get_device(i));
      contexts_.push_back(b_.make_context(devices_.back()));
    }
  }
  stress_run(const stress_run&) = delete;
  stress_run& operator=(const stress_run&) = delete;
  /// Destroys the backend (it drains what is queued) before the run counters
  /// its tasks write go, also when a check stopped the test half-way; bounded.
  ~stress_run() {
    if (held_)
      held_->release.open();
    teardown_.emplace(what("destroying the backend"));
  }

  const tally& totals() const noexcept { return t_; }

  /// Schedules `tasks` tasks (the first numbered `first` in the run) in
  /// random steps, waits for every device, then checks every task's event
  /// and run count.
  void round(uint64_t first, uint64_t tasks) {
    first_ = first;
    records_.clear();
    records_.reserve(tasks);
    runs_ = std::vector<std::atomic<uint8_t>>(tasks);
    std::optional<watchdog> watch;
    uint64_t steps = 0;
    while (records_.size() < tasks) {
      if (steps++ % steps_per_watch == 0) {
        watch.reset();
        watch.emplace(what("scheduling from task " + std::to_string(first_ + records_.size())));
      }
      step(tasks - records_.size());
    }
    watch.reset();
    drain();
    check();
  }

  /// Every device, failed or not, comes back and runs new work.
  void check_devices_still_work() {
    watchdog watch{what("scheduling after the run")};
    std::atomic<int> ran{0};
    for (int i = 0; i < num_devices; ++i)
      schedule(i, [&] { return task{{}, [&ran] { ++ran; }}; });
    for (int i = 0; i < num_devices; ++i) {
      auto last = b_.all_work(devices_[i]);
      b_.sync(last); // must be done: nothing failed after the recovery
      BOOST_TEST((b_.state(last) == event_state::done));
    }
    BOOST_TEST(ran.load() == num_devices);
  }

private:
  std::string what(const std::string& doing) const {
    return "stress (seed " + std::to_string(seed_) + "): " + doing;
  }

  /// Reports one failed check; the first ten in detail.
  template <class Describe>
  void mismatch(Describe describe) {
    if (++t_.mismatches <= 10)
      BOOST_ERROR("seed " << seed_ << ": " << describe());
  }

  /// One random step; schedules at most `room` tasks.
  void step(uint64_t room) {
    auto x = rng_();
    auto i = static_cast<int>(x % num_devices);
    auto draw = static_cast<uint32_t>((x >> 3) % draw_range);
    auto more = x >> 23; // the rest of the bits, for picking an earlier event
    auto limit = chance_episode;
    if (draw < limit && room > episode_tasks)
      return episode(i);
    if (draw < (limit += chance_cancel)) {
      b_.cancel(devices_[i]);
      ++t_.cancels;
      return;
    }
    if (draw < (limit += chance_sync))
      return host_sync(more);
    if (draw < (limit += chance_wait))
      return wait(i, more);
    if (draw < (limit += chance_throw))
      return add(i, task_kind::thrower);
    add(i, task_kind::plain);
  }

  /// Schedules the task `make()` returns on device `i`. A failed device
  /// refuses it: the host recovers the device and schedules it again.
  template <class Make>
  void schedule(int i, Make make) {
    for (int attempt = 0;; ++attempt) {
      try {
        b_.schedule_task(devices_[i], make());
        return;
      } catch (const device_error& e) {
        refused(i, attempt, e);
      }
    }
  }

  /// A failed device refused work: bring it back. Nothing else schedules on
  /// it, so a second refusal in a row means recovery did not work.
  void refused(int i, int attempt, const device_error& e) {
    ++t_.refused;
    BOOST_TEST_REQUIRE(attempt == 0, "seed " << seed_ << ": " << devices_[i].name()
                                              << " refused work again after recover: "
                                              << e.what());
    BOOST_TEST_REQUIRE(b_.recover(devices_[i]), "seed " << seed_ << ": recover("
                                                         << devices_[i].name()
                                                         << ") failed after: " << e.what());
    ++t_.recoveries;
  }

  /// Schedules one counted task of kind `k` on device `i` and records its event.
  void add(int i, task_kind k, std::shared_ptr<hold> h = nullptr) {
    auto n = records_.size();
    auto* runs = &runs_[n];
    schedule(i, [&] {
      switch (k) {
        case task_kind::thrower:
          return task{"injected #" + std::to_string(first_ + n), [runs] {
                        runs->fetch_add(1, std::memory_order_relaxed);
                        throw std::runtime_error("injected failure");
                      }};
        case task_kind::blocker:
          return task{"blocker", [runs, h] {
                        runs->fetch_add(1, std::memory_order_relaxed);
                        h->started.open();
                        h->release.wait();
                      }};
        case task_kind::plain:
        case task_kind::held:
          break;
      }
      // Nameless, nothing kept alive: the runtime's cheapest task.
      return task{{}, [runs] { runs->fetch_add(1, std::memory_order_relaxed); }};
    });
    records_.push_back({b_.all_work(devices_[i]).seq(), static_cast<uint8_t>(i), k});
    ++t_.scheduled;
  }

  /// An event of a task scheduled earlier this round: mostly a recent one
  /// (still pending, likely), one in sixteen any (resolved, likely; a
  /// failed one fails the waiter and drops its queue).
  event earlier(uint64_t x) const {
    auto n = records_.size();
    auto back = std::min<uint64_t>(n, 1024);
    auto k = (x & 15) != 0 ? n - 1 - (x >> 4) % back : (x >> 4) % n;
    return event_of(records_[k]);
  }

  event event_of(const task_record& r) const {
    return event{devices_[r.device].get_runner(), r.seq};
  }

  /// Device `i` waits for an earlier event (of any device, itself included:
  /// a no-op). When that event fails, so does `i`.
  void wait(int i, uint64_t x) {
    if (records_.empty())
      return;
    auto e = earlier(x);
    for (int attempt = 0;; ++attempt) {
      try {
        b_.will_wait_for(contexts_[i], e);
        ++t_.waits;
        return;
      } catch (const device_error& err) {
        refused(i, attempt, err);
      }
    }
  }

  /// The host blocks on an earlier event; how `sync` ends must match `state`.
  void host_sync(uint64_t x) {
    if (records_.empty())
      return;
    auto e = earlier(x);
    ++t_.host_syncs;
    auto expected = event_state::done;
    try {
      b_.sync(e);
    } catch (const cancelled_error&) {
      expected = event_state::cancelled;
    } catch (const device_error&) {
      expected = event_state::failed;
    }
    if (auto s = b_.state(e); s != expected)
      mismatch([&] {
        return "sync on " + to_sexp(e).to_string() + " ended as " + to_string(expected) +
               " but its state is " + to_string(s);
      });
  }

  /// Holds device `i`'s runner in a blocker task, queues tasks behind it,
  /// cancels them, then releases the runner: the blocker must end done (a
  /// running task is not interrupted) and every queued task cancelled.
  void episode(int i) {
    ++t_.episodes;
    // What `i` has queued resolves first, so nothing ahead can drop the
    // blocker: it will run, and the host can wait for it to start.
    try {
      b_.sync(b_.all_work(devices_[i]));
    } catch (const device_error&) {
      // The device failed: scheduling the blocker recovers it.
    }
    held_ = std::make_shared<hold>();
    add(i, task_kind::blocker, held_);
    if (!held_->started.wait())
      mismatch([&] { return "the blocker on " + devices_[i].name() + " never started"; });
    for (int k = 0; k < episode_tasks; ++k)
      add(i, task_kind::held);
    b_.cancel(devices_[i]);
    ++t_.cancels;
    held_->release.open();
    held_.reset();
  }

  /// Waits until every device resolved everything scheduled on it: its last
  /// event resolves after all earlier ones.
  void drain() {
    for (int i = 0; i < num_devices; ++i) {
      watchdog watch{what("waiting for " + devices_[i].name())};
      auto last = b_.all_work(devices_[i]);
      try {
        b_.sync(last);
      } catch (const device_error&) {
        // Failed or cancelled: resolved all the same.
      }
    }
  }

  /// Every task's event resolved and agrees with how often the task ran.
  void check() {
    for (std::size_t n = 0; n < records_.size(); ++n) {
      const auto& r = records_[n];
      auto e = event_of(r);
      auto s = b_.state(e);
      auto runs = runs_[n].load(std::memory_order_relaxed);
      auto report = [&](const char* expectation) {
        mismatch([&] {
          return "task " + std::to_string(first_ + n) + " on " + devices_[r.device].name() +
                 " seq " + std::to_string(r.seq) + " (" + kind_name(r.kind) + "): state " +
                 to_string(s) + ", ran " + std::to_string(runs) + " times; expected " +
                 expectation;
        });
      };
      if (r.kind == task_kind::blocker && (s != event_state::done || runs != 1))
        report("a blocker to end done, having run once");
      if (r.kind == task_kind::held && (s != event_state::cancelled || runs != 0))
        report("a task queued behind a blocker, then cancelled, to end cancelled, never run");
      switch (s) {
        case event_state::pending:
          report("resolved after its device's last event was");
          break;
        case event_state::done:
          ++t_.done;
          if (runs != 1 || r.kind == task_kind::thrower)
            report("a done task to have run once, without throwing");
          break;
        case event_state::cancelled:
          ++t_.cancelled;
          if (runs != 0)
            report("a cancelled task never to run");
          break;
        case event_state::failed:
          if (runs == 0) {
            ++t_.dropped;
          } else if (runs == 1 && r.kind == task_kind::thrower) {
            ++t_.threw;
            check_origin(n, e);
          } else {
            report("a failed task to have run once only if it threw, else never");
          }
          break;
      }
    }
  }

  /// A task that threw is the origin of its own event's failure.
  void check_origin(std::size_t n, const event& e) {
    try {
      b_.sync(e);
      mismatch([&] { return "sync on the failed " + to_sexp(e).to_string() + " returned"; });
    } catch (const device_error& err) {
      if (err.origin_task() != "injected #" + std::to_string(first_ + n) || !err.path().empty() ||
          err.original_message() != "injected failure")
        mismatch([&] {
          return to_sexp(e).to_string() + " should have failed by its own task: " + err.what();
        });
    }
  }

  // Destroyed in reverse: the backend first, then what its tasks use.
  std::optional<watchdog> teardown_;
  std::vector<std::atomic<uint8_t>> runs_; // per task of the round, by record index
  std::shared_ptr<hold> held_;             // an episode's blocked runner, until released
  backend b_;
  std::mt19937_64 rng_;
  uint64_t seed_;
  std::vector<device> devices_;
  std::vector<context> contexts_;
  uint64_t first_ = 0;               // the run's number of the round's first task
  std::vector<task_record> records_; // the round's tasks
  tally t_;
};

} // namespace

BOOST_AUTO_TEST_CASE(test_stress_every_event_resolves_and_no_task_is_lost_or_run_twice) {
  auto seed = env_number("MULTIDEV_STRESS_SEED", default_seed);
  auto tasks = env_number("MULTIDEV_STRESS_TASKS", default_tasks);
  BOOST_TEST_MESSAGE("stress: seed " << seed << " (MULTIDEV_STRESS_SEED), " << tasks
                                     << " tasks (MULTIDEV_STRESS_TASKS) on " << num_devices
                                     << " devices");
  tally t;
  {
    stress_run run{seed};
    for (uint64_t first = 0; first < tasks; first += round_tasks)
      run.round(first, std::min(round_tasks, tasks - first));
    run.check_devices_still_work();
    t = run.totals();
  }
  BOOST_TEST_MESSAGE("stress: " << t.scheduled << " tasks: " << t.done << " done, " << t.threw
                                << " threw, " << t.dropped << " dropped behind a failure, "
                                << t.cancelled << " cancelled; " << t.waits << " waits, "
                                << t.cancels << " cancels (" << t.episodes << " on a held runner), "
                                << t.host_syncs << " host syncs, " << t.refused
                                << " refusals, " << t.recoveries << " recoveries");
  BOOST_TEST_CONTEXT("seed " << seed) {
    BOOST_TEST(t.mismatches == 0u);
    // Every task scheduled is accounted for by exactly one outcome.
    BOOST_TEST(t.scheduled == tasks);
    BOOST_TEST(t.done + t.threw + t.dropped + t.cancelled == t.scheduled);
    // A run long enough to draw every kind of step saw every outcome.
    if (tasks >= 200'000) {
      BOOST_TEST(t.done > 0u);
      BOOST_TEST(t.threw > 0u);
      BOOST_TEST(t.dropped > 0u);
      BOOST_TEST(t.cancelled > 0u);
      BOOST_TEST(t.episodes > 0u);
      BOOST_TEST(t.recoveries > 0u);
      BOOST_TEST(t.host_syncs > 0u);
    }
  }
}
