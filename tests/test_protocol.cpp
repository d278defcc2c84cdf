// The device actors' protocol (multidev/protocol.hpp): stepped message by
// message with CAF's deterministic scheduler where order matters, driven by a
// user actor under the normal scheduler (embedding), and serialized with CAF's
// binary serializer (the wire form used across processes).
//
// Under the testing scheduler only actor messages are stepped by hand: the
// device runners are real threads. Nothing here calls a backend member that
// blocks on an actor reply (alloc_pool, free_pool, memset_zero), since no one
// would run the device actor to answer it; the pool messages are sent directly.
#define BOOST_TEST_MODULE protocol
#include <boost/test/unit_test.hpp>

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/message.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduled_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

#include "embed_driver.hpp"
#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace std::chrono_literals;
using namespace multidev::atoms;
using multidev::backend;
using multidev::backend_options;
using multidev::buffer_arg;
using multidev::buffer_loc;
using multidev::device_actor;
using multidev::errc;
using multidev::task;
using multidev::task_spec;
using test_support::blocker;
using test_support::bounded;
using test_support::contains;
using test_support::eventually;
using test_support::field_of;
using test_support::watchdog;

namespace {

/// One reply a probe received: a value or an error.
struct reply {
  std::string what;
  std::optional<uint64_t> value;
  caf::error err;
  std::string text; // for `debug`
};
using reply_log = std::vector<reply>;

/// Forwards protocol messages to `dev` as requests and logs every reply in
/// arrival order. Under the testing scheduler all of it runs on the test's
/// thread, so the log needs no lock.
caf::behavior probe(caf::event_based_actor* self, std::shared_ptr<reply_log> log,
                    device_actor dev) {
  auto fwd = [self, log, dev](std::string what, auto... xs) {
    self->request(dev, caf::infinite, xs...)
      .then([log, what](uint64_t v) { log->push_back(reply{what, v, {}, {}}); },
            [log, what](caf::error& e) { log->push_back(reply{what, std::nullopt, e, {}}); });
  };
  return {
    [=](wait_atom a, uint64_t seq) { fwd("wait", a, seq); },
    [=](depend_atom a, caf::actor owner, uint64_t seq) { fwd("depend", a, owner, seq); },
    [=](schedule_atom a, const task_spec& spec) { fwd("schedule", a, spec); },
    [=](alloc_atom a, int32_t id, uint64_t size, uint64_t alignment, int32_t mode) {
      fwd("alloc", a, id, size, alignment, mode);
    },
    [=](free_atom a, int32_t id) { fwd("free", a, id); },
    [=](memset_atom a, int32_t id, uint64_t offset, uint64_t size) {
      fwd("memset", a, id, offset, size);
    },
    [=](write_atom a, int32_t id, uint64_t offset, const std::string& bytes) {
      fwd("write", a, id, offset, bytes);
    },
    [=](read_atom a, int32_t id, uint64_t offset, uint64_t size) {
      self->request(dev, caf::infinite, a, id, offset, size)
        .then([log](std::string& s) { log->push_back(reply{"read", std::nullopt, {}, s}); },
              [log](caf::error& e) { log->push_back(reply{"read", std::nullopt, e, {}}); });
    },
    [=](debug_atom a) {
      self->request(dev, caf::infinite, a)
        .then([log](std::string& s) { log->push_back(reply{"debug", std::nullopt, {}, s}); },
              [log](caf::error& e) { log->push_back(reply{"debug", std::nullopt, e, {}}); });
    },
  };
}

/// An actor system on CAF's deterministic scheduler.
struct testing_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;

  testing_system() {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.inline-output", true);
    multidev::register_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = dynamic_cast<caf::scheduler::test_coordinator*>(&sys->scheduler());
    BOOST_TEST_REQUIRE(sched != nullptr, "scheduler.policy=testing did not take");
    sched->run();
  }

  ~testing_system() {
    // Exit messages of the device actors and probes are queued by now.
    sched->run();
    watchdog guard{"actor system shutdown"};
    sys.reset();
  }
};

/// One device of a backend on the testing system, and a probe that forwards
/// to its actor and logs the replies. On destruction the probe exits first,
/// then the backend goes under a watchdog.
class one_stepped_device {
public:
  explicit one_stepped_device(testing_system& ts)
    : ts_(ts),
      b_{*ts.sys, backend_options{.num_devices = 1}},
      d_{b_.get_device(0)},
      act_{multidev::device_actor_of(b_, d_)},
      log_{std::make_shared<reply_log>()},
      probe_{ts.sys->spawn(probe, log_, act_)},
      parts_{b_, d_, act_, log_, probe_} {
    ts.sched->run();
  }
  ~one_stepped_device() {
    caf::anon_send_exit(probe_, caf::exit_reason::user_shutdown);
    ts_.sched->run();
    shutdown_guard_.emplace("backend destruction");
  }
  struct refs {
    backend& b;
    multidev::device& d;
    device_actor& act;
    std::shared_ptr<reply_log>& log;
    caf::actor& p;
  };
  refs& parts() { return parts_; }

private:
  testing_system& ts_;
  std::optional<watchdog> shutdown_guard_; // destroyed last: bounds ~backend
  backend b_;
  multidev::device d_;
  device_actor act_;
  std::shared_ptr<reply_log> log_;
  caf::actor probe_;
  refs parts_;
};

