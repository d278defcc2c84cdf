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

#include "actors/core/backstop.hpp"    // set_period_for_tests
#include "actors/core/device_core.hpp" // pending_gates, queue().sleeping()
#include "runner_hold.hpp"
#include "test_support.hpp"

#include <sched.h> // sched_getscheduler

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
    t.b.schedule_task(t.d[2], {"c", [r = release_c] { r->wait_in_task(); }});
    t.b.will_wait_for(t.ctx[1], t.b.all_work(t.d[2]));
    t.b.schedule_task(t.d[1], {"x", [this] {
                                 x_thread = std::this_thread::get_id();
                                 order.push_back("x");
                               }});
    x = t.b.all_work(t.d[1]);
    // Asleep at its wait: not spinning, so a helper may take its token.
    BOOST_REQUIRE(test_support::eventually([&] {
      return t.field(1, "parked_on") != "none" && t.field(1, "run_by") == "lendable" &&
             (t.core(1).queue().sleeping() != multidev::detail::device_core::work_queue_t::awake);
    }));
  }
  event run() {
    hold.emplace(t.core(1));
    t.b.schedule_task(t.d[0], {"a", [r = release_a, this] {
                                 r->wait_in_task();
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
    BOOST_REQUIRE(
      test_support::eventually([&] { return t.core(1).inspect().pending_gates().empty(); }));
    release_a->open();
    return y;
  }
  /// The tasks' gates opened in time (checked here: no Boost.Test macro may
  /// run in a task, see `latch_gate::wait_in_task`).
  void check_gates() const {
    BOOST_TEST(!release_a->timed_out(), "task a's gate timed out");
    BOOST_TEST(!release_c->timed_out(), "task c's gate timed out");
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
  s.check_gates();
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
  s.check_gates();
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
  t.b.schedule_task(t.d[0], {"a", [r = s.release_a] { r->wait_in_task(); }});
  auto g = std::make_shared<detail::gate>();
  g->owner = t.d[1].get_runner().core();
  g->owner_seq = s.x.seq();
  t.core(0).push_gate(g);
  t.b.schedule_task(t.d[0], {"y", [&s] { s.y_thread = std::this_thread::get_id(); }});
  auto y = t.b.all_work(t.d[0]);
  s.release_c->open();
  BOOST_REQUIRE(
    test_support::eventually([&] { return t.core(1).inspect().pending_gates().empty(); }));
  s.release_a->open();
  // Device 0 parks at g and helps device 1 up to x, which completes while
  // device 1's runner is held.
  BOOST_TEST(test_support::eventually([&] { return s.x.is_done(); }, std::chrono::seconds{10}));
  BOOST_TEST((s.x_thread == t.runner[0]), "x ran on device 0's runner");
  // z is left for device 1's own runner, once it is let go.
  BOOST_TEST(test_support::eventually([&] { return t.field(1, "run_by") == "returned"; }));
  BOOST_TEST(!z.is_done());
  t.core(1).runner().handover().hold_after_wake(false);
  sync(t.b, z);
  BOOST_TEST((z_thread == t.runner[1]), "z ran on its own runner");
  BOOST_TEST(!y.is_done());
  t.core(0).resolve_gate(*g, static_cast<const std::string*>(nullptr));
  sync(t.b, y);
  BOOST_TEST((s.y_thread == t.runner[0]));
  s.check_gates();
}

namespace {

/// Deferred wake-ups on, whatever this machine's CPU count, and the
/// backstop's period set; both restored on the way out.
struct deferring {
  explicit deferring(std::chrono::microseconds backstop_period) {
    detail::hand_over::set_defer_threshold_for_tests(1);
    detail::wake_backstop::set_period_for_tests(backstop_period);
  }
  ~deferring() {
    detail::hand_over::set_defer_threshold_for_tests(0);
    detail::wake_backstop::set_period_for_tests({});
  }
  deferring(const deferring&) = delete;
  deferring& operator=(const deferring&) = delete;
};

/// Device 1 waits for device 0's `source`, then runs x; device 0 runs
/// `source`, then `between`, then waits for x, then runs y. `between` is
/// empty, or (`between_waits_for_x`) polls for x to be done, for at most
/// 10 s. Device 0's runner is held in a blocker until device 1's runner
/// sleeps at its wait and device 0's items are all queued, so that it takes
/// them in one batch: when `source` completes, device 0's wait for device 1
/// is two items ahead. With `held`, `between` first waits until it opens.
struct deferral_scenario {
  deferral_scenario(three_devices& t, bool between_waits_for_x,
                    std::shared_ptr<test_support::latch_gate> held = nullptr)
      : t(t) {
    auto hold = test_support::block_runner(t.b, t.d[0]);
    t.b.schedule_task(t.d[0], {"source", [] {}});
    t.b.will_wait_for(t.ctx[1], t.b.all_work(t.d[0]));
    t.b.schedule_task(t.d[1], {"x", [this] { x_thread = std::this_thread::get_id(); }});
    x = t.b.all_work(t.d[1]);
    BOOST_REQUIRE(test_support::eventually([&] {
      return t.field(1, "parked_on") != "none" && t.field(1, "run_by") == "lendable" &&
             (t.core(1).queue().sleeping() != multidev::detail::device_core::work_queue_t::awake);
    }));
    rings_before = t.core(1).queue().rings();
    auto between = [this, between_waits_for_x, held] {
      if (held)
        held->wait_in_task();
      if (between_waits_for_x)
        saw_x = test_support::eventually([this] { return x.is_done(); }, std::chrono::seconds{10});
    };
    t.b.schedule_task(t.d[0], {"between", between});
    t.b.will_wait_for(t.ctx[0], x);
    t.b.schedule_task(t.d[0], {"y", [] {}});
    y = t.b.all_work(t.d[0]);
    hold->open();
  }

  three_devices& t;
  event x, y;
  std::thread::id x_thread;
  bool saw_x = false;
  uint32_t rings_before = 0;
};

/// A `deferral_scenario` with deferral on and the backstop's period set,
/// run to its end (y done).
struct deferred_run {
  deferred_run(std::chrono::microseconds backstop_period, bool between_waits_for_x)
      : on{backstop_period}, s{t, between_waits_for_x} {
    sync(t.b, s.y);
  }
  deferring on;
  three_devices t;
  deferral_scenario s;
};

} // namespace

BOOST_AUTO_TEST_CASE(test_hand_over_help_a_runner_that_will_wait_leaves_the_sleeper_asleep) {
  // Device 0's `source` opens device 1's wait. Device 0 waits for device 1
  // two items later: it opens the wait without ringing device 1's runner
  // (a deferred wake-up), and runs x itself at its own wait. The backstop's
  // period is long enough that only a helper can have run x.
  deferred_run r{std::chrono::seconds{30}, false};
  auto& t = r.t;
  auto& s = r.s;
  BOOST_TEST(t.core(1).runner().handover().token().deferred_wakes() == 1u);
  BOOST_TEST(t.core(1).queue().rings() == s.rings_before, "device 1's runner was woken");
  BOOST_TEST((s.x_thread == t.runner[0]), "x ran on device 0's runner");
  BOOST_TEST(std::stoull(t.field(1, "run_by_others")) >= 1);
  // Device 1 takes new work on its own runner again.
  std::thread::id id;
  t.b.schedule_task(t.d[1], {"after", [&id] { id = std::this_thread::get_id(); }});
  sync(t.b, t.b.all_work(t.d[1]));
  BOOST_TEST((id == t.runner[1]));
}

BOOST_AUTO_TEST_CASE(test_hand_over_help_the_backstop_rings_a_deferred_wake_nobody_takes_up) {
  // The same, but device 0's `between` waits for x: device 0 does not get
  // to its wait until x is done, and x waits for device 1's runner, which
  // the deferral left asleep. The backstop rings it a period or two later;
  // without it, `between` gives up after 10 s.
  deferred_run r{std::chrono::milliseconds{1}, true};
  auto& t = r.t;
  auto& s = r.s;
  BOOST_TEST(t.core(1).runner().handover().token().deferred_wakes() == 1u);
  BOOST_TEST(s.saw_x, "x never ran while device 0 waited for it in a task");
  BOOST_TEST((s.x_thread == t.runner[1]), "x ran on its own runner, rung");
  BOOST_TEST(t.core(1).queue().rings() > s.rings_before);
}

BOOST_AUTO_TEST_CASE(test_hand_over_help_the_backstop_runs_under_the_batch_policy) {
  // Its timer must not take the CPU from a runner: under the batch policy,
  // a woken thread does not preempt the one running on its CPU (see
  // backstop.cpp). Its period here outlasts the test, so its thread still
  // runs, with the deferral left to ring.
  deferred_run r{std::chrono::seconds{30}, false};
  BOOST_TEST(r.t.core(1).runner().handover().token().deferred_wakes() == 1u);
  auto& backstop = detail::wake_backstop::instance();
  BOOST_REQUIRE(test_support::eventually([&] { return backstop.thread_id() != 0; }));
  BOOST_TEST(sched_getscheduler(backstop.thread_id()) == SCHED_BATCH);
}

BOOST_AUTO_TEST_CASE(test_hand_over_help_the_backstop_rings_a_deferral_made_while_it_lingers) {
  // The same twice, with the backstop's thread made to linger for an hour
  // between the two: the second deferral must get it looking again. Before
  // it notified a lingering thread, the second `between` gave up after 10 s
  // (with the default linger, the ring came 20 ms late).
  deferring on{std::chrono::milliseconds{1}};
  struct linger_restored {
    ~linger_restored() { detail::wake_backstop::set_linger_for_tests({}); }
  } restore;
  detail::wake_backstop::set_linger_for_tests(std::chrono::hours{1});
  auto& backstop = detail::wake_backstop::instance();
  three_devices t;
  {
    deferral_scenario first{t, true};
    sync(t.b, first.y);
    BOOST_REQUIRE(first.saw_x);
  }
  BOOST_REQUIRE(test_support::eventually([&] { return backstop.lingering(); }));
  auto rang = backstop.rang();
  deferral_scenario second{t, true};
  sync(t.b, second.y);
  BOOST_TEST(t.core(1).runner().handover().token().deferred_wakes() == 2u);
  BOOST_TEST(second.saw_x, "the lingering backstop did not ring the second deferral");
  BOOST_TEST(backstop.rang() > rang);
}

namespace {

/// Device 1's runner left asleep by a deferral (the backstop's period, 30 s,
/// outlasts the tests) while device 0 is held in `between` until `release`
/// opens: x (device 1's item) is run only once something rings device 1,
/// and y (device 0's, after x) once x is done and `between` released.
struct deferred_device_1 {
  deferring on{std::chrono::seconds{30}};
  three_devices t;
  std::shared_ptr<test_support::latch_gate> release = std::make_shared<test_support::latch_gate>();
  deferral_scenario s{t, false, release};

  deferred_device_1() {
    BOOST_REQUIRE(test_support::eventually(
      [&] { return t.core(1).runner().handover().token().deferred_wakes() == 1u; }));
  }

  /// x ran on device 1's own runner; then `between` is released and y runs.
  void finish() {
    BOOST_TEST((s.x_thread == t.runner[1]));
    release->open();
    sync(t.b, s.y);
    BOOST_TEST(!release->timed_out());
  }
};

} // namespace

BOOST_AUTO_TEST_CASE(test_hand_over_help_a_host_waiting_on_a_deferred_device_rings_it) {
  // A host that blocks on device 1's work rings its deferred runner rather
  // than wait for the backstop (whose period here is longer than the test's
  // bound) or for device 0 (held in `between` until the host saw x).
  deferred_device_1 f;
  // Bounded: a host that did not ring would wait for the backstop's 30 s.
  BOOST_CHECK_NO_THROW(f.t.b.sync(f.s.x, std::chrono::seconds{10}));
  f.finish();
}

BOOST_AUTO_TEST_CASE(test_hand_over_help_a_deferred_wake_is_rung_once_through_the_hand_over) {
  // Through the hand-over's own interface (hand_over.hpp): a deferred
  // wake-up is rung by its own stamp only, and once (`ring_if_deferred`,
  // `ring_deferred`), whoever asks: only these calls can wake device 1.
  deferred_device_1 f;
  auto& t = f.t;
  auto& ho = t.core(1).runner().handover();
  auto stamp = ho.token().deferred();
  BOOST_REQUIRE(stamp != 0u);
  auto rings = t.core(1).queue().rings();
  // Another stamp's ring (a backstop entry of an earlier deferral) rings nothing.
  BOOST_TEST(!ho.ring_if_deferred(stamp + 1));
  BOOST_TEST(ho.token().deferred() == stamp);
  BOOST_TEST(t.core(1).queue().rings() == rings);
  // Whoever needs the items now rings it, and takes the deferral up.
  ho.ring_deferred();
  BOOST_TEST(ho.token().deferred() == 0u);
  BOOST_TEST(t.core(1).queue().rings() == rings + 1);
  // The backstop's ring for the same stamp comes too late: no second ring.
  BOOST_TEST(!ho.ring_if_deferred(stamp));
  BOOST_TEST(t.core(1).queue().rings() == rings + 1);
  // Rung, device 1's own runner runs x.
  BOOST_CHECK_NO_THROW(t.b.sync(f.s.x, std::chrono::seconds{10}));
  f.finish();
}
