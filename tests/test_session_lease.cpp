// A session's lease (actors/core/lease.hpp, issue 40 point 1): on its own,
// then on a device core, on the synchronous runner (cpu) and the
// asynchronous one (fake), which check it before each item.
#define BOOST_TEST_MODULE test_session_lease
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/core/device_core.hpp"
#include "actors/core/lease.hpp"
#include "devices/registry.hpp"

namespace {
namespace d = multidev::detail;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

constexpr int64_t hour_ns = 3'600'000'000'000;

/// A device core on `driver` (no actor, no backend).
std::shared_ptr<d::device_core> make_core(const char* driver) {
  auto drv = d::find_driver(driver)(d::driver_params{.num_devices = 1});
  return std::make_shared<d::device_core>(std::string{"lease_"} + driver, 0, drv, 64,
                                          std::make_shared<d::result_board>());
}

/// Syncs on `seq` for at most 10 s; the event's state then.
multidev::event_state settle(d::device_core& core, uint64_t seq) {
  try {
    core.events().sync_until(seq, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  } catch (const std::exception&) {
    // failed, cancelled or timed out: the state says which
  }
  return core.outcomes().state(seq);
}
} // namespace

BOOST_AUTO_TEST_CASE(test_session_lease_none_is_never_over) {
  d::session_lease l;
  BOOST_TEST(!l.over());
  BOOST_TEST(l.why().empty());
}

BOOST_AUTO_TEST_CASE(test_session_lease_in_the_future_is_not_over) {
  d::session_lease l;
  auto deadline = std::make_shared<std::atomic<int64_t>>(now_ns() + hour_ns);
  auto at = deadline->load();
  l.set(deadline, "the lease ran out");
  BOOST_TEST(!l.over());
  BOOST_TEST(deadline->load() == at); // untouched
  BOOST_TEST(l.why() == "the lease ran out");
}

BOOST_AUTO_TEST_CASE(test_session_lease_past_is_over_for_good) {
  d::session_lease l;
  auto deadline = std::make_shared<std::atomic<int64_t>>(now_ns() - 1);
  l.set(deadline, "the lease ran out");
  BOOST_TEST(l.over());
  // Over for good: the word says 0, so the node refuses a renewal.
  BOOST_TEST(deadline->load() == 0);
  BOOST_TEST(l.over());
}

BOOST_AUTO_TEST_CASE(test_session_lease_keeps_its_deadline_alive) {
  d::session_lease l;
  std::weak_ptr<std::atomic<int64_t>> seen;
  {
    auto deadline = std::make_shared<std::atomic<int64_t>>(now_ns() + hour_ns);
    seen = deadline;
    l.set(std::move(deadline), "why");
  }
  BOOST_TEST(!seen.expired());
  BOOST_TEST(!l.over());
}

BOOST_AUTO_TEST_CASE(test_session_lease_a_device_runs_items_while_its_lease_holds) {
  for (const char* driver : {"cpu", "fake"}) {
    BOOST_TEST_CONTEXT("driver " << driver) {
      auto core = make_core(driver);
      auto deadline = std::make_shared<std::atomic<int64_t>>(now_ns() + hour_ns);
      core->life().set_lease(deadline, "the session's lease is over");
      std::atomic<int> ran{0};
      auto seq = core->push(multidev::task{.work = [&] { ++ran; }});
      BOOST_TEST(multidev::to_string(settle(*core, seq)) == "done");
      BOOST_TEST(ran.load() == 1);
      core->shutdown();
    }
  }
}

BOOST_AUTO_TEST_CASE(test_session_lease_a_device_past_its_lease_cancels_what_it_has_not_started) {
  for (const char* driver : {"cpu", "fake"}) {
    BOOST_TEST_CONTEXT("driver " << driver) {
      auto core = make_core(driver);
      auto deadline = std::make_shared<std::atomic<int64_t>>(now_ns() - 1);
      core->life().set_lease(deadline, "the session's lease is over");
      std::atomic<int> ran{0};
      auto seq = core->push(multidev::task{.work = [&] { ++ran; }});
      BOOST_TEST(multidev::to_string(settle(*core, seq)) == "cancelled");
      BOOST_TEST(ran.load() == 0);
      auto cause = core->outcomes().cause_of(seq);
      BOOST_TEST_REQUIRE(cause != nullptr);
      BOOST_TEST(cause->message == "the session's lease is over");
      BOOST_TEST(deadline->load() == 0);
      core->shutdown();
    }
  }
}
