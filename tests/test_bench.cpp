#define BOOST_TEST_MODULE bench
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench.hpp"
#include "bench_peers.hpp"

using namespace multidev;

// Only the shape of the results is tested; the figures themselves belong to
// `multidev bench`, never to pass/fail tests.

namespace {
/// The suite in quick mode, one repetition, on 2 devices; `filter` as
/// `--filter`, `only` as `--only`.
std::vector<tools::bench_result> quick_run(const std::string& filter,
                                           std::vector<std::string> only = {}) {
  tools::bench_options o;
  o.quick = true;
  o.repeats = 1;
  o.filter = filter;
  o.only = std::move(only);
  return tools::run_benchmarks(backend_options{.num_devices = 2}, o);
}

/// The whole quick suite, run once for the test cases that read it.
const std::vector<tools::bench_result>& quick_suite() {
  static const auto rs = quick_run("");
  return rs;
}

/// What one entry of the suite must look like.
struct expected_entry {
  std::string name, baseline, unit, better;
  std::optional<double> target, value_target;
  /// Non-empty: the peer is not measured in this build, and this says why.
  std::string skipped = {};
  /// Set: `value_target` is the baseline's value plus this (a bound on what
  /// the case adds to its baseline, measured in the same run).
  std::optional<double> value_target_over_baseline = {};
};

std::string tbb_skip() {
  return tools::peers::have_tbb() ? "" : "skipped: oneTBB not installed";
}

/// Why a StarPU entry on `workers` CPU workers is skipped here ("": it is not).
std::string starpu_skip(int workers = 1) {
  if (!tools::peers::have_starpu())
    return "skipped: StarPU not installed";
  if (workers > tools::peers::starpu_max_workers())
    return "skipped: this StarPU runs at most "
           + std::to_string(tools::peers::starpu_max_workers()) + " CPU workers";
  return "";
}

/// Every entry of the quick suite, in order, as designed: one entry per
/// (case, baseline), named after the case; a peer missing from this build
/// (or unable to run the case) as a skipped entry.
std::vector<expected_entry> expected_suite() {
  const std::optional<double> none;
  std::vector<expected_entry> e{
    {"independent_tasks", "spsc ring", "ns/task", "lower", 1.5, none},
    {"independent_tasks", "spsc ring of std::function", "ns/task", "lower", none, none},
    {"independent_tasks", "spsc ring of 40-byte slots (a queue entry's size)", "ns/task",
     "lower", none, none},
    {"independent_tasks", "mutex+cv queue", "ns/task", "lower", 0.5, none},
    {"independent_tasks", "oneTBB serial function_node", "ns/task", "lower", 0.25, none,
     tbb_skip()},
    {"independent_tasks", "StarPU empty CPU tasks", "ns/task", "lower", 1.0 / 50, none,
     starpu_skip()},
    {"independent_tasks_described", "the same tasks, no description", "ns/task",
     "lower", 1.5, none},
    {"will_wait_for_chain", "atomic wait/notify ping-pong", "ns/hop", "lower", 3.0, none},
    {"will_wait_for_chain", "spinning ping-pong", "ns/hop", "lower", none, none},
    {"will_wait_for_chain", "oneTBB two-node ping-pong", "ns/hop", "lower", 1.0, none,
     tbb_skip()},
    {"will_wait_for_chain", "CAF actor ping-pong (sharing)", "ns/hop", "lower", 1.0, none},
    {"will_wait_for_chain", "CAF actor ping-pong (detached)", "ns/hop", "lower", none, none},
    {"will_wait_for_chain", "StarPU read-write chain on one handle", "ns/hop", "lower", 1.0,
     none, starpu_skip(2)},
    {"will_wait_for_chain_replay", "oneTBB two-node ping-pong", "ns/hop", "lower", 1.0, none,
     tbb_skip()},
    {"will_wait_for_chain_replay", "the same chain scheduled call by call", "ns/hop", "lower",
     none, none},
    {"will_wait_for_chain_scheduled", "atomic wait/notify ping-pong", "ns/hop", "lower", none,
     none},
    {"will_wait_for_chain_scheduled", "CAF actor ping-pong (sharing)", "ns/hop", "lower", 2.5,
     none},
    // 64 MiB even in quick mode
    {"copy_host_to_device_64MiB", "memcpy, same buffers+runner", "GB/s", "higher", 0.9, none},
    {"copy_device_to_device_64MiB", "memcpy, same buffers+runner", "GB/s", "higher", 0.9, none},
    {"copy_4KiB", "memcpy 4KiB + one empty task", "ns/copy", "lower", 3.0, none},
    {"copy_4KiB", "spsc ring of std::function, 4KiB memcpy", "ns/copy", "lower", none, none},
  };
  for (int n : {1, 2, 4})
    e.push_back({"gradient_merge_" + std::to_string(n) + "dev", "same sum, host loop", "ms/step",
                 "lower", none, none});
  e.push_back({"pool_calls", "aligned_alloc+memset+free 4KiB", "ns/iter", "lower", 20.0, none});
  e.push_back({"independent_tasks_trace", "independent_tasks, trace off", "ns/task", "lower",
               1.5, none});
  e.push_back({"caf_remote_round_trip", "raw TCP ping-pong, 64 B", "us/trip", "lower", none,
               none});
  e.push_back({"remote_hop", "CAF remote ping-pong hop, same connection", "us/hop", "lower",
               1.0, none});
  e.push_back({"remote_hop_vs_tcp", "raw TCP round trip, 64 B", "us/hop", "lower", 5.0, none});
  e.push_back({"remote_named_tasks", "schedule_named, one round trip each", "tasks/s", "higher",
               none, 200'000.0});
  e.push_back({"node_hop", "CAF remote ping-pong hop, same kind of connection", "us/hop",
               "lower", 1.2, none});
  e.push_back({"node_hop_vs_tcp", "raw TCP round trip, 64 B", "us/hop", "lower", 4.0, none});
  // 64 MiB even in quick mode
  e.push_back({"copy_node_to_node_64MiB", "raw TCP transfer of 64 MiB, loopback", "GB/s",
               "higher", 0.7, none});
  e.push_back({"copy_node_to_node_call", "the whole copy, until written on b", "us/call",
               "lower", none, 1'000.0});
  // A recorded round across both nodes (issue 41).
  e.push_back({"round_nodes_replay", "CAF remote ping-pong hop, same kind of connection",
               "us/replay", "lower", 2.0, none});
  e.push_back({"round_nodes_replay", "the same round scheduled call by call", "us/replay",
               "lower", none, none});
  // The same with a device of the client's own in the round.
  e.push_back({"round_mixed_replay", "round_nodes_replay's round, on the nodes only",
               "us/replay", "lower", none, none});
  e.push_back({"round_mixed_replay", "the same round scheduled call by call", "us/replay",
               "lower", none, none});
  // Copies between the nodes in a round (its bytes node to node).
  e.push_back({"round_nodes_copy_replay", "CAF remote ping-pong hop, same kind of connection",
               "us/replay", "lower", 3.0, none});
  e.push_back({"round_nodes_copy_replay", "the same round scheduled call by call", "us/replay",
               "lower", none, none});
  for (int n : {1, 2, 4, 8}) {
    auto name = "fan_dag_" + std::to_string(n) + "dev";
    e.push_back({name, "oneTBB flow graph", "us/round", "lower", 1.0, none, tbb_skip()});
    e.push_back({name, "a thread per device, atomics", "us/round", "lower", none, none,
                 n == 1 ? "skipped: one device, no hand-off between threads" : ""});
    e.push_back({name, "StarPU", "us/round", "lower", 1.0, none, starpu_skip(n)});
    // The same rounds scheduled before the clock starts: informative.
    e.push_back({name + "_prebuilt", "oneTBB flow graph", "us/round", "lower", none, none,
                 tbb_skip()});
    // Recorded once, replayed each round (issue 41).
    e.push_back({name + "_replay", "oneTBB flow graph", "us/round", "lower", 1.0, none,
                 tbb_skip()});
    e.push_back({name + "_replay", "the same rounds scheduled call by call (fan_dag)",
                 "us/round", "lower", none, none});
  }
  // quick mode idles 2 ms before each wake
  e.push_back({"wake_after_idle", "condition variable round trip, 2 ms idle", "us/wake",
               "lower", 1.5, none});
  for (int n : {1, 2, 4, 8})
    e.push_back({"scale_" + std::to_string(n) + "dev", "a mutex+cv queue per device", "tasks/s",
                 "higher", none, none});
  for (int d : {1, 100, 10'000, 1'000'000})
    e.push_back({"scale_depth_" + std::to_string(d), "mutex+cv queue", "tasks/s", "higher", none,
                 none});
  e.push_back({"bytes_per_idle_device",
               "a mutex+cv queue and its thread (heap; stacks not counted)", "B", "lower", none,
               none});
  e.push_back({"bytes_per_queued_task", "std::deque<std::function> behind a mutex", "B", "lower",
               none, 256.0});
  e.push_back({"bytes_per_queued_task_described",
               "the same tasks, no description", "B", "lower", none, none, "",
               128.0});
  e.push_back({"idle_cpu_8dev", "8 devices, CAF defaults", "ms/s", "lower", none, 2.0});
  // Skipped here (a client process needs the multidev tool), named all the same.
  e.push_back({"session_cleanup", "the lease (3000 ms; renewed every 1000 ms, margin 1000 ms)",
               "ms", "lower", 1.1, none,
               "skipped: needs the multidev tool to start a client process"});
  e.push_back({"scenario_steps", "the same kernels through the C++ API", "steps/s", "higher",
               0.05, none});
  e.push_back({"scenario_steps_named", "the same kernels through the C++ API", "steps/s",
               "higher", 0.05, none});
  return e;
}

using name_and_baseline = std::pair<std::string, std::string>;

std::vector<name_and_baseline> pairs_of(const std::vector<tools::bench_result>& rs) {
  std::vector<name_and_baseline> v;
  for (const auto& r : rs)
    v.emplace_back(r.name, r.baseline);
  return v;
}

/// The names of `rs` in order, each once (entries of one case are adjacent).
std::vector<std::string> case_sequence(const std::vector<tools::bench_result>& rs) {
  std::vector<std::string> names;
  for (const auto& r : rs)
    if (names.empty() || names.back() != r.name)
      names.push_back(r.name);
  return names;
}

/// Figures that may be 0 (a byte count, idle CPU time): everything else is a
/// time or a rate of work that ran.
bool may_be_zero(const tools::bench_result& r) {
  return r.unit == "B" || r.unit == "ms/s";
}

/// A fresh directory under the system's temporary directory, removed at the end.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = std::filesystem::temp_directory_path()
           / ("multidev_test_bench_" + std::to_string(::getpid()) + "_" + std::to_string(stamp));
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::string read_all(const std::filesystem::path& p) {
  std::ifstream f{p};
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A bound as text, for comparing and printing: "none" when unset.
std::string show(const std::optional<double>& x) {
  if (!x)
    return "none";
  std::ostringstream s;
  s.precision(17);
  s << *x;
  return s.str();
}

tools::bench_result scale_entry(std::string name, std::string baseline, double ours,
                                double base) {
  tools::bench_result r;
  r.name = std::move(name);
  r.unit = "tasks/s";
  r.value = ours;
  r.baseline = std::move(baseline);
  r.baseline_value = base;
  r.ratio = ours / base;
  r.better = "higher";
  return r;
}
} // namespace

// So that BOOST_TEST can print the pairs it compares.
namespace boost::test_tools::tt_detail {
template <>
struct print_log_value<name_and_baseline> {
  void operator()(std::ostream& os, const name_and_baseline& p) {
    os << "(" << p.first << ", " << p.second << ")";
  }
};
} // namespace boost::test_tools::tt_detail

BOOST_AUTO_TEST_CASE(test_bench_reports_every_case_beside_each_baseline) {
  const auto& rs = quick_suite();
  BOOST_TEST_MESSAGE("the quick suite (figures for the log, never checked):\n"
                     << tools::format_table(rs));
  auto expected = expected_suite();
  std::vector<name_and_baseline> want;
  for (const auto& e : expected)
    want.emplace_back(e.name, e.baseline);
  BOOST_TEST(pairs_of(rs) == want, boost::test_tools::per_element());
  // The cases in the order `case_names` lists them (for `--only`, `--help`).
  BOOST_TEST(case_sequence(rs) == tools::case_names(), boost::test_tools::per_element());
  BOOST_TEST_REQUIRE(rs.size() == expected.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const auto& r = rs[i];
    const auto& e = expected[i];
    BOOST_TEST_CONTEXT(r.name << " vs " << r.baseline) {
      BOOST_TEST(r.unit == e.unit);
      BOOST_TEST(r.better == e.better);
      BOOST_TEST(show(r.target) == show(e.target));
      if (e.value_target_over_baseline) {
        BOOST_TEST_REQUIRE(r.value_target.has_value());
        BOOST_TEST(*r.value_target == r.baseline_value + *e.value_target_over_baseline,
                   boost::test_tools::tolerance(1e-12));
      } else {
        BOOST_TEST(show(r.value_target) == show(e.value_target));
      }
      BOOST_TEST(r.skipped == e.skipped);
      if (!r.skipped.empty()) {
        // Nothing measured, so nothing missed.
        BOOST_TEST(r.value == 0);
        BOOST_TEST(r.baseline_value == 0);
        BOOST_TEST(r.ratio == 0);
        BOOST_TEST(r.meets_target());
        continue;
      }
      if (may_be_zero(r)) {
        BOOST_TEST(r.value >= 0);
        BOOST_TEST(r.baseline_value >= 0);
      } else {
        BOOST_TEST(r.value > 0);
        BOOST_TEST(r.baseline_value > 0);
      }
      if (r.baseline_value > 0)
        BOOST_TEST(r.ratio == r.value / r.baseline_value, boost::test_tools::tolerance(1e-12));
    }
  }
}

BOOST_AUTO_TEST_CASE(test_bench_baselines_of_a_case_share_one_measurement_of_multidev) {
  // Each case is measured once for multidev, alternating with all of its
  // baselines: every entry of the case shows that one value, in one unit.
  const auto& rs = quick_suite();
  std::map<std::string, std::vector<const tools::bench_result*>> by_case;
  for (const auto& r : rs)
    if (r.skipped.empty())
      by_case[r.name].push_back(&r);
  for (const char* name :
       {"independent_tasks", "will_wait_for_chain", "will_wait_for_chain_replay",
        "will_wait_for_chain_scheduled", "fan_dag_1dev", "fan_dag_2dev", "fan_dag_4dev",
        "fan_dag_8dev", "fan_dag_1dev_replay", "fan_dag_2dev_replay", "fan_dag_4dev_replay",
        "fan_dag_8dev_replay", "round_nodes_replay", "round_mixed_replay",
        "round_nodes_copy_replay"}) {
    BOOST_TEST_CONTEXT(name) {
      const auto& entries = by_case[name];
      BOOST_TEST_REQUIRE(!entries.empty());
      for (const auto* r : entries) {
        BOOST_TEST(r->value == entries.front()->value);
        BOOST_TEST(r->unit == entries.front()->unit);
        BOOST_TEST(r->better == entries.front()->better);
      }
    }
  }
  // independent_tasks and will_wait_for_chain always have at least their
  // two baselines that need no peer.
  BOOST_TEST(by_case["independent_tasks"].size() >= 2u);
  BOOST_TEST(by_case["will_wait_for_chain"].size() >= 2u);
  BOOST_TEST(by_case["will_wait_for_chain_scheduled"].size() == 2u);
  // A multidev hop across the connection, beside a CAF hop and beside a raw
  // TCP round trip: one measurement of multidev for both.
  BOOST_TEST_REQUIRE(by_case["remote_hop"].size() == 1u);
  BOOST_TEST_REQUIRE(by_case["remote_hop_vs_tcp"].size() == 1u);
  BOOST_TEST(by_case["remote_hop"][0]->value == by_case["remote_hop_vs_tcp"][0]->value);
  // The same for a crossing between two nodes.
  BOOST_TEST_REQUIRE(by_case["node_hop"].size() == 1u);
  BOOST_TEST_REQUIRE(by_case["node_hop_vs_tcp"].size() == 1u);
  BOOST_TEST(by_case["node_hop"][0]->value == by_case["node_hop_vs_tcp"][0]->value);
}

BOOST_AUTO_TEST_CASE(test_bench_json_has_the_documented_fields) {
  const auto& rs = quick_suite();
  auto j = nlohmann::json::parse(tools::to_json(rs));
  BOOST_TEST_REQUIRE(j.is_array());
  BOOST_TEST_REQUIRE(j.size() == rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const auto& r = rs[i];
    const auto& o = j[i];
    BOOST_TEST_CONTEXT(r.name << " vs " << r.baseline) {
      for (const char* key : {"name", "unit", "value", "baseline", "baseline_value", "ratio",
                              "better", "target", "value_target", "meets_target"})
        BOOST_TEST(o.contains(key), key);
      BOOST_TEST(o["name"] == r.name);
      BOOST_TEST(o["baseline"] == r.baseline);
      BOOST_TEST(o["unit"] == r.unit);
      BOOST_TEST(o["better"] == r.better);
      if (r.target)
        BOOST_TEST(o["target"] == *r.target);
      else
        BOOST_TEST(o["target"].is_null());
      if (r.value_target)
        BOOST_TEST(o["value_target"] == *r.value_target);
      else
        BOOST_TEST(o["value_target"].is_null());
      if (r.skipped.empty()) {
        BOOST_TEST(!o.contains("skipped"));
        BOOST_TEST(o["meets_target"] == r.meets_target());
        BOOST_TEST(o["value"].get<double>() == r.value);
        if (r.baseline_value > 0)
          BOOST_TEST(o["ratio"].get<double>()
                       == o["value"].get<double>() / o["baseline_value"].get<double>(),
                     boost::test_tools::tolerance(1e-9));
      } else {
        BOOST_TEST(o["meets_target"].is_null());
        BOOST_TEST(o["skipped"] == r.skipped);
      }
    }
  }
  auto table = tools::format_table(rs);
  BOOST_TEST(table.find("independent_tasks") != std::string::npos);
  BOOST_TEST(table.find("mutex+cv queue") != std::string::npos);
  BOOST_TEST(table.find("<=2.0 ms/s") != std::string::npos); // idle_cpu_8dev's own bound
}

BOOST_AUTO_TEST_CASE(test_bench_a_skipped_entry_says_why_and_meets_no_target) {
  // Made by hand, so it does not depend on what this build has installed.
  tools::bench_result r;
  r.name = "fan_dag_2dev";
  r.unit = "us/round";
  r.baseline = "StarPU";
  r.better = "lower";
  r.target = 1.0;
  r.skipped = "skipped: StarPU not installed";
  BOOST_TEST(r.meets_target());
  auto j = nlohmann::json::parse(tools::to_json({r}));
  BOOST_TEST_REQUIRE(j.size() == 1u);
  BOOST_TEST(j[0]["name"] == "fan_dag_2dev");
  BOOST_TEST(j[0]["baseline"] == "StarPU");
  BOOST_TEST(j[0]["value"] == 0.0);
  BOOST_TEST(j[0]["baseline_value"] == 0.0);
  BOOST_TEST(j[0]["target"] == 1.0);
  BOOST_TEST_REQUIRE(j[0].contains("meets_target"));
  BOOST_TEST(j[0]["meets_target"].is_null());
  BOOST_TEST_REQUIRE(j[0].contains("skipped"));
  BOOST_TEST(j[0]["skipped"] == "skipped: StarPU not installed");
  auto table = tools::format_table({r});
  BOOST_TEST(table.find("skipped: StarPU not installed") != std::string::npos);
  BOOST_TEST(table.find("MISSED") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(test_bench_meets_target_checks_the_ratio_and_the_value_bounds) {
  tools::bench_result r;
  r.value = 3;
  r.baseline_value = 2;
  r.ratio = 1.5;
  BOOST_TEST(r.meets_target()); // informative
  r.target = 2.0;
  BOOST_TEST(r.meets_target());
  r.value_target = 2.0;
  BOOST_TEST(!r.meets_target()); // 3 > 2 although the ratio is within 2
  r.value_target = 3.0;
  BOOST_TEST(r.meets_target());
  r.target = 1.0;
  BOOST_TEST(!r.meets_target()); // the ratio now misses
  r.better = "higher";
  r.target.reset();
  r.value_target = 4.0;
  BOOST_TEST(!r.meets_target()); // 3 < 4 when higher is better
  auto table = tools::format_table({r});
  BOOST_TEST(table.find(">=4.0 ms/s") == std::string::npos); // unit is the result's own
  r.unit = "ms/s";
  table = tools::format_table({r});
  BOOST_TEST(table.find(">=4.0 ms/s MISSED") != std::string::npos);
  r.skipped = "skipped: oneTBB not installed"; // nothing measured, nothing missed
  BOOST_TEST(r.meets_target());
}

BOOST_AUTO_TEST_CASE(test_bench_numbers_print_with_units_and_thousands_separators) {
  BOOST_TEST(tools::format_quantity(6141203.2, "tasks/s") == "6,141,203 tasks/s");
  BOOST_TEST(tools::format_quantity(1000, "ns/task") == "1,000 ns/task");
  BOOST_TEST(tools::format_quantity(999.94, "ns/task") == "999.9 ns/task");
  BOOST_TEST(tools::format_quantity(313.44, "ns/task") == "313.4 ns/task");
  BOOST_TEST(tools::format_quantity(0.0028, "") == "0.0028");
  BOOST_TEST(tools::format_quantity(-12345.0, "B") == "-12,345 B");
  tools::bench_result r;
  r.name = "remote_named_tasks";
  r.unit = "tasks/s";
  r.baseline = "schedule_named, one round trip each";
  r.value = 6141203.2;
  r.baseline_value = 6027;
  r.ratio = r.value / r.baseline_value;
  r.better = "higher";
  r.value_target = 200000;
  auto table = tools::format_table({r});
  BOOST_TEST(table.find("6,141,203 tasks/s") != std::string::npos, table);
  BOOST_TEST(table.find("6,027 tasks/s") != std::string::npos, table);
  BOOST_TEST(table.find(">=200,000 tasks/s ok") != std::string::npos, table);
  BOOST_TEST(table.find("6141203") == std::string::npos, table);
}

BOOST_AUTO_TEST_CASE(test_bench_only_selects_exact_cases) {
  auto rs = quick_run("", {"copy_4KiB"});
  BOOST_TEST(pairs_of(rs)
               == (std::vector<name_and_baseline>{
                 {"copy_4KiB", "memcpy 4KiB + one empty task"},
                 {"copy_4KiB", "spsc ring of std::function, 4KiB memcpy"}}),
             boost::test_tools::per_element());
  rs = quick_run("", {"fan_dag_2dev"});
  BOOST_TEST(pairs_of(rs)
               == (std::vector<name_and_baseline>{{"fan_dag_2dev", "oneTBB flow graph"},
                                                  {"fan_dag_2dev", "a thread per device, atomics"},
                                                  {"fan_dag_2dev", "StarPU"}}),
             boost::test_tools::per_element());
  // Exact, not a substring: independent_tasks_trace is another case.
  rs = quick_run("", {"independent_tasks"});
  BOOST_TEST(case_sequence(rs) == std::vector<std::string>{"independent_tasks"},
             boost::test_tools::per_element());
  BOOST_TEST(rs.size() == 6u); // its six baselines
}

BOOST_AUTO_TEST_CASE(test_bench_filter_selects_by_substring) {
  auto rs = quick_run("caf_remote");
  BOOST_TEST_REQUIRE(rs.size() == 1u);
  BOOST_TEST(rs[0].name == "caf_remote_round_trip");
}

BOOST_AUTO_TEST_CASE(test_bench_write_plots_draws_the_scaling_cases) {
  temp_dir dir;
  std::vector<tools::bench_result> rs{
    scale_entry("scale_1dev", "mutex+cv queues", 2e6, 1e6),
    scale_entry("scale_2dev", "mutex+cv queues", 3e6, 1.5e6),
    scale_entry("scale_depth_1", "one mutex+cv queue", 1e6, 0.5e6),
    scale_entry("scale_depth_100", "one mutex+cv queue", 4e6, 2e6),
  };
  auto files = tools::write_plots(rs, dir.path.string());
  BOOST_TEST(files.size() == 2u);
  for (auto [file, label] :
       {std::pair{"scale_devices.svg", "mutex+cv queues"},
        std::pair{"scale_queue_depth.svg", "one mutex+cv queue"}}) {
    BOOST_TEST_CONTEXT(file) {
      auto path = dir.path / file;
      BOOST_TEST_REQUIRE(std::filesystem::exists(path));
      BOOST_TEST((std::find(files.begin(), files.end(), path.string()) != files.end()));
      auto svg = read_all(path);
      BOOST_TEST(svg.starts_with("<svg"));
      BOOST_TEST(svg.find("</svg>") != std::string::npos);
      BOOST_TEST(svg.find("multidev") != std::string::npos);
      BOOST_TEST(svg.find(label) != std::string::npos);
    }
  }
  // The device chart has no queue-depth point, and the other way round.
  BOOST_TEST(read_all(dir.path / "scale_devices.svg").find(">100<") == std::string::npos);
  BOOST_TEST(read_all(dir.path / "scale_queue_depth.svg").find("2dev") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(test_bench_write_plots_writes_nothing_without_scaling_cases) {
  temp_dir dir;
  tools::bench_result r;
  r.name = "copy_4KiB";
  r.unit = "ns/copy";
  r.value = 300;
  r.baseline = "memcpy 4KiB + one empty task";
  r.baseline_value = 200;
  r.ratio = 1.5;
  auto files = tools::write_plots({r}, dir.path.string());
  BOOST_TEST(files.empty());
  BOOST_TEST(!std::filesystem::exists(dir.path / "scale_devices.svg"));
  BOOST_TEST(!std::filesystem::exists(dir.path / "scale_queue_depth.svg"));
}

BOOST_AUTO_TEST_CASE(test_bench_write_plots_takes_the_suite_as_it_comes) {
  // The real names and labels (e.g. "4dev", "1000000") parse into charts.
  temp_dir dir;
  auto files = tools::write_plots(quick_suite(), dir.path.string());
  BOOST_TEST(files.size() == 2u);
  for (const auto& f : files)
    BOOST_TEST(read_all(f).starts_with("<svg"));
}
