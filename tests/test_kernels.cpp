// The kernel registry and the built-in kernels (include/multidev/kernels.hpp):
// each built-in does what its doc says, user kernels run through link/run and
// schedule_named, and bad calls or definitions are refused with clear errors.
#define BOOST_TEST_MODULE kernels
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <span>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using multidev::arg_kind;
using multidev::backend;
using multidev::buffer_arg;
using multidev::context;
using multidev::event;
using multidev::kernel_def;
using multidev::memory_mode;
using multidev::merge_buffer_use;
using multidev::task_spec;
using multidev::tnode;
using test_support::bounded;
using test_support::contains;
using test_support::make_backend;
using test_support::node;
using test_support::read_back;
using test_support::scheduled_count;
using test_support::sync;

namespace {

void upload(backend& b, const context& c, const tnode& t, const std::vector<float>& v) {
  BOOST_TEST_REQUIRE(b.from_host(c, t, std::as_bytes(std::span{v})));
  sync(b, b.all_work(c.device));
}

uint64_t fnv1a(std::span<const std::byte> bytes) {
  uint64_t h = 14695981039346656037ull;
  for (auto x : bytes) {
    h ^= static_cast<uint8_t>(x);
    h *= 1099511628211ull;
  }
  return h;
}

/// A device with nodes `a`, `b` (n floats each) allocated.
struct fixture {
  static constexpr std::size_t n = 37;
  backend b = make_backend(2);
  multidev::device d = b.get_device(0);
  tnode a = node(1, "a", n), x = node(2, "x", n);
  context c = b.alloc_node(b.alloc_node(b.make_context(d), a), x);
  buffer_arg arg_of(const tnode& t) const { return buffer_arg{c.buffers.at(t), t.size_in_bytes}; }
};

} // namespace

// -- built-ins --------------------------------------------------------------------

BOOST_FIXTURE_TEST_CASE(test_kernels_fill_sets_every_element, fixture) {
  b.run(b.link(c, "fill", {a, 2.5}));
  auto v = read_back(b, c, a);
  BOOST_TEST(v.size() == n);
  BOOST_TEST(std::all_of(v.begin(), v.end(), [](float y) { return y == 2.5f; }));
  // An integer argument is accepted where a float is expected.
  b.run(b.link(c, "fill", {a, int64_t{-3}}));
  v = read_back(b, c, a);
  BOOST_TEST(std::all_of(v.begin(), v.end(), [](float y) { return y == -3.0f; }));
}

BOOST_FIXTURE_TEST_CASE(test_kernels_iota_counts_from_start, fixture) {
  b.run(b.link(c, "iota", {a, 3.0}));
  auto v = read_back(b, c, a);
  for (std::size_t i = 0; i < n; ++i)
    BOOST_TEST(v[i] == 3.0f + static_cast<float>(i));
  b.run(b.link(c, "iota", {a, -10.5}));
  v = read_back(b, c, a);
  for (std::size_t i = 0; i < n; ++i)
    BOOST_TEST(v[i] == -10.5f + static_cast<float>(i));
}

BOOST_FIXTURE_TEST_CASE(test_kernels_scale_multiplies_in_place, fixture) {
  std::vector<float> init(n);
  for (std::size_t i = 0; i < n; ++i)
    init[i] = static_cast<float>(i) - 7.0f;
  upload(b, c, a, init);
  b.run(b.link(c, "scale", {a, 0.5}));
  b.run(b.link(c, "scale", {a, -4.0}));
  auto v = read_back(b, c, a);
  for (std::size_t i = 0; i < n; ++i)
    BOOST_TEST(v[i] == init[i] * 0.5f * -4.0f);
}

