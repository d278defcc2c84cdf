#include "bench_peers.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>

#ifdef MULTIDEV_HAVE_TBB
#include <deque>
#include <optional>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#endif

#ifdef MULTIDEV_HAVE_STARPU
#include <array>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include <starpu.h>
#endif

namespace multidev::tools::peers {

namespace {

using clock_type = std::chrono::steady_clock;

[[maybe_unused]] double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

[[maybe_unused]] void require_positive(int v, const char* what) {
  if (v < 1)
    throw std::invalid_argument(std::string("peers: ") + what + " must be at least 1, got " +
                                std::to_string(v));
}

} // namespace

// -- oneTBB ----------------------------------------------------------------------

#ifdef MULTIDEV_HAVE_TBB

namespace {

namespace flow = oneapi::tbb::flow;
using oneapi::tbb::global_control;
using oneapi::tbb::task_arena;

/// Lets oneTBB run at least `threads` threads in all while alive (its default
/// is the hardware's thread count, too few for 4 or 8 workers on a small
/// machine). A lower limit the caller set stays in force: oneTBB keeps the
/// smallest of the active limits.
class allow_threads {
public:
  explicit allow_threads(int threads)
      : gc_(global_control::max_allowed_parallelism,
            std::max<std::size_t>(static_cast<std::size_t>(threads),
                                  global_control::active_value(
                                      global_control::max_allowed_parallelism))) {}

private:
  global_control gc_;
};

} // namespace

bool have_tbb() noexcept { return true; }

// One TBB worker thread runs the node: an arena of one slot, none reserved
// for this thread, which only pushes (from outside the arena, as the host
// pushes to a device) and then waits (wait_for_all hands its wait to the
// arena). Measured alike within 1% here: the implicit arena and arenas of
// (2 slots, 1 reserved) or (1, 1).
double tbb_ns_per_task(int n) {
  require_positive(n, "n");
  allow_threads threads(2); // this thread and one worker
  task_arena arena(1, 0);
  std::optional<flow::graph> g; // declared first: destroyed after the node
  std::optional<flow::function_node<flow::continue_msg, flow::continue_msg>> node;
  arena.execute([&] { // a graph runs its tasks in the arena it was made in
    g.emplace();
    node.emplace(*g, flow::serial, [](const flow::continue_msg& m) { return m; });
  });
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    node->try_put(flow::continue_msg{});
  g->wait_for_all();
  return seconds_since(t0) * 1e9 / n;
}

// The message carries the hops left; the node that runs the last one unlinks
// both edges so its output goes nowhere (a function_node always forwards what
// its body returns). A function_node hands the successor's task straight to
// the thread that ran the body (task bypass), so the chain may stay on one
// thread: that is oneTBB's own hop. A multifunction_node pair, which can
// stop without unlinking but spawns each hop, measured ~20% slower here.
double tbb_ns_per_hop(int hops) {
  require_positive(hops, "hops");
  using hop_node = flow::function_node<int, int>;
  allow_threads threads(2);
  task_arena arena(2); // this thread (in wait_for_all) and one worker
  std::optional<flow::graph> g;
  std::optional<hop_node> a, b;
  auto body = [&a, &b](int left) {
    if (left == 1) {
      flow::remove_edge(*a, *b);
      flow::remove_edge(*b, *a);
    }
    return left - 1;
  };
  arena.execute([&] {
    g.emplace();
    a.emplace(*g, flow::serial, body);
    b.emplace(*g, flow::serial, body);
    flow::make_edge(*a, *b);
    flow::make_edge(*b, *a);
  });
  auto t0 = clock_type::now();
  a->try_put(hops);
  g->wait_for_all();
  return seconds_since(t0) * 1e9 / hops;
}

// Variant: one round's graph, built once outside the timing and reused, each
// round a try_put to the source and a wait_for_all, all inside the arena (so
// this thread keeps its slot rather than joining per round). It is the one
// most favorable to oneTBB: building all rounds up front as one graph of
// rounds*(width+2) continue_nodes, construction timed (as multidev's host
// schedules each round), measured ~3.5x slower here (3.7 vs 1.1 us per
// round at width 16), node construction and make_edge dominating. The
// per-round wait is a barrier multidev's side does not have; it costs oneTBB
// a host round trip per round, and gains it graph reuse.
double tbb_fan_dag_us(int workers, int width, int rounds) {
  require_positive(workers, "workers");
  require_positive(width, "width");
  require_positive(rounds, "rounds");
  using node = flow::continue_node<flow::continue_msg>;
  allow_threads threads(workers);
  task_arena arena(workers); // `workers` slots, one of them for this thread
  std::optional<flow::graph> g;
  std::deque<node> nodes; // destroyed before the graph
  node* source = nullptr;
  auto empty = [](const flow::continue_msg&) {};
  arena.execute([&] {
    g.emplace();
    source = &nodes.emplace_back(*g, empty);
    node& sink = nodes.emplace_back(*g, empty);
    for (int i = 0; i < width; ++i) {
      node& w = nodes.emplace_back(*g, empty);
      flow::make_edge(*source, w);
      flow::make_edge(w, sink);
    }
  });
  auto t0 = clock_type::now();
  arena.execute([&] {
    for (int r = 0; r < rounds; ++r) {
      source->try_put(flow::continue_msg{});
      g->wait_for_all();
    }
  });
  return seconds_since(t0) * 1e6 / rounds;
}

#else // !MULTIDEV_HAVE_TBB

bool have_tbb() noexcept { return false; }
double tbb_ns_per_task(int) { throw std::logic_error("oneTBB not in this build"); }
double tbb_ns_per_hop(int) { throw std::logic_error("oneTBB not in this build"); }
double tbb_fan_dag_us(int, int, int) { throw std::logic_error("oneTBB not in this build"); }

#endif

// -- StarPU ----------------------------------------------------------------------

#ifdef MULTIDEV_HAVE_STARPU

namespace {

void check(int rc, const char* what) {
  if (rc != 0)
    throw std::runtime_error(std::string("StarPU: ") + what + " returned " + std::to_string(rc));
}

extern "C" void empty_cpu_func(void** /*buffers*/, void* /*cl_arg*/) {}

/// An empty CPU codelet with `nbuffers` (0 or 1) buffers in STARPU_RW. No
/// performance model, so StarPU neither calibrates nor writes model files.
starpu_codelet make_codelet(int nbuffers, const char* name) {
  starpu_codelet cl;
  starpu_codelet_init(&cl);
  cl.where = STARPU_CPU;
  cl.cpu_funcs[0] = empty_cpu_func;
  cl.nbuffers = nbuffers;
  if (nbuffers > 0)
    cl.modes[0] = STARPU_RW;
  cl.model = nullptr;
  cl.name = name;
  return cl;
}

starpu_codelet no_buffer_codelet = make_codelet(0, "multidev_peer_empty");
starpu_codelet rw_codelet = make_codelet(1, "multidev_peer_empty_rw");

/// The process's StarPU session: starpu_init is process-wide and slow (20 to
/// 70 ms here), so the session is kept while the worker count asked for stays
/// the same and redone (starpu_shutdown, starpu_init) when it changes; shut
/// down at exit. Between measurements the workers are paused: this StarPU is
/// built with non-blocking drivers, whose idle workers poll in a tight loop
/// (a whole core here), which would slow whatever the bench measures next;
/// paused, they sleep. The scheduler is StarPU's default (lws in 1.3) unless
/// STARPU_SCHED says otherwise: eager, prio and ws measured no better here.
class starpu_session {
public:
  /// While alive: StarPU runs with exactly the CPU workers asked for, and no
  /// other measurement of this session runs.
  class lease {
  public:
    explicit lease(starpu_session& s) : lock_(s.mu_), s_(s) {}
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      if (s_.workers_ > 0 && !s_.paused_) {
        starpu_pause();
        s_.paused_ = true;
      }
    }

