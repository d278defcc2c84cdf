// The outcome board of a device, through its own interface (white box, issue
// 40 point 4): what a seq became (done, failed, cancelled) and why, the
// drops and their causes, the out-of-memory stand-ins, and waiters that are
// told exactly once -- without a device, a runner or a queue.
//
// This binary replaces the global operator new (failing_alloc.hpp): an
// armed countdown on one thread makes the k-th allocation from now on that
// thread throw bad_alloc.
#define BOOST_TEST_MODULE outcome_board
#pragma GCC diagnostic ignored "-Wmismatched-new-delete" // see failing_alloc.hpp
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "actors/core/outcome_board.hpp"

#include "failing_alloc.hpp"

namespace multidev {
// Found by Boost.Test through ADL: a failed check names the states.
std::ostream& boost_test_print_type(std::ostream& os, event_state s) {
  return os << to_string(s);
}
} // namespace multidev

using multidev::event_state;
using multidev::failure;
using multidev::detail::outcome_board;
using test_support::alloc_countdown;

namespace {

using failure_ptr = outcome_board::failure_ptr;

failure_ptr task_failed(uint64_t seq, std::string message) {
  return std::make_shared<const failure>(
    failure{failure::kind::failed, "cpu:0:1", "step", seq, std::move(message), {}});
}

failure_ptr cancelled(std::string why) {
  return std::make_shared<const failure>(
    failure{failure::kind::cancelled, "cpu:0:1", {}, 0, std::move(why), {}});
}

/// Counts the calls a resolver gets, and the cause of the last one.
struct calls {
  int done = 0;
  int failed = 0;
  std::string last_message;
  outcome_board::resolver resolver() {
    return [this](const failure* cause) {
      if (cause) {
        ++failed;
        last_message = cause->message;
      } else {
        ++done;
      }
    };
  }
  int total() const { return done + failed; }
};

/// What the device does as it resolves `seq`: publish, then fire the waiters
/// due (under the lock, out of the list; called without it).
void resolve_and_fire(outcome_board& b, uint64_t seq) {
  if (!b.publish(seq))
    return;
  outcome_board::waiter_list due;
  {
    std::lock_guard guard{b.waiters_mutex()};
    b.take_due_locked(seq, false, due);
    b.set_min_waiter_locked(b.first_waiter_locked(), true);
  }
  auto resolved = b.finished();
  failure_ptr hold;
  for (auto& [s, r] : due)
    outcome_board::invoke(r, b.outcome_for(s, resolved, nullptr, hold));
}

/// What the device does to register a waiter: stored while `seq` is
/// pending, fired by whichever side sees the other; told at once otherwise.
void register_waiter(outcome_board& b, uint64_t seq, outcome_board::resolver r) {
  {
    std::unique_lock guard{b.waiters_mutex()};
    if (b.accepts_locked(seq)) {
      b.add_locked(seq, std::move(r));
      b.set_min_waiter_locked(b.first_waiter_locked(), false);
      auto p = b.progress_now();
      guard.unlock();
      if (p >= seq) {
        outcome_board::waiter_list due;
        {
          std::lock_guard again{b.waiters_mutex()};
          b.take_due_locked(p, false, due);
          b.set_min_waiter_locked(b.first_waiter_locked(), true);
        }
        failure_ptr hold;
        for (auto& [s, w] : due)
          outcome_board::invoke(w, b.outcome_for(s, p, nullptr, hold));
      }
      return;
    }
  }
  failure_ptr hold = b.cause_of(seq);
  outcome_board::invoke(r, hold.get());
}

} // namespace

BOOST_AUTO_TEST_CASE(test_outcome_board_a_new_board_has_everything_pending) {
  outcome_board b{"cpu:0:1"};
  BOOST_TEST(b.finished() == 0u);
  BOOST_TEST(!b.is_done(1));
  BOOST_TEST(!b.is_failed(1));
  BOOST_TEST(b.state(1) == event_state::pending);
  BOOST_TEST(!b.cause_of(1));
  BOOST_TEST(b.dropped_upto() == 0u);
}

BOOST_AUTO_TEST_CASE(test_outcome_board_published_seqs_are_done_and_later_ones_pending) {
  outcome_board b{"cpu:0:1"};
  b.publish(1);
  b.publish(2);
  BOOST_TEST(b.finished() == 2u);
  BOOST_TEST(b.is_done(1));
  BOOST_TEST(b.is_done(2));
  BOOST_TEST(b.state(2) == event_state::done);
  BOOST_TEST(!b.is_failed(2));
  BOOST_TEST(!b.cause_of(2));
  BOOST_TEST(!b.is_done(3));
  BOOST_TEST(b.state(3) == event_state::pending);
}

