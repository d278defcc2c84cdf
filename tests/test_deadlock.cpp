// Explained hangs (issue 12): a task whose `sync` would close a cycle of
// runners gets `deadlock_error` naming the cycle; a `sync` or `await` with a
// deadline ends with the chain of waits that holds the event; the live
// wait-for graph is in `get_global_debug_info`; a `will_wait_for` that could
// close a cycle (on work not yet scheduled) is refused at call time.
#define BOOST_TEST_MODULE deadlock
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

using namespace std::chrono_literals;
using multidev::backend;
using multidev::backend_options;
using multidev::deadlock_error;
using multidev::device;
using multidev::device_error;
using multidev::event;
using multidev::sexp;
using multidev::task;
using multidev::timeout_error;
using test_support::bounded;
using test_support::contains;
using test_support::eventually;
using test_support::latch_gate;

namespace {

/// What a task's sync ended in.
struct outcome {
  std::atomic<int> kind{0}; // 1 deadlock_error, 2 returned, 3 other error
  std::string what;
  latch_gate done;
};

/// A task that, once `release` opens, syncs on the event `target` will hold
/// (set by the test before it opens `release`), and records how that ended.
/// Its wait for `release` is bounded (30 s), so a broken test frees the runner.
task sync_later(backend& b, std::shared_ptr<latch_gate> release,
                std::shared_ptr<std::promise<event>> target, std::shared_ptr<outcome> out,
                std::string description) {
  auto f = target->get_future().share();
  return task{std::move(description), [&b, release, f, out] {
                if (!release->wait() || f.wait_for(30s) != std::future_status::ready) {
                  out->what = "never released";
                  out->kind.store(3);
                  out->done.open();
                  return;
                }
                try {
                  b.sync(f.get());
                  out->kind.store(2);
                } catch (const deadlock_error& e) {
                  out->what = e.what();
                  out->kind.store(1);
                } catch (const std::exception& e) {
                  out->what = e.what();
                  out->kind.store(3);
                }
                out->done.open();
              }};
}

/// Whether the global debug info's wait graph shows a task of `d` blocked
/// in a sync.
bool shows_blocked_task(const backend& b, const device& d) {
  return contains(b.get_global_debug_info().to_string(),
                  "(wait (waiter " + d.name() + ") (at_seq");
}

} // namespace

BOOST_AUTO_TEST_CASE(test_deadlock_a_sync_that_closes_a_cycle_of_two_runners_is_refused) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto release = std::make_shared<latch_gate>();
  auto target = std::make_shared<std::promise<event>>();
  auto out = std::make_shared<outcome>();
  // d0: [sync_later] [after]; d1: [wait for after] [later]. d0's task syncs
  // on d1's later, which needs d0's after, which needs the task to end.
  b.schedule_task(d0, sync_later(b, release, target, out, "syncs on d1"));
  auto after_ran = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(d0, task{"after", [after_ran] { after_ran->store(true); }});
  auto after = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), after);
  b.schedule_task(d1, task{"later", [] {}});
  auto later = b.all_work(d1);
  target->set_value(later);
  release->open();

  BOOST_REQUIRE(out->done.wait());
  BOOST_TEST(out->kind.load() == 1, "outcome " << out->kind.load() << ": " << out->what);
  BOOST_TEST(contains(out->what, "cycle: " + d0.name() + " -> " + d1.name() + " -> " + d0.name()),
             out->what);
  BOOST_TEST(contains(out->what, "waits on " + d0.name() + " seq " + std::to_string(after.seq())),
             out->what);
  // The task caught the error and returned: the cycle is broken, all runs.
  bounded([&] { b.sync(later); }, "sync after the refused cycle");
  BOOST_TEST(after_ran->load());
}