template <class Handle>
caf::resumable* job_of(const Handle& h) {
  return dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(h));
}

/// The device name and message an error of the multidev category carries
/// (first in its context; a failed event's error carries its `failure` too).
std::pair<std::string, std::string> error_strings(const caf::error& e) {
  const auto& ctx = e.context();
#if defined(__SANITIZE_THREAD__)
  // As parts_of (messages/protocol.cpp): make_error released the context.
  __tsan_acquire(const_cast<void*>(static_cast<const void*>(ctx.cvals().get())));
#endif
  if (ctx.size() >= 2 && ctx.match_element<std::string>(0)
      && ctx.match_element<std::string>(1))
    return {ctx.get_as<std::string>(0), ctx.get_as<std::string>(1)};
  return {"<no context>", "<no context>"};
}

bool is_multidev_error(const caf::error& e, errc code) {
  return e && e.category() == multidev::error_category
         && e.code() == static_cast<uint8_t>(code);
}

} // namespace

// -- stepped: depend --------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_protocol_depend_holds_later_work_until_the_owner_resolves) {
  testing_system ts;
  auto& sched = *ts.sched;
  {
    std::optional<watchdog> shutdown_guard; // destroyed last: bounds ~backend
    backend b{*ts.sys, backend_options{.num_devices = 2}};
    auto a = b.get_device(0);
    auto bd = b.get_device(1);
    auto act_a = multidev::device_actor_of(b, a);
    auto act_b = multidev::device_actor_of(b, bd);
    auto log = std::make_shared<reply_log>();
    auto probe_a = ts.sys->spawn(probe, log, act_a);
    sched.run();

    // B holds at its seq 1 until released.
    std::promise<void> release;
    b.schedule_task(bd, blocker(release.get_future().share()));
    auto b_seq = b.all_work(bd).seq();
    BOOST_TEST_REQUIRE(b_seq == 1u);

    caf::anon_send(probe_a, depend_atom::value, caf::actor_cast<caf::actor>(act_b), b_seq);
    // probe -> A (gate, request to B) -> B (wait: not done, registers) -> A's
    // request stays open; nothing else to run.
    auto steps = sched.run();
    BOOST_TEST(steps >= 3u);
    BOOST_TEST_REQUIRE(log->size() == 1u);
    BOOST_TEST(log->at(0).what == "depend");
    BOOST_TEST_REQUIRE(log->at(0).value.has_value(), ts.sys->render(log->at(0).err));
    auto gate_seq = *log->at(0).value;
    BOOST_TEST(gate_seq == b.all_work(a).seq());
    BOOST_TEST(field_of(b.get_debug_info(a), "pending_waits") == "1");
    BOOST_TEST(field_of(b.get_debug_info(bd), "waiters") == "1");

    auto later_ran = std::make_shared<std::atomic<bool>>(false);
    b.schedule_task(a, task{"later on A", [later_ran] { later_ran->store(true); }, {}});
    auto a_later = b.all_work(a);
    BOOST_TEST(a_later.seq() == gate_seq + 1);
    // A's runner parks on the gate.
    BOOST_TEST(eventually([&] { return field_of(b.get_debug_info(a), "parked_on") != "none"; }),
               b.get_debug_info(a).to_string());
    BOOST_TEST(!sched.has_job());

    // Let B finish seq 1. Its runner fires the waiter, which sends the reply
    // to A's request itself; the reply lands in A's reply sink
    // (actors/remote/reply_sink.hpp), which opens the gate on the delivering
    // thread: no actor is scheduled, and A's later task runs without a
    // single message stepped.
    BOOST_TEST(!later_ran->load());
    release.set_value();
    bounded([&] { b.sync(a_later); }, "sync on A's later task");
    BOOST_TEST(!sched.has_job());
    BOOST_TEST(later_ran->load());
    BOOST_TEST(field_of(b.get_debug_info(a), "pending_waits") == "0");
    BOOST_TEST(field_of(b.get_debug_info(a), "error") == "none");
    BOOST_TEST(!sched.has_job());

    caf::anon_send_exit(probe_a, caf::exit_reason::user_shutdown);
    sched.run();
  } // the backend joins the runners and queues the actors' exits
}

