// Kernel preconditions (include/multidev/kernels.hpp, docs/kernels.md): what a
// kernel can check from its arguments is checked by `link`, `schedule_named`
// and the device actor's `schedule` message, before anything is queued. A bad
// call is refused with std::invalid_argument naming the kernel, the argument
// and what was expected; the device is not failed, nothing is queued, and it
// still runs work. User kernels declare their own checks with their signature.
#define BOOST_TEST_MODULE preconditions
#include <boost/test/unit_test.hpp>

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "test_support.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using namespace multidev;
using test_support::contains;
using test_support::field_of;
using test_support::make_backend;
using test_support::node;
using test_support::read_back;
using test_support::scheduled_count;
using test_support::sync;

namespace {

/// Device 0 holds `y`, `x` (64 floats), `half` (32 floats) and `odd` (6
/// bytes); device 1 holds `y` and `half`, filled, to copy into device 0's
/// merge buffer. Device 0 has no merge buffer yet.
struct fixture {
  backend b = make_backend(2);
  device d = b.get_device(0), d1 = b.get_device(1);
  tnode y = node(1, "y", 64), x = node(2, "x", 64), half = node(3, "half", 32);
  tnode odd{4, "odd", 6, memory_mode::on_device};
  context c = alloc(b.make_context(d), {y, x, half, odd});
  context c1 = alloc(b.make_context(d1), {y, half});

  fixture() {
    b.run(b.link(c1, "fill", {y, 2.0}));
    b.run(b.link(c1, "fill", {half, 3.0}));
  }

  context alloc(context ctx, std::initializer_list<tnode> ts) {
    for (const auto& t : ts)
      ctx = b.alloc_node(ctx, t);
    return ctx;
  }

  buffer_arg arg_of(const tnode& t) const { return {c.buffers.at(t), t.size_in_bytes}; }

  /// A merge-buffer argument: the node expected in the merge buffer.
  static buffer_arg merge_arg(const tnode& t) { return {{0, 0}, t.size_in_bytes}; }

  /// `ctx` expecting `t` in the merge buffer, without copying anything in.
  context expecting(const context& ctx, const tnode& t) {
    return b.make_child(ctx, std::nullopt, std::nullopt, std::optional<tnode>{t});
  }

  /// Checks that `what` threw std::invalid_argument whose message holds every
  /// one of `says`.
  template <class F>
  void expect_invalid(const std::string& path, F what, const std::vector<std::string>& says) {
    try {
      what();
      BOOST_ERROR(path << " accepted the call");
    } catch (const std::invalid_argument& e) {
      for (const auto& s : says)
        BOOST_TEST(contains(e.what(), s), path << ": '" << e.what() << "' lacks '" << s << "'");
    } catch (const std::exception& e) {
      BOOST_ERROR(path << " threw something else: " << e.what());
    }
  }

  /// `spec` is refused by `schedule_named` and by the device actor's
  /// `schedule` message, and `link_args` against `ctx` by `link` (when given),
  /// each saying `says`; then the device is unchanged and still works.
  void expect_refused(const task_spec& spec, const context& ctx,
                      const std::optional<std::vector<link_arg>>& link_args,
                      const std::vector<std::string>& says) {
    auto before = scheduled_count(b, d);
    expect_invalid("schedule_named", [&] { b.schedule_named(d, spec); }, says);
    if (link_args)
      expect_invalid("link", [&] { b.link(ctx, spec.kernel, *link_args); }, says);
    expect_invalid(
      "the schedule message",
      [&] {
        caf::scoped_actor self{b.system()};
        std::optional<caf::error> err;
        self->request(device_actor_of(b, d), 30s, atoms::schedule_atom::value, spec)
          .receive([](uint64_t) {}, [&](caf::error& e) { err = e; });
        if (err)
          throw_error(*err, d.name());
      },
      says);
    BOOST_TEST(scheduled_count(b, d) == before, "something was queued for " << spec.kernel);
    expect_usable();
  }

  /// The device is not failed and runs a kernel.
  void expect_usable() {
    BOOST_TEST(field_of(b.get_debug_info(d), "error") == "none");
    b.run(b.link(c, "fill", {x, 7.0}));
    auto v = read_back(b, c, x);
    BOOST_TEST(std::all_of(v.begin(), v.end(), [](float f) { return f == 7.0f; }));
  }
};

} // namespace

