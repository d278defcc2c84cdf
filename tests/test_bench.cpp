#define BOOST_TEST_MODULE bench
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "bench.hpp"

using namespace multidev;

// Only the shape of the results is tested; the figures themselves belong to
// `multidev bench`, never to pass/fail tests.

namespace {
/// The suite in quick mode, one repetition, on 2 devices; `filter` as `--filter`.
std::vector<tools::bench_result> quick_run(const std::string& filter) {
  tools::bench_options o;
  o.quick = true;
  o.repeats = 1;
  o.filter = filter;
  return tools::run_benchmarks(backend_options{.num_devices = 2}, o);
}

/// The whole quick suite, run once for the test cases that read it.
const std::vector<tools::bench_result>& quick_suite() {
  static const auto rs = quick_run("");
  return rs;
}
} // namespace

BOOST_AUTO_TEST_CASE(test_bench_reports_every_figure_beside_its_baseline) {
  const auto& rs = quick_suite();
  std::vector<std::string> names;
  for (const auto& r : rs)
    names.push_back(r.name);
  std::vector<std::string> expected{"independent_tasks",
                                    "independent_tasks_vs_ring",
                                    "will_wait_for_chain",
                                    "will_wait_for_chain_vs_caf",
                                    "will_wait_for_chain_scheduled",
                                    "will_wait_for_chain_scheduled_vs_caf",
                                    "copy_host_to_device_8MiB",
                                    "copy_device_to_device_8MiB",
                                    "gradient_merge_1dev",
                                    "gradient_merge_2dev",
                                    "gradient_merge_4dev",
                                    "pool_calls",
                                    "independent_tasks_trace",
                                    "caf_remote_round_trip",
                                    "remote_hop",
                                    "remote_hop_vs_tcp",
                                    "remote_named_tasks",
                                    "idle_cpu_8dev"};
  BOOST_TEST(names == expected, boost::test_tools::per_element());
  for (const auto& r : rs) {
    BOOST_TEST_CONTEXT(r.name) {
      BOOST_TEST(r.value > 0);
      BOOST_TEST(r.baseline_value > 0);
      BOOST_TEST(!r.baseline.empty());
      BOOST_TEST(r.ratio == r.value / r.baseline_value, boost::test_tools::tolerance(1e-12));
      BOOST_TEST((r.better == "lower" || r.better == "higher"));
    }
  }
}

BOOST_AUTO_TEST_CASE(test_bench_json_has_the_documented_fields) {
  auto rs = quick_run("independent_tasks");
  // beside the cv queue and the ring, and with the trace on
  BOOST_TEST_REQUIRE(rs.size() == 3u);
  rs.erase(rs.begin() + 1); // keep the cv-queue row and the trace row
  auto j = nlohmann::json::parse(tools::to_json(rs));
  BOOST_TEST_REQUIRE(j.is_array());
  BOOST_TEST_REQUIRE(j.size() == 2u);
  for (const char* key : {"name", "unit", "value", "baseline", "baseline_value", "ratio",
                          "better", "target", "value_target", "meets_target"})
    BOOST_TEST(j[0].contains(key), key);
  BOOST_TEST(j[0]["name"] == "independent_tasks");
  BOOST_TEST(j[0]["target"] == 1.0);
  BOOST_TEST(j[1]["name"] == "independent_tasks_trace");
  BOOST_TEST(j[1]["target"] == 1.5);
  BOOST_TEST(j[0]["value_target"].is_null());
  BOOST_TEST(j[0]["ratio"].get<double>()
               == j[0]["value"].get<double>() / j[0]["baseline_value"].get<double>(),
             boost::test_tools::tolerance(1e-9));
  auto table = tools::format_table(rs);
  BOOST_TEST(table.find("independent_tasks") != std::string::npos);
  BOOST_TEST(table.find("mutex+cv queue") != std::string::npos);
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
}

