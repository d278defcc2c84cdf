// Hand-over at a park (`try_help`): a runner about to park at a wait on a
// device whose own wait has ended, while that device's runner is asleep and
// not yet back with its token (rung, not yet scheduled), runs that device's
// items itself until its own wait opens. The window is a context switch
// wide, so the test holds the woken runner there (`hold_after_wake`, a hook
// for tests) and checks that the waiting device's work completes without
// it, on the helper's thread, in order, and that the held runner takes its
// device back afterwards.
#define BOOST_TEST_MODULE hand_over_help
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "actors/device_core.hpp" // pending_gates, runner_sleeping
#include "runner_hold.hpp"
#include "test_support.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace multidev;
using test_support::field_of;
using test_support::hold_guard;
using test_support::sync;

namespace {

/// Three CPU devices with hand-over on, and each one's runner thread id.
struct three_devices {
  explicit three_devices(bool hand_over = true)
    : b(backend_options{.num_devices = 3, .scheduler_threads = 2, .hand_over = hand_over}) {
    for (int i = 0; i < 3; ++i) {
      d.push_back(b.get_device(i));
      ctx.push_back(b.make_context(d.back()));
      std::thread::id id;
      b.schedule_task(d[i], {"probe", [&id] { id = std::this_thread::get_id(); }});
      sync(b, b.all_work(d[i]));
      runner.push_back(id);
    }
  }
  std::string field(int i, const char* key) const {
    return field_of(b.get_debug_info(d[static_cast<std::size_t>(i)]), key);
  }
  detail::device_core& core(int i) const { return *d[static_cast<std::size_t>(i)].get_runner().core(); }

  backend b;
  std::vector<device> d;
  std::vector<context> ctx;
  std::vector<std::thread::id> runner;
};

/// Device 1 waits on device 2's blocked task, then runs `x`; device 0 runs a
/// blocked task, then waits for `x`, then runs `y`. Device 1's runner goes
/// to sleep at its wait and is held once woken. Opens device 2's task, then
/// (once device 1's wait has opened) device 0's. Returns `y`'s event.
struct help_scenario {
  explicit help_scenario(three_devices& t) : t(t) {
    t.b.schedule_task(t.d[2], {"c", [r = release_c] { BOOST_REQUIRE(r->wait()); }});
    t.b.will_wait_for(t.ctx[1], t.b.all_work(t.d[2]));
    t.b.schedule_task(t.d[1], {"x", [this] {
                                 x_thread = std::this_thread::get_id();
                                 order.push_back("x");
                               }});
    x = t.b.all_work(t.d[1]);
    // Asleep at its wait: not spinning, so a helper may take its token.
    BOOST_REQUIRE(test_support::eventually([&] {
      return t.field(1, "parked_on") != "none" && t.field(1, "run_by") == "lendable" &&
             t.core(1).runner_sleeping();
    }));
  }
  event run() {
    hold.emplace(t.core(1));
    t.b.schedule_task(t.d[0], {"a", [r = release_a, this] {
                                 BOOST_REQUIRE(r->wait());
                                 order.push_back("a");
                               }});
    t.b.will_wait_for(t.ctx[0], x);
    t.b.schedule_task(t.d[0], {"y", [this] {
                                 y_thread = std::this_thread::get_id();
                                 order.push_back("y");
                               }});
    auto y = t.b.all_work(t.d[0]);
    release_c->open();
    // Device 1's wait has opened and its runner was rung; held, it cannot
    // take its token back.
    BOOST_REQUIRE(test_support::eventually([&] { return t.core(1).pending_gates().empty(); }));
    release_a->open();
    return y;
  }

  three_devices& t;
  std::shared_ptr<test_support::latch_gate> release_a = std::make_shared<test_support::latch_gate>();
  std::shared_ptr<test_support::latch_gate> release_c = std::make_shared<test_support::latch_gate>();
  std::optional<hold_guard> hold;
  event x;
  std::thread::id x_thread, y_thread;
  std::vector<std::string> order; // a, x, y run one after the other, never at once
};

} // namespace