// -- built-ins --------------------------------------------------------------------

BOOST_FIXTURE_TEST_CASE(test_preconditions_axpy_sizes_must_match, fixture) {
  expect_refused(task_spec{"axpy", {arg_of(y), 2.0, arg_of(half)}}, c,
                 std::vector<link_arg>{y, 2.0, half},
                 {"axpy", "argument 0", "argument 2", "256", "128", "same size"});
  // Either way round.
  expect_refused(task_spec{"axpy", {arg_of(half), 2.0, arg_of(y)}}, c,
                 std::vector<link_arg>{half, 2.0, y}, {"axpy", "128", "256"});
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_float_buffers_hold_whole_floats, fixture) {
  buffer_arg six = arg_of(odd);
  struct bad {
    task_spec spec;
    std::vector<link_arg> link_args;
    std::string arg;
  };
  std::vector<bad> cases = {
    {{"fill", {six, 1.0}}, {odd, 1.0}, "argument 0"},
    {{"iota", {six, 1.0}}, {odd, 1.0}, "argument 0"},
    {{"scale", {six, 1.0}}, {odd, 1.0}, "argument 0"},
    {{"checksum", {six, std::string{"pre_odd"}}}, {odd, std::string{"pre_odd"}}, "argument 0"},
    // Same sizes, so only the element rule refuses it.
    {{"axpy", {six, 1.0, six}}, {odd, 1.0, odd}, "argument 0"},
    // A 64-float Y and a buffer cut to 6 bytes: the first odd argument is named.
    {{"axpy", {arg_of(y), 1.0, buffer_arg{c.buffers.at(x), 6}}}, {}, "argument 2"},
  };
  for (const auto& k : cases) {
    BOOST_TEST_CONTEXT(k.spec.kernel << " " << k.arg) {
      std::optional<std::vector<link_arg>> link_args;
      if (!k.link_args.empty())
        link_args = k.link_args;
      expect_refused(k.spec, c, link_args, {k.spec.kernel, k.arg, "6 bytes", "4-byte"});
    }
  }
  BOOST_TEST(!b.result("pre_odd").has_value());
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_spin_ns_must_not_be_negative, fixture) {
  expect_refused(task_spec{"spin_ns", {int64_t{-5}}}, c, std::vector<link_arg>{int64_t{-5}},
                 {"spin_ns", "argument 0", "-5", ">= 0"});
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_add_from_merge_needs_a_merge_buffer, fixture) {
  BOOST_TEST_REQUIRE(!d.merge_buffer().has_value());
  expect_refused(task_spec{"add_from_merge", {arg_of(y), merge_arg(y)}}, expecting(c, y),
                 std::vector<link_arg>{y, y},
                 {"add_from_merge", "argument 1", "merge buffer", "has none"});
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_add_from_merge_needs_a_big_enough_merge_buffer,
                        fixture) {
  auto copy = b.device_to_device(half, merge_buffer_use::copy, c, c1);
  BOOST_TEST_REQUIRE(copy.has_value());
  BOOST_TEST_REQUIRE(d.merge_buffer_capacity() == half.size_in_bytes);
  expect_refused(task_spec{"add_from_merge", {arg_of(y), merge_arg(y)}}, expecting(c, y),
                 std::vector<link_arg>{y, y},
                 {"add_from_merge", "argument 1", "256", "only 128"});
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_add_from_merge_dst_must_match_node, fixture) {
  auto copy = b.device_to_device(y, merge_buffer_use::copy, c, c1);
  BOOST_TEST_REQUIRE(copy.has_value());
  expect_refused(task_spec{"add_from_merge", {arg_of(half), merge_arg(y)}}, copy->context,
                 std::vector<link_arg>{half, y},
                 {"add_from_merge", "argument 0", "argument 1", "128", "256", "same size"});
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_calls_at_the_limits_run, fixture) {
  // A merge buffer larger than the node it holds; zero nanoseconds of spin.
  auto big = b.device_to_device(y, merge_buffer_use::copy, c, c1);
  BOOST_TEST_REQUIRE(big.has_value());
  auto small = b.device_to_device(half, merge_buffer_use::copy, c, c1);
  BOOST_TEST_REQUIRE(small.has_value());
  BOOST_TEST(d.merge_buffer_capacity() == y.size_in_bytes);
  b.run(b.link(c, "fill", {half, 1.0}));
  b.run(b.link(small->context, "add_from_merge", {half, half}));
  sync(b, b.schedule_named(d, task_spec{"add_from_merge", {arg_of(half), merge_arg(half)}}));
  sync(b, b.schedule_named(d, task_spec{"spin_ns", {int64_t{0}}}));
  auto v = read_back(b, c, half);
  BOOST_TEST(std::all_of(v.begin(), v.end(), [](float f) { return f == 7.0f; }));
  expect_usable();
}

