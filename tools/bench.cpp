#include "bench.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <time.h>

#include <multidev/kernels.hpp>

#include "gradient_merge.hpp"

namespace multidev::tools {

namespace {

using clock_type = std::chrono::steady_clock;

/// Copies per bandwidth sample: a few back to back smooth out the guest's
/// memory-bandwidth noise.
constexpr int copies_per_sample = 4;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

/// Runs `base` and `ours` alternately `repeats` times, so drift on a shared
/// machine hits both alike; the medians of what they return. One unrecorded
/// round first warms caches, pages and sleeping threads.
template <class Base, class Ours>
std::pair<double, double> medians(int repeats, Base base, Ours ours) {
  base();
  ours();
  std::vector<double> xs, ys;
  for (int i = 0; i < repeats; ++i) {
    xs.push_back(base());
    ys.push_back(ours());
  }
  return {median(std::move(xs)), median(std::move(ys))};
}

bench_result make(std::string name, std::string unit, double value, std::string baseline,
                  double baseline_value, std::string better, std::optional<double> target) {
  bench_result r{std::move(name), std::move(unit), value, std::move(baseline),
                 baseline_value, value / baseline_value, std::move(better), target};
  return r;
}

// -- baselines ------------------------------------------------------------------

/// The textbook queue: std::function under a mutex, a condition variable
/// notified on every push, one consumer thread.
class cv_queue {
public:
  cv_queue() : worker_([this] { loop(); }) {}
  ~cv_queue() {
    {
      std::lock_guard g{mu_};
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }
  void push(std::function<void()> f) {
    {
      std::lock_guard g{mu_};
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock lk{mu_};
        cv_.wait(lk, [this] { return stop_ || !q_.empty(); });
        if (q_.empty())
          return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::thread worker_;
};

/// ns per task: push n tasks, wait until the last one ran. The queue (and
/// its thread) lives across samples, like a device's runner.
double cv_queue_ns_per_task(cv_queue& q, int n) {
  std::atomic<int> done{0};
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    q.push([&done] { done.fetch_add(1, std::memory_order_relaxed); });
  std::promise<void> all;
  q.push([&all] { all.set_value(); });
  all.get_future().wait();
  return seconds_since(t0) * 1e9 / n;
}

/// ns per hop: two threads hand a token back and forth with atomic wait/notify.
double atomic_ping_pong_ns_per_hop(int hops) {
  std::atomic<int> turn{0};
  auto player = [&turn, hops](int me) {
    for (int i = me; i < hops; i += 2) {
      int v;
      while ((v = turn.load(std::memory_order_acquire)) != i)
        turn.wait(v);
      turn.store(i + 1, std::memory_order_release);
      turn.notify_one();
    }
  };
  auto t0 = clock_type::now();
  std::thread other(player, 1);
  player(0);
  other.join();
  return seconds_since(t0) * 1e9 / hops;
}

/// GB/s of a plain memcpy of `n` bytes between the very buffers the device
/// copy uses, timed on the runner thread of `d` itself: the guest's vCPUs and
/// pages differ in memory bandwidth, so the baseline runs where the device's
/// copies run, on the same memory, and without multidev's scheduling.
double memcpy_gbps(backend& b, const device& d, std::byte* dst, const std::byte* src,
                   std::size_t n) {
  double secs = 0;
  b.schedule_task(d, task{"memcpy baseline",
                          [&] {
                            auto t0 = clock_type::now();
                            for (int i = 0; i < copies_per_sample; ++i)
                              std::memcpy(dst, src, n);
                            secs = seconds_since(t0);
                          },
                          {}});
  b.sync(b.all_work(d));
  return static_cast<double>(n) * copies_per_sample / secs / 1e9;
}

/// Where `ctx` keeps `t`, as `ctx.device`'s runner sees it (for the memcpy
/// baselines): a kernel linked against `ctx` reports its buffer's address,
/// through the public kernel API only.
std::byte* node_bytes(backend& b, const context& ctx, const tnode& t) {
  auto address = std::make_shared<std::atomic<std::byte*>>(nullptr);
  kernel_def def;
  def.params = {arg_kind::buffer};
  def.reads = {0};
  def.body = [address](kernel_call& call) { address->store(call.buffer(0).data()); };
  def.doc = "bench_node_address NODE: reports NODE's address to `multidev bench`";
  register_kernel("bench_node_address", std::move(def));
  b.sync(b.run(b.link(ctx, "bench_node_address", {t})));
  return address->load();
}

/// Bytes of the pool `pool_calls` allocates, zeroes and frees.
constexpr std::size_t pool_call_bytes = 4096;

/// ns per `std::aligned_alloc` + `memset` + `free` of 4 KiB on this thread.
double aligned_alloc_ns_per_iteration(int n) {
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) {
    void* p = std::aligned_alloc(64, pool_call_bytes);
    std::memset(p, 0, pool_call_bytes);
    asm volatile("" : : "r"(p) : "memory"); // keep the allocation and the memset
    std::free(p);
  }
  return seconds_since(t0) * 1e9 / n;
}

/// CPU time of the whole process (every thread), in seconds.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// CPU ms per second of wall time the process spends over `window_s` while
/// this thread sleeps: with nothing else running, what the idle backend costs.
double idle_cpu_ms_per_s(double window_s) {
  auto w0 = clock_type::now();
  double c0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
  double c1 = process_cpu_seconds();
  return (c1 - c0) * 1e3 / seconds_since(w0);
}

/// Devices, settling time and window of `idle_cpu_8dev`.
constexpr int idle_devices = 8;
constexpr auto idle_settle = std::chrono::milliseconds(100);

/// `idle_cpu_ms_per_s` of `b` once all its devices exist and have settled.
double idle_backend_cpu(backend& b, double window_s) {
  for (int i = 0; i < idle_devices; ++i)
    b.get_device(i);
  std::this_thread::sleep_for(idle_settle);
  return idle_cpu_ms_per_s(window_s);
}

std::vector<std::byte> random_bytes(std::size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng{42};
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    auto x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  return v;
}

// -- multidev figures ----------------------------------------------------------

double multidev_ns_per_task(backend& b, const device& d, int n) {
  std::atomic<int> done{0};
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    b.schedule_task(d, task{{}, [&done] { done.fetch_add(1, std::memory_order_relaxed); }, {}});
  b.sync(b.all_work(d));
  return seconds_since(t0) * 1e9 / n;
}

/// ns per alloc_pool + memset_zero + free_pool of 4 KiB from this host
/// thread on `d`, `n` times, then waiting for `d`.
double multidev_pool_calls_ns(backend& b, const device& d, int n) {
  constexpr int pool_id = 1'000'000; // far from the ids alloc_node hands out
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) {
    b.alloc_pool(d, pool_id, pool_call_bytes, 64);
    b.memset_zero(d, pool_id, 0, pool_call_bytes);
    b.free_pool(d, pool_id);
  }
  b.sync(b.all_work(d));
  return seconds_since(t0) * 1e9 / n;
}

/// ns per hop of a chain of empty tasks alternating between two devices,
/// each waiting for the previous one through will_wait_for. `prebuilt`: the
/// chain is scheduled while device 0 is held, and only its execution is timed
/// (the dependency latency); otherwise the host schedules it while it runs.
double multidev_ns_per_hop(backend& b, const device& d0, const device& d1, int hops,
                           bool prebuilt) {
  context ctx[2] = {b.make_context(d0), b.make_context(d1)};
  std::atomic<bool> go{!prebuilt};
  b.schedule_task(d0, task{{}, [&go] { go.wait(false); }, {}});
  auto t0 = clock_type::now();
  event last = b.all_work(d0);
  for (int i = 1; i <= hops; ++i) {
    auto& c = ctx[i % 2];
    b.will_wait_for(c, last);
    b.schedule_task(c.device, task{{}, [] {}, {}});
    last = b.all_work(c.device);
  }
  if (prebuilt) {
    t0 = clock_type::now();
    go.store(true);
    go.notify_one();
  }
  b.sync(last);
  return seconds_since(t0) * 1e9 / hops;
}

} // namespace

bool bench_result::meets_target() const {
  auto meets = [this](double x, std::optional<double> bound) {
    return !bound || (better == "lower" ? x <= *bound : x >= *bound);
  };
  return meets(ratio, target) && meets(value, value_target);
}

namespace {

bool is_wanted(const bench_options& o, const std::string& name) {
  return o.filter.empty() || name.find(o.filter) != std::string::npos;
}

/// The figures measured on one backend of at least 4 devices, shared by all.
void shared_backend_figures(std::vector<bench_result>& out, const backend_options& opts,
                            const bench_options& o) {
  auto wanted = [&o](const std::string& name) { return is_wanted(o, name); };
  auto bopts = opts;
  bopts.num_devices = std::max(4, opts.num_devices.value_or(4));
  backend b{bopts};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  int reps = std::max(1, o.repeats);

  if (wanted("independent_tasks")) {
    int n = o.quick ? 20'000 : 200'000;
    cv_queue q;
    auto [base, ours] = medians(reps, [&] { return cv_queue_ns_per_task(q, n); },
                                [&] { return multidev_ns_per_task(b, d0, n); });
    out.push_back(make("independent_tasks", "ns/task", ours, "mutex+cv queue", base,
                       "lower", 1.0));
  }
  int hops = o.quick ? 2'000 : 20'000;
  if (wanted("will_wait_for_chain")) {
    auto [base, ours] = medians(reps, [&] { return atomic_ping_pong_ns_per_hop(hops); },
                                [&] { return multidev_ns_per_hop(b, d0, d1, hops, true); });
    out.push_back(make("will_wait_for_chain", "ns/hop", ours, "atomic wait/notify ping-pong",
                       base, "lower", 3.0));
  }
  if (wanted("will_wait_for_chain_scheduled")) {
    auto [base, ours] = medians(reps, [&] { return atomic_ping_pong_ns_per_hop(hops); },
                                [&] { return multidev_ns_per_hop(b, d0, d1, hops, false); });
    out.push_back(make("will_wait_for_chain_scheduled", "ns/hop", ours,
                       "atomic wait/notify ping-pong", base, "lower", std::nullopt));
  }
  std::size_t mib = o.quick ? 8 : 64;
  std::size_t bytes = mib << 20;
  auto copy_name = [mib](const char* what) { return fmt::format("{}_{}MiB", what, mib); };
  if (wanted("copy")) {
    auto host = random_bytes(bytes);
    tnode t{1, "copy", bytes, memory_mode::on_device};
    auto c0 = b.init_from_host(b.make_context(d0), t, host); // allocates, warms pages
    auto c1 = b.init_from_device(t, b.make_context(d1), c0);
    b.sync(b.all_work(d1));
    b.sync(b.all_work(d0));
    int copy_reps = reps;
    if (wanted(copy_name("copy_host_to_device"))) {
      auto* dst = node_bytes(b, c0, t);
      auto memcpy_base = [&] { return memcpy_gbps(b, d0, dst, host.data(), bytes); };
      auto [base, ours] = medians(copy_reps, memcpy_base, [&] {
        auto t0 = clock_type::now();
        for (int i = 0; i < copies_per_sample; ++i)
          b.from_host(c0, t, host);
        b.sync(b.all_work(d0));
        return static_cast<double>(bytes) * copies_per_sample / seconds_since(t0) / 1e9;
      });
      out.push_back(make(copy_name("copy_host_to_device"), "GB/s", ours, "memcpy, same buffers+runner", base,
                         "higher", 0.9));
    }
    if (wanted(copy_name("copy_device_to_device"))) {
      auto *dst = node_bytes(b, c1, t), *src = node_bytes(b, c0, t);
      auto memcpy_base = [&] { return memcpy_gbps(b, d1, dst, src, bytes); };
      auto [base, ours] = medians(copy_reps, memcpy_base, [&] {
        auto t0 = clock_type::now();
        for (int i = 0; i < copies_per_sample; ++i)
          b.device_to_device(t, merge_buffer_use::no, c1, c0);
        b.sync(b.all_work(d1));
        return static_cast<double>(bytes) * copies_per_sample / seconds_since(t0) / 1e9;
      });
      out.push_back(make(copy_name("copy_device_to_device"), "GB/s", ours, "memcpy, same buffers+runner", base,
                         "higher", 0.9));
    }
    b.sync_device(d0);
    b.sync_device(d1);
  }
  std::size_t n = o.quick ? (1u << 16) : (1u << 20);
  for (int devices : {1, 2, 4}) {
    auto name = fmt::format("gradient_merge_{}dev", devices);
    if (!wanted(name))
      continue;
    auto p = gradient_merge::setup(b, devices, n);
    std::vector<float> merged;
    gradient_merge::step(b, p, merged); // warm up
    auto [base, ours] = medians(
      reps,
      [&] {
        auto t0 = clock_type::now();
        auto sum = gradient_merge::host_sum(devices, n);
        volatile float sink = sum[n - 1];
        (void) sink;
        return seconds_since(t0) * 1e3;
      },
      [&] {
        auto t0 = clock_type::now();
        gradient_merge::step(b, p, merged, /*checksum=*/false);
        return seconds_since(t0) * 1e3;
      });
    out.push_back(make(name, "ms/step", ours, "same sum, host loop", base, "lower",
                       std::nullopt));
  }
  if (wanted("pool_calls")) {
    int n = o.quick ? 200 : 2'000;
    auto [base, ours] = medians(reps, [&] { return aligned_alloc_ns_per_iteration(100 * n); },
                                [&] { return multidev_pool_calls_ns(b, d0, n); });
    out.push_back(make("pool_calls", "ns/iter", ours, "aligned_alloc+memset+free 4KiB", base,
                       "lower", 20.0));
  }
}

/// `independent_tasks` with the runner trace on (`trace_capacity`, default
/// 4096) beside the same with it off, each on a backend of its own, built
/// alike, measured alternately in this run.
bench_result trace_figure(const backend_options& opts, const bench_options& o) {
  constexpr std::size_t default_trace_capacity = 4096;
  auto off = opts;
  off.num_devices = 1;
  off.trace_capacity = 0;
  auto on = off;
  on.trace_capacity = opts.trace_capacity > 0 ? opts.trace_capacity : default_trace_capacity;
  backend b_off{off};
  backend b_on{on};
  auto d_off = b_off.get_device(0);
  auto d_on = b_on.get_device(0);
  int n = o.quick ? 20'000 : 200'000;
  auto [base, ours] = medians(std::max(1, o.repeats),
                              [&] { return multidev_ns_per_task(b_off, d_off, n); },
                              [&] { return multidev_ns_per_task(b_on, d_on, n); });
  return make("independent_tasks_trace", "ns/task", ours, "independent_tasks, trace off", base,
              "lower", 1.5);
}

/// CPU ms per idle second of a backend that owns its actor system, beside
/// the same backend on a caller-owned system left at CAF's defaults (only
/// `scheduler.max-threads` set, as the tool does). Each sample builds its
/// backend, so nothing else runs in the process while it is measured.
bench_result idle_cpu_figure(const backend_options& opts, const bench_options& o) {
  auto iopts = opts;
  iopts.num_devices = idle_devices;
  double window_s = o.quick ? 0.25 : 1.5;
  int reps = o.quick ? 1 : std::clamp(o.repeats, 1, 3);
  auto ours = [&] {
    backend b{iopts};
    return idle_backend_cpu(b, window_s);
  };
  auto base = [&] {
    caf::actor_system_config cfg;
    cfg.set("scheduler.max-threads",
            static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency())));
    caf::actor_system sys{cfg};
    backend b{sys, iopts};
    return idle_backend_cpu(b, window_s);
  };
  std::vector<double> xs, ys;
  for (int i = 0; i < reps; ++i) {
    xs.push_back(base());
    ys.push_back(ours());
  }
  auto r = make("idle_cpu_8dev", "ms/s", median(ys), "8 devices, CAF defaults", median(xs),
                "lower", std::nullopt);
  r.value_target = 2.0; // 0.2 % of a core
  return r;
}

} // namespace