  private:
    std::unique_lock<std::mutex> lock_;
    starpu_session& s_;
  };

  starpu_session() = default;
  starpu_session(const starpu_session&) = delete;
  starpu_session& operator=(const starpu_session&) = delete;
  ~starpu_session() { shutdown(); }

  /// StarPU running with exactly `workers` CPU workers and no other device,
  /// until the lease ends.
  [[nodiscard]] std::unique_ptr<lease> use(int workers) {
    if (workers > STARPU_MAXCPUS) // StarPU would quietly start fewer
      throw std::invalid_argument("StarPU: this build runs at most " +
                                  std::to_string(STARPU_MAXCPUS) +
                                  " CPU workers (STARPU_MAXCPUS), asked for " +
                                  std::to_string(workers));
    auto l = std::make_unique<lease>(*this);
    if (workers != workers_) {
      shutdown();
      init(workers);
    } else if (paused_) {
      starpu_resume();
      paused_ = false;
    }
    return l;
  }

private:
  void init(int workers) {
    // The user's settings of these win. Unbound workers, as multidev's and
    // oneTBB's threads are: on a shared machine a worker StarPU pins to a
    // busy core cannot move, which tripled and scattered its ns/task here.
    ::setenv("STARPU_SILENT", "1", 0);
    ::setenv("STARPU_WORKERS_NOBIND", "1", 0);
    starpu_conf conf;
    check(starpu_conf_init(&conf), "starpu_conf_init");
    conf.ncpus = workers;
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.nmic = 0;
    conf.nmpi_ms = 0;
    // The counts above over STARPU_NCPU and the like; fields left unset
    // (e.g. the scheduler) still follow the environment.
    conf.precedence_over_environment_variables = 1;
    check(starpu_init(&conf), "starpu_init");
    workers_ = workers;
    paused_ = false;
    if (auto got = starpu_cpu_worker_get_count(); got != static_cast<unsigned>(workers))
      throw std::runtime_error("StarPU: asked for " + std::to_string(workers) +
                               " CPU workers, got " + std::to_string(got));
  }