// -- user kernels -----------------------------------------------------------------

BOOST_FIXTURE_TEST_CASE(test_preconditions_user_kernel_declares_its_own_checks, fixture) {
  // WINDOW DST LO HI: pairs of floats (8-byte elements); pair i of [LO, HI)
  // becomes (i, -i). Its check keeps the window ordered and inside DST.
  register_kernel(
    "pre_window",
    {.params = {arg_kind::buffer, arg_kind::integer, arg_kind::integer},
     .writes = {0},
     .body =
       [](kernel_call& k) {
         auto xs = k.floats(0);
         for (auto i = k.integer(1); i < k.integer(2); ++i) {
           xs[static_cast<std::size_t>(2 * i)] = static_cast<float>(i);
           xs[static_cast<std::size_t>(2 * i + 1)] = -static_cast<float>(i);
         }
       },
     .doc = "pre_window DST LO HI: pair i of DST becomes (i, -i) for LO <= i < HI",
     .element_size = 8,
     .check =
       [](const kernel_args& a) {
         if (a.integer(1) < 0 || a.integer(1) > a.integer(2))
           throw std::invalid_argument(
             "LO (argument 1) and HI (argument 2) must satisfy 0 <= LO <= HI");
         auto pairs = a.buffer_size(0) / 8;
         if (static_cast<uint64_t>(a.integer(2)) > pairs)
           throw std::invalid_argument("HI (argument 2) is past the end of DST (argument 0)");
       }});
  tnode twelve{5, "twelve", 12, memory_mode::on_device};
  c = b.alloc_node(c, twelve);
  // 12 bytes: whole floats, but not whole 8-byte elements.
  expect_refused(task_spec{"pre_window", {arg_of(twelve), int64_t{0}, int64_t{1}}}, c,
                 std::vector<link_arg>{twelve, int64_t{0}, int64_t{1}},
                 {"pre_window", "argument 0", "12 bytes", "8-byte"});
  expect_refused(task_spec{"pre_window", {arg_of(y), int64_t{5}, int64_t{2}}}, c,
                 std::vector<link_arg>{y, int64_t{5}, int64_t{2}},
                 {"kernel 'pre_window'", "LO (argument 1)", "HI (argument 2)"});
  expect_refused(task_spec{"pre_window", {arg_of(y), int64_t{0}, int64_t{33}}}, c,
                 std::vector<link_arg>{y, int64_t{0}, int64_t{33}},
                 {"kernel 'pre_window'", "past the end"});
  // A good call runs.
  b.run(b.link(c, "fill", {y, 0.0}));
  b.run(b.link(c, "pre_window", {y, int64_t{30}, int64_t{32}}));
  auto v = read_back(b, c, y);
  BOOST_TEST(v[60] == 30.0f);
  BOOST_TEST(v[61] == -30.0f);
  BOOST_TEST(v[63] == -31.0f);
  BOOST_TEST(v[59] == 0.0f);
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_check_sees_the_arguments_and_merge_buffer, fixture) {
  struct seen {
    std::string kernel;
    std::size_t count = 0;
    int64_t n = 0;
    double r = 0;
    std::string s;
    std::size_t bytes = 0;
    std::optional<std::size_t> merge;
  };
  auto last = std::make_shared<seen>();
  register_kernel("pre_probe",
                  {.params = {arg_kind::buffer, arg_kind::integer, arg_kind::real,
                              arg_kind::string},
                   .body = [](kernel_call&) {},
                   .doc = "pre_probe BUF N R S: records what its check sees",
                   .element_size = 1,
                   .check =
                     [last](const kernel_args& a) {
                       *last = seen{a.kernel(), a.size(),         a.integer(1), a.real(2),
                                    a.string(3), a.buffer_size(0), a.merge_buffer_size()};
                       if (a.string(3) == "no")
                         throw std::runtime_error("told to refuse");
                       if (a.string(3) == "kind")
                         (void)a.integer(0); // a buffer: the wrong accessor
                     }});
  sync(b, b.schedule_named(d, task_spec{"pre_probe", {arg_of(odd), int64_t{3}, int64_t{4},
                                                      std::string{"yes"}}}));
  BOOST_TEST(last->kernel == "pre_probe");
  BOOST_TEST(last->count == 4u);
  BOOST_TEST(last->n == 3);
  BOOST_TEST(last->r == 4.0); // an int where a float is declared
  BOOST_TEST(last->s == "yes");
  BOOST_TEST(last->bytes == 6u); // element size 1 accepts any size
  BOOST_TEST(!last->merge.has_value());
  // Whatever the check throws refuses the call as invalid_argument.
  expect_refused(task_spec{"pre_probe", {arg_of(odd), int64_t{3}, 4.5, std::string{"no"}}}, c,
                 std::vector<link_arg>{odd, int64_t{3}, 4.5, std::string{"no"}},
                 {"kernel 'pre_probe'", "told to refuse"});
  // A check using the wrong accessor is refused, not crashed.
  expect_refused(task_spec{"pre_probe", {arg_of(odd), int64_t{3}, 4.5, std::string{"kind"}}},
                 c, std::vector<link_arg>{odd, int64_t{3}, 4.5, std::string{"kind"}},
                 {"kernel 'pre_probe'", "argument 0", "buffer", "not int"});
  // After a merge copy the check sees the merge buffer's size.
  auto copy = b.device_to_device(half, merge_buffer_use::copy, c, c1);
  BOOST_TEST_REQUIRE(copy.has_value());
  b.link(c, "pre_probe", {odd, int64_t{1}, 0.5, std::string{"yes"}});
  BOOST_TEST_REQUIRE(last->merge.has_value());
  BOOST_TEST(*last->merge == half.size_in_bytes);
  BOOST_TEST(last->r == 0.5);
}

