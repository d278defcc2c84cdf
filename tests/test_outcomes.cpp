// Per-event outcomes (done, failed, cancelled) with provenance; cancellation,
// recovery, a kill through the device actor, and the destroy policy.
#define BOOST_TEST_MODULE outcomes
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/core/device_core.hpp"
#include "multidev/multidev.hpp"
#include "multidev/protocol.hpp"
#include "test_support.hpp"

using namespace multidev;
using namespace std::chrono_literals;
using namespace test_support;

namespace {

/// Runs `f`, which must throw `E`; returns the exception.
template <class E, class F>
E expect_throw(F f, const char* what) {
  try {
    bounded(f, what);
  } catch (const E& e) {
    return e;
  }
  BOOST_FAIL(what << ": did not throw the expected exception");
  throw std::logic_error("unreachable");
}

std::string fmt_seq(const event& e) {
  return "seq " + std::to_string(e.seq());
}

} // namespace

BOOST_AUTO_TEST_CASE(test_outcomes_failure_carries_its_provenance_across_devices) {
  backend b{backend_options{.num_devices = 3}};
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  b.schedule_task(d0, {"step 3", [] { throw std::runtime_error("boom"); }});
  auto origin = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), origin);
  auto hop1 = b.all_work(d1); // d1's wait itself
  b.will_wait_for(b.make_context(d2), hop1);
  b.schedule_task(d2, {"downstream", [] {}});
  auto last = b.all_work(d2);

  auto e = expect_throw<device_error>([&] { b.sync(last); }, "sync downstream");
  BOOST_TEST(e.what() == d2.name() + " waited for " + d1.name() + " " + fmt_seq(hop1) +
                           ", which waited for " + d0.name() + " " + fmt_seq(origin) +
                           ": task 'step 3' failed: boom");
  BOOST_TEST(e.device_name() == d2.name());
  BOOST_TEST(e.origin_device() == d0.name());
  BOOST_TEST(e.origin_task() == "step 3");
  BOOST_TEST(e.original_message() == "boom");
  BOOST_TEST_REQUIRE(e.path().size() == 2u);
  BOOST_TEST(e.path()[0].waiter == d2.name());
  BOOST_TEST(e.path()[0].device == d1.name());
  BOOST_TEST(e.path()[0].seq == hop1.seq());
  BOOST_TEST(e.path()[1].waiter == d1.name());
  BOOST_TEST(e.path()[1].device == d0.name());
  BOOST_TEST(e.path()[1].seq == origin.seq());
  BOOST_TEST(e.cause().seq == origin.seq());
  // The origin's own event says it without a path.
  auto o = expect_throw<device_error>([&] { b.sync(origin); }, "sync origin");
  BOOST_TEST(o.what() == d0.name() + ": task 'step 3' failed: boom");
  BOOST_TEST(o.path().empty());
  BOOST_TEST((b.state(origin) == event_state::failed));
}

BOOST_AUTO_TEST_CASE(test_outcomes_nameless_task_is_named_by_its_seq) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  b.schedule_task(d, {"", [] { throw std::runtime_error("no name"); }});
  auto e = b.all_work(d);
  auto err = expect_throw<device_error>([&] { b.sync(e); }, "sync");
  BOOST_TEST(err.origin_task() == "task#" + std::to_string(e.seq()));
  BOOST_TEST(contains(err.what(), "task task#" + std::to_string(e.seq()) + " failed: no name"),
             err.what());
}

