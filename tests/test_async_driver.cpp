// Asynchronous completion, on the fake driver (devices/fake): items complete
// on the driver's thread after the runner has moved on, yet events resolve
// in seq order; the runner keeps at most max_in_flight items submitted
// without waiting for each; a wait on another device holds back what follows
// it; a failure fails its event with its provenance and the ones behind it,
// even those that already ran; cancel and shutdown with items in flight.
#define BOOST_TEST_MODULE async_driver
#include <boost/test/unit_test.hpp>

#include "actors/backend_impl.hpp"
#include "actors/core/device_core.hpp"
#include "devices/fake/fake_driver.hpp"
#include "multidev/multidev.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace multidev;
using namespace std::chrono_literals;
using namespace test_support;
using detail::fake_driver;
using detail::fake_stream_stats;

namespace {

backend_options on_fake(int devices, std::size_t in_flight = 64) {
  return backend_options{.driver = "fake",
                         .num_devices = devices,
                         .max_in_flight = in_flight,
                         .scheduler_threads = 2};
}

fake_driver& fake_of(backend& b) {
  auto* f = dynamic_cast<fake_driver*>(b.impl().drv.get());
  BOOST_TEST_REQUIRE(f != nullptr);
  return *f;
}

/// Waits (at most 30 s) until `pred` holds for device `ordinal`'s stream.
void await_stream(const fake_driver& f, int ordinal,
                  const std::function<bool(const fake_stream_stats&)>& pred, const char* what) {
  BOOST_TEST_REQUIRE(f.wait_until(ordinal, pred), what << ": not reached within 30 s");
}

using flags = std::vector<std::shared_ptr<std::atomic<bool>>>;

flags make_flags(int n) {
  flags v;
  for (int i = 0; i < n; ++i)
    v.push_back(std::make_shared<std::atomic<bool>>(false));
  return v;
}

/// Schedules one task per flag (`<prefix><i>`, setting it); returns their events.
std::vector<event> schedule_marks(backend& b, const device& d, const flags& ran,
                                  const std::string& prefix) {
  std::vector<event> evs;
  for (std::size_t i = 0; i < ran.size(); ++i) {
    auto flag = ran[i];
    b.schedule_task(d, {prefix + std::to_string(i + 1), [flag] { flag->store(true); }});
    evs.push_back(b.all_work(d));
  }
  return evs;
}

/// `b.sync(e)`, which must throw `device_error`; returns it.
device_error expect_failure(backend& b, const event& e, const char* what) {
  try {
    bounded([&] { b.sync(e); }, what);
  } catch (const device_error& err) {
    return err;
  }
  BOOST_FAIL(what << ": sync returned normally");
  throw std::logic_error("unreachable");
}

} // namespace

