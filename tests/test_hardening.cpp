// Regressions for the defects found in review of the single-node runtime
// (issue 6): each case fails on the code before its fix. Synchronization is
// on state (debug info, the core's counters, latches), never on sleeps.
#define BOOST_TEST_MODULE hardening
#include <boost/test/unit_test.hpp>

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/attachable.hpp>
#include <caf/default_attachable.hpp>
#include <caf/monitorable_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "actors/core/device_core.hpp" // add_waiter_unchecked: the lost race, made deterministic

#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using namespace multidev;
using test_support::block_runner;
using test_support::bounded;
using test_support::contains;
using test_support::eventually;
using test_support::field_of;
using test_support::latch_gate;
using test_support::scheduled_count;

// -- defect 1: a seq at or below progress is done, forever ---------------------

BOOST_AUTO_TEST_CASE(test_hardening_finished_seq_is_done_for_a_waiter_that_lost_the_race) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto core = d.get_runner().core();
  b.schedule_task(d, {"five", [] {}});
  auto five = b.all_work(d);
  // The runner is past `five`, held inside the task that will fail: no
  // completion after `five` fires its waiter before the failure does.
  auto release = std::make_shared<latch_gate>();
  auto started = std::make_shared<latch_gate>();
  b.schedule_task(d, {"boom", [release, started] {
                        started->open();
                        release->wait();
                        throw std::runtime_error("later task failed");
                      }});
  BOOST_TEST_REQUIRE(started->wait());
  auto boom = b.all_work(d);
  BOOST_TEST_REQUIRE(five.is_done());
  // A waiter that stored itself after `complete(five)` read the waiter
  // minimum, and before its own re-check: still registered, seq already done.
  std::optional<std::string> told_five, told_boom;
  core->events().add_waiter_unchecked(five.seq(), [&](const std::string* error) {
    told_five = error ? *error : "done";
  });
  core->events().add_waiter_unchecked(boom.seq(), [&](const std::string* error) {
    told_boom = error ? *error : "done";
  });
  release->open();
  BOOST_TEST_REQUIRE(eventually([&] { return boom.is_failed(); }));
  BOOST_TEST_REQUIRE(eventually([&] { return told_five && told_boom; }));
  BOOST_TEST(*told_five == "done");
  BOOST_TEST(contains(*told_boom, "later task failed"), *told_boom);
  BOOST_TEST(five.is_done());
  BOOST_TEST(!five.is_failed());
  bounded([&] { b.sync(five); }, "sync on the done seq"); // does not throw
  // The message path agrees: a wait for the done seq replies with the seq.
  caf::scoped_actor self{b.system()};
  std::optional<uint64_t> got;
  self->request(device_actor_of(b, d), 30s, atoms::wait_atom::value, five.seq())
    .receive([&](uint64_t s) { got = s; }, [&](caf::error&) {});
  BOOST_TEST((got && *got == five.seq()));
}

// -- defect 3: a runner belongs to its backend --------------------------------------

BOOST_AUTO_TEST_CASE(test_hardening_make_device_refuses_another_backends_runner) {
  backend b1{backend_options{.num_devices = 1}};
  auto other = std::make_unique<backend>(backend_options{.num_devices = 1});
  auto foreign = other->get_device(0);
  try {
    b1.make_device(dev{"cpu", 0}, foreign.get_runner(), 0);
    BOOST_ERROR("make_device accepted another backend's runner");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), foreign.name()), e.what());
    BOOST_TEST(contains(e.what(), "another backend"), e.what());
  }
  // Its own runners are fine, and the other backend goes without harm.
  auto own = b1.get_device(0);
  auto twin = b1.make_device(dev{"cpu", 0}, own.get_runner(), 0);
  other.reset();
  int ran = 0;
  b1.schedule_task(twin, {"still alive", [&ran] { ran = 1; }});
  bounded([&] { b1.await(own); }, "await");
  BOOST_TEST(ran == 1);
}

namespace {
/// Holds `d`'s runner in a user task until the returned latch opens, for at
/// most 120 s: longer than any bounded step here, so that a hang behind it is
/// reported rather than outlasted.
std::shared_ptr<latch_gate> hold_long(backend& b, const device& d) {
  auto release = std::make_shared<latch_gate>();
  auto started = std::make_shared<latch_gate>();
  b.schedule_task(d, {"held by the user", [release, started] {
                        started->open();
                        release->wait(std::chrono::seconds{120});
                      }});
  BOOST_TEST_REQUIRE(started->wait());
  return release;
}
} // namespace

// -- defect 5: nothing hangs at shutdown or on errors -------------------------------