// -- stepped: wait ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_protocol_wait_replies_at_once_when_done_and_errors_when_failed) {
  testing_system ts;
  auto& sched = *ts.sched;
  {
    std::optional<watchdog> shutdown_guard; // destroyed last: bounds ~backend
    backend b{*ts.sys, backend_options{.num_devices = 2}};
    auto d0 = b.get_device(0);
    auto d1 = b.get_device(1);
    auto act0 = multidev::device_actor_of(b, d0);
    auto act1 = multidev::device_actor_of(b, d1);
    auto log0 = std::make_shared<reply_log>();
    auto log1 = std::make_shared<reply_log>();
    auto probe0 = ts.sys->spawn(probe, log0, act0);
    auto probe1 = ts.sys->spawn(probe, log1, act1);
    sched.run();

    // A seq already done: probe -> device -> probe, three steps, no detour.
    auto done = b.schedule_named(d0, task_spec{"spin_ns", {int64_t{1}}});
    bounded([&] { b.sync(done); }, "sync");
    caf::anon_send(probe0, wait_atom::value, done.seq());
    sched.run_once();
    BOOST_TEST((&sched.next_job<caf::resumable>() == job_of(act0)));
    sched.run_once();
    BOOST_TEST_REQUIRE(sched.jobs.size() == 1u);
    BOOST_TEST((&sched.next_job<caf::resumable>() == job_of(probe0)));
    sched.run_once();
    BOOST_TEST(!sched.has_job());
    BOOST_TEST_REQUIRE(log0->size() == 1u);
    BOOST_TEST_REQUIRE(log0->at(0).value.has_value());
    BOOST_TEST(*log0->at(0).value == done.seq());

    // A seq still pending: the same three steps leave the request open.
    std::promise<void> release;
    b.schedule_task(d0, blocker(release.get_future().share()));
    auto held = b.all_work(d0);
    caf::anon_send(probe0, wait_atom::value, held.seq());
    sched.run_once();
    sched.run_once();
    BOOST_TEST(!sched.has_job());
    BOOST_TEST(log0->size() == 1u);
    b.schedule_task(d0, task{"marker", [] {}, {}});
    auto marker = b.all_work(d0);
    release.set_value();
    bounded([&] { b.sync(marker); }, "sync on the marker");
    BOOST_TEST_REQUIRE(eventually([&] { return sched.has_job(); }));
    sched.run();
    BOOST_TEST_REQUIRE(log0->size() == 2u);
    BOOST_TEST_REQUIRE(log0->at(1).value.has_value(), ts.sys->render(log0->at(1).err));
    BOOST_TEST(*log0->at(1).value == held.seq()); // "Replies with `seq`"

    // A failed device: waits behind the failure end in errors.
    auto ok = b.schedule_named(d1, task_spec{"spin_ns", {int64_t{1}}});
    auto failing = b.schedule_named(d1, task_spec{"fail", {std::string{"protocol boom"}}});
    BOOST_TEST_REQUIRE(eventually([&] { return failing.is_failed(); }));
    BOOST_TEST_REQUIRE(ok.is_done());
    caf::anon_send(probe1, wait_atom::value, ok.seq());
    caf::anon_send(probe1, wait_atom::value, failing.seq());
    caf::anon_send(probe1, wait_atom::value, uint64_t{1000});
    caf::anon_send(probe1, schedule_atom::value, task_spec{"spin_ns", {int64_t{1}}});
    sched.run();
    BOOST_TEST_REQUIRE(log1->size() == 4u);
    BOOST_TEST_REQUIRE(log1->at(0).value.has_value());
    BOOST_TEST(*log1->at(0).value == ok.seq());
    // The replies may come in any order (a wait's error is sent by the
    // runner that resolves the seq); find them by kind.
    std::vector<const reply*> waits;
    const reply* sched_reply = nullptr;
    for (std::size_t i = 1; i < log1->size(); ++i)
      (log1->at(i).what == "wait" ? waits.push_back(&log1->at(i))
                                  : void(sched_reply = &log1->at(i)));
    BOOST_TEST_REQUIRE(waits.size() == 2u);
    BOOST_TEST_REQUIRE(sched_reply != nullptr);
    // The wait for a seq that was never scheduled fails at once, as bad input.
    if (is_multidev_error(waits[0]->err, errc::invalid_argument))
      std::swap(waits[0], waits[1]);
    BOOST_TEST(is_multidev_error(waits[1]->err, errc::invalid_argument),
               ts.sys->render(waits[1]->err));
    BOOST_TEST(contains(error_strings(waits[1]->err).second, "seq 1000 was never scheduled"),
               ts.sys->render(waits[1]->err));
    for (const auto* r : {waits[0], sched_reply}) {
      BOOST_TEST(!r->value.has_value());
      BOOST_TEST(is_multidev_error(r->err, errc::device_failed), ts.sys->render(r->err));
      auto [dev, msg] = error_strings(r->err);
      BOOST_TEST(contains(dev + " " + msg, b.get_name(d1)), dev << " / " << msg);
      BOOST_TEST(contains(msg, "protocol boom"), msg);
    }
    // The public edge turns it into device_error.
    try {
      multidev::throw_error(waits[0]->err, b.get_name(d1));
      BOOST_ERROR("throw_error returned");
    } catch (const multidev::device_error& e) {
      BOOST_TEST(contains(e.what(), "protocol boom"), e.what());
      BOOST_TEST(contains(e.what(), b.get_name(d1)), e.what());
    }

    caf::anon_send_exit(probe0, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(probe1, caf::exit_reason::user_shutdown);
    sched.run();
    shutdown_guard.emplace("backend destruction");
  }
}

