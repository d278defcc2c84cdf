#define BOOST_TEST_MODULE bench
#include <boost/test/unit_test.hpp>

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
} // namespace

BOOST_AUTO_TEST_CASE(test_bench_reports_every_figure_beside_its_baseline) {
  auto rs = quick_run("");
  std::vector<std::string> names;
  for (const auto& r : rs)
    names.push_back(r.name);
  std::vector<std::string> expected{"independent_tasks",          "will_wait_for_chain",
                                    "will_wait_for_chain_scheduled",
                                    "copy_host_to_device_8MiB",   "copy_device_to_device_8MiB",
                                    "gradient_merge_1dev",        "gradient_merge_2dev",
                                    "gradient_merge_4dev",        "pool_calls",
                                    "independent_tasks_trace",    "idle_cpu_8dev"};
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
  auto rs = quick_run("independent"); // independent_tasks and independent_tasks_trace
  BOOST_TEST_REQUIRE(rs.size() == 2u);
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
