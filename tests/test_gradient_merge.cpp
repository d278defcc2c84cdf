// The example pipeline (examples/gradient_merge.hpp): partial gradients merged
// through device 0's merge buffer equal the host sum exactly, over 1-4 devices.
// And the merge buffer under pool changes: a copy into it, and a kernel reading
// it, use pool 0 as it was when they were scheduled, so a later `free_pool` or
// `alloc_pool` of pool 0 (ordered like cudaFreeAsync) cannot break them.
#define BOOST_TEST_MODULE gradient_merge
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "gradient_merge.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <vector>

namespace bdata = boost::unit_test::data;
using namespace std::chrono_literals;
using test_support::bounded;
using test_support::block_runner;
using test_support::field_of;
using test_support::make_backend;
using test_support::node;
using test_support::read_back;
using test_support::sync;

namespace {

std::size_t mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return std::max(got.size(), want.size());
  std::size_t bad = 0;
  for (std::size_t j = 0; j < got.size(); ++j)
    bad += std::memcmp(&got[j], &want[j], sizeof(float)) != 0;
  return bad;
}

/// Device 0's runner is held while a copy of `g` from device 1 into device 0's
/// merge buffer and an `add_from_merge` into `acc` are scheduled; then
/// `change` alters pool 0 and the runner goes on. Both must use the merge
/// buffer they were scheduled with: `acc` = 1 + g, the device is fine, and a
/// later merge works on whatever pool 0 now is.
void merge_then_change_pool_0(const std::function<void(multidev::backend&,
                                                       const multidev::device&)>& change) {
  using multidev::merge_buffer_use;
  auto b = make_backend(2);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto g = node(1, "g", 256), acc = node(2, "acc", 256);
  auto c0 = b.alloc_node(b.make_context(d0), acc);
  auto c1 = b.alloc_node(b.make_context(d1), g);
  b.run(b.link(c0, "fill", {acc, 1.0}));
  b.run(b.link(c1, "iota", {g, 10.0}));

  auto release = block_runner(b, d0);
  auto copy = b.device_to_device(g, merge_buffer_use::copy, c0, c1);
  BOOST_TEST_REQUIRE(copy.has_value());
  auto added = b.run(b.link(copy->context, "add_from_merge", {acc, g}));
  change(b, d0);
  release->open();
  sync(b, added);
  BOOST_TEST(field_of(b.get_debug_info(d0), "error") == "none");
  auto v = read_back(b, c0, acc);
  for (std::size_t i = 0; i < v.size(); ++i)
    BOOST_TEST(v[i] == 11.0f + static_cast<float>(i), "acc[" << i << "]");

  // The merge buffer is usable again: the next copy takes pool 0 as it is now.
  auto again = b.device_to_device(g, merge_buffer_use::copy, c0, c1);
  BOOST_TEST_REQUIRE(again.has_value());
  b.run(b.link(again->context, "add_from_merge", {acc, g}));
  v = read_back(b, c0, acc);
  for (std::size_t i = 0; i < v.size(); ++i)
    BOOST_TEST(v[i] == 21.0f + 2.0f * static_cast<float>(i), "acc[" << i << "] again");
}

} // namespace

BOOST_AUTO_TEST_CASE(test_gradient_merge_scheduled_merge_survives_free_pool_0) {
  merge_then_change_pool_0(
    [](multidev::backend& b, const multidev::device& d) { b.free_pool(d, 0); });
}

BOOST_AUTO_TEST_CASE(test_gradient_merge_scheduled_merge_survives_smaller_pool_0) {
  merge_then_change_pool_0([](multidev::backend& b, const multidev::device& d) {
    b.alloc_pool(d, 0, 16, 64);
  });
}

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