BOOST_FIXTURE_TEST_CASE(test_kernels_axpy_adds_scaled_x, fixture) {
  b.run(b.link(c, "iota", {a, 1.0}));
  b.run(b.link(c, "iota", {x, 100.0}));
  b.run(b.link(c, "axpy", {a, 3.0, x}));
  auto y = read_back(b, c, a);
  auto xs = read_back(b, c, x);
  for (std::size_t i = 0; i < n; ++i) {
    BOOST_TEST(y[i] == (1.0f + static_cast<float>(i)) + 3.0f * (100.0f + static_cast<float>(i)));
    BOOST_TEST(xs[i] == 100.0f + static_cast<float>(i)); // X is only read
  }
  // Mismatched sizes are refused before scheduling (tests/test_preconditions.cpp).
  tnode little = node(4, "little", n / 2);
  auto c2 = b.alloc_node(c, little);
  BOOST_CHECK_THROW(b.link(c2, "axpy", {a, 1.0, little}), std::invalid_argument);
}

BOOST_FIXTURE_TEST_CASE(test_kernels_add_from_merge_adds_merge_buffer, fixture) {
  auto d1 = b.get_device(1);
  auto c1 = b.alloc_node(b.make_context(d1), x);
  b.run(b.link(c, "iota", {a, 0.0}));
  b.run(b.link(c1, "iota", {x, 50.0}));
  auto copy = b.device_to_device(x, merge_buffer_use::copy, c, c1);
  BOOST_TEST_REQUIRE(copy.has_value());
  b.run(b.link(copy->context, "add_from_merge", {a, x}));
  b.run(b.link(copy->context, "add_from_merge", {a, x}));
  auto v = read_back(b, c, a);
  for (std::size_t i = 0; i < n; ++i)
    BOOST_TEST(v[i] == static_cast<float>(i) + 2.0f * (50.0f + static_cast<float>(i)));
}

BOOST_FIXTURE_TEST_CASE(test_kernels_checksum_publishes_sum_hash_count, fixture) {
  std::vector<float> init(n);
  for (std::size_t i = 0; i < n; ++i)
    init[i] = static_cast<float>(i) * 0.25f + 1.0f;
  upload(b, c, a, init);
  BOOST_TEST(!b.result("kernels_ck_a").has_value());
  auto e = b.run(b.link(c, "checksum", {a, std::string{"kernels_ck_a"}}));
  sync(b, e);
  auto r = b.result("kernels_ck_a");
  BOOST_TEST_REQUIRE(r.has_value());
  double sum = 0;
  for (float y : init)
    sum += y;
  BOOST_TEST(r->sum == sum);
  BOOST_TEST(r->count == n);
  BOOST_TEST(r->hash == fnv1a(std::as_bytes(std::span{init})));
  // A later checksum under the same name replaces it; other names are apart.
  b.run(b.link(c, "fill", {a, 1.0}));
  sync(b, b.schedule_named(d, task_spec{"checksum", {arg_of(a), std::string{"kernels_ck_a"}}}));
  auto r2 = b.result("kernels_ck_a");
  BOOST_TEST_REQUIRE(r2.has_value());
  BOOST_TEST(r2->sum == static_cast<double>(n));
  BOOST_TEST(r2->count == n);
  BOOST_TEST(r2->hash != r->hash);
  BOOST_TEST(!b.result("kernels_ck_other").has_value());
}

BOOST_FIXTURE_TEST_CASE(test_kernels_spin_ns_runs_in_order, fixture) {
  auto before = scheduled_count(b, d);
  auto t0 = std::chrono::steady_clock::now();
  auto e = b.run(b.link(c, "spin_ns", {int64_t{3'000'000}}));
  auto e2 = b.schedule_named(d, task_spec{"spin_ns", {int64_t{1000}}});
  b.run(b.link(c, "fill", {a, 9.0}));
  sync(b, b.all_work(d));
  auto elapsed = std::chrono::steady_clock::now() - t0;
  BOOST_TEST(e.is_done());
  BOOST_TEST(e2.is_done());
  BOOST_TEST(e2.seq() > e.seq());
  BOOST_TEST(scheduled_count(b, d) == before + 3);
  // It busy-waits at least its argument (a lower bound, never flaky).
  BOOST_TEST(elapsed >= 3ms);
  auto v = read_back(b, c, a);
  BOOST_TEST(v[0] == 9.0f);
}