BOOST_AUTO_TEST_CASE(test_outcomes_each_event_resolves_once_and_done_stays_done) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto core = d.get_runner().core();
  auto release = block_runner(b, d);
  b.schedule_task(d, {"ok", [] {}});
  auto ok = b.all_work(d);
  b.schedule_task(d, {"bad", [] { throw std::runtime_error("bad"); }});
  auto bad = b.all_work(d);
  b.schedule_task(d, {"behind", [] {}});
  auto behind = b.all_work(d);
  std::atomic<int> calls_ok{0}, calls_bad{0}, calls_behind{0};
  std::atomic<int> ok_failed{0};
  core->events().when_resolved(ok.seq(), [&](const failure* f) {
    ++calls_ok;
    ok_failed = f ? 1 : 0;
  });
  core->events().when_resolved(bad.seq(), [&](const failure* f) { calls_bad += f ? 1 : 100; });
  core->events().when_resolved(behind.seq(),
                               [&](const failure* f) { calls_behind += f ? 1 : 100; });
  BOOST_TEST((b.state(ok) == event_state::pending));
  release->open();
  BOOST_CHECK_THROW(bounded([&] { b.sync(behind); }, "sync behind"), device_error);
  BOOST_TEST(calls_ok.load() == 1);
  BOOST_TEST(ok_failed.load() == 0);
  BOOST_TEST(calls_bad.load() == 1);
  BOOST_TEST(calls_behind.load() == 1);
  // Done before the failure: done for every observer, also later ones.
  BOOST_TEST((b.state(ok) == event_state::done));
  BOOST_TEST(ok.is_done());
  b.sync(ok);
  BOOST_TEST((b.state(bad) == event_state::failed));
  BOOST_TEST((b.state(behind) == event_state::failed));
  // The item behind the failure carries the failure's provenance.
  auto err = expect_throw<device_error>([&] { b.sync(behind); }, "sync behind again");
  BOOST_TEST(err.origin_task() == "bad");
  // Recovering does not change what already resolved.
  BOOST_TEST(b.recover(d));
  BOOST_TEST((b.state(ok) == event_state::done));
  BOOST_TEST((b.state(bad) == event_state::failed));
}

BOOST_AUTO_TEST_CASE(test_outcomes_cancel_drops_queued_work_and_the_device_goes_on) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  auto running = b.all_work(d);
  std::atomic<int> ran{0};
  std::vector<event> queued;
  for (int i = 0; i < 100; ++i) {
    b.schedule_task(d, {"queued", [&] { ++ran; }});
    queued.push_back(b.all_work(d));
  }
  b.cancel(d);
  release->open();
  auto err = expect_throw<cancelled_error>([&] { b.sync(queued.back()); }, "sync cancelled");
  BOOST_TEST(err.cause().is_cancellation());
  BOOST_TEST(contains(err.what(), d.name()), err.what());
  BOOST_TEST(contains(err.what(), "cancel"), err.what());
  BOOST_TEST(ran.load() == 0);
  // The running task was not interrupted.
  BOOST_TEST((b.state(running) == event_state::done));
  for (const auto& e : queued) {
    BOOST_TEST((b.state(e) == event_state::cancelled));
    BOOST_TEST(e.is_failed());
    BOOST_TEST(!e.is_done());
  }
  // The device stays usable.
  b.schedule_task(d, {"after", [&] { ran += 1000; }});
  bounded([&] { b.await(d); }, "await after cancel");
  BOOST_TEST(ran.load() == 1000);
  BOOST_TEST(b.is_idle(d));
  // Nothing to cancel: a no-op.
  b.cancel(d);
  b.schedule_task(d, {"after again", [&] { ran += 1; }});
  bounded([&] { b.await(d); }, "await after an empty cancel");
  BOOST_TEST(ran.load() == 1001);
}

BOOST_AUTO_TEST_CASE(test_outcomes_dependents_of_a_cancelled_event_fail_saying_so) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto release = block_runner(b, d0);
  b.schedule_task(d0, {"to cancel", [] {}});
  auto cancelled = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), cancelled);
  b.schedule_task(d1, {"dependent", [] {}});
  auto dependent = b.all_work(d1);
  b.cancel(d0);
  release->open();
  try {
    bounded([&] { b.sync(dependent); }, "sync dependent");
    BOOST_ERROR("sync on a dependent of a cancelled event returned");
  } catch (const cancelled_error& e) {
    BOOST_ERROR("the dependent failed; it was not cancelled itself: " << e.what());
  } catch (const device_error& e) {
    BOOST_TEST(e.device_name() == d1.name());
    BOOST_TEST(contains(e.what(), "cancel"), e.what());
    BOOST_TEST(contains(e.what(), d0.name() + " " + fmt_seq(cancelled)), e.what());
    BOOST_TEST((e.cause().origin_kind == failure::kind::cancelled));
  }
  BOOST_TEST((b.state(dependent) == event_state::failed));
}