// -- stepped: internal messages ------------------------------------------------------

namespace {
// `resolved` answered a wait through the device's mailbox before the runner
// replied itself; a message of its shapes must still answer nothing.
using forged_resolved = caf::atom_constant<caf::atom("resolved")>;
using forged_room = caf::atom_constant<caf::atom("room")>;
} // namespace

/// Whether a typed interface handles a message that starts with `Atom`.
template <class Atom, class Signatures>
struct handles_atom;
template <class Atom, class... Sigs>
struct handles_atom<Atom, caf::detail::type_list<Sigs...>> {
  template <class Sig>
  struct first_is : std::false_type {};
  template <class... Is, class Out>
  struct first_is<caf::typed_mpi<caf::detail::type_list<Atom, Is...>, Out>>
    : std::true_type {};
  static constexpr bool value = (first_is<Sigs>::value || ...);
};

// The public interface lists no internal message (issue 6, defect 8), and
// still lists the public ones.
static_assert(!handles_atom<forged_resolved, device_actor::signatures>::value);
static_assert(!handles_atom<forged_room, device_actor::signatures>::value);
static_assert(handles_atom<wait_atom, device_actor::signatures>::value);

BOOST_AUTO_TEST_CASE(test_protocol_forged_internal_messages_do_not_answer_a_wait) {
  testing_system ts;
  auto& sched = *ts.sched;
  {
    one_stepped_device f{ts};
    auto& [b, d, act, log, p] = f.parts();
    std::promise<void> release;
    b.schedule_task(d, blocker(release.get_future().share()));
    auto held = b.all_work(d);
    caf::anon_send(p, wait_atom::value, held.seq());
    sched.run(); // the wait is registered, its reply owed
    BOOST_TEST_REQUIRE(log->empty());
    // Anyone holding the handle can send these; none may answer the wait.
    auto untyped = caf::actor_cast<caf::actor>(act);
    caf::anon_send(untyped, forged_resolved::value, uint64_t{0}, std::string{});
    caf::anon_send(untyped, forged_resolved::value, uint64_t{0}, uint64_t{0}, std::string{});
    caf::anon_send(untyped, forged_resolved::value, uint64_t{0}, uint64_t{0},
                   std::string{"forged failure"});
    // The shape the internal message has (key, token, cause, failed).
    caf::anon_send(untyped, forged_resolved::value, uint64_t{0}, uint64_t{0},
                   multidev::failure{}, false);
    multidev::failure forged;
    forged.message = "forged failure";
    caf::anon_send(untyped, forged_resolved::value, uint64_t{0}, uint64_t{0}, forged, true);
    sched.run();
    BOOST_TEST(log->empty(), "a forged message answered the wait");
    release.set_value();
    bounded([&] { b.sync(held); }, "sync");
    BOOST_TEST_REQUIRE(eventually([&] { return sched.has_job(); }));
    sched.run();
    BOOST_TEST_REQUIRE(log->size() == 1u);
    BOOST_TEST_REQUIRE(log->at(0).value.has_value(), ts.sys->render(log->at(0).err));
    BOOST_TEST(*log->at(0).value == held.seq());
  }
}