BOOST_AUTO_TEST_CASE(test_kernels_schedule_batch_runs_each_task_once_and_refuses_a_bad_batch_whole) {
  auto b = make_backend(1);
  auto d = b.get_device(0);
  b.alloc_pool(d, 1000, 8, 64);
  auto y = buffer_arg{multidev::buffer_loc{1000, 0}, 4};
  auto x = buffer_arg{multidev::buffer_loc{1000, 4}, 4};
  b.schedule_named(d, task_spec{"fill", {buffer_arg{multidev::buffer_loc{1000, 0}, 8}, 1.0}});
  b.schedule_named(d, task_spec{"fill", {y, 0.0}});
  std::vector<task_spec> specs(5'000, task_spec{"axpy", {y, 1.0, x}});
  auto events = b.schedule_batch(d, specs);
  BOOST_TEST_REQUIRE(events.size() == specs.size());
  BOOST_TEST(events.back().seq() - events.front().seq() == specs.size() - 1);
  auto before = b.all_work(d).seq();
  std::vector<task_spec> bad{{"axpy", {y, 1.0, x}},
                             {"axpy", {buffer_arg{multidev::buffer_loc{77, 0}, 4}, 1.0, x}}};
  try {
    b.schedule_batch(d, bad);
    BOOST_ERROR("a batch naming an unknown pool was scheduled");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "77"), e.what());
  }
  BOOST_TEST(b.all_work(d).seq() == before);
  b.sync(b.schedule_named(d, task_spec{"checksum", {y, std::string{"local_batch"}}}));
  auto r = b.result(d, "local_batch");
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 5000.0);
}

BOOST_AUTO_TEST_CASE(test_kernels_fail_fails_device_with_message) {
  auto b = make_backend(2);
  auto d = b.get_device(0), other = b.get_device(1);
  auto e = b.schedule_named(d, task_spec{"fail", {std::string{"kaboom-1729"}}});
  try {
    sync(b, e);
    BOOST_ERROR("sync on a failed kernel's event did not throw");
  } catch (const multidev::device_error& err) {
    BOOST_TEST(contains(err.message(), "kaboom-1729"), err.message());
    BOOST_TEST(err.device_name() == d.name());
    BOOST_TEST(contains(err.what(), d.name()), err.what());
  }
  BOOST_TEST(e.is_failed());
  BOOST_CHECK_THROW(b.schedule_task(d, multidev::task{"after", [] {}, nullptr}),
                    multidev::device_error);
  BOOST_CHECK_THROW(bounded([&] { b.await(d); }), multidev::device_error);
  // Through link/run as well, on a separate device; the first stays isolated.
  auto c = b.make_context(other);
  auto e2 = b.run(b.link(c, "fail", {std::string{"second"}}));
  try {
    sync(b, e2);
    BOOST_ERROR("link/run of fail did not fail");
  } catch (const multidev::device_error& err) {
    BOOST_TEST(contains(err.message(), "second"), err.message());
    BOOST_TEST(!contains(err.message(), "kaboom-1729"), err.message());
  }
}

// -- user kernels -----------------------------------------------------------------

