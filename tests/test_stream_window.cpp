// The flight window on its own (actors/core/stream_window.hpp, issue 40
// point 1): an asynchronous driver's items between their start and their
// resolution. A stream that only records what is submitted stands in for
// the driver's: this thread runs the work and reports it, in whatever
// order a case needs, and an owner that logs each verdict stands in for the
// device (it resolves into an outcome board, as the device does).
#define BOOST_TEST_MODULE test_stream_window
#include <boost/test/unit_test.hpp>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "actors/core/gate.hpp"
#include "actors/core/outcome_board.hpp"
#include "actors/core/stream_window.hpp"

namespace {
namespace d = multidev::detail;
using verdict = d::stream_window::verdict;

/// Keeps what is submitted; `refuse` makes the next `submit` throw.
struct recording_stream final : d::stream {
  std::vector<std::pair<uint64_t, std::function<void()>>>* submitted;
  bool* refuse;
  recording_stream(std::vector<std::pair<uint64_t, std::function<void()>>>* s, bool* r)
    : submitted(s), refuse(r) {}
  void submit(uint64_t seq, std::function<void()> work) override {
    if (*refuse)
      throw std::runtime_error("stream refused");
    submitted->emplace_back(seq, std::move(work));
  }
};

/// The device's part: logs each verdict and resolves the seq on the board.
struct logging_owner final : d::stream_window::owner {
  d::outcome_board board{"dev"};
  std::vector<std::pair<uint64_t, verdict>> log;
  std::vector<std::string> errors; // a failed task's error, as it resolved
  int wakes = 0;
  void resolve_flight(d::stream_window::flight& f, verdict v) noexcept override {
    log.emplace_back(f.seq, v);
    if (v == verdict::failed && f.error) {
      try {
        std::rethrow_exception(f.error);
      } catch (const std::exception& e) {
        errors.emplace_back(e.what());
      }
    }
    if (v != verdict::done)
      board.record_bad(f.seq, std::make_shared<multidev::failure>());
    board.publish(f.seq);
  }
  void window_changed() noexcept override { ++wakes; }
};

struct fixture {
  logging_owner owner;
  std::vector<std::pair<uint64_t, std::function<void()>>> submitted;
  bool refuse = false;
  d::stream_window w{owner, owner.board, nullptr, nullptr};
  explicit fixture(std::size_t size = 4) {
    w.attach(std::make_unique<recording_stream>(&submitted, &refuse), size);
  }
  /// Runs the work submitted as `seq` on "the stream" and reports it.
  void run_and_report(uint64_t seq) {
    for (auto& [s, work] : submitted)
      if (s == seq) {
        work();
        w.sink().completed(seq, nullptr);
        return;
      }
    BOOST_FAIL("seq " << seq << " was not submitted");
  }
  void start_task(std::function<void()> work) {
    w.start(d::item{std::move(work), {}}, 0, false);
  }
};

d::item gate_item(const std::shared_ptr<d::gate>& g) {
  auto x = std::make_unique<d::item_extra>();
  x->g = g;
  return d::item{{}, d::extra_ptr{std::move(x)}};
}

using log_t = std::vector<std::pair<uint64_t, verdict>>;
} // namespace

BOOST_AUTO_TEST_CASE(test_stream_window_without_a_stream_stays_synchronous) {
  logging_owner owner;
  d::stream_window w{owner, owner.board, nullptr, nullptr};
  w.attach(nullptr, 8);
  BOOST_TEST(!w.async());
  BOOST_TEST(w.size() == 1u);
}

BOOST_AUTO_TEST_CASE(test_stream_window_resolves_in_seq_order_whatever_the_report_order) {
  fixture f;
  BOOST_TEST(f.w.async());
  for (int i = 0; i < 3; ++i)
    f.start_task([] {});
  BOOST_TEST(f.w.started() == 3u);
  BOOST_TEST(f.submitted.size() == 3u);
  // Reported late to early: nothing resolves until the oldest is reported.
  f.run_and_report(3);
  f.run_and_report(2);
  BOOST_TEST(f.owner.log.empty());
  BOOST_TEST(f.w.retired() == 0u);
  BOOST_TEST(!f.w.retirable());
  f.run_and_report(1);
  // The reporting thread resolved all three, in order.
  BOOST_TEST((f.owner.log == log_t{{1, verdict::done}, {2, verdict::done}, {3, verdict::done}}));
  BOOST_TEST(f.w.retired() == 3u);
  BOOST_TEST(f.w.idle());
  BOOST_TEST(f.owner.wakes == 3);
}