// -- stepped: pools ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_protocol_pool_messages_reply_in_order) {
  testing_system ts;
  auto& sched = *ts.sched;
  {
    one_stepped_device f{ts};
    auto& [b, d, act, log, p] = f.parts();
    const auto materialized = static_cast<int32_t>(multidev::memory_mode::materialized);

    caf::anon_send(p, alloc_atom::value, int32_t{1}, uint64_t{1024}, uint64_t{64}, int32_t{-1});
    caf::anon_send(p, alloc_atom::value, int32_t{2}, uint64_t{512}, uint64_t{3}, int32_t{-1});
    caf::anon_send(p, memset_atom::value, int32_t{1}, uint64_t{0}, uint64_t{1024});
    caf::anon_send(p, memset_atom::value, int32_t{7}, uint64_t{0}, uint64_t{16});
    caf::anon_send(p, free_atom::value, int32_t{7});
    caf::anon_send(p, memset_atom::value, int32_t{1}, uint64_t{1000}, uint64_t{100});
    caf::anon_send(p, alloc_atom::value, int32_t{2}, uint64_t{256}, uint64_t{64}, materialized);
    caf::anon_send(p, debug_atom::value);
    caf::anon_send(p, free_atom::value, int32_t{1});
    sched.run();

    BOOST_TEST_REQUIRE(log->size() == 9u);
    const char* kinds[] = {"alloc", "alloc", "memset", "memset", "free",
                           "memset", "alloc", "debug", "free"};
    for (std::size_t i = 0; i < 9; ++i)
      BOOST_TEST(log->at(i).what == kinds[i], "reply " << i);

    auto value = [&](std::size_t i) -> uint64_t {
      BOOST_TEST_REQUIRE(log->at(i).value.has_value(),
                         "reply " << i << ": " << ts.sys->render(log->at(i).err));
      return *log->at(i).value;
    };
    auto invalid = [&](std::size_t i, const std::string& needle) {
      const auto& r = log->at(i);
      BOOST_TEST(!r.value.has_value(), "reply " << i);
      BOOST_TEST(is_multidev_error(r.err, errc::invalid_argument),
                 "reply " << i << ": " << ts.sys->render(r.err));
      auto [dev, msg] = error_strings(r.err);
      BOOST_TEST(dev == b.get_name(d), "reply " << i);
      BOOST_TEST(contains(msg, needle), "reply " << i << ": " << msg);
    };

    BOOST_TEST(value(0) == 1024u); // used memory after the alloc
    invalid(1, "alignment 3");
    auto memset_seq = value(2);
    BOOST_TEST(memset_seq >= 1u);
    invalid(3, "pool 7 is not allocated");
    invalid(4, "pool 7");
    invalid(5, "pool 1");
    BOOST_TEST(value(6) == 1280u);
    const auto& dbg = log->at(7);
    BOOST_TEST(!dbg.err, ts.sys->render(dbg.err));
    auto info = multidev::parse_sexp(dbg.text);
    BOOST_TEST(field_of(info, "name") == b.get_name(d));
    BOOST_TEST(contains(dbg.text, "(pool (id 2) (size 256) (alignment 64) (mode materialized))"),
               dbg.text);
    BOOST_TEST(contains(dbg.text, "(pool (id 1) (size 1024)"), dbg.text);
    // Freeing pool 1 drops it now; its bytes go once the work before it is done.
    auto after_free = value(8);
    BOOST_TEST((after_free == 256u || after_free == 1280u), after_free);

    bounded([&] { b.await(d); }, "await");
    BOOST_TEST(b.all_work(d).seq() >= memset_seq);
    BOOST_TEST(field_of(b.get_debug_info(d), "error") == "none");
    BOOST_TEST(!contains(b.get_debug_info(d).to_string(), "(pool (id 1)"));

  }
}