BOOST_AUTO_TEST_CASE(test_async_driver_out_of_order_completions_resolve_in_seq_order) {
  backend b{on_fake(1)};
  auto& f = fake_of(b);
  f.set_max_delay(0us);
  auto d = b.get_device(0);
  auto core = d.get_runner().core();
  constexpr int n = 20;
  f.hold_completions(0, true);
  for (int i = 0; i < n; ++i)
    b.schedule_task(d, {"t" + std::to_string(i), [] {}});
  await_stream(f, 0, [](auto& s) { return s.held == n; }, "every item ran, completions held");
  BOOST_TEST(core->outcomes().finished() == 0u);

  std::mutex mu;
  std::vector<uint64_t> order;
  for (uint64_t seq = 1; seq <= n; ++seq)
    core->events().when_done(seq, [&, seq](const std::string*) {
      std::lock_guard guard{mu};
      order.push_back(seq);
    });
  // The stream reports in a shuffled order; after each report exactly the
  // prefix of seqs reported so far is resolved.
  std::vector<uint64_t> perm(n);
  std::iota(perm.begin(), perm.end(), uint64_t{1});
  std::shuffle(perm.begin(), perm.end(), std::mt19937{7});
  if (perm.front() == 1) // make sure an early report has to wait
    std::swap(perm.front(), perm.back());
  std::set<uint64_t> reported;
  bool prefix_only = true;
  for (std::size_t k = 0; k < perm.size(); ++k) {
    BOOST_TEST_REQUIRE(f.deliver(0, perm[k]));
    await_stream(f, 0, [k](auto& s) { return s.returned == k + 1; }, "a report returned");
    reported.insert(perm[k]);
    uint64_t prefix = 0;
    while (reported.contains(prefix + 1))
      ++prefix;
    prefix_only = prefix_only && core->outcomes().finished() == prefix;
    for (uint64_t seq = 1; seq <= n; ++seq)
      prefix_only = prefix_only && core->outcomes().is_done(seq) == (seq <= prefix);
  }
  BOOST_TEST(prefix_only);
  std::vector<uint64_t> expected(n);
  std::iota(expected.begin(), expected.end(), uint64_t{1});
  std::lock_guard guard{mu};
  BOOST_TEST(order == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(test_async_driver_keeps_at_most_max_in_flight_without_waiting_for_each) {
  constexpr std::size_t k = 4;
  constexpr int n = 10;
  backend b{on_fake(1, k)};
  auto& f = fake_of(b);
  f.set_max_delay(0us);
  auto d = b.get_device(0);
  auto core = d.get_runner().core();
  f.hold_completions(0, true);
  auto ran = make_flags(n);
  auto evs = schedule_marks(b, d, ran, "t");
  // Without a single completion the runner submits k items, then sleeps
  // (rather than spinning) until one is reported.
  await_stream(f, 0, [](auto& s) { return s.submitted >= k && s.held >= k; },
               "k items submitted and run");
  BOOST_TEST_REQUIRE(eventually([&] { return (core->queue().sleeping() != multidev::detail::device_core::work_queue_t::awake); }));
  BOOST_TEST(f.stats(0).submitted == k);
  BOOST_TEST(core->outcomes().finished() == 0u);
  f.hold_completions(0, false);
  bounded([&] { b.await(d); }, "await");
  auto s = f.stats(0);
  BOOST_TEST(s.submitted == static_cast<uint64_t>(n));
  BOOST_TEST(s.max_outstanding == k);
  BOOST_TEST(std::all_of(ran.begin(), ran.end(), [](auto& r) { return r->load(); }));

  // With real delays too: the window fills, and never overflows.
  f.set_max_delay(100us);
  auto more = make_flags(300);
  schedule_marks(b, d, more, "m");
  bounded([&] { b.await(d); }, "await");
  BOOST_TEST(f.stats(0).max_outstanding == k);
  BOOST_TEST(std::all_of(more.begin(), more.end(), [](auto& r) { return r->load(); }));
}

BOOST_AUTO_TEST_CASE(test_async_driver_wait_holds_back_what_follows_it) {
  backend b{on_fake(2)};
  auto& f = fake_of(b);
  f.set_max_delay(0us);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto core1 = d1.get_runner().core();
  f.hold_completions(0, true);
  b.schedule_task(d0, {"awaited", [] {}});
  auto e0 = b.all_work(d0);
  await_stream(f, 0, [](auto& s) { return s.held == 1; }, "the awaited item ran");
  auto before = make_flags(3), after = make_flags(3);
  auto eb = schedule_marks(b, d1, before, "before");
  b.will_wait_for(b.make_context(d1), e0);
  auto ea = schedule_marks(b, d1, after, "after");
  // What precedes the wait completes; nothing behind it is submitted.
  bounded([&] { b.sync(eb.back()); }, "sync before the wait");
  BOOST_TEST_REQUIRE(eventually([&] { return (core1->queue().sleeping() != multidev::detail::device_core::work_queue_t::awake); }));
  BOOST_TEST(f.stats(1).submitted == 3u);
  BOOST_TEST(!ea.front().is_done());
  BOOST_TEST(std::none_of(after.begin(), after.end(), [](auto& r) { return r->load(); }));
  BOOST_TEST_REQUIRE(f.deliver(0, e0.seq()));
  bounded([&] { b.sync(ea.back()); }, "sync after the wait");
  BOOST_TEST(std::all_of(after.begin(), after.end(), [](auto& r) { return r->load(); }));
}

BOOST_AUTO_TEST_CASE(test_async_driver_fault_fails_its_event_with_provenance_and_those_behind) {
  backend b{on_fake(2)};
  auto& f = fake_of(b);
  f.set_max_delay(0us);
  auto d = b.get_device(0), other = b.get_device(1);
  f.pause(0); // every item is submitted before any runs
  auto ran = make_flags(6);
  auto evs = schedule_marks(b, d, ran, "step ");
  f.fail_at(0, evs[2].seq(), "device fault 77");
  await_stream(f, 0, [](auto& s) { return s.submitted == 6; }, "all six submitted");
  f.resume(0);

  auto e = expect_failure(b, evs[2], "sync on the failing item");
  BOOST_TEST(e.origin_device() == d.name());
  BOOST_TEST(e.origin_task() == "step 3");
  BOOST_TEST(e.original_message() == "device fault 77");
  BOOST_TEST(evs[0].is_done());
  BOOST_TEST(evs[1].is_done());
  BOOST_TEST(ran[0]->load());
  BOOST_TEST(ran[1]->load());
  for (std::size_t i = 2; i < evs.size(); ++i) {
    // The items behind the fault resolve after it, on the runner or the
    // stream: wait for each before reading its state (read at once, it was
    // sometimes still pending, about once in 200 runs under load).
    auto behind = expect_failure(b, evs[i], "sync behind the fault");
    BOOST_TEST((b.state(evs[i]) == event_state::failed), "step " << i + 1);
    BOOST_TEST(!ran[i]->load(), "step " << i + 1 << " ran behind the fault");
    BOOST_TEST(behind.origin_task() == "step 3");
    BOOST_TEST(behind.original_message() == "device fault 77");
  }
  BOOST_CHECK_THROW(b.schedule_task(d, {"refused", [] {}}), device_error);
  // The other device goes on; the failed one comes back.
  auto ok = make_flags(1);
  bounded([&] { b.sync(schedule_marks(b, other, ok, "other").back()); }, "other device");
  BOOST_TEST(ok[0]->load());
  BOOST_TEST_REQUIRE(b.recover(d));
  auto again = make_flags(1);
  bounded([&] { b.sync(schedule_marks(b, d, again, "again").back()); }, "after recover");
  BOOST_TEST(again[0]->load());
}

BOOST_AUTO_TEST_CASE(test_async_driver_items_that_ran_behind_a_failure_are_never_done) {
  backend b{on_fake(1)};
  auto& f = fake_of(b);
  f.set_max_delay(0us);
  auto d = b.get_device(0);
  // The fault is reported only after the items behind it have run.
  f.hold_completions(0, true);
  f.fail_at(0, 1, "late report");
  auto ran = make_flags(3);
  auto evs = schedule_marks(b, d, ran, "s");
  await_stream(f, 0, [](auto& s) { return s.held == 3; }, "all three ran");
  BOOST_TEST(!ran[0]->load());
  BOOST_TEST(ran[1]->load());
  BOOST_TEST(ran[2]->load());
  f.hold_completions(0, false);
  for (std::size_t i = 0; i < evs.size(); ++i) {
    auto e = expect_failure(b, evs[i], "sync");
    BOOST_TEST(e.origin_task() == "s1");
    BOOST_TEST(e.original_message() == "late report");
    BOOST_TEST(!evs[i].is_done());
    BOOST_TEST((b.state(evs[i]) == event_state::failed));
  }
}

BOOST_AUTO_TEST_CASE(test_async_driver_cancel_drops_items_in_flight_not_yet_started) {
  backend b{on_fake(1)};
  auto& f = fake_of(b);
  f.set_max_delay(0us);
  auto d = b.get_device(0);
  auto release = block_runner(b, d); // running on the stream now
  auto running = b.all_work(d);
  auto ran = make_flags(5);
  auto evs = schedule_marks(b, d, ran, "queued");
  await_stream(f, 0, [](auto& s) { return s.submitted == 6; }, "all submitted");
  b.cancel(d);
  release->open();
  bounded(
    [&] {
      try {
        b.sync(evs.back());
      } catch (const cancelled_error&) {
      }
    },
    "sync on the last cancelled item");
  BOOST_TEST((b.state(running) == event_state::done)); // it had started
  for (std::size_t i = 0; i < evs.size(); ++i) {
    BOOST_TEST((b.state(evs[i]) == event_state::cancelled), "item " << i);
    BOOST_TEST(!ran[i]->load(), "item " << i << " ran after cancel");
  }
  // The device goes on.
  auto later = make_flags(1);
  bounded([&] { b.sync(schedule_marks(b, d, later, "later").back()); }, "after cancel");
  BOOST_TEST(later[0]->load());
}

BOOST_AUTO_TEST_CASE(test_async_driver_shutdown_with_items_in_flight_finishes_them) {
  constexpr int n = 400;
  auto count = std::make_shared<std::atomic<int>>(0);
  std::vector<event> evs;
  {
    auto b = std::make_unique<backend>(on_fake(2, 8));
    fake_of(*b).set_max_delay(200us);
    for (int i = 0; i < n; ++i) {
      auto d = b->get_device(i % 2);
      b->schedule_task(d, {"count", [count] { count->fetch_add(1); }});
      evs.push_back(b->all_work(d));
    }
    BOOST_TEST(count->load() < n); // most are still queued or in flight
    bounded([&] { b.reset(); }, "~backend with items in flight");
  }
  BOOST_TEST(count->load() == n);
  BOOST_TEST(std::all_of(evs.begin(), evs.end(), [](auto& e) { return e.is_done(); }));
}

BOOST_AUTO_TEST_CASE(test_async_driver_shutdown_cancelling_items_in_flight_resolves_each_once) {
  constexpr int n = 400;
  auto count = std::make_shared<std::atomic<int>>(0);
  std::vector<event> evs;
  {
    auto opts = on_fake(2, 8);
    opts.on_destroy = backend_options::destroy_policy::cancel;
    auto b = std::make_unique<backend>(opts);
    fake_of(*b).set_max_delay(200us);
    for (int i = 0; i < n; ++i) {
      auto d = b->get_device(i % 2);
      b->schedule_task(d, {"count", [count] { count->fetch_add(1); }});
      evs.push_back(b->all_work(d));
    }
    bounded([&] { b.reset(); }, "~backend cancelling items in flight");
  }
  // Every event resolved, done exactly when its task ran.
  auto done = std::count_if(evs.begin(), evs.end(), [](auto& e) { return e.is_done(); });
  auto failed = std::count_if(evs.begin(), evs.end(), [](auto& e) { return e.is_failed(); });
  BOOST_TEST(done + failed == n);
  BOOST_TEST(done == count->load());
  BOOST_TEST(failed > 0);
}

BOOST_AUTO_TEST_CASE(test_async_driver_trace_records_every_item_with_stream_times) {
  // On an asynchronous driver the records are written as items resolve
  // (often on the stream's thread), with the times the stream ran each.
  auto opts = on_fake(2);
  opts.trace_capacity = 64;
  backend b{opts};
  auto& f = fake_of(b);
  f.set_max_delay(20us);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  for (int i = 1; i <= 5; ++i)
    b.schedule_task(d0, {"a" + std::to_string(i), [] {}});
  b.schedule_task(d0, task{{}, [] {}, {}});                  // seq 6, nameless
  auto e0 = b.all_work(d0);
  b.will_wait_for(b.make_context(d1), e0);               // d1 seq 1
  b.schedule_task(d1, {"b2", [] {}});                    // d1 seq 2
  f.fail_at(0, 8, "device fault");
  b.schedule_task(d0, {"c7", [] {}});                    // seq 7
  b.schedule_task(d0, {"c8", [] {}});                    // seq 8: the fault
  b.schedule_task(d0, {"c9", [] {}});                    // seq 9: behind it
  bounded([&] { b.sync(b.all_work(d1)); }, "sync d1");
  BOOST_CHECK_THROW(bounded([&] { b.await(d0); }, "await d0"), device_error);

  auto t0 = b.trace(d0);
  BOOST_TEST_REQUIRE(t0.records.size() == 9u);
  for (std::size_t i = 0; i < t0.records.size(); ++i) {
    const auto& r = t0.records[i];
    BOOST_TEST(r.seq == i + 1);
    BOOST_TEST(r.start_ns <= r.end_ns, "seq " << r.seq);
    if (i > 0 && r.seq <= 8) // the stream runs them one after the other
      BOOST_TEST(r.start_ns >= t0.records[i - 1].end_ns, "seq " << r.seq);
  }
  for (int i = 1; i <= 5; ++i) {
    BOOST_TEST((t0.records[i - 1].kind == trace_kind::task));
    BOOST_TEST(t0.records[i - 1].description == "a" + std::to_string(i));
    BOOST_TEST(!t0.records[i - 1].failed);
  }
  BOOST_TEST(t0.records[5].description == "task#6");
  BOOST_TEST(t0.records[6].description == "c7");
  BOOST_TEST(!t0.records[6].failed);
  BOOST_TEST(t0.records[7].description == "c8");
  BOOST_TEST(t0.records[7].failed);
  BOOST_TEST((t0.records[8].kind == trace_kind::cancel));
  BOOST_TEST(t0.records[8].failed);
  BOOST_TEST(contains(t0.records[8].description, "c9"), t0.records[8].description);

  auto t1 = b.trace(d1);
  BOOST_TEST_REQUIRE(t1.records.size() == 2u);
  BOOST_TEST((t1.records[0].kind == trace_kind::gate));
  BOOST_TEST(t1.records[0].awaited_seq == 6u);
  BOOST_TEST(t1.records[0].awaited_device == t0.device);
  BOOST_TEST(t1.records[0].start_ns <= t1.records[0].end_ns);
  BOOST_TEST(t1.records[1].description == "b2");
  BOOST_TEST(t1.records[1].start_ns >= t1.records[0].end_ns);
}