BOOST_AUTO_TEST_CASE(test_hardening_shutdown_cancels_a_wait_on_another_backends_held_device) {
  backend other{backend_options{.num_devices = 1}};
  auto owner = other.get_device(0);
  auto release = hold_long(other, owner);
  auto owner_done = other.all_work(owner);
  auto b = std::make_unique<backend>(backend_options{.num_devices = 1});
  auto d = b->get_device(0);
  b->will_wait_for(b->make_context(d), owner_done);
  b->schedule_task(d, {"behind the wait", [] {}});
  auto behind = b->all_work(d);
  // Destroying the backend must not wait for the other backend's device.
  bounded([&] { b.reset(); }, "~backend with a wait on a held foreign device",
          std::chrono::seconds{20});
  BOOST_TEST(behind.is_failed());
  try {
    behind.sync();
    BOOST_ERROR("sync on cancelled work returned");
  } catch (const device_error& e) {
    BOOST_TEST(contains(e.what(), "cancelled at shutdown"), e.what());
    BOOST_TEST(contains(e.what(), owner.name()), e.what());
  }
  release->open();
  bounded([&] { other.sync(owner_done); }, "the owner finishes");
}

BOOST_AUTO_TEST_CASE(test_hardening_waits_for_a_seq_never_scheduled_fail_at_once) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  b.schedule_task(d0, {"one", [] {}});
  event bogus{d0.get_runner(), 1000};
  try {
    b.will_wait_for(b.make_context(d1), bogus);
    BOOST_ERROR("will_wait_for accepted a seq never scheduled");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(contains(e.what(), "seq 1000 was never scheduled"), e.what());
    BOOST_TEST(contains(e.what(), d0.name()), e.what());
  }
  BOOST_CHECK_THROW(bounded([&] { b.sync(bogus); }, "sync"), std::invalid_argument);
  caf::scoped_actor self{b.system()};
  std::optional<caf::error> err;
  self->request(device_actor_of(b, d0), 30s, atoms::wait_atom::value, uint64_t{1000})
    .receive([](uint64_t) {}, [&](caf::error& e) { err = e; });
  BOOST_TEST_REQUIRE(err.has_value());
  BOOST_TEST(err->code() == static_cast<uint8_t>(errc::invalid_argument));
  // d1 was left unchanged: nothing queued, not failed.
  BOOST_TEST(scheduled_count(b, d1) == 0);
  BOOST_TEST(b.is_idle(d1));
}

// -- defect 6: will_wait_for returns at once ---------------------------------------

BOOST_AUTO_TEST_CASE(test_hardening_will_wait_for_returns_at_once_on_a_full_queue) {
  backend b{backend_options{.num_devices = 2, .queue_capacity = 2}};
  auto owner = b.get_device(0), d = b.get_device(1);
  auto hold_owner = block_runner(b, owner);
  auto hold_d = block_runner(b, d);
  int order = 0, first = 0, second = 0, after = 0;
  b.schedule_task(d, {"first", [&] { first = ++order; }});
  b.schedule_task(d, {"second", [&] { second = ++order; }}); // the queue is full now
  bounded([&] { b.will_wait_for(b.make_context(d), b.all_work(owner)); },
          "will_wait_for on a full queue", std::chrono::seconds{20});
  hold_d->open();
  hold_owner->open();
  b.schedule_task(d, {"after", [&] { after = ++order; }});
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST(first == 1);
  BOOST_TEST(second == 2);
  BOOST_TEST(after == 3);
}

// -- defect 9: host calls after messages -------------------------------------------

BOOST_AUTO_TEST_CASE(test_hardening_flush_orders_a_host_call_after_an_earlier_message) {
  backend b{backend_options{.num_devices = 2}};
  auto owner = b.get_device(0), d = b.get_device(1);
  auto release = block_runner(b, owner);
  auto owner_seq = b.all_work(owner).seq();
  std::atomic<bool> ran{false};
  for (int round = 0; round < 20; ++round) {
    // Without the flush, the task may be queued before the gate exists.
    caf::anon_send(device_actor_of(b, d), atoms::depend_atom::value,
                   caf::actor_cast<caf::actor>(device_actor_of(b, owner)), owner_seq);
    b.flush(d);
    b.schedule_task(d, {"after the dependency", [&ran] { ran = true; }});
  }
  BOOST_TEST_REQUIRE(eventually([&] {
    return field_of(b.get_debug_info(d), "parked_on") != "none";
  }));
  BOOST_TEST(!ran.load());
  BOOST_TEST(scheduled_count(b, d) == 40);
  release->open();
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST(ran.load());
}

// -- defect 12 and flow control: every request ends in a value or an error -------------

