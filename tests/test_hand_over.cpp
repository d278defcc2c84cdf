// Hand-over (`backend_options::hand_over`): when a device's next item waits
// for a device parked at a wait that the first one's last item just opened,
// the first device's runner runs the second one's items itself, in their
// order, until its own wait opens, instead of waking the other runner and
// sleeping. The tests check that a chain of waits between two devices then
// stays on one thread, that nothing else changes (order, failures,
// cancellation, deadlock detection, new work after it), and that with the
// option off each device's items run on its own runner thread only. During
// a chain, device 1's own runner is asleep and held once woken (a hook for
// tests): when it would take its token back is up to the OS, so the thread
// each hop runs on is decided by hand-over alone.
#define BOOST_TEST_MODULE hand_over
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "actors/core/device_core.hpp" // queue().sleeping(); white-box for the runner hold
#include "runner_hold.hpp"
#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace multidev;
using test_support::field_of;
using test_support::sync;

namespace {

constexpr int hops = 200;

/// Two CPU devices, and the thread id of each one's runner (a probe task).
struct two_devices {
  explicit two_devices(bool hand_over = true)
    : hand_over(hand_over),
      b(backend_options{.num_devices = 2, .scheduler_threads = 2, .hand_over = hand_over}) {
    for (int i = 0; i < 2; ++i) {
      std::thread::id id;
      b.schedule_task(d[i], {"probe", [&id] { id = std::this_thread::get_id(); }});
      sync(b, b.all_work(d[i]));
      runner[i] = id;
    }
  }
  std::string info(int i) const { return b.get_debug_info(d[i]).to_string(); }
  std::string field(int i, const char* key) const {
    return field_of(b.get_debug_info(d[i]), key);
  }
  uint64_t run_by_others(int i) const { return std::stoull(field(i, "run_by_others")); }
  detail::device_core& core(int i) const { return *d[i].get_runner().core(); }

  /// Schedules, while device 0 is held, the chain hop 0 (on device 0, the
  /// holder), hop 1 on device 1, hop 2 on device 0, ..., each hop waiting
  /// (will_wait_for) for the one before. Hop i calls `body(i)` and records
  /// its thread and its place in the order it ran. Releases device 0 once
  /// device 1 is parked at its first wait; returns the last hop's event.
  event run_chain(const std::function<void(int)>& body = [](int) {}) {
    threads.assign(hops + 1, std::thread::id{});
    order.assign(hops + 1, -1);
    ran = 0;
    auto release = std::make_shared<test_support::latch_gate>();
    // Opened below once device 1 is parked; a time-out would follow a
    // failed set-up check, already reported.
    b.schedule_task(d[0], {"hop 0", [this, release] {
                             release->wait_in_task();
                             record(0);
                           }});
    event last = b.all_work(d[0]);
    events.assign(1, last);
    for (int i = 1; i <= hops; ++i) {
      auto& c = ctx[i % 2];
      b.will_wait_for(c, last);
      b.schedule_task(c.device, {"hop " + std::to_string(i), [this, i, body] {
                                   body(i);
                                   record(i);
                                 }});
      last = b.all_work(c.device);
      events.push_back(last);
    }
    // Device 1 parks at its wait for hop 0 (lendable: its items may run
    // elsewhere); with hand-over off it stays with its runner.
    auto parked = hand_over ? "lendable" : "runner";
    BOOST_REQUIRE(test_support::eventually([&] {
      return field(1, "parked_on") != "none" && field(1, "run_by") == parked &&
             (!hand_over || (core(1).queue().sleeping() != multidev::detail::device_core::work_queue_t::awake));
    }));
    // Device 1's own runner may take its token back whenever it finds it
    // lendable, and the chain then goes on from its thread: correct, but
    // when that happens is up to the OS (a runner still spinning, or
    // preempted on its way to sleep, finds device 0's runner already done
    // with hop 1). Asleep and held once woken, it cannot: which thread runs
    // each hop is then decided by hand-over alone.
    if (hand_over)
      hold.emplace(core(1));
    rings_at_release = core(1).queue().rings();
    release->open();
    return last;
  }
  /// New work on each device runs, on that device's own runner: no device
  /// is left with its token elsewhere.
  void check_new_work_runs_on_own_runners() {
    hold.reset();
    for (int i = 0; i < 2; ++i) {
      std::thread::id id;
      b.schedule_task(d[i], {"after", [&id] { id = std::this_thread::get_id(); }});
      sync(b, b.all_work(d[i]));
      BOOST_TEST((id == runner[i]), "device " << i);
    }
  }
  void record(int i) {
    threads[static_cast<std::size_t>(i)] = std::this_thread::get_id();
    order[static_cast<std::size_t>(i)] = ran++;
  }
  /// Hops from `from` on that ran on another thread than the hop before.
  int thread_changes(int from = 1) const {
    int n = 0;
    for (int i = from; i <= hops; ++i)
      if (threads[static_cast<std::size_t>(i)] != threads[static_cast<std::size_t>(i) - 1])
        ++n;
    return n;
  }