BOOST_AUTO_TEST_CASE(test_hand_over_help_a_parking_runner_runs_the_items_it_waits_for) {
  three_devices t;
  help_scenario s{t};
  auto y = s.run();
  // Device 1's runner is held: only a helper can have run x.
  bool done = test_support::eventually([&] { return y.is_done(); }, std::chrono::seconds{10});
  BOOST_TEST(done, "device 0 still waits for x while device 1's runner is held: no help");
  BOOST_TEST((s.x_thread == t.runner[0]), "x ran on device 0's runner");
  BOOST_TEST((s.y_thread == t.runner[0]));
  BOOST_TEST(std::stoull(t.field(1, "run_by_others")) >= 1);
  BOOST_TEST(t.field(1, "run_by") == "returned"); // back to its runner, which is held
  s.hold.reset();
  sync(t.b, y);
  BOOST_TEST((s.order == std::vector<std::string>{"a", "x", "y"}));
  // Each device takes new work on its own runner again.
  for (int i = 0; i < 3; ++i) {
    std::thread::id id;
    t.b.schedule_task(t.d[static_cast<std::size_t>(i)],
                      {"after", [&id] { id = std::this_thread::get_id(); }});
    sync(t.b, t.b.all_work(t.d[static_cast<std::size_t>(i)]));
    BOOST_TEST((id == t.runner[static_cast<std::size_t>(i)]), "device " << i);
  }
  BOOST_TEST(t.field(1, "run_by") == "runner");
}

BOOST_AUTO_TEST_CASE(test_hand_over_help_leaves_a_device_still_waiting_as_it_was) {
  // Device 0 parks at its wait for x while device 1 still waits for device
  // 2: nothing of device 1 can run, so device 0 takes its token only to give
  // it back. Device 1's runner must still wake when its wait opens, and run
  // x itself.
  three_devices t;
  help_scenario s{t};
  t.b.will_wait_for(t.ctx[0], s.x);
  t.b.schedule_task(t.d[0], {"y", [&s] { s.y_thread = std::this_thread::get_id(); }});
  auto y = t.b.all_work(t.d[0]);
  BOOST_REQUIRE(test_support::eventually([&] { return t.field(0, "parked_on") != "none"; }));
  BOOST_TEST(t.field(1, "run_by") == "lendable");
  s.release_c->open();
  sync(t.b, y);
  BOOST_TEST((s.x_thread == t.runner[1]), "x ran on its own runner");
  BOOST_TEST(t.field(1, "run_by_others") == "0");
}

BOOST_AUTO_TEST_CASE(test_hand_over_help_stops_at_the_item_it_waits_for) {
  // A wait whose gate has not opened although the awaited item is done: the
  // host that schedules it opens it itself when it registers the wait after
  // the item completed. Here the test holds that gate and opens it by hand.
  // A helper must run the other device's items up to the awaited one, never
  // past it: the next one is not what it waits for (it could even wait for
  // the helper's own later work).
  three_devices t;
  help_scenario s{t};
  std::thread::id z_thread;
  t.b.schedule_task(t.d[1], {"z", [&z_thread] { z_thread = std::this_thread::get_id(); }});
  auto z = t.b.all_work(t.d[1]);
  hold_guard hold{t.core(1)};
  t.b.schedule_task(t.d[0], {"a", [r = s.release_a] { BOOST_REQUIRE(r->wait()); }});
  auto g = std::make_shared<detail::gate>();
  g->owner = t.d[1].get_runner().core();
  g->owner_seq = s.x.seq();
  t.core(0).push_gate(g);
  t.b.schedule_task(t.d[0], {"y", [&s] { s.y_thread = std::this_thread::get_id(); }});
  auto y = t.b.all_work(t.d[0]);
  s.release_c->open();
  BOOST_REQUIRE(test_support::eventually([&] { return t.core(1).pending_gates().empty(); }));
  s.release_a->open();
  // Device 0 parks at g and helps device 1 up to x, which completes while
  // device 1's runner is held.
  BOOST_TEST(test_support::eventually([&] { return s.x.is_done(); }, std::chrono::seconds{10}));
  BOOST_TEST((s.x_thread == t.runner[0]), "x ran on device 0's runner");
  // z is left for device 1's own runner, once it is let go.
  BOOST_TEST(test_support::eventually([&] { return t.field(1, "run_by") == "returned"; }));
  BOOST_TEST(!z.is_done());
  t.core(1).hold_after_wake(false);
  sync(t.b, z);
  BOOST_TEST((z_thread == t.runner[1]), "z ran on its own runner");
  BOOST_TEST(!y.is_done());
  t.core(0).resolve_gate(*g, static_cast<const std::string*>(nullptr));
  sync(t.b, y);
  BOOST_TEST((s.y_thread == t.runner[0]));
}