namespace {

using pending_reply =
  decltype(std::declval<caf::scoped_actor&>()->request(std::declval<device_actor&>(), 30s,
                                                         atoms::all_work_atom::value));

/// Three schedules and an all_work to `a`, whose device's queue is full:
/// all four are deferred once this returns (an idle query, handled after them
/// in mailbox order, has been answered).
std::vector<pending_reply> defer_four_requests(caf::scoped_actor& self, const device_actor& a) {
  std::vector<pending_reply> pending;
  for (int i = 0; i < 3; ++i)
    pending.push_back(self->request(a, 10s, atoms::schedule_atom::value,
                                    task_spec{"spin_ns", {int64_t{1}}}));
  pending.push_back(self->request(a, 10s, atoms::all_work_atom::value));
  self->request(a, 10s, atoms::idle_atom::value).receive([](bool) {}, [](caf::error&) {});
  return pending;
}

/// How many of `pending` got a reply (a value or an error other than a
/// timeout), and how many timed out.
std::pair<int, int> count_answers(std::vector<pending_reply>& pending) {
  int answered = 0, timed_out = 0;
  for (auto& p : pending)
    p.receive([&](uint64_t) { ++answered; },
              [&](caf::error& e) { ++(e == caf::sec::request_timeout ? timed_out : answered); });
  return {answered, timed_out};
}

/// A device `d` whose runner is held (`release` lets it go) and whose queue
/// of one is full, and four requests to its actor `a` deferred by flow
/// control (defer_four_requests), `pending` for `self`.
struct four_deferred_requests {
  four_deferred_requests() {
    b.schedule_task(d, {"fills the queue", [] {}});
    pending = defer_four_requests(self, a);
    BOOST_TEST(scheduled_count(b, d) == 2);
  }

  backend b{backend_options{.num_devices = 1, .queue_capacity = 1}};
  device d = b.get_device(0);
  std::shared_ptr<latch_gate> release = block_runner(b, d);
  device_actor a = device_actor_of(b, d);
  caf::scoped_actor self{b.system()};
  std::vector<pending_reply> pending;
};

} // namespace

BOOST_AUTO_TEST_CASE(test_hardening_requests_deferred_by_flow_control_are_answered_at_shutdown) {
  caf::actor_system_config cfg;
  register_types(cfg);
  cfg.set("scheduler.max-threads", size_t{2});
  caf::actor_system sys{cfg};
  {
    auto b = std::make_unique<backend>(sys, backend_options{.num_devices = 1, .queue_capacity = 1});
    auto d = b->get_device(0);
    auto release = block_runner(*b, d);
    b->schedule_task(d, {"fills the queue", [] {}});
    auto a = device_actor_of(*b, d);
    caf::scoped_actor self{sys};
    auto pending = defer_four_requests(self, a);
    BOOST_TEST(scheduled_count(*b, d) == 2);
    // The backend goes while they wait; the runner is freed so it can join.
    std::thread opener([release] { release->open(); });
    bounded([&] { b.reset(); }, "~backend with deferred requests");
    opener.join();
    auto [answered, timed_out] = count_answers(pending);
    BOOST_TEST(answered == 4);
    BOOST_TEST(timed_out == 0);
  }
}

// -- errors say once which device, which event, and why ----------------------------

namespace {
std::size_t count_of(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto i = haystack.find(needle); i != std::string::npos; i = haystack.find(needle, i + 1))
    ++n;
  return n;
}
} // namespace

BOOST_AUTO_TEST_CASE(test_hardening_errors_name_each_device_once) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  b.schedule_task(d0, {"boom", [] { throw std::runtime_error("original"); }});
  auto failed = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), failed);
  b.schedule_task(d1, {"behind", [] {}});
  std::vector<std::string> messages;
  try {
    bounded([&] { b.await(d1); }, "await");
  } catch (const device_error& e) {
    messages.push_back(e.what());
    BOOST_TEST(e.device_name() == d1.name());
    BOOST_TEST(count_of(e.what(), d0.name()) == 1u, e.what());
    BOOST_TEST(contains(e.what(), "seq " + std::to_string(failed.seq())), e.what());
  }
  try {
    bounded([&] { b.sync(failed); }, "sync");
  } catch (const device_error& e) {
    messages.push_back(e.what());
  }
  caf::scoped_actor self{b.system()};
  for (auto* d : {&d0, &d1})
    self->request(device_actor_of(b, *d), 30s, atoms::wait_atom::value,
                  b.all_work(*d).seq())
      .receive([](uint64_t) {},
               [&](caf::error& err) {
                 try {
                   throw_error(err, d->name());
                 } catch (const device_error& e) {
                   messages.push_back(e.what());
                 }
               });
  BOOST_TEST_REQUIRE(messages.size() == 4u);
  for (const auto& m : messages) {
    BOOST_TEST(count_of(m, d0.name()) == 1u, m);
    BOOST_TEST(count_of(m, d1.name()) <= 1u, m);
    BOOST_TEST(contains(m, "original"), m);
  }
}