  bool hand_over;
  backend b;
  device d[2] = {b.get_device(0), b.get_device(1)};
  context ctx[2] = {b.make_context(d[0]), b.make_context(d[1])};
  std::thread::id runner[2];
  std::optional<test_support::hold_guard> hold; // device 1's runner, during a chain
  uint32_t rings_at_release = 0;                 // device 1's doorbell, as run_chain starts it
  std::vector<std::thread::id> threads;
  std::vector<int> order;
  std::vector<event> events;
  int ran = 0;
};

} // namespace

BOOST_AUTO_TEST_CASE(test_hand_over_a_chain_between_two_devices_stays_on_one_thread) {
  two_devices t;
  BOOST_REQUIRE(t.runner[0] != t.runner[1]);
  sync(t.b, t.run_chain());
  // Each of device 1's waits was opened by device 0's runner claiming it
  // (`try_claim`), never by ringing device 1's runner, asleep since its
  // first wait (and held, were it woken; `try_help` would then run it).
  BOOST_TEST(t.core(1).queue().rings() == t.rings_at_release);
  for (int i = 0; i <= hops; ++i)
    BOOST_TEST(t.order[static_cast<std::size_t>(i)] == i, "hop " << i << " ran in place "
                                                                  << t.order[static_cast<std::size_t>(i)]);
  // Device 0's runner opens each of device 1's waits while its own next
  // item waits for device 1: it runs device 1's items itself, every time.
  BOOST_TEST(t.thread_changes() == 0, t.thread_changes() << " of " << hops
                                                         << " hops changed threads");
  for (int i = 0; i <= hops; ++i)
    BOOST_TEST((t.threads[static_cast<std::size_t>(i)] == t.runner[0]), "hop " << i);
  // Device 1's waits and tasks: two items a hop.
  BOOST_TEST(t.run_by_others(1) == static_cast<uint64_t>(hops), t.info(1));
  BOOST_TEST(t.run_by_others(0) == 0u, t.info(0));
  // Both are back with their runners' rules once the chain is done: new work
  // on each runs, and device 1's own runner takes it up.
  t.check_new_work_runs_on_own_runners();
}

BOOST_AUTO_TEST_CASE(test_hand_over_off_each_device_runs_its_items_on_its_own_runner) {
  two_devices t{false};
  sync(t.b, t.run_chain());
  for (int i = 0; i <= hops; ++i) {
    BOOST_TEST(t.order[static_cast<std::size_t>(i)] == i);
    BOOST_TEST((t.threads[static_cast<std::size_t>(i)] == t.runner[i % 2]), "hop " << i);
  }
  BOOST_TEST(t.thread_changes() == hops);
  BOOST_TEST(t.run_by_others(0) == 0u);
  BOOST_TEST(t.run_by_others(1) == 0u);
}

BOOST_AUTO_TEST_CASE(test_hand_over_a_task_that_throws_fails_its_own_device) {
  // Hop 101 runs on device 1 (on device 0's runner) and throws: device 1
  // fails with it, device 0 fails at its wait for it, the rest never runs,
  // and both come back with `recover`, their runners running new work.
  two_devices t;
  auto last = t.run_chain([](int i) {
    if (i == 101)
      throw std::runtime_error("hop 101 broke");
  });
  BOOST_CHECK_THROW(test_support::bounded([&] { t.b.sync(last); }), device_error);
  BOOST_TEST((t.threads[100] == t.runner[0]));
  BOOST_TEST(t.ran == 101); // hops 0..100
  auto e1 = t.field(1, "error");
  BOOST_TEST(test_support::contains(e1, "hop 101 broke"), e1);
  BOOST_TEST((t.b.state(t.events[101]) == event_state::failed));
  BOOST_TEST((t.b.state(t.events[102]) == event_state::failed));
  auto e0 = t.field(0, "error");
  BOOST_TEST(test_support::contains(e0, "hop 101 broke"), e0);
  for (int i = 0; i < 2; ++i)
    BOOST_TEST(t.b.recover(t.d[i]), "device " << i);
  t.check_new_work_runs_on_own_runners();
}