// Issue 36 point 1: any peer can send these. A size whose rounding wrapped
// around was allocated as a tiny block that the pool recorded at the size
// asked for; memset, write and read then ran past it.
BOOST_AUTO_TEST_CASE(test_protocol_pool_messages_refuse_sizes_and_offsets_that_overflow) {
  testing_system ts;
  auto& sched = *ts.sched;
  {
    one_stepped_device f{ts};
    auto& [b, d, act, log, p] = f.parts();
    constexpr auto max = std::numeric_limits<uint64_t>::max();
    auto invalid = [&](std::size_t i, const char* what, const std::string& needle) {
      const auto& r = log->at(i);
      BOOST_TEST(r.what == what, "reply " << i);
      BOOST_TEST(!r.value.has_value(), "reply " << i << " (" << what << ") was a value");
      BOOST_TEST(is_multidev_error(r.err, errc::invalid_argument),
                 "reply " << i << ": " << ts.sys->render(r.err));
      auto [dev, msg] = error_strings(r.err);
      BOOST_TEST(dev == b.get_name(d), "reply " << i);
      BOOST_TEST(contains(msg, needle), "reply " << i << ": " << msg);
    };

    caf::anon_send(p, alloc_atom::value, int32_t{1}, uint64_t{256}, uint64_t{64}, int32_t{-1});
    caf::anon_send(p, debug_atom::value);
    sched.run();
    BOOST_TEST_REQUIRE(log->size() == 2u);
    BOOST_TEST_REQUIRE(log->at(0).value.has_value(), ts.sys->render(log->at(0).err));
    const auto info = log->at(1).text;
    log->clear();

    // A fresh pool and the existing one: both refused, neither changed.
    caf::anon_send(p, alloc_atom::value, int32_t{2}, max - 10, uint64_t{64}, int32_t{-1});
    caf::anon_send(p, alloc_atom::value, int32_t{1}, max - 10, uint64_t{64}, int32_t{-1});
    caf::anon_send(p, alloc_atom::value, int32_t{2}, max, uint64_t{1}, int32_t{-1});
    caf::anon_send(p, debug_atom::value);
    sched.run();
    BOOST_TEST_REQUIRE(log->size() == 4u);
    for (std::size_t i = 0; i < 3; ++i)
      BOOST_TEST_REQUIRE(!log->at(i).value.has_value(),
                         "alloc " << i << " of a huge size was accepted");
    invalid(0, "alloc", "pool 2");
    invalid(1, "alloc", "pool 1");
    invalid(2, "alloc", "pool 2");
    BOOST_TEST(log->at(3).text == info);
    BOOST_TEST(b.get_used_memory(d) == 256u);
    log->clear();

    // Spans whose end wraps around. Every one is refused in the handler
    // (the reads too: their replies come at once), so the log is complete
    // once the scheduler has run.
    caf::anon_send(p, memset_atom::value, int32_t{2}, uint64_t{0}, uint64_t{1} << 20);
    caf::anon_send(p, memset_atom::value, int32_t{1}, max - 4, uint64_t{8});
    caf::anon_send(p, memset_atom::value, int32_t{1}, uint64_t{8}, max - 4);
    caf::anon_send(p, write_atom::value, int32_t{1}, max - 2, std::string(8, 'x'));
    caf::anon_send(p, read_atom::value, int32_t{1}, max - 2, uint64_t{8});
    caf::anon_send(p, read_atom::value, int32_t{1}, uint64_t{0}, max - 10);
    caf::anon_send(p, debug_atom::value);
    sched.run();
    BOOST_TEST_REQUIRE(log->size() == 7u);
    invalid(0, "memset", "pool 2 is not allocated");
    invalid(1, "memset", "pool 1");
    invalid(2, "memset", "pool 1");
    invalid(3, "write", "pool 1");
    invalid(4, "read", "pool 1");
    invalid(5, "read", "pool 1");
    BOOST_TEST(log->at(6).text == info);
    log->clear();

    // The device still works through the same messages: two floats written
    // at the end of pool 1, summed by a kernel.
    const float ones[2] = {1.0f, 1.0f};
    caf::anon_send(p, write_atom::value, int32_t{1}, uint64_t{248},
                   std::string(reinterpret_cast<const char*>(ones), sizeof ones));
    sched.run();
    BOOST_TEST_REQUIRE(log->size() == 1u);
    BOOST_TEST(log->at(0).value.has_value(), ts.sys->render(log->at(0).err));
    auto e = b.schedule_named(
      d, task_spec{"checksum", {buffer_arg{buffer_loc{1, 248}, 8}, std::string{"tail"}}});
    bounded([&] { b.sync(e); }, "sync on the checksum");
    auto r = b.result("tail");
    BOOST_TEST_REQUIRE(r.has_value());
    BOOST_TEST(r->sum == 2.0);
    BOOST_TEST(field_of(b.get_debug_info(d), "error") == "none");
  }
}

// -- embedding with the normal scheduler ------------------------------------------------

namespace {

/// A user actor that fills a buffer, checksums it and waits for the result,
/// purely by messages; replies with the seq the wait returned.
caf::behavior user_driver(caf::event_based_actor* self, device_actor dev, uint64_t n,
                          std::string result_name) {
  return {[=](schedule_atom) {
    auto rp = self->make_response_promise();
    buffer_arg buf{buffer_loc{1, 0}, n * sizeof(float)};
    self->request(dev, caf::infinite, schedule_atom::value, task_spec{"fill", {buf, 3.0}})
      .then(
        [=](uint64_t) mutable {
          self->request(dev, caf::infinite, schedule_atom::value,
                        task_spec{"checksum", {buf, result_name}})
            .then(
              [=](uint64_t seq) mutable {
                self->request(dev, caf::infinite, wait_atom::value, seq)
                  .then([=](uint64_t done) mutable { rp.deliver(seq, done); },
                        [=](caf::error& e) mutable { rp.deliver(e); });
              },
              [=](caf::error& e) mutable { rp.deliver(e); });
        },
        [=](caf::error& e) mutable { rp.deliver(e); });
    return rp;
  }};
}

} // namespace