BOOST_FIXTURE_TEST_CASE(test_hardening_deferred_requests_are_answered_when_the_actor_is_killed,
                        four_deferred_requests) {
  // The actor is stopped while its core still runs: no room message comes.
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  auto [answered, timed_out] = count_answers(pending);
  BOOST_TEST(answered == 4);
  BOOST_TEST(timed_out == 0);
  release->open();
}

BOOST_FIXTURE_TEST_CASE(test_hardening_deferred_requests_are_answered_when_the_actor_is_killed_outright,
                        four_deferred_requests) {
  // Issue 36 point 6: `exit_reason::kill` skips the exit handler, which
  // answered the deferred requests; they must be answered all the same.
  caf::anon_send_exit(a, caf::exit_reason::kill);
  std::vector<std::string> errors;
  int timed_out = 0, values = 0;
  for (auto& p : pending)
    p.receive([&](uint64_t) { ++values; },
              [&](caf::error& e) {
                if (e == caf::sec::request_timeout)
                  ++timed_out;
                else
                  errors.push_back(b.system().render(e));
              });
  BOOST_TEST(timed_out == 0);
  BOOST_TEST(values == 0); // refused, not run: the device is killed
  BOOST_TEST_REQUIRE(errors.size() == 4u);
  for (const auto& e : errors) {
    BOOST_TEST(contains(e, "stopped before this request was handled"), e);
    BOOST_TEST(contains(e, d.name()), e);
  }
  release->open();
}

// -- issue 36 point 3: one monitor per (waiting actor, owner) ------------------------

namespace {

/// White box: how many monitors `observer` holds on `observed`. CAF keeps
/// them in the observed actor's list of attachables (protected; reached
/// through member pointers taken in a derived class).
struct attachables_peek : caf::monitorable_actor {
  static std::size_t monitors(const caf::actor& observed, const caf::actor_addr& observer) {
    auto* a = dynamic_cast<caf::monitorable_actor*>(caf::actor_cast<caf::abstract_actor*>(observed));
    BOOST_TEST_REQUIRE(a != nullptr);
    std::mutex caf::abstract_actor::*mtx = &attachables_peek::mtx_;
    caf::attachable_ptr caf::monitorable_actor::*head = &attachables_peek::attachables_head_;
    caf::default_attachable::predicate is_monitor{observer, caf::default_attachable::monitor};
    std::size_t n = 0;
    std::lock_guard guard{a->*mtx};
    for (const caf::attachable_ptr* p = &(a->*head); *p; p = &(*p)->next)
      if (is_monitor(*p))
        ++n;
    return n;
  }
};

} // namespace

BOOST_AUTO_TEST_CASE(test_hardening_sequential_depends_on_one_owner_keep_one_monitor) {
  backend b{backend_options{.num_devices = 2, .scheduler_threads = 2}};
  auto owner = b.get_device(0), waiter = b.get_device(1);
  auto owner_actor = caf::actor_cast<caf::actor>(device_actor_of(b, owner));
  auto waiter_actor = caf::actor_cast<caf::actor>(device_actor_of(b, waiter));
  caf::scoped_actor self{b.system()};
  constexpr int waits = 2000;
  int answered = 0;
  for (int i = 0; i < waits; ++i) {
    b.schedule_task(owner, {"step", [] {}});
    auto seq = b.all_work(owner).seq();
    self->request(waiter_actor, 30s, atoms::depend_atom::value, owner_actor, seq)
      .receive([&](uint64_t) { ++answered; },
               [&](caf::error& e) { BOOST_ERROR("depend: " << b.system().render(e)); });
    // Each wait is over before the next one starts.
    bounded([&] { b.sync(b.all_work(waiter)); }, "the wait");
  }
  BOOST_TEST(answered == waits);
  BOOST_TEST(attachables_peek::monitors(owner_actor, waiter_actor.address()) == 1u);
}

// -- from review: waits that leave with the actor, chains across backends -------------