BOOST_AUTO_TEST_CASE(test_hand_over_cancel_while_another_runner_runs_the_items) {
  // Hop 51 (device 1) blocks while device 0's runner runs it; device 1 is
  // cancelled meanwhile. Hop 51 completes, what follows it on device 1 is
  // cancelled, device 0 fails at its wait for a cancelled hop, and device 1's
  // own runner takes up new work: nothing is stranded with the other runner.
  two_devices t;
  auto started = std::make_shared<test_support::latch_gate>();
  auto release = std::make_shared<test_support::latch_gate>();
  auto last = t.run_chain([&](int i) {
    if (i == 51) {
      started->open();
      release->wait_in_task();
    }
  });
  BOOST_REQUIRE(started->wait());
  BOOST_TEST(t.field(1, "run_by") == "lent");
  t.hold.reset(); // device 1's own runner drops what the cancel leaves
  t.b.cancel(t.d[1]);
  release->open();
  BOOST_CHECK_THROW(test_support::bounded([&] { t.b.sync(last); }), device_error);
  BOOST_TEST((t.threads[51] == t.runner[0]));
  BOOST_TEST((t.b.state(t.events[51]) == event_state::done));
  BOOST_TEST((t.b.state(t.events[52]) == event_state::done)); // device 0's, after 51
  BOOST_TEST((t.b.state(t.events[53]) == event_state::cancelled));
  BOOST_TEST(t.ran == 53);
  BOOST_TEST(!release->timed_out());
  t.b.recover(t.d[0]);
  t.check_new_work_runs_on_own_runners();
}

BOOST_AUTO_TEST_CASE(test_hand_over_a_sync_that_closes_a_cycle_still_throws_deadlock) {
  // Hop 31 (device 1, run by device 0's runner) syncs on hop 40 (device 0,
  // behind device 0's wait for hop 31): a cycle, refused as without
  // hand-over, and the chain goes on.
  two_devices t;
  std::atomic<bool> refused{false};
  // The chain's events are all recorded before device 0 is released.
  auto last = t.run_chain([&](int i) {
    if (i != 31)
      return;
    try {
      t.events[40].sync();
    } catch (const deadlock_error&) {
      refused = true;
    }
  });
  sync(t.b, last);
  BOOST_TEST(refused.load());
  BOOST_TEST((t.threads[31] == t.runner[0]));
  BOOST_TEST(t.ran == hops + 1);
}

BOOST_AUTO_TEST_CASE(test_hand_over_a_batch_taken_early_behind_bare_closures_keeps_its_wait) {
  // Device 0 runs a batch of bare closures (no extras: the runner's short
  // path). The last one's completion opens device 1's wait, and `try_claim`
  // takes device 0's next batch early to look at it: a wait on device 2,
  // still pending, then a closure. The runner must leave the short path
  // with the batch that changed under it, and park at that wait: the
  // closure behind it runs only once device 2's task has.
  backend b{backend_options{.num_devices = 3, .scheduler_threads = 2, .hand_over = true}};
  std::vector<device> d;
  std::vector<context> ctx;
  for (int i = 0; i < 3; ++i) {
    d.push_back(b.get_device(i));
    ctx.push_back(b.make_context(d.back()));
  }
  auto release_c = test_support::block_runner(b, d[2]);
  auto c = b.all_work(d[2]);
  auto started = std::make_shared<test_support::latch_gate>();
  auto release_a = std::make_shared<test_support::latch_gate>();
  // A bare closure (no description): taken alone, as the batch it starts.
  b.schedule_task(d[0], task{{}, [started, release_a] {
                               started->open();
                               release_a->wait_in_task();
                             }, {}});
  BOOST_REQUIRE(started->wait());
  auto a = b.all_work(d[0]);
  b.will_wait_for(ctx[1], a); // a waiter on the closure: its completion fires
  std::atomic<bool> behind_ran{false};
  std::atomic<bool> c_done_first{false};
  b.will_wait_for(ctx[0], c);
  b.schedule_task(d[0], task{{}, [&] {
                               c_done_first = b.state(c) == event_state::done;
                               behind_ran = true;
                             }, {}});
  auto behind = b.all_work(d[0]);
  release_a->open();
  // Device 1's wait opens with the closure; device 0 then either parks at
  // its wait on device 2 (right) or has run past it.
  sync(b, b.all_work(d[1]));
  BOOST_REQUIRE(test_support::eventually([&] {
    return field_of(b.get_debug_info(d[0]), "parked_on") != "none" || behind_ran.load();
  }));
  BOOST_TEST(!behind_ran.load());
  release_c->open();
  sync(b, behind);
  BOOST_TEST(behind_ran.load());
  BOOST_TEST(c_done_first.load());
  BOOST_TEST(!release_a->timed_out());
}