BOOST_FIXTURE_TEST_CASE(test_preconditions_docs_example_registers_and_checks, fixture) {
  // As in docs/kernels.md, "Registering a kernel".
  multidev::register_kernel("axpby", {
    .params = {multidev::arg_kind::buffer, multidev::arg_kind::real,
               multidev::arg_kind::buffer, multidev::arg_kind::real},
    .reads = {0, 2}, .writes = {0},
    .body = [](multidev::kernel_call& c) {
      auto y = c.floats(0);
      auto x = c.floats(2);
      auto a = static_cast<float>(c.real(1)), b = static_cast<float>(c.real(3));
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = a * x[i] + b * y[i];
    },
    .doc = "axpby Y A X B: Y[i] = A * X[i] + B * Y[i]",
    .element_size = sizeof(float), // the default; 1 accepts any size
    .check = [](const multidev::kernel_args& a) {
      if (a.buffer_size(0) != a.buffer_size(2))
        throw std::invalid_argument("Y (argument 0) and X (argument 2) differ in size");
    }});
  expect_refused(task_spec{"axpby", {arg_of(y), 1.0, arg_of(half), 1.0}}, c,
                 std::vector<link_arg>{y, 1.0, half, 1.0},
                 {"kernel 'axpby'", "argument 0", "argument 2", "differ in size"});
  b.run(b.link(c, "fill", {y, 1.0}));
  b.run(b.link(c, "fill", {x, 2.0}));
  b.run(b.link(c, "axpby", {y, 3.0, x, 0.5}));
  auto v = read_back(b, c, y);
  BOOST_TEST(std::all_of(v.begin(), v.end(), [](float f) { return f == 6.5f; }));
}

BOOST_AUTO_TEST_CASE(test_preconditions_register_kernel_refuses_element_size_zero) {
  try {
    register_kernel("pre_zero", {.params = {arg_kind::buffer},
                                 .body = [](kernel_call&) {},
                                 .element_size = 0});
    BOOST_ERROR("register_kernel accepted element_size 0");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "pre_zero"), e.what());
    BOOST_TEST(contains(e.what(), "element_size"), e.what());
  }
  BOOST_TEST(find_kernel("pre_zero") == nullptr);
  // The built-ins declare float elements.
  for (const auto& name : kernel_names())
    if (!name.starts_with("pre_") && name != "axpby")
      BOOST_TEST(find_kernel(name)->element_size == sizeof(float), name);
}