BOOST_AUTO_TEST_CASE(test_outcome_board_failed_and_cancelled_seqs_keep_their_provenance) {
  outcome_board b{"cpu:0:1"};
  auto boom = task_failed(1, "boom");
  auto stop = cancelled("stop");
  b.record_bad(1, boom);
  b.publish(1);
  b.publish(2); // done between two bad ones
  b.record_bad(3, stop);
  b.publish(3);
  b.publish(4);

  BOOST_TEST(b.state(1) == event_state::failed);
  BOOST_TEST(b.is_failed(1));
  BOOST_TEST(!b.is_done(1));
  BOOST_TEST(b.cause_of(1).get() == boom.get()); // the very failure, shared
  BOOST_TEST(b.cause_of(1)->task == "step");
  BOOST_TEST(b.cause_of(1)->message == "boom");

  // Below the last bad seq, so looked up in the table: still done.
  BOOST_TEST(b.is_done(2));
  BOOST_TEST(!b.is_failed(2));
  BOOST_TEST(b.state(2) == event_state::done);

  BOOST_TEST(b.state(3) == event_state::cancelled);
  BOOST_TEST(b.cause_of(3).get() == stop.get());
  BOOST_TEST(b.state(4) == event_state::done);
}

BOOST_AUTO_TEST_CASE(test_outcome_board_ranges_end_where_their_seqs_do) {
  // 1-3 one cause (a range), 4 done, 5-6 another cause, 7 the first cause
  // again: not joined to 1-3 across the others; 8 done, 9 that cause again:
  // not joined to 7 across the done seq.
  outcome_board b{"cpu:0:1"};
  auto first = task_failed(1, "first");
  auto second = task_failed(5, "second");
  for (uint64_t s = 1; s <= 3; ++s) {
    b.record_bad(s, first);
    b.publish(s);
  }
  b.publish(4);
  for (uint64_t s = 5; s <= 6; ++s) {
    b.record_bad(s, second);
    b.publish(s);
  }
  b.record_bad(7, first);
  b.publish(7);
  b.publish(8);
  b.record_bad(9, first);
  b.publish(9);
  for (uint64_t s = 1; s <= 3; ++s)
    BOOST_TEST(b.cause_of(s).get() == first.get(), "seq " << s);
  BOOST_TEST(!b.cause_of(4));
  BOOST_TEST(b.is_done(4));
  BOOST_TEST(b.cause_of(5).get() == second.get());
  BOOST_TEST(b.cause_of(6).get() == second.get());
  BOOST_TEST(b.cause_of(7).get() == first.get());
  BOOST_TEST(b.is_done(8));
  BOOST_TEST(!b.cause_of(8));
  BOOST_TEST(b.cause_of(9).get() == first.get());
}

BOOST_AUTO_TEST_CASE(test_outcome_board_a_missing_cause_is_the_fallback_naming_the_device) {
  outcome_board b{"cpu:0:1"};
  b.record_bad(1, nullptr);
  b.publish(1);
  BOOST_TEST(b.state(1) == event_state::failed);
  BOOST_TEST_REQUIRE(b.cause_of(1));
  BOOST_TEST(b.cause_of(1).get() == b.fallback_cause().get());
  BOOST_TEST(b.cause_of(1)->device == "cpu:0:1");
  BOOST_TEST(b.cause_of(1)->message == "task failed");
}

BOOST_AUTO_TEST_CASE(test_outcome_board_out_of_memory_a_bad_seq_never_reads_done) {
  // Recording the range needs a map node; without one the previous range
  // grows over the seq, which still resolves failed.
  outcome_board b{"cpu:0:1"};
  auto first = task_failed(1, "first");
  b.record_bad(1, first);
  b.publish(1);
  b.publish(2);
  b.publish(3);
  auto lost = task_failed(4, "lost");
  alloc_countdown = 1; // the next allocation on this thread throws
  b.record_bad(4, lost);
  bool tried = alloc_countdown == 0;
  alloc_countdown = 0;
  BOOST_TEST_REQUIRE(tried); // recording it did allocate, and failed
  b.publish(4);
  BOOST_TEST(!b.is_done(4));
  BOOST_TEST(b.is_failed(4));
  BOOST_TEST(b.state(4) == event_state::failed);
  BOOST_TEST(b.cause_of(4).get() == first.get());
  BOOST_TEST(b.cause_of(2).get() == first.get()); // the range now spans 1-4
}