BOOST_AUTO_TEST_CASE(test_stream_window_has_room_for_size_items_and_honours_the_barrier) {
  fixture f{2};
  BOOST_TEST(f.w.has_room(0));
  f.start_task([] {});
  f.start_task([] {});
  // Two in flight in a window of two: the next must wait for a slot.
  BOOST_TEST(!f.w.has_room(0));
  f.run_and_report(1);
  BOOST_TEST(f.w.has_room(0));
  // A barrier at seq 2 (a failed wait behind it): no room until 2 resolved.
  BOOST_TEST(!f.w.has_room(2));
  f.run_and_report(2);
  BOOST_TEST(f.w.has_room(2));
  // Slots are reused: seq 3 goes where seq 1 was.
  f.start_task([] {});
  f.run_and_report(3);
  BOOST_TEST((f.owner.log.back() == std::pair<uint64_t, verdict>{3, verdict::done}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_the_stream_skips_what_follows_a_thrower) {
  fixture f;
  int ran = 0;
  f.start_task([] { throw std::runtime_error("kernel failed"); });
  f.start_task([&] { ++ran; });
  // The stream takes up 2 after 1 threw and before 1 resolved: it skips it.
  f.submitted[0].second();
  f.run_and_report(2);
  BOOST_TEST(ran == 0);
  BOOST_TEST(f.owner.log.empty());
  f.w.sink().completed(1, nullptr);
  BOOST_TEST((f.owner.log == log_t{{1, verdict::failed}, {2, verdict::dropped}}));
  BOOST_TEST((f.owner.errors == std::vector<std::string>{"kernel failed"}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_what_ran_behind_a_failure_is_never_done) {
  fixture f;
  int ran = 0;
  f.start_task([] {});
  f.start_task([&] { ++ran; });
  f.start_task([&] { ++ran; });
  // 1 and 2 ran; the device reports 1 failed (a fault found after its
  // launch) once 2 was reported done: 2 ran, but behind a failure.
  f.submitted[0].second();
  f.run_and_report(2);
  BOOST_TEST(ran == 1);
  f.w.sink().completed(1, std::make_exception_ptr(std::runtime_error("device fault")));
  BOOST_TEST((f.owner.log == log_t{{1, verdict::failed}, {2, verdict::dropped}}));
  BOOST_TEST((f.owner.errors == std::vector<std::string>{"device fault"}));
  // 3 was submitted before the failure resolved: dropped too, though it runs.
  f.run_and_report(3);
  BOOST_TEST((f.owner.log.back() == std::pair<uint64_t, verdict>{3, verdict::dropped}));
  // What starts after the failure resolved is judged on its own.
  f.start_task([] {});
  f.run_and_report(4);
  BOOST_TEST((f.owner.log.back() == std::pair<uint64_t, verdict>{4, verdict::done}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_dropped_items_are_not_run) {
  fixture f;
  int ran = 0;
  // Dropped before it starts: settled at once, never submitted.
  f.owner.board.drop_through(1, std::make_shared<multidev::failure>());
  f.start_task([&] { ++ran; });
  BOOST_TEST(f.submitted.empty());
  BOOST_TEST(f.w.retirable());
  f.w.retire_ready();
  BOOST_TEST((f.owner.log == log_t{{1, verdict::dropped}}));
  // Dropped after it was submitted: the stream skips its work.
  f.start_task([&] { ++ran; });
  BOOST_TEST(f.submitted.size() == 1u);
  f.owner.board.drop_through(2, std::make_shared<multidev::failure>());
  f.run_and_report(2);
  BOOST_TEST(ran == 0);
  BOOST_TEST((f.owner.log == log_t{{1, verdict::dropped}, {2, verdict::dropped}}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_a_refused_submission_fails_its_item) {
  fixture f;
  f.refuse = true;
  f.start_task([] {});
  BOOST_TEST(f.w.started() == 1u);
  BOOST_TEST(f.w.retirable());
  f.w.retire_ready();
  BOOST_TEST((f.owner.log == log_t{{1, verdict::failed}}));
  BOOST_TEST((f.owner.errors == std::vector<std::string>{"stream refused"}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_a_gate_on_the_device_waits_until_it_ends) {
  fixture f;
  auto g = std::make_shared<d::gate>();
  f.w.start(gate_item(g), 0, true); // ordered on the device: gated
  f.start_task([] {});
  f.run_and_report(2); // the stream ran what followed it
  // The gate holds the head of the window until it opens.
  BOOST_TEST(!f.w.retirable());
  BOOST_TEST(!f.w.settle_gated());
  BOOST_TEST(!f.w.resolve_settled());
  BOOST_TEST(f.owner.log.empty());
  g->state.store(d::gate::open);
  BOOST_TEST(f.w.resolve_settled());
  BOOST_TEST((f.owner.log == log_t{{1, verdict::done}, {2, verdict::done}}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_a_failed_gate_fails_and_drops_what_started_behind_it) {
  fixture f;
  auto g = std::make_shared<d::gate>();
  f.w.start(gate_item(g), 0, true);
  f.start_task([] {});
  f.run_and_report(2);
  g->state.store(d::gate::failed);
  BOOST_TEST(f.w.settle_gated());
  f.w.retire_ready();
  BOOST_TEST((f.owner.log == log_t{{1, verdict::failed}, {2, verdict::dropped}}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_a_gate_the_runner_saw_end_resolves_at_once) {
  fixture f;
  auto g = std::make_shared<d::gate>();
  g->state.store(d::gate::open);
  f.w.start(gate_item(g), 0, false);
  BOOST_TEST(f.submitted.empty());
  BOOST_TEST(f.w.retirable());
  f.w.retire_ready();
  BOOST_TEST((f.owner.log == log_t{{1, verdict::done}}));
}

BOOST_AUTO_TEST_CASE(test_stream_window_reask_is_taken_once) {
  fixture f;
  BOOST_TEST(!f.w.take_reask());
  f.w.ask_again();
  BOOST_TEST(f.w.take_reask());
  BOOST_TEST(!f.w.take_reask());
}