BOOST_AUTO_TEST_CASE(test_protocol_user_actor_drives_a_device_in_an_embedding_system) {
  auto cfg = std::make_unique<caf::actor_system_config>();
  multidev::register_types(*cfg);
  cfg->set("scheduler.max-threads", std::size_t{2});
  auto sys = std::make_unique<caf::actor_system>(*cfg);
  auto b = std::make_unique<backend>(*sys, backend_options{.num_devices = 2});
  constexpr uint64_t n = 4096;
  auto d = b->get_device(1);
  b->alloc_pool(d, 1, n * sizeof(float), 64);
  const std::string result_name = "protocol_embed";
  BOOST_TEST(!b->result(result_name));

  auto drv = sys->spawn(user_driver, multidev::device_actor_of(*b, d), n, result_name);
  std::optional<std::pair<uint64_t, uint64_t>> got;
  caf::error err;
  {
    caf::scoped_actor self{*sys};
    self->request(drv, std::chrono::seconds(30), schedule_atom::value)
      .receive([&](uint64_t seq, uint64_t done) { got.emplace(seq, done); },
               [&](caf::error& e) { err = e; });
    self->send_exit(drv, caf::exit_reason::user_shutdown);
  }
  BOOST_TEST_REQUIRE(got.has_value(), sys->render(err));
  BOOST_TEST(got->second == got->first); // wait replies with the seq awaited
  // The wait replied, so the checksum ran: the host sees its result.
  auto r = b->result(result_name);
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->sum == 3.0 * n);
  BOOST_TEST(r->count == n);
  BOOST_TEST(b->is_done(multidev::event{d.get_runner(), got->first}));

  drv = nullptr;
  bounded([&] { b.reset(); }, "backend destruction");
  {
    watchdog guard{"actor system destruction"};
    sys.reset();
  }
  BOOST_TEST(!sys);
}

/// An owner that accepts `wait` and never answers (a node gone silent).
struct silent_state {
  std::vector<caf::response_promise> held; // owner actor only
  std::atomic<int> asked{0};
};

caf::behavior silent_owner(caf::event_based_actor* self, std::shared_ptr<silent_state> st) {
#if defined(__SANITIZE_THREAD__)
  // Made by the spawning thread, which CAF's (uninstrumented) scheduler
  // hands this actor from: see actors/tsan.hpp.
  __tsan_acquire(st.get());
  __tsan_release(st.get()); // to the handler's turn, maybe on another worker
#endif
  return {[self, st](wait_atom, uint64_t) -> caf::result<uint64_t> {
#if defined(__SANITIZE_THREAD__)
    __tsan_acquire(st.get()); // each turn follows the last one (tsan.hpp)
#endif
    st->held.push_back(self->make_response_promise());
    st->asked.fetch_add(1);
#if defined(__SANITIZE_THREAD__)
    __tsan_release(st.get());
#endif
    return caf::delegated<uint64_t>{};
  }};
}

BOOST_AUTO_TEST_CASE(test_protocol_shutdown_cancels_a_remote_wait_that_never_answers) {
  auto cfg = std::make_unique<caf::actor_system_config>();
  multidev::register_types(*cfg);
  cfg->set("scheduler.max-threads", std::size_t{2});
  auto sys = std::make_unique<caf::actor_system>(*cfg);
  auto b = std::make_unique<backend>(*sys, backend_options{.num_devices = 1});
  auto d = b->get_device(0);
  auto held = std::make_shared<silent_state>();
#if defined(__SANITIZE_THREAD__)
  __tsan_release(held.get()); // see silent_owner
#endif
  auto owner = sys->spawn(silent_owner, held);
  std::atomic<bool> ran{false};
  {
    caf::scoped_actor self{*sys};
    std::optional<uint64_t> gate_seq;
    self->request(multidev::device_actor_of(*b, d), std::chrono::seconds(30), depend_atom::value,
                  owner, uint64_t{1})
      .receive([&](uint64_t seq) { gate_seq = seq; }, [&](caf::error&) {});
    BOOST_TEST_REQUIRE(gate_seq.has_value());
  }
  b->schedule_task(d, task{"after the remote wait", [&ran] { ran = true; }, {}});
  auto later = b->all_work(d);
  BOOST_TEST(eventually([&] { return held->asked.load() == 1; }));
  BOOST_TEST(!later.is_done());
  // Destroying the backend must not wait forever for the silent owner.
  bounded([&] { b.reset(); }, "backend destruction with a pending remote wait");
  BOOST_TEST(later.is_failed());
  BOOST_TEST(!ran.load());
  caf::anon_send_exit(owner, caf::exit_reason::user_shutdown);
  owner = nullptr;
  {
    watchdog guard{"actor system destruction"};
    sys.reset();
  }
  BOOST_TEST(!sys);
}