std::vector<bench_result> run_benchmarks(const backend_options& opts, const bench_options& o) {
  std::vector<bench_result> out;
  shared_backend_figures(out, opts, o);
  if (is_wanted(o, "independent_tasks_trace"))
    out.push_back(trace_figure(opts, o));
  // Last, once the shared backend is gone: nothing else may run meanwhile.
  if (is_wanted(o, "idle_cpu_8dev"))
    out.push_back(idle_cpu_figure(opts, o));
  return out;
}

std::string format_table(const std::vector<bench_result>& rs) {
  std::string s = fmt::format("{:<30} {:>14} {:<31} {:>14} {:>8}  {}\n", "benchmark",
                              "multidev", "baseline", "baseline", "ratio", "target");
  for (const auto& r : rs) {
    auto op = r.better == "lower" ? "<=" : ">=";
    std::string target;
    if (r.target)
      target = fmt::format("{}{:.1f}", op, *r.target);
    if (r.value_target) // an absolute bound on the value, shown with its unit
      target += fmt::format("{}{}{:.1f} {}", target.empty() ? "" : ", ", op, *r.value_target,
                            r.unit);
    target = target.empty() ? "-" : target + (r.meets_target() ? " ok" : " MISSED");
    s += fmt::format("{:<30} {:>9.1f} {:<4} {:<31} {:>9.1f} {:<4} {:>8.3f}  {}\n", r.name,
                     r.value, r.unit, r.baseline, r.baseline_value, r.unit, r.ratio, target);
  }
  return s;
}

std::string to_json(const std::vector<bench_result>& rs) {
  auto arr = nlohmann::json::array();
  for (const auto& r : rs) {
    nlohmann::json j{{"name", r.name},
                     {"unit", r.unit},
                     {"value", r.value},
                     {"baseline", r.baseline},
                     {"baseline_value", r.baseline_value},
                     {"ratio", r.ratio},
                     {"better", r.better}};
    j["target"] = r.target ? nlohmann::json(*r.target) : nlohmann::json(nullptr);
    j["value_target"] =
      r.value_target ? nlohmann::json(*r.value_target) : nlohmann::json(nullptr);
    j["meets_target"] = r.meets_target();
    arr.push_back(std::move(j));
  }
  return arr.dump(2);
}

} // namespace multidev::tools
