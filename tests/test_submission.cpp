// A device's submission path through its own interface (actors/core/
// submission.hpp, issue 40 point 1): what a wait on another device appends
// or refuses (`push_wait`), the seq check (`check_scheduled`), and the
// flow control of a producer that must not block (`has_room`,
// `notify_when_room`). Device cores on the cpu driver, no actor, no backend.
#define BOOST_TEST_MODULE test_submission
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "actors/core/device_core.hpp"
#include "devices/registry.hpp"
#include "test_support.hpp"

namespace {
namespace d = multidev::detail;

/// A device core named `name` on the cpu driver, with a queue of `capacity`.
std::shared_ptr<d::device_core> make_core(const char* name, std::size_t capacity = 64) {
  auto drv = d::find_driver("cpu")(d::driver_params{.num_devices = 1});
  return std::make_shared<d::device_core>(name, 0, drv, capacity,
                                          std::make_shared<d::result_board>());
}

/// Syncs on `seq` for at most 10 s.
void settle(d::device_core& core, uint64_t seq) {
  core.events().sync_until(seq, std::chrono::steady_clock::now() + std::chrono::seconds(10));
}

/// The message of the `std::invalid_argument` `f` throws, or "no throw".
template <class F>
std::string refusal_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no throw";
}

} // namespace

BOOST_AUTO_TEST_CASE(test_submission_a_wait_is_queued_only_when_there_is_something_to_wait_for) {
  auto a = make_core("sub_a");
  auto b = make_core("sub_b");
  d::work_submission& sub = *a;
  // On itself, or on a seq already done: nothing to wait for, nothing queued.
  auto done = b->push(multidev::task{.work = [] {}});
  settle(*b, done);
  BOOST_TEST(!sub.push_wait(a, done));
  BOOST_TEST(!sub.push_wait(b, done));
  BOOST_TEST(a->queue().scheduled() == 0u);
  // On a seq b never scheduled: refused, naming b, nothing queued.
  auto says = refusal_of([&] { sub.push_wait(b, done + 1); });
  BOOST_TEST(says.find("seq 2 was never scheduled on sub_b") != std::string::npos, says);
  BOOST_TEST(a->queue().scheduled() == 0u);
  // On b's next item, held: a gate queued on a, which opens as b's item ends.
  auto release = std::make_shared<test_support::latch_gate>();
  auto held = b->push(multidev::task{.work = [release] { release->wait_in_task(); }});
  BOOST_TEST(sub.push_wait(b, held));
  BOOST_TEST(a->queue().scheduled() == 1u);
  BOOST_TEST(a->inspect().pending_gates().size() == 1u);
  auto after = a->push(multidev::task{.work = [] {}});
  release->open();
  settle(*a, after);
  BOOST_TEST(a->outcomes().is_done(after));
  BOOST_TEST(!release->timed_out());
}

BOOST_AUTO_TEST_CASE(test_submission_check_scheduled_names_the_device_and_the_seq) {
  auto a = make_core("sub_c");
  const d::work_submission& sub = *a;
  auto seq = a->push(multidev::task{.work = [] {}});
  BOOST_CHECK_NO_THROW(sub.check_scheduled(seq, "when_done"));
  auto says = refusal_of([&] { sub.check_scheduled(seq + 1, "when_done"); });
  BOOST_TEST(says == "when_done: seq 2 was never scheduled on sub_c (it has scheduled 1 so far)",
             says);
  settle(*a, seq);
}

BOOST_AUTO_TEST_CASE(test_submission_a_producer_that_must_not_block_is_called_back_for_room) {
  // A queue of 1 entry, its runner held in its first item: the second push
  // (may not wait) fills it; the callback comes once the runner takes it.
  auto a = make_core("sub_d", 1);
  d::work_submission& sub = *a;
  auto release = std::make_shared<test_support::latch_gate>();
  a->push(multidev::task{.work = [release] { release->wait_in_task(); }});
  BOOST_REQUIRE(test_support::eventually([&] { return sub.has_room(); }));
  auto second = sub.push(multidev::task{.work = [] {}}, false);
  BOOST_TEST(!sub.has_room());
  std::atomic<int> called{0};
  BOOST_TEST(sub.notify_when_room([&called] { ++called; }));
  BOOST_TEST(called.load() == 0);
  release->open();
  settle(*a, second);
  BOOST_TEST(test_support::eventually([&] { return called.load() == 1; }));
  BOOST_TEST(sub.has_room());
  BOOST_TEST(!sub.notify_when_room([&called] { ++called; })); // room: not stored
}