  void shutdown() {
    if (workers_ == 0)
      return;
    if (paused_) // paused workers would not see the shutdown
      starpu_resume();
    starpu_shutdown();
    workers_ = 0;
    paused_ = false;
  }

  std::mutex mu_;
  int workers_ = 0; // 0: not initialized
  bool paused_ = false;
};

starpu_session& session() {
  static starpu_session s;
  return s;
}

/// An empty task of `cl`, detached and destroyed by StarPU when done.
starpu_task* new_task(starpu_codelet* cl) {
  starpu_task* t = starpu_task_create();
  if (t == nullptr)
    throw std::runtime_error("StarPU: starpu_task_create returned null");
  t->cl = cl;
  return t;
}

void submit(starpu_task* t) {
  int rc = starpu_task_submit(t);
  if (rc != 0) {
    starpu_task_destroy(t); // not submitted: still ours
    check(rc, "starpu_task_submit");
  }
}

} // namespace

bool have_starpu() noexcept { return true; }
int starpu_max_workers() noexcept { return STARPU_MAXCPUS; }

double starpu_ns_per_task(int n) {
  require_positive(n, "n");
  auto lease = session().use(1);
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    submit(new_task(&no_buffer_codelet));
  check(starpu_task_wait_for_all(), "starpu_task_wait_for_all");
  return seconds_since(t0) * 1e9 / n;
}

// The chain comes from StarPU's implicit data dependencies (sequential
// consistency, on by default): each RW access waits for the one before.
double starpu_ns_per_hop(int hops) {
  require_positive(hops, "hops");
  auto lease = session().use(2);
  std::array<double, 4> data{};
  starpu_data_handle_t handle = nullptr;
  starpu_vector_data_register(&handle, STARPU_MAIN_RAM, reinterpret_cast<std::uintptr_t>(data.data()),
                              static_cast<std::uint32_t>(data.size()), sizeof(double));
  struct unregister {
    starpu_data_handle_t h;
    ~unregister() { starpu_data_unregister(h); }
  } guard{handle};
  auto t0 = clock_type::now();
  for (int i = 0; i < hops; ++i) {
    starpu_task* t = new_task(&rw_codelet);
    t->handles[0] = handle;
    submit(t);
  }
  check(starpu_task_wait_for_all(), "starpu_task_wait_for_all");
  return seconds_since(t0) * 1e9 / hops;
}

// Tasks are destroyed by StarPU once done, and a dependency may only be
// declared on a task still alive; so each task's dependents are declared
// before it is submitted (StarPU allows dependencies on tasks not yet
// submitted): a round's sink is submitted only after the next round's source
// has declared its dependency on it.
double starpu_fan_dag_us(int workers, int width, int rounds) {
  require_positive(workers, "workers");
  require_positive(width, "width");
  require_positive(rounds, "rounds");
  auto lease = session().use(workers);
  std::vector<starpu_task*> fan(static_cast<std::size_t>(width));
  auto t0 = clock_type::now();
  starpu_task* pending_sink = nullptr; // the previous round's, not yet submitted
  for (int r = 0; r < rounds; ++r) {
    starpu_task* source = new_task(&no_buffer_codelet);
    if (pending_sink != nullptr) {
      starpu_task_declare_deps_array(source, 1, &pending_sink);
      submit(pending_sink);
    }
    starpu_task* sink = new_task(&no_buffer_codelet);
    for (auto& t : fan) {
      t = new_task(&no_buffer_codelet);
      starpu_task_declare_deps_array(t, 1, &source);
    }
    starpu_task_declare_deps_array(sink, static_cast<unsigned>(width), fan.data());
    submit(source);
    for (auto* t : fan)
      submit(t);
    pending_sink = sink;
  }
  submit(pending_sink);
  check(starpu_task_wait_for_all(), "starpu_task_wait_for_all");
  return seconds_since(t0) * 1e6 / rounds;
}

#else // !MULTIDEV_HAVE_STARPU

bool have_starpu() noexcept { return false; }
int starpu_max_workers() noexcept { return 0; }
double starpu_ns_per_task(int) { throw std::logic_error("StarPU not in this build"); }
double starpu_ns_per_hop(int) { throw std::logic_error("StarPU not in this build"); }
double starpu_fan_dag_us(int, int, int) { throw std::logic_error("StarPU not in this build"); }

#endif

} // namespace multidev::tools::peers