// -- serialization ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_protocol_task_spec_round_trips_through_the_binary_serializer) {
  testing_system ts;
  constexpr auto i64min = std::numeric_limits<int64_t>::min();
  constexpr auto sz_max = std::numeric_limits<std::size_t>::max();
  task_spec spec{"every_kind",
                 {std::monostate{}, int64_t{42}, i64min, -2.5, 1e300, std::string{},
                  std::string{"quoted \"text\"\n\xc3\xa9"},
                  buffer_arg{buffer_loc{7, 128}, 64}, buffer_arg{buffer_loc{0, sz_max}, sz_max}}};

  std::vector<char> buf;
  {
    caf::binary_serializer sink{*ts.sys, buf};
    auto err = sink(spec);
    BOOST_TEST_REQUIRE(!err, ts.sys->render(err));
  }
  BOOST_TEST(!buf.empty());
  task_spec out;
  {
    caf::binary_deserializer source{*ts.sys, buf};
    auto err = source(out);
    BOOST_TEST_REQUIRE(!err, ts.sys->render(err));
  }
  BOOST_TEST((out == spec));
  BOOST_TEST_REQUIRE(out.args.size() == spec.args.size());
  for (std::size_t i = 0; i < spec.args.size(); ++i)
    BOOST_TEST(out.args[i].index() == spec.args[i].index(), "argument " << i);
  BOOST_TEST(to_sexp(out).to_string() == to_sexp(spec).to_string());

  // Into an object that already held something: the arguments are replaced.
  task_spec reused{"old", {int64_t{1}, int64_t{2}}};
  {
    caf::binary_deserializer source{*ts.sys, buf};
    BOOST_TEST_REQUIRE(!source(reused));
  }
  BOOST_TEST((reused == spec));

  // As a whole protocol message, which needs the registered type names.
  auto msg = caf::make_message(schedule_atom::value, spec);
  std::vector<char> mbuf;
  {
    caf::binary_serializer sink{*ts.sys, mbuf};
    auto err = sink(msg);
    BOOST_TEST_REQUIRE(!err, ts.sys->render(err));
  }
  caf::message back;
  {
    caf::binary_deserializer source{*ts.sys, mbuf};
    auto err = source(back);
    BOOST_TEST_REQUIRE(!err, ts.sys->render(err));
  }
  BOOST_TEST_REQUIRE((back.match_elements<schedule_atom, task_spec>()));
  BOOST_TEST((back.get_as<task_spec>(1) == spec));

  // An empty spec round-trips too.
  task_spec empty_in{}, empty_out{"x", {1.0}};
  std::vector<char> ebuf;
  {
    caf::binary_serializer sink{*ts.sys, ebuf};
    BOOST_TEST_REQUIRE(!sink(empty_in));
  }
  {
    caf::binary_deserializer source{*ts.sys, ebuf};
    BOOST_TEST_REQUIRE(!source(empty_out));
  }
  BOOST_TEST((empty_out == empty_in));
}

// -- a user actor's message chain ends in a value or an error -----------------------

BOOST_AUTO_TEST_CASE(test_protocol_embed_driver_reports_failures_instead_of_hanging) {
  backend b{backend_options{.num_devices = 1, .scheduler_threads = 2}};
  auto d = b.get_device(0);
  constexpr uint64_t n = 256;
  b.alloc_pool(d, 1, n * sizeof(float), 64);
  caf::scoped_actor self{b.system()};
  // An unknown kernel fails the first request; a kernel that throws fails the
  // device, so the wait at the end of the chain fails, and so does any later
  // chain on that device.
  multidev::register_kernel("fill_but_throw",
                            {.params = {multidev::arg_kind::buffer, multidev::arg_kind::real},
                             .writes = {0},
                             .body = [](multidev::kernel_call&) {
                               throw std::runtime_error("fill_but_throw threw");
                             }});
  for (std::string kernel : {"no_such_kernel", "fill_but_throw", "fill"}) {
    auto drv = b.system().spawn(embed::driver, multidev::device_actor_of(b, d), n, kernel);
    std::optional<uint64_t> value;
    std::optional<caf::error> err;
    bounded(
      [&] {
        caf::scoped_actor asker{b.system()};
        asker->request(drv, caf::infinite, schedule_atom::value)
          .receive([&](uint64_t v) { value = v; }, [&](caf::error& e) { err = e; });
      },
      "the embed driver's reply for kernel " + kernel);
    if (kernel == "fill") {
      BOOST_TEST(!value.has_value(), "the device failed before: fill cannot succeed");
      BOOST_TEST_REQUIRE(err.has_value());
      BOOST_TEST(is_multidev_error(*err, errc::device_failed), b.system().render(*err));
    } else if (kernel == "no_such_kernel") {
      BOOST_TEST_REQUIRE(err.has_value());
      BOOST_TEST(is_multidev_error(*err, errc::invalid_argument), b.system().render(*err));
      BOOST_TEST(contains(error_strings(*err).second, "no_such_kernel"));
    } else {
      BOOST_TEST_REQUIRE(err.has_value());
      BOOST_TEST(is_multidev_error(*err, errc::device_failed), b.system().render(*err));
      BOOST_TEST(contains(error_strings(*err).second, "fill_but_throw threw"));
    }
    self->send_exit(drv, caf::exit_reason::user_shutdown);
  }
}