BOOST_AUTO_TEST_CASE(test_bench_idle_cpu_has_an_absolute_target_in_the_json) {
  auto rs = quick_run("idle_cpu_8dev");
  BOOST_TEST_REQUIRE(rs.size() == 1u);
  BOOST_TEST(rs[0].unit == "ms/s");
  BOOST_TEST(rs[0].value >= 0);
  BOOST_TEST(rs[0].baseline_value >= 0);
  BOOST_TEST(!rs[0].target.has_value());
  BOOST_TEST_REQUIRE(rs[0].value_target.has_value());
  BOOST_TEST(*rs[0].value_target == 2.0);
  auto j = nlohmann::json::parse(tools::to_json(rs));
  BOOST_TEST(j[0]["value_target"] == 2.0);
  BOOST_TEST(j[0]["target"].is_null());
  BOOST_TEST(j[0]["meets_target"] == (rs[0].value <= 2.0));
  BOOST_TEST(tools::format_table(rs).find("<=2.0 ms/s") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(test_bench_new_baselines_share_one_measurement_of_multidev) {
  // Each baseline figure of issue 7 beside the figure it extends: the same
  // multidev value (measured once, alternating with both baselines), its own
  // baseline and target.
  const auto& rs = quick_suite();
  auto find = [&rs](const std::string& name) -> const tools::bench_result& {
    auto i = std::find_if(rs.begin(), rs.end(), [&](const auto& r) { return r.name == name; });
    BOOST_TEST_REQUIRE((i != rs.end()), name);
    return *i;
  };
  struct pairing {
    const char *figure, *extends, *baseline;
    double target;
  };
  for (auto p : {pairing{"independent_tasks_vs_ring", "independent_tasks",
                         "lock-free SPSC ring, fn pointers", 2.0},
                 pairing{"will_wait_for_chain_vs_caf", "will_wait_for_chain",
                         "CAF actor ping-pong (sharing)", 1.0},
                 pairing{"will_wait_for_chain_scheduled_vs_caf", "will_wait_for_chain_scheduled",
                         "CAF actor ping-pong (sharing)", 2.5}}) {
    BOOST_TEST_CONTEXT(p.figure) {
      const auto& r = find(p.figure);
      const auto& base = find(p.extends);
      BOOST_TEST(r.value == base.value);
      BOOST_TEST(r.unit == base.unit);
      BOOST_TEST(r.baseline == p.baseline);
      BOOST_TEST(r.baseline_value > 0);
      BOOST_TEST(r.baseline != base.baseline);
      BOOST_TEST_REQUIRE(r.target.has_value());
      BOOST_TEST(*r.target == p.target);
      BOOST_TEST(r.better == "lower");
    }
  }
  // The remote round trip is informative: a CAF round trip between two actor
  // systems over 127.0.0.1, beside raw TCP on the same loopback.
  const auto& remote = find("caf_remote_round_trip");
  BOOST_TEST(remote.unit == "us/trip");
  BOOST_TEST(remote.value > 0);
  BOOST_TEST(remote.baseline_value > 0);
  BOOST_TEST(!remote.target.has_value());
  BOOST_TEST(!remote.value_target.has_value());
  // A multidev hop across that connection (to a node's device), beside a
  // CAF ping-pong hop on it and beside a raw TCP round trip: one
  // measurement of multidev for both.
  const auto& hop = find("remote_hop");
  BOOST_TEST(hop.unit == "us/hop");
  BOOST_TEST(hop.value > 0);
  BOOST_TEST(hop.baseline_value > 0);
  BOOST_TEST_REQUIRE(hop.target.has_value());
  BOOST_TEST(*hop.target == 1.0);
  const auto& tcp = find("remote_hop_vs_tcp");
  BOOST_TEST(tcp.value == hop.value);
  BOOST_TEST(tcp.baseline == "raw TCP round trip, 64 B");
  BOOST_TEST_REQUIRE(tcp.target.has_value());
  BOOST_TEST(*tcp.target == 5.0);
  // Batched named tasks to the node: tasks per second, higher is better,
  // with a floor on the value.
  const auto& tasks = find("remote_named_tasks");
  BOOST_TEST(tasks.unit == "tasks/s");
  BOOST_TEST(tasks.better == "higher");
  BOOST_TEST(tasks.value > 0);
  BOOST_TEST(tasks.baseline_value > 0);
  BOOST_TEST(!tasks.target.has_value());
  BOOST_TEST_REQUIRE(tasks.value_target.has_value());
  BOOST_TEST(*tasks.value_target == 200'000.0);
}

BOOST_AUTO_TEST_CASE(test_bench_filter_selects_one_baseline_of_a_figure) {
  auto rs = quick_run("_vs_ring");
  BOOST_TEST_REQUIRE(rs.size() == 1u);
  BOOST_TEST(rs[0].name == "independent_tasks_vs_ring");
  rs = quick_run("caf_remote");
  BOOST_TEST_REQUIRE(rs.size() == 1u);
  BOOST_TEST(rs[0].name == "caf_remote_round_trip");
}