BOOST_AUTO_TEST_CASE(test_outcomes_cancel_drops_a_wait_the_runner_is_parked_on) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto release = block_runner(b, d1);
  auto held = b.all_work(d1);
  b.will_wait_for(b.make_context(d0), held);
  auto wait = b.all_work(d0);
  BOOST_TEST_REQUIRE(eventually([&] { return !b.is_idle(d0); }));
  b.cancel(d0);
  // d0 goes on while d1 is still held.
  std::atomic<bool> ran{false};
  b.schedule_task(d0, {"after", [&] { ran = true; }});
  bounded([&] { b.await(d0); }, "await d0 while d1 is held");
  BOOST_TEST(ran.load());
  BOOST_TEST((b.state(wait) == event_state::cancelled));
  release->open();
  bounded([&] { b.await(d1); }, "await d1");
}

BOOST_AUTO_TEST_CASE(test_outcomes_recover_brings_a_failed_device_back_with_its_pools) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  b.alloc_pool(d, 7, 4096, 64);
  auto used = b.get_used_memory(d);
  BOOST_TEST(!b.recover(d)); // not failed
  b.schedule_task(d, {"fails", [] { throw std::runtime_error("fault"); }});
  auto failed = b.all_work(d);
  BOOST_CHECK_THROW(bounded([&] { b.sync(failed); }, "sync"), device_error);
  BOOST_CHECK_THROW(b.schedule_task(d, {"refused", [] {}}), device_error);
  BOOST_TEST(b.recover(d));
  BOOST_TEST(!b.recover(d)); // once
  // A recovered device is not failed: await returns though its last item failed.
  bounded([&] { b.await(d); }, "await after recovery");
  BOOST_TEST(b.get_used_memory(d) == used);
  std::atomic<int> ran{0};
  b.schedule_task(d, {"after recovery", [&] { ++ran; }});
  b.memset_zero(d, 7, 0, 4096); // the pool survived
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST(ran.load() == 1);
  BOOST_TEST((b.state(failed) == event_state::failed));
  BOOST_TEST(b.is_idle(d));
}

BOOST_AUTO_TEST_CASE(test_outcomes_exit_to_the_device_actor_kills_it_and_its_dependents) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto release = block_runner(b, d0);
  b.schedule_task(d0, {"pending", [] {}});
  auto pending = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), pending);
  b.schedule_task(d1, {"dependent", [] {}});
  auto dependent = b.all_work(d1);
  auto a = device_actor_of(b, d0);
  // A user actor monitors the device actor and hears of its end.
  caf::scoped_actor self{b.system()};
  self->monitor(a);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  bool down = false;
  self->receive(
    [&](caf::down_msg& dm) {
      down = dm.source == a.address() && dm.reason == caf::exit_reason::user_shutdown;
    },
    caf::after(30s) >> [] {});
  BOOST_TEST(down);
  release->open();
  auto e = expect_throw<device_error>([&] { b.sync(pending); }, "sync pending");
  BOOST_TEST(contains(e.what(), d0.name()), e.what());
  BOOST_TEST(contains(e.what(), "killed"), e.what());
  BOOST_TEST(contains(e.what(), "user_shutdown"), e.what());
  auto f = expect_throw<device_error>([&] { b.sync(dependent); }, "sync dependent");
  BOOST_TEST(f.device_name() == d1.name());
  BOOST_TEST(f.origin_device() == d0.name());
  BOOST_TEST(contains(f.what(), "killed"), f.what());
  // A killed device accepts nothing and does not come back.
  BOOST_CHECK_THROW(b.schedule_task(d0, {"refused", [] {}}), device_error);
  BOOST_TEST(!b.recover(d0));
}