BOOST_AUTO_TEST_CASE(test_deadlock_a_cycle_through_three_runners_and_a_blocked_task_is_named) {
  backend b{backend_options{.num_devices = 3}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto d2 = b.get_device(2);
  // d1's task blocks (legitimately) on d2's work, which waits for d0's
  // "after"; then d0's task syncs on d1's later work: a cycle through three.
  auto release0 = std::make_shared<latch_gate>();
  auto target0 = std::make_shared<std::promise<event>>();
  auto out0 = std::make_shared<outcome>();
  b.schedule_task(d0, sync_later(b, release0, target0, out0, "d0 syncs on d1"));
  b.schedule_task(d0, task{"after", [] {}});
  auto after = b.all_work(d0);
  b.will_wait_for(b.make_context(d2), after);
  b.schedule_task(d2, task{"d2 work", [] {}});
  auto d2_work = b.all_work(d2);

  auto release1 = std::make_shared<latch_gate>();
  auto target1 = std::make_shared<std::promise<event>>();
  auto out1 = std::make_shared<outcome>();
  b.schedule_task(d1, sync_later(b, release1, target1, out1, "d1 syncs on d2"));
  auto d1_work = b.all_work(d1);
  target1->set_value(d2_work);
  release1->open();
  // Synchronize on state: d1's task is registered as blocked in its sync.
  BOOST_REQUIRE(eventually([&] { return shows_blocked_task(b, d1); }));

  target0->set_value(d1_work);
  release0->open();
  BOOST_REQUIRE(out0->done.wait());
  BOOST_TEST(out0->kind.load() == 1, "outcome " << out0->kind.load() << ": " << out0->what);
  auto cycle = "cycle: " + d0.name() + " -> " + d1.name() + " -> " + d2.name() + " -> " + d0.name();
  BOOST_TEST(contains(out0->what, cycle), out0->what);
  BOOST_TEST(contains(out0->what, "blocked in sync"), out0->what);
  // d0's task returned, so d0 runs "after", d2 runs, and d1's sync returns.
  BOOST_REQUIRE(out1->done.wait());
  BOOST_TEST(out1->kind.load() == 2, out1->what);
  bounded([&] { b.sync(d1_work); }, "sync after the refused cycle");
}

BOOST_AUTO_TEST_CASE(test_deadlock_a_deadline_names_the_chain_of_waits) {
  backend b{backend_options{.num_devices = 3}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto d2 = b.get_device(2);
  auto release = test_support::block_runner(b, d0); // d0 runs its seq 1
  b.schedule_task(d0, task{"behind the blocker", [] {}});
  auto e0 = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), e0);
  b.schedule_task(d1, task{"on d1", [] {}});
  auto e1 = b.all_work(d1);
  b.will_wait_for(b.make_context(d2), e1);
  b.schedule_task(d2, task{"on d2", [] {}});
  auto e2 = b.all_work(d2);
  // Both runners park on their gates (synchronize on state, not time).
  auto parked = [&](const device& d) {
    return test_support::field_of(b.get_debug_info(d), "parked_on") != "none";
  };
  BOOST_REQUIRE(eventually([&] { return parked(d1) && parked(d2); }));
  try {
    b.sync(e2, 20ms);
    BOOST_ERROR("sync with a deadline returned on a held event");
  } catch (const timeout_error& e) {
    std::string what = e.what();
    auto chain = d2.name() + " waits on event " + std::to_string(e1.seq()) + " of " + d1.name() +
                 ", which waits on event " + std::to_string(e0.seq()) + " of " + d0.name() +
                 ", which is running its seq 1, 1 item before seq " + std::to_string(e0.seq());
    BOOST_TEST(contains(what, "sync on " + d2.name() + " seq " + std::to_string(e2.seq())), what);
    BOOST_TEST(contains(what, "passed its deadline"), what);
    BOOST_TEST(e.chain() == chain, e.chain());
    BOOST_TEST(contains(what, chain), what);
  }
  // await too, and the event is not affected: it completes once released.
  BOOST_CHECK_THROW(b.await(d1, std::chrono::steady_clock::now() + 5ms), timeout_error);
  BOOST_TEST((b.state(e2) == multidev::event_state::pending));
  release->open();
  bounded([&] { b.sync(e2, 30s); }, "sync with a deadline that is met");
  bounded([&] { b.await(d2, 30s); }, "await with a deadline that is met");
}

BOOST_AUTO_TEST_CASE(test_deadlock_the_wait_graph_is_in_the_global_debug_info) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto release = test_support::block_runner(b, d0);
  b.schedule_task(d0, task{"behind", [] {}});
  auto e0 = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), e0);
  b.schedule_task(d1, task{"on d1", [] {}});
  auto e1 = b.all_work(d1);
  // A host thread blocks on e1 too.
  auto host = std::async(std::launch::async, [&] { b.sync(e1); });
  auto gate_wait = "(wait (waiter " + d1.name() + ") (at_seq 1) (kind gate) (parked true) (event (device " +
                   d0.name() + ") (seq " + std::to_string(e0.seq()) + ") (state pending) (held_by (device " +
                   d0.name() + ") (running_seq 1)))";
  auto host_wait = "(wait (waiter host) (kind sync)";
  std::string info;
  BOOST_REQUIRE(eventually([&] {
    info = b.get_global_debug_info().to_string();
    return contains(info, gate_wait) && contains(info, host_wait);
  }));
  BOOST_TEST(contains(info, "(wait_for"), info);
  BOOST_TEST(contains(info, "(event (device " + d1.name() + ") (seq " + std::to_string(e1.seq()) +
                              ") (state pending)"),
             info);
  // Once it drains, the graph is empty.
  release->open();
  BOOST_REQUIRE(host.wait_for(30s) == std::future_status::ready);
  host.get();
  BOOST_TEST(b.get_global_debug_info().find("wait_for")->items().size() == 1u,
             b.get_global_debug_info().to_string());
}

BOOST_AUTO_TEST_CASE(test_deadlock_the_wait_graph_names_the_task_that_poisoned_an_event) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto release = test_support::block_runner(b, d1);
  b.schedule_task(d0, task{"poisoner", [] { throw std::runtime_error("boom"); }});
  auto e0 = b.all_work(d0);
  BOOST_CHECK_THROW(bounded([&] { b.sync(e0); }), device_error);
  // d1 is busy, so its gate on the failed e0 is still queued, not reached.
  b.will_wait_for(b.make_context(d1), e0);
  auto info = b.get_global_debug_info().to_string();
  // A failed event is already resolved: will_wait_for queues a gate that fails
  // when reached; the graph shows who poisoned it.
  BOOST_TEST(contains(info, "(poisoned_by (device " + d0.name() + ") (task poisoner) (message boom))"),
             info);
  release->open();
}

BOOST_AUTO_TEST_CASE(test_deadlock_will_wait_for_on_work_not_yet_scheduled_is_refused) {
  // The only way will_wait_for could close a cycle is a wait on work not yet
  // scheduled (a gate is its device's newest item): refused at call time.
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  b.schedule_task(d0, task{"one", [] {}});
  auto now = b.all_work(d0);
  event future{now.key(), now.seq() + 5};
  try {
    b.will_wait_for(b.make_context(d1), future);
    BOOST_ERROR("a wait on work not yet scheduled was accepted");
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    BOOST_TEST(contains(what, "never scheduled on " + d0.name()), what);
    BOOST_TEST(contains(what, "cycle"), what);
  }
  BOOST_TEST(b.is_idle(d1));
}
