// Recorded rounds across `multidev node` processes (issue 41 point 3): a
// round recorded on node a's device runs there; node a is killed; a replay
// of the round fails at once naming the lost device and the round, with
// nothing scheduled and the backend usable; the same round remapped to node
// b's device runs there with the right results. The remap checks that need
// a node: a lost target, a closure sent to another process.
//
// The tool's path is the test's first argument (tests/node_support.hpp).
#define BOOST_TEST_MODULE rounds_nodes
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "actors/round_state.hpp"
#include "node_support.hpp"
#include "test_certs.hpp"
#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>

using namespace multidev;
using test_support::contains;
using test_support::expect_throw;

BOOST_FIXTURE_TEST_CASE(test_rounds_nodes_remap_after_a_node_kill, test_support::two_nodes) {
  // The round: on a0, a pool it allocates, a fill whose value is a slot and
  // its checksum; the local device l0 waits for the checksum and counts.
  auto l0 = b.get_device(0);
  constexpr std::size_t n = 16;
  buffer_arg whole{buffer_loc{5, 0}, n * sizeof(float)};
  std::atomic<int> after{0};
  event filled, summed;
  auto r = b.record("step", [&] {
    b.alloc_pool(a0, 5, n * sizeof(float), 64);
    filled = b.schedule_named(a0, {"fill", {whole, 1.0}});
    summed = b.schedule_named(a0, {"checksum", {whole, std::string{"step_sum"}}});
    b.will_wait_for(b.make_context(l0), summed);
    b.schedule_task(l0, {"after the sum", [&] { ++after; }});
  });
  auto s = r.slot(filled, 1);
  r.arg(s) = 2.0;
  test_support::sync(b, b.replay(r).all_work_of(l0));
  auto on_a = b.result(a0, "step_sum");
  BOOST_TEST_REQUIRE(on_a.has_value());
  BOOST_TEST(on_a->sum == 2.0 * n);

  // Node a is killed while busy; its loss is seen once the busy item fails.
  auto busy = b.schedule_named(a0, {"spin_ns", {int64_t{30'000'000'000}}});
  na->kill9();
  expect_throw<device_error>(
    [&] { test_support::bounded([&] { b.sync(busy); }, "sync on the killed node"); }, "a/");

  // A replay fails at once, naming the lost device and the round; nothing
  // of it is scheduled (l0 got nothing) and the backend goes on.
  auto l0_before = b.all_work(l0).seq();
  std::string text;
  try {
    test_support::bounded([&] { b.replay(r); }, "a replay on the killed node");
    BOOST_ERROR("a replay on the killed node was scheduled");
  } catch (const device_error& e) {
    text = e.what();
  }
  BOOST_TEST(contains(text, "replay 2 of round 'step': its device " + a0.name() + " is lost"),
             text);
  BOOST_TEST(contains(text, "remap"), text);
  BOOST_TEST(b.all_work(l0).seq() == l0_before);
  BOOST_TEST(r.replays() == 1u);
  test_support::sync(b, b.schedule_named(l0, {"spin_ns", {int64_t{0}}}));

  // A lost device is no target either.
  auto on_b = b.record("on b", [&] { b.schedule_named(b0, {"spin_ns", {int64_t{0}}}); });
  expect_throw<std::invalid_argument>(
    [&] { b.replay(on_b, {{b0, a0}}); },
    "remap of round 'on b': target " + a0.name() + " of " + b0.name() + " is lost");
  // A closure cannot go to a device of another process.
  auto local = b.record("local", [&] { b.schedule_task(l0, {"closure", [] {}}); });
  expect_throw<std::invalid_argument>([&] { b.replay(local, {{l0, b0}}); },
                                      "item 'closure 0' is a closure (schedule_task) recorded on "
                                        + l0.name());

  // Remapped to b0, the round runs there: the slot's value, the pool the
  // round allocates, l0's wait for b0's checksum.
  for (double v : {3.0, 4.0}) {
    r.arg(s) = v;
    auto ev = b.replay(r, {{a0, b0}});
    BOOST_TEST((ev.item(1).key() == b0.key()));
    BOOST_TEST((ev.item(2).key() == b0.key()));
    test_support::sync(b, ev.all_work_of(l0));
    auto res = b.result(b0, "step_sum");
    BOOST_TEST_REQUIRE(res.has_value());
    BOOST_TEST(res->sum == v * n);
  }
  BOOST_TEST(after.load() == 3);
  BOOST_TEST(r.replays() == 3u);
}

BOOST_FIXTURE_TEST_CASE(test_rounds_nodes_a_killed_node_fails_the_other_nodes_waits_on_it,
                        test_support::two_nodes) {
  // A round on the nodes alone is replayed there (one message per node);
  // b0 waits on a0's item node to node. Node a is killed while that item
  // runs: b hears that a's actor is gone and fails the wait, instead of
  // waiting for a notice that never comes.
  auto r = b.record("across", [&] {
    auto e = b.schedule_named(a0, {"spin_ns", {int64_t{60'000'000'000}}});
    b.will_wait_for(b.make_context(b0), e);
    b.schedule_named(b0, {"spin_ns", {int64_t{0}}});
  });
  auto ev = b.replay(r);
  auto on_b = ev.item(2); // pushed on b, behind its wait
  na->kill9();
  auto text = expect_throw<device_error>(
    [&] { test_support::bounded([&] { b.sync(on_b); }, "sync on b's item"); }, "node a");
  BOOST_TEST(contains(text, "went down"), text);
  // b goes on: a round on b alone replays there.
  BOOST_TEST(b.recover(b0));
  auto only_b = b.record("on b", [&] { b.schedule_named(b0, {"spin_ns", {int64_t{0}}}); });
  test_support::bounded([&] { b.sync(b.replay(only_b).all_work_of(b0)); }, "a replay on b");
}

BOOST_TEST_DECORATOR(*boost::unit_test::precondition(test_support::have_certificates))
BOOST_AUTO_TEST_CASE(test_rounds_nodes_a_round_here_and_on_two_nodes_replays_over_tls) {
  // Two `multidev node` processes over TLS and a client of that kind: a
  // round on both nodes and this process's device replays on the nodes
  // (one message per node), its edges a -> b node to node (over TLS the
  // notices take the client's route: node.cpp, watch_peers) and b -> here.
  BOOST_TEST_REQUIRE(test_support::test_certificates().has_value());
  using multidev::scenario::node_process;
  node_process na{test_support::tool(), 1, "a", true, test_support::node_tls_args()};
  node_process nb{test_support::tool(), 1, "b", true, test_support::node_tls_args()};
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  register_types(cfg);
  cfg.set("scheduler.max-threads", std::size_t{2});
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds{500}});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds{3}});
  configure_tls(cfg, *test_support::test_certificates());
  caf::actor_system sys{cfg};
  backend b{sys, {.num_devices = 1}};
  auto a0 = attach_node(b, "127.0.0.1", na.port(), test_support::test_attach_options()).at(0);
  auto b0 = attach_node(b, "127.0.0.1", nb.port(), test_support::test_attach_options()).at(0);
  auto l0 = b.get_device(0);
  std::atomic<int> here{0};
  auto r = b.record("tls", [&] {
    auto on_a = b.schedule_named(a0, {"spin_ns", {int64_t{1'000'000}}});
    b.will_wait_for(b.make_context(b0), on_a);
    auto on_b = b.schedule_named(b0, {"spin_ns", {int64_t{0}}});
    b.will_wait_for(b.make_context(l0), on_b);
    b.schedule_task(l0, {"count", [&] { ++here; }});
  });
  replay_events first, last;
  for (int k = 0; k < 5; ++k) {
    last = b.replay(r);
    if (k == 0)
      first = last;
  }
  for (const auto& [d, e] : last.all_work())
    test_support::sync(b, e);
  BOOST_TEST(here.load() == 5);
  BOOST_TEST(r.state()->nodes.usable); // on the nodes, not call by call
  for (std::size_t i = 0; i < last.size(); ++i) {
    test_support::sync(b, last.item(i));
    BOOST_TEST(b.is_done(last.item(i)), "item " << i);
  }
  // Each replay takes the same number of entries on each device.
  BOOST_TEST(last.all_work_of(b0).seq() == first.all_work_of(b0).seq() + 4 * 2);
  BOOST_TEST(last.all_work_of(l0).seq() == first.all_work_of(l0).seq() + 4 * 2);
}