BOOST_FIXTURE_TEST_CASE(test_kernels_user_kernel_runs_via_link_and_schedule_named, fixture) {
  multidev::register_kernel(
    "kernels_test_affine",
    kernel_def{{arg_kind::buffer, arg_kind::buffer, arg_kind::real, arg_kind::integer},
               {1},
               {0},
               -1,
               [](multidev::kernel_call& k) {
                 auto y = k.floats(0);
                 auto xs = k.floats(1);
                 auto m = static_cast<float>(k.real(2));
                 auto add = static_cast<float>(k.integer(3));
                 for (std::size_t i = 0; i < y.size(); ++i)
                   y[i] = m * xs[i] + add;
               },
               "kernels_test_affine Y X M C: Y = M * X + C"});
  BOOST_TEST_REQUIRE(multidev::find_kernel("kernels_test_affine") != nullptr);
  auto names = multidev::kernel_names();
  BOOST_TEST(std::is_sorted(names.begin(), names.end()));
  BOOST_TEST((std::find(names.begin(), names.end(), "kernels_test_affine") != names.end()));

  b.run(b.link(c, "iota", {x, 0.0}));
  auto r = b.link(c, "kernels_test_affine", {a, x, 2.0, int64_t{5}});
  BOOST_TEST(r.name == "kernels_test_affine");
  BOOST_TEST(r.outputs.contains(a));
  BOOST_TEST(r.inputs.contains(x));
  BOOST_TEST(!r.inputs.contains(a));
  auto e = b.run(r);
  BOOST_TEST(d.updating_for(a).has_value());
  BOOST_TEST(d.updating_for(a)->seq() == e.seq());
  auto v = read_back(b, c, a);
  for (std::size_t i = 0; i < n; ++i)
    BOOST_TEST(v[i] == 2.0f * static_cast<float>(i) + 5.0f);

  // The same kernel as a named task.
  auto e2 = b.schedule_named(
    d, task_spec{"kernels_test_affine", {arg_of(a), arg_of(x), -1.0, int64_t{100}}});
  sync(b, e2);
  v = read_back(b, c, a);
  for (std::size_t i = 0; i < n; ++i)
    BOOST_TEST(v[i] == -1.0f * static_cast<float>(i) + 100.0f);

  // Re-registering replaces the kernel.
  multidev::register_kernel(
    "kernels_test_affine",
    kernel_def{{arg_kind::buffer, arg_kind::buffer, arg_kind::real, arg_kind::integer},
               {1},
               {0},
               -1,
               [](multidev::kernel_call& k) {
                 for (auto& y : k.floats(0))
                   y = 42.0f;
               },
               "replaced"});
  b.run(b.link(c, "kernels_test_affine", {a, x, 0.0, int64_t{0}}));
  v = read_back(b, c, a);
  BOOST_TEST(std::all_of(v.begin(), v.end(), [](float y) { return y == 42.0f; }));
}

// -- bad calls --------------------------------------------------------------------