BOOST_AUTO_TEST_CASE(test_outcome_board_dropped_seqs_take_the_cause_of_the_drop_covering_them) {
  outcome_board b{"cpu:0:1"};
  auto cancel = cancelled("cancel");
  auto kill = task_failed(0, "killed");
  BOOST_TEST(b.drop_through(3, cancel));
  BOOST_TEST(b.dropped_upto() == 3u);
  BOOST_TEST(!b.drop_through(2, kill)); // nothing new
  BOOST_TEST(!b.drop_through(3, kill));
  BOOST_TEST(b.dropped_upto() == 3u);
  BOOST_TEST(b.drop_through(5, kill));
  BOOST_TEST(b.dropped_upto() == 5u);
  for (uint64_t s = 1; s <= 5; ++s) {
    b.record_dropped(s);
    b.publish(s);
  }
  for (uint64_t s = 1; s <= 3; ++s) {
    BOOST_TEST(b.state(s) == event_state::cancelled, "seq " << s);
    BOOST_TEST(b.cause_of(s).get() == cancel.get(), "seq " << s);
  }
  for (uint64_t s = 4; s <= 5; ++s) {
    BOOST_TEST(b.state(s) == event_state::failed, "seq " << s);
    BOOST_TEST(b.cause_of(s).get() == kill.get(), "seq " << s);
  }
}

BOOST_AUTO_TEST_CASE(test_outcome_board_out_of_memory_a_drop_still_drops_with_the_fallback) {
  // Drops of one seq each, every one with the next allocation failing, until
  // one needs memory for its record (the list grows by blocks): that drop
  // still counts, its seq resolves with the fallback cause, and the seqs of
  // the drops before it keep theirs.
  outcome_board b{"cpu:0:1"};
  auto cancel = cancelled("cancel");
  uint64_t failed_at = 0;
  for (uint64_t s = 1; s <= 1000 && failed_at == 0; ++s) {
    alloc_countdown = 1;
    bool dropped = b.drop_through(s, cancel);
    if (alloc_countdown == 0)
      failed_at = s; // this one's record could not be stored
    alloc_countdown = 0;
    BOOST_TEST_REQUIRE(dropped);
  }
  BOOST_TEST_REQUIRE(failed_at != 0u);
  BOOST_TEST(b.dropped_upto() == failed_at);
  for (uint64_t s = 1; s <= failed_at; ++s) {
    b.record_dropped(s);
    b.publish(s);
  }
  for (uint64_t s = 1; s < failed_at; ++s)
    BOOST_TEST(b.cause_of(s).get() == cancel.get(), "seq " << s);
  BOOST_TEST(b.state(failed_at) == event_state::failed);
  BOOST_TEST(b.cause_of(failed_at).get() == b.fallback_cause().get());
}

BOOST_AUTO_TEST_CASE(test_outcome_board_publish_reports_due_waiters_only) {
  outcome_board b{"cpu:0:1"};
  BOOST_TEST(!b.publish(1)); // nobody waits
  calls c;
  register_waiter(b, 3, c.resolver());
  BOOST_TEST(!b.publish(2));
  BOOST_TEST(c.total() == 0);
  BOOST_TEST(b.publish(3));
}

BOOST_AUTO_TEST_CASE(test_outcome_board_waiters_are_told_once_with_their_own_outcome) {
  outcome_board b{"cpu:0:1"};
  calls one, two, three, later;
  register_waiter(b, 1, one.resolver());
  register_waiter(b, 2, two.resolver());
  register_waiter(b, 3, three.resolver());
  register_waiter(b, 3, later.resolver());
  {
    std::lock_guard guard{b.waiters_mutex()};
    BOOST_TEST(b.waiter_count_locked() == 4u);
    BOOST_TEST(b.first_waiter_locked() == 1u);
  }
  resolve_and_fire(b, 1);
  b.record_bad(2, task_failed(2, "boom"));
  resolve_and_fire(b, 2);
  BOOST_TEST(one.done == 1);
  BOOST_TEST(two.failed == 1);
  BOOST_TEST(two.last_message == "boom");
  BOOST_TEST(three.total() == 0);
  resolve_and_fire(b, 3);
  resolve_and_fire(b, 4);
  BOOST_TEST(one.total() == 1);
  BOOST_TEST(two.total() == 1);
  BOOST_TEST(three.done == 1);
  BOOST_TEST(three.total() == 1);
  BOOST_TEST(later.total() == 1);
  std::lock_guard guard{b.waiters_mutex()};
  BOOST_TEST(b.waiter_count_locked() == 0u);
  BOOST_TEST(b.first_waiter_locked() == UINT64_MAX);
}

BOOST_AUTO_TEST_CASE(test_outcome_board_a_waiter_of_a_resolved_seq_is_told_at_once) {
  outcome_board b{"cpu:0:1"};
  b.record_bad(1, cancelled("gone"));
  b.publish(1);
  b.publish(2);
  calls bad, good;
  register_waiter(b, 1, bad.resolver());
  register_waiter(b, 2, good.resolver());
  BOOST_TEST(bad.failed == 1);
  BOOST_TEST(bad.last_message == "gone");
  BOOST_TEST(good.done == 1);
  std::lock_guard guard{b.waiters_mutex()};
  BOOST_TEST(b.waiter_count_locked() == 0u);
}

