// A device's life and failure state on its own (actors/core/device_life.hpp,
// issue 40): the transitions of its state table (a poison fails it, recover
// brings it back once, a kill and a stop are for good), what a refused push
// says, cancelling, the lease, and the waits cut as it stops. No runner and
// no device core: a queue, an outcome board and a gate list stand in, and
// this thread plays the runner where a transition is the runner's.
#define BOOST_TEST_MODULE test_device_life
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "actors/core/device_life.hpp"
#include "actors/core/gate.hpp"
#include "actors/core/gate_list.hpp"
#include "actors/core/item.hpp"
#include "actors/core/outcome_board.hpp"
#include "actors/core/work_queue.hpp"
#include "multidev/types.hpp"

namespace {

namespace d = multidev::detail;
using multidev::device_error;

bool never_waits() noexcept {
  return true;
}

/// The parts a device_life changes, as a device core holds them.
struct parts {
  std::string name{"dev0"};
  d::work_queue<d::item> queue{64, never_waits};
  d::outcome_board outcomes{name};
  d::gate_list gates;
  d::device_life life{name, queue, outcomes, gates};

  /// Appends an empty item as a push does (refused as the life says).
  uint64_t push() {
    return queue.push(
      false, std::function<void()>{}, [](std::string&) { return d::extra_ptr{}; },
      [this] { life.throw_refusal_locked(); });
  }
  /// A poison, as the runner makes it: the device fails with `message`.
  void poison(const std::string& message) {
    auto cause = life.device_failure(message);
    std::lock_guard guard{queue.mutex()};
    life.fail_locked(cause);
    life.drop_locked(cause);
  }
  /// The message a push gets now, or "accepted".
  std::string push_says() {
    try {
      push();
      return "accepted";
    } catch (const device_error& e) {
      return e.what();
    }
  }
};

/// A pending gate listed as queued on the device (remote or on `owner`).
std::shared_ptr<d::gate> listed_gate(parts& p, bool remote) {
  auto g = std::make_shared<d::gate>();
  g->remote = remote;
  g->label = remote ? "remote seq 1" : "gone seq 1";
  std::lock_guard guard{p.outcomes.waiters_mutex()};
  p.gates.add_locked(g);
  return g;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_device_life_starts_running_and_accepts_work) {
  parts p;
  BOOST_TEST(!p.life.failed());
  BOOST_TEST(!p.life.stopping());
  BOOST_TEST(!p.life.error().has_value());
  BOOST_CHECK_NO_THROW(p.life.check());
  BOOST_CHECK_NO_THROW(p.life.throw_if_failed());
  BOOST_TEST(p.push_says() == "accepted");
  BOOST_TEST(!p.life.recover()); // not failed: nothing to recover from
}

BOOST_AUTO_TEST_CASE(test_device_life_poison_fails_until_one_recover) {
  parts p;
  auto first = p.push();
  p.poison("task 'x' failed: boom");
  BOOST_TEST(p.life.failed());
  BOOST_TEST(p.queue.failed_locked());
  BOOST_TEST(p.outcomes.dropped_upto() == first); // what was queued fails with it
  BOOST_TEST(p.life.error().value_or("") == "task 'x' failed: boom");
  BOOST_CHECK_THROW(p.life.check(), device_error);
  BOOST_CHECK_THROW(p.life.throw_if_failed(), device_error);
  BOOST_TEST(p.push_says() == "dev0: task 'x' failed: boom");
  BOOST_TEST(p.life.recover());
  BOOST_TEST(!p.life.failed());
  BOOST_TEST(!p.queue.failed_locked());
  BOOST_TEST(!p.life.error().has_value());
  BOOST_TEST(p.push_says() == "accepted");
  BOOST_TEST(!p.life.recover()); // once
}

BOOST_AUTO_TEST_CASE(test_device_life_kill_is_for_good_and_keeps_its_cause) {
  parts p;
  auto queued = p.push();
  p.life.kill("the actor exited");
  BOOST_TEST(p.life.failed());
  BOOST_TEST(p.outcomes.dropped_upto() == queued);
  BOOST_TEST(p.push_says() == "dev0: killed: the actor exited; no new work is accepted");
  // A poison of a killed device (its last item failing) keeps the kill's cause.
  p.poison("task 'y' failed");
  BOOST_TEST(p.life.error().value_or("") == "killed: the actor exited");
  BOOST_TEST(!p.life.recover());
  BOOST_TEST(p.life.failed());
  // Killing again changes nothing.
  p.life.kill("again");
  BOOST_TEST(p.life.error().value_or("") == "killed: the actor exited");
}

BOOST_AUTO_TEST_CASE(test_device_life_a_stopped_device_does_not_recover) {
  parts p;
  p.poison("boom");
  p.life.request_stop();
  BOOST_TEST(p.life.stopping());
  BOOST_TEST(!p.life.recover());
  BOOST_TEST(p.life.failed());
  parts q;
  q.life.request_stop();
  BOOST_TEST(q.life.stopping());
  BOOST_TEST(!q.life.failed());
  BOOST_TEST(q.push_says() == "dev0: device is shut down; no new work is accepted");
}

BOOST_AUTO_TEST_CASE(test_device_life_cancel_drops_what_is_queued_and_stays_usable) {
  parts p;
  BOOST_TEST(p.life.cancel("nothing yet") == 0u);
  p.push();
  auto last = p.push();
  BOOST_TEST(p.life.cancel("by the test") == last);
  BOOST_TEST(p.outcomes.dropped_upto() == last);
  BOOST_TEST(p.life.cancel() == 0u); // nothing new since
  BOOST_TEST(!p.life.failed());
  BOOST_TEST(p.push_says() == "accepted");
}

BOOST_AUTO_TEST_CASE(test_device_life_lease_cancels_once_over_and_for_good) {
  parts p;
  p.life.check_lease(); // no lease: nothing happens
  auto queued = p.push();
  auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now().time_since_epoch())
                  .count();
  auto deadline = std::make_shared<std::atomic<int64_t>>(now_ns + int64_t{3600} * 1000000000);
  p.life.set_lease(deadline, "the lease is over");
  p.life.check_lease();
  BOOST_TEST(p.outcomes.dropped_upto() == 0u); // an hour left
  deadline->store(now_ns - 1);
  p.life.check_lease();
  BOOST_TEST(p.outcomes.dropped_upto() == queued);
  BOOST_TEST(deadline->load() == 0); // over for good: a renewal is refused
  BOOST_TEST(!p.life.failed());      // cancelled, not failed
}

BOOST_AUTO_TEST_CASE(test_device_life_stop_cuts_remote_and_unanswerable_waits) {
  parts p;
  auto remote = listed_gate(p, true);
  auto orphan = listed_gate(p, false); // a local wait whose owner is gone
  p.life.request_stop();               // cancels the remote waits
  BOOST_TEST(remote->state.load() == int{d::gate::failed});
  BOOST_REQUIRE(remote->cause);
  BOOST_TEST(remote->cause->message == "the wait was cancelled at shutdown");
  BOOST_TEST(orphan->state.load() == int{d::gate::pending});
  p.life.cancel_unanswerable_waits();
  BOOST_TEST(orphan->state.load() == int{d::gate::failed});
  BOOST_REQUIRE(orphan->cause);
  BOOST_TEST(orphan->cause->device == "gone seq 1");
}