BOOST_AUTO_TEST_CASE(test_hardening_a_stopped_device_actor_fails_its_remote_waits) {
  backend b{backend_options{.num_devices = 2}};
  auto owner = b.get_device(0), d = b.get_device(1);
  auto release = block_runner(b, owner);
  auto owner_seq = b.all_work(owner).seq();
  auto a = device_actor_of(b, d);
  {
    caf::scoped_actor self{b.system()};
    bool queued = false;
    self->request(a, 30s, atoms::depend_atom::value,
                  caf::actor_cast<caf::actor>(device_actor_of(b, owner)), owner_seq)
      .receive([&](uint64_t) { queued = true; }, [](caf::error&) {});
    BOOST_TEST_REQUIRE(queued);
  }
  b.schedule_task(d, {"behind the remote wait", [] {}});
  auto behind = b.all_work(d);
  // The actor that would receive the owner's answer goes away first.
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  BOOST_TEST_REQUIRE(eventually([&] { return behind.is_failed(); }));
  release->open();
  try {
    bounded([&] { b.sync(behind); }, "sync behind a wait whose actor stopped");
    BOOST_ERROR("sync returned");
  } catch (const device_error& e) {
    // The actor's exit kills the device: what it held fails with the reason.
    BOOST_TEST(contains(e.what(), "device actor exited"), e.what());
    BOOST_TEST(contains(e.what(), "user_shutdown"), e.what());
    BOOST_TEST(contains(e.what(), d.name()), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_hardening_shutdown_cuts_a_chain_that_leaves_the_backend_two_hops_away) {
  backend other{backend_options{.num_devices = 1}};
  auto z = other.get_device(0);
  auto release = hold_long(other, z);
  auto b = std::make_unique<backend>(backend_options{.num_devices = 2});
  auto x = b->get_device(0), y = b->get_device(1); // x is shut down first
  b->will_wait_for(b->make_context(y), other.all_work(z));
  b->schedule_task(y, {"y", [] {}});
  b->will_wait_for(b->make_context(x), b->all_work(y));
  b->schedule_task(x, {"x", [] {}});
  auto behind = b->all_work(x);
  bounded([&] { b.reset(); }, "~backend: x waits on y, which waits on a held foreign device",
          std::chrono::seconds{20});
  BOOST_TEST(behind.is_failed());
  release->open();
}

BOOST_AUTO_TEST_CASE(test_hardening_no_pool_is_allocated_on_a_shut_down_device) {
  auto b = std::make_unique<backend>(backend_options{.num_devices = 1});
  auto core = b->get_device(0).get_runner().core();
  b.reset();
  BOOST_CHECK_THROW(core->memory().alloc_pool(1, 64, 64, std::nullopt), device_error);
  BOOST_TEST(core->pools().used_memory() == 0u);
}

BOOST_AUTO_TEST_CASE(test_hardening_flush_from_a_task_is_refused) {
  backend b{backend_options{.num_devices = 1, .queue_capacity = 1}};
  auto d = b.get_device(0);
  std::optional<std::string> refused;
  b.schedule_task(d, {"flushes", [&] {
                        try {
                          b.flush(d);
                        } catch (const deadlock_error& e) {
                          refused = e.what();
                        }
                      }});
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST_REQUIRE(refused.has_value());
  BOOST_TEST(contains(*refused, d.name()), *refused);
}

// -- issue 36 point 2: a timed-out sync deregisters ---------------------------------

BOOST_AUTO_TEST_CASE(test_hardening_a_timed_out_sync_leaves_no_waiter_behind) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  auto ran = std::make_shared<std::atomic<bool>>(false);
  b.schedule_task(d, {"pending", [ran] { ran->store(true); }});
  auto pending = b.all_work(d);
  BOOST_TEST_REQUIRE(field_of(b.get_debug_info(d), "waiters") == "0");

  // Each call registers a waiter and gives up: a deadline already passed,
  // then a few real time-outs (sync and await share the wait).
  constexpr int passed = 5000, short_waits = 20;
  int timed_out = 0;
  for (int i = 0; i < passed + short_waits; ++i) {
    try {
      if (i < passed)
        b.sync(pending, std::chrono::steady_clock::now());
      else if (i % 2 == 0)
        b.sync(pending, 1ms);
      else
        b.await(d, 1ms);
    } catch (const timeout_error&) {
      ++timed_out;
    }
  }
  BOOST_TEST(timed_out == passed + short_waits);
  BOOST_TEST(!pending.is_done());
  auto info = b.get_debug_info(d);
  BOOST_TEST(field_of(info, "waiters") == "0", info.to_string());

  // The event still resolves, and a sync without a deadline still completes.
  release->open();
  bounded([&] { b.sync(pending); }, "sync on the released event");
  BOOST_TEST(ran->load());
  BOOST_TEST(field_of(b.get_debug_info(d), "waiters") == "0");
  b.sync(pending, 1ms); // done: returns at once
}