BOOST_AUTO_TEST_CASE(test_outcomes_await_on_a_device_killed_while_idle_throws) {
  // Every item finished before the kill: the device is failed all the same,
  // and await says so (as schedule_task does).
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  b.schedule_task(d, {"before the kill", [] {}});
  bounded([&] { b.await(d); }, "await before the kill");
  auto a = device_actor_of(b, d);
  caf::scoped_actor self{b.system()};
  self->monitor(a);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  self->receive([](caf::down_msg&) {}, caf::after(30s) >> [] {});
  auto e = expect_throw<device_error>([&] { b.await(d); }, "await after the kill");
  BOOST_TEST(contains(e.what(), "killed"), e.what());
}

BOOST_AUTO_TEST_CASE(test_outcomes_a_wait_owed_when_the_device_actor_is_killed_is_answered) {
  // The reply to a `wait` request comes from the core when the seq resolves,
  // not from the actor: one still owed when the actor stops is answered
  // all the same, with the outcome the kill gave the seq.
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  b.schedule_task(d, {"pending", [] {}});
  auto pending = b.all_work(d);
  auto a = device_actor_of(b, d);
  caf::scoped_actor self{b.system()};
  auto request = self->request(a, 30s, atoms::wait_atom::value, pending.seq());
  BOOST_TEST_REQUIRE(eventually([&] { return field_of(b.get_debug_info(d), "waiters") == "1"; }),
                     b.get_debug_info(d).to_string());
  self->monitor(a);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  self->receive([](caf::down_msg&) {}, caf::after(30s) >> [] {});
  release->open();
  std::optional<caf::error> err;
  bool value = false;
  request.receive([&](uint64_t) { value = true; }, [&](caf::error& e) { err = e; });
  BOOST_TEST(!value);
  BOOST_TEST_REQUIRE(err.has_value());
  try {
    throw_error(*err, "");
    BOOST_ERROR("throw_error returned");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), d.name()), e.what());
    BOOST_TEST(contains(e.what(), "killed"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_outcomes_destroy_policy_cancel_skips_queued_work) {
  for (auto policy : {backend_options::destroy_policy::drain,
                      backend_options::destroy_policy::cancel}) {
    std::atomic<int> ran{0};
    {
      backend b{backend_options{.num_devices = 1, .on_destroy = policy}};
      auto d = b.get_device(0);
      auto core = d.get_runner().core();
      // Held until the destructor has begun (stopping: after any cancel).
      b.schedule_task(d, {"held", [core] {
                            eventually([&] { return core->life().stopping(); });
                          }});
      for (int i = 0; i < 50; ++i)
        b.schedule_task(d, {"queued", [&] { ++ran; }});
    }
    if (policy == backend_options::destroy_policy::drain)
      BOOST_TEST(ran.load() == 50);
    else
      BOOST_TEST(ran.load() == 0);
  }
}

BOOST_AUTO_TEST_CASE(test_outcomes_dropped_items_are_traced_as_cancel) {
  backend b{backend_options{.num_devices = 1, .trace_capacity = 64}};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  b.schedule_task(d, {"dropped", [] {}});
  auto dropped = b.all_work(d);
  b.cancel(d);
  release->open();
  b.schedule_task(d, {"ran", [] {}});
  bounded([&] { b.await(d); }, "await");
  auto t = b.trace(d);
  bool saw_cancel = false, saw_ran = false;
  for (const auto& r : t.records) {
    if (r.seq == dropped.seq()) {
      saw_cancel = r.kind == trace_kind::cancel && contains(r.description, "dropped");
    }
    if (r.description == "ran")
      saw_ran = r.kind == trace_kind::task;
  }
  BOOST_TEST(saw_cancel);
  BOOST_TEST(saw_ran);
}
