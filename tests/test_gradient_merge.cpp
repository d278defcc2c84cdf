// The example pipeline (examples/gradient_merge.hpp): partial gradients merged
// through device 0's merge buffer equal the host sum exactly, over 1-4 devices.
#define BOOST_TEST_MODULE gradient_merge
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "gradient_merge.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <vector>

namespace bdata = boost::unit_test::data;
using namespace std::chrono_literals;
using test_support::bounded;

namespace {

std::size_t mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return std::max(got.size(), want.size());
  std::size_t bad = 0;
  for (std::size_t j = 0; j < got.size(); ++j)
    bad += std::memcmp(&got[j], &want[j], sizeof(float)) != 0;
  return bad;
}

} // namespace

BOOST_DATA_TEST_CASE(test_gradient_merge_equals_host_sum,
                     bdata::make({1, 2, 3, 4}) * bdata::make({std::size_t{1}, std::size_t{1000},
                                                             std::size_t{1} << 16}),
                     devices, n) {
  multidev::backend b{multidev::backend_options{.num_devices = 4, .scheduler_threads = 2}};
  auto p = gradient_merge::setup(b, devices, n);
  BOOST_TEST(p.ctx.size() == static_cast<std::size_t>(devices));
  auto expected = gradient_merge::host_sum(devices, n);

  std::vector<float> merged;
  bounded([&] { gradient_merge::step(b, p, merged); }, "the gradient-merge step");
  BOOST_TEST_REQUIRE(merged.size() == n);
  BOOST_TEST(mismatches(merged, expected) == 0u,
             "merged gradient differs from the host sum (" << devices << " devices, " << n
                                                            << " floats)");
  BOOST_TEST(merged[0] == expected[0]);
  BOOST_TEST(merged[n - 1] == expected[n - 1]);

  // The checksum the pipeline publishes matches the host sum.
  auto r = b.result("grad");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->count == n);
  double host = 0;
  for (float x : expected)
    host += x;
  BOOST_TEST(r->sum == host);

  // The merge buffer of device 0 is used iff there is more than one device.
  auto d0 = b.get_device(0);
  if (devices > 1) {
    BOOST_TEST(d0.merge_buffer_capacity() == n * sizeof(float));
    auto held = d0.updating_for_merge_buffer();
    BOOST_TEST_REQUIRE(held.has_value());
    BOOST_TEST((held->first == p.grad));
  } else {
    BOOST_TEST(d0.merge_buffer_capacity() == 0u);
    BOOST_TEST(!d0.updating_for_merge_buffer().has_value());
  }

  // A second step gives the same result, bit for bit.
  std::vector<float> again(n, -1.0f);
  bounded([&] { gradient_merge::step(b, p, again); }, "the second gradient-merge step");
  BOOST_TEST(mismatches(again, merged) == 0u, "second step differs from the first");
  auto r2 = b.result("grad");
  BOOST_TEST_REQUIRE(r2.has_value());
  BOOST_TEST((*r2 == *r));
  for (int i = 0; i < devices; ++i)
    BOOST_TEST(b.get_debug_info(b.get_device(i)).find("error")->items().at(1).as_atom()
               == "none");
}