BOOST_AUTO_TEST_CASE(test_outcome_board_a_closed_board_stores_no_waiter) {
  outcome_board b{"cpu:0:1"};
  std::lock_guard guard{b.waiters_mutex()};
  BOOST_TEST(b.accepts_locked(1));
  b.close_locked();
  BOOST_TEST(!b.accepts_locked(1));
}

BOOST_AUTO_TEST_CASE(test_outcome_board_a_firing_at_shutdown_tells_unresolved_seqs_beyond) {
  outcome_board b{"cpu:0:1"};
  calls done, pending;
  register_waiter(b, 1, done.resolver());
  register_waiter(b, 5, pending.resolver());
  b.publish(1);
  outcome_board::waiter_list due;
  {
    std::lock_guard guard{b.waiters_mutex()};
    b.take_due_locked(1, true, due); // all: the device shut down
    b.set_min_waiter_locked(b.first_waiter_locked(), true);
  }
  BOOST_TEST(due.size() == 2u);
  const failure shut{failure::kind::failed, "cpu:0:1", {}, 0, "device is shut down", {}};
  failure_ptr hold;
  for (auto& [s, r] : due)
    outcome_board::invoke(r, b.outcome_for(s, b.finished(), &shut, hold));
  BOOST_TEST(done.done == 1); // resolved before: done, not shut down
  BOOST_TEST(pending.failed == 1);
  BOOST_TEST(pending.last_message == "device is shut down");
}

BOOST_AUTO_TEST_CASE(test_outcome_board_dropping_waiters_leaves_them_uncalled) {
  outcome_board b{"cpu:0:1"};
  calls a, c, d;
  register_waiter(b, 2, a.resolver());
  register_waiter(b, 2, c.resolver());
  register_waiter(b, 3, d.resolver());
  auto any = [](const outcome_board::resolver&) { return true; };
  auto none = [](const outcome_board::resolver&) { return false; };
  {
    std::lock_guard guard{b.waiters_mutex()};
    BOOST_TEST(!b.drop_waiter_locked(2, none));
    BOOST_TEST(!b.drop_waiter_locked(4, any)); // nobody waits for 4
    BOOST_TEST(b.drop_waiter_locked(2, any));  // one of the two
    BOOST_TEST(b.waiter_count_locked() == 2u);
    BOOST_TEST(b.drop_waiters_locked(none) == 0u);
    BOOST_TEST(b.drop_waiters_locked([](const outcome_board::resolver&) {
      static int n = 0;
      return n++ == 0; // the first listed (seq 2) only
    }) == 1u);
    BOOST_TEST(b.waiter_count_locked() == 1u);
    b.set_min_waiter_locked(b.first_waiter_locked(), true);
    BOOST_TEST(b.first_waiter_locked() == 3u);
  }
  resolve_and_fire(b, 2);
  resolve_and_fire(b, 3);
  BOOST_TEST(a.total() + c.total() == 0);
  BOOST_TEST(d.done == 1);
}

BOOST_AUTO_TEST_CASE(test_outcome_board_a_throwing_waiter_does_not_stop_the_others) {
  outcome_board b{"cpu:0:1"};
  calls after;
  register_waiter(b, 1, [](const failure*) { throw std::runtime_error{"waiter's own"}; });
  register_waiter(b, 1, after.resolver());
  resolve_and_fire(b, 1);
  BOOST_TEST(after.done == 1);
}

BOOST_AUTO_TEST_CASE(test_outcome_board_racing_registrations_are_each_told_exactly_once) {
  // One thread resolves seqs while another registers a waiter for each,
  // just ahead of or just behind the progress: whichever side sees the
  // other fires it (the store-then-load on both sides), never neither, never
  // both. Checked on this thread once both are done.
  // The resolver resolves seq s only once the registration of s has begun,
  // so the two meet at every seq.
  constexpr uint64_t n = 100000;
  outcome_board b{"cpu:0:1"};
  std::vector<std::atomic<int>> told(n + 1);
  std::atomic<uint64_t> registering{0};
  std::thread resolver{[&] {
    for (uint64_t s = 1; s <= n; ++s) {
      while (registering.load() < s)
        std::this_thread::yield(); // the registrar always moves on
      resolve_and_fire(b, s);
    }
  }};
  for (uint64_t s = 1; s <= n; ++s) {
    registering.store(s);
    register_waiter(b, s, [&told, s](const failure*) { told[s].fetch_add(1); });
  }
  resolver.join();
  int never = 0, twice = 0;
  for (uint64_t s = 1; s <= n; ++s) {
    auto t = told[s].load();
    never += t == 0;
    twice += t > 1;
  }
  BOOST_TEST(never == 0);
  BOOST_TEST(twice == 0);
}