BOOST_FIXTURE_TEST_CASE(test_kernels_bad_calls_are_refused_and_schedule_nothing, fixture) {
  b.run(b.link(c, "fill", {a, 1.0}));
  sync(b, b.all_work(d));
  auto before = scheduled_count(b, d);
  struct bad {
    std::string kernel;
    std::vector<multidev::link_arg> link_args;
    std::vector<multidev::kernel_arg> spec_args;
    std::vector<std::string> says;
  };
  tnode absent = node(77, "absent", n);
  std::vector<bad> cases = {
    {"no_such_kernel_xyz", {a}, {arg_of(a)}, {"unknown kernel", "no_such_kernel_xyz", "fill"}},
    {"fill", {a}, {arg_of(a)}, {"fill", "2", "1"}},
    {"fill", {a, 1.0, 2.0}, {arg_of(a), 1.0, 2.0}, {"fill", "2", "3"}},
    {"fill", {a, std::string{"one"}}, {arg_of(a), std::string{"one"}}, {"fill", "argument 1", "float", "string"}},
    {"spin_ns", {a}, {arg_of(a)}, {"spin_ns", "argument 0", "int", "a"}},
    {"spin_ns", {1.5}, {1.5}, {"spin_ns", "argument 0", "int", "float"}},
    {"fill", {2.0, 1.0}, {2.0, 1.0}, {"fill", "argument 0", "buffer", "float"}},
    {"checksum", {a, int64_t{3}}, {arg_of(a), int64_t{3}}, {"checksum", "argument 1", "string", "int"}},
  };
  for (const auto& k : cases) {
    try {
      b.link(c, k.kernel, k.link_args);
      BOOST_ERROR("link " << k.kernel << " with bad arguments did not throw");
    } catch (const std::invalid_argument& e) {
      for (const auto& s : k.says)
        BOOST_TEST(contains(e.what(), s), "link message '" << e.what() << "' lacks '" << s << "'");
    }
    try {
      b.schedule_named(d, task_spec{k.kernel, k.spec_args});
      BOOST_ERROR("schedule_named " << k.kernel << " with bad arguments did not throw");
    } catch (const std::invalid_argument& e) {
      for (const auto& s : k.says)
        if (s != "a") // a spec names no node
          BOOST_TEST(contains(e.what(), s),
                     "schedule_named message '" << e.what() << "' lacks '" << s << "'");
    }
    BOOST_TEST(scheduled_count(b, d) == before, "something was scheduled for " << k.kernel);
  }
  // A node the context does not hold.
  try {
    b.link(c, "fill", {absent, 1.0});
    BOOST_ERROR("link with an absent node did not throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "absent"), e.what());
  }
  // A named task whose buffer is in no pool, or out of the pool's range.
  BOOST_CHECK_THROW(
    b.schedule_named(d, task_spec{"fill", {buffer_arg{{555, 0}, 8}, 1.0}}),
    std::invalid_argument);
  BOOST_CHECK_THROW(b.schedule_named(d, task_spec{"fill",
                                                  {buffer_arg{c.buffers.at(a), n * 4 + 4}, 1.0}}),
                    std::invalid_argument);
  BOOST_CHECK_THROW(b.schedule_named(d, task_spec{"fill", {std::monostate{}, 1.0}}),
                    std::invalid_argument);
  BOOST_TEST(scheduled_count(b, d) == before);
  // The device is unharmed.
  b.run(b.link(c, "fill", {a, 6.0}));
  auto v = read_back(b, c, a);
  BOOST_TEST(std::all_of(v.begin(), v.end(), [](float y) { return y == 6.0f; }));
  BOOST_TEST(scheduled_count(b, d) == before + 2); // fill + to_host
}

BOOST_AUTO_TEST_CASE(test_kernels_register_kernel_rejects_bad_definitions) {
  auto body = [](multidev::kernel_call&) {};
  auto expect_refused = [](const std::string& name, kernel_def def,
                           std::vector<std::string> says) {
    try {
      multidev::register_kernel(name, std::move(def));
      BOOST_ERROR("register_kernel '" << name << "' did not throw");
    } catch (const std::invalid_argument& e) {
      for (const auto& s : says)
        BOOST_TEST(contains(e.what(), s), "'" << e.what() << "' lacks '" << s << "'");
    }
    if (!name.empty())
      BOOST_TEST(multidev::find_kernel(name) == nullptr, name << " was registered anyway");
  };
  expect_refused("kernels_bad_nobody", kernel_def{{arg_kind::buffer}, {0}, {0}, -1, {}, ""},
                 {"kernels_bad_nobody", "body"});
  expect_refused("kernels_bad_reads",
                 kernel_def{{arg_kind::buffer, arg_kind::real}, {1}, {0}, -1, body, ""},
                 {"kernels_bad_reads", "reads", "1"});
  expect_refused("kernels_bad_writes",
                 kernel_def{{arg_kind::buffer}, {0}, {3}, -1, body, ""},
                 {"kernels_bad_writes", "writes", "3"});
  expect_refused("kernels_bad_neg", kernel_def{{arg_kind::buffer}, {-1}, {}, -1, body, ""},
                 {"kernels_bad_neg", "reads"});
  expect_refused("kernels_bad_merge",
                 kernel_def{{arg_kind::buffer, arg_kind::string}, {}, {0}, 1, body, ""},
                 {"kernels_bad_merge", "merge_buffer_param"});
  expect_refused("", kernel_def{{}, {}, {}, -1, body, ""}, {"empty"});
  // A refused re-registration keeps the built-in.
  auto fill = multidev::find_kernel("fill");
  BOOST_TEST_REQUIRE(fill != nullptr);
  BOOST_CHECK_THROW(multidev::register_kernel("fill", kernel_def{}), std::invalid_argument);
  BOOST_TEST(multidev::find_kernel("fill") == fill);
  // Every built-in is documented.
  for (const auto& name : {"fill", "iota", "scale", "axpy", "add_from_merge", "checksum",
                           "spin_ns", "fail"}) {
    auto k = multidev::find_kernel(name);
    BOOST_TEST_REQUIRE(k != nullptr, name);
    BOOST_TEST(!k->doc.empty(), name);
  }
}
