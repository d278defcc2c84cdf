// The work queue on its own (actors/core/work_queue.hpp, issue 40 point 4):
// appending and taking, backpressure (a full queue holds a producer back,
// a take frees it, a refusal turns it away), flow control for producers
// that must not block, and the runner's doorbell. No runner thread and no
// device: this thread is the runner, and helper threads are producers or a
// sleeping runner. Every wait is on state, bounded so that a failure fails
// instead of hanging.
#define BOOST_TEST_MODULE test_work_queue
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/core/work_queue.hpp"

namespace {

namespace d = multidev::detail;

/// An entry: a closure and an int for its extra; a negative extra is
/// flagged (as a device's orders and waits are).
struct entry {
  std::function<void()> work;
  int extra = 0;
  entry() = default;
  entry(std::function<void()> w, int x) : work(std::move(w)), extra(x) {}
  static bool flags(int x) noexcept { return x < 0; }
};
using queue = d::work_queue<entry>;

// Whether the calling thread is a "runner" that must never wait for room,
// and how many times a full queue asked (a producer about to wait asks
// first, under the queue's lock).
thread_local bool is_runner = false;
std::atomic<int> full_asks{0};
bool never_waits() noexcept {
  full_asks.fetch_add(1);
  return is_runner;
}

struct refused : std::runtime_error {
  refused() : std::runtime_error("refused") {}
};

uint64_t push(queue& q, int extra = 0, bool may_wait = true, std::string text = {}) {
  return q.push(
    may_wait, std::function<void()>{},
    [&](std::string& t) {
      t += text;
      return extra;
    },
    [] { throw refused{}; });
}

/// Polls `pred` for up to 10 s; whether it held.
template <class Pred>
bool eventually(Pred pred) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until)
      return false;
    std::this_thread::yield();
  }
  return true;
}

struct fresh {
  fresh() { full_asks = 0; }
};

} // namespace

BOOST_FIXTURE_TEST_CASE(test_work_queue_take_moves_every_entry_in_seq_order, fresh) {
  queue q{8, never_waits};
  BOOST_TEST(push(q, 1, true, "a") == 1u);
  BOOST_TEST(push(q, 2, true, "bc") == 2u);
  BOOST_TEST(push(q, 3) == 3u);
  BOOST_TEST(q.scheduled() == 3u);
  BOOST_TEST(q.untaken() == 3u);
  std::vector<entry> batch;
  std::string text;
  auto t = q.take(batch, text);
  BOOST_TEST(t.took);
  BOOST_TEST(!t.flagged); // no negative extra
  BOOST_TEST(!t.wants_room);
  BOOST_TEST_REQUIRE(batch.size() == 3u);
  BOOST_TEST(batch[0].extra == 1);
  BOOST_TEST(batch[2].extra == 3);
  BOOST_TEST(text == "abc");
  BOOST_TEST(q.untaken() == 0u);
  BOOST_TEST(!q.has_untaken());
  // Empty: nothing taken, the batch left as it was.
  std::vector<entry> again;
  BOOST_TEST(!q.take(again, text).took);
  BOOST_TEST(again.empty());
  // The next batch's text starts afresh.
  push(q, -1, true, "d");
  batch.clear();
  t = q.take(batch, text);
  BOOST_TEST(text == "d");
  BOOST_TEST(t.flagged); // a flagged entry, and the count starts afresh
  push(q, 5);
  batch.clear();
  BOOST_TEST(!q.take(batch, text).flagged);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_a_full_queue_holds_a_producer_until_a_take, fresh) {
  queue q{2, never_waits};
  push(q);
  push(q);
  BOOST_TEST(!q.has_room());
  BOOST_TEST(full_asks == 0); // not full before this push: nothing asked
  std::atomic<uint64_t> seq{0};
  std::thread producer([&] { seq = push(q, 7); });
  // The producer found the queue full (it asks `never_waits` under the
  // lock, then waits on the room condition, which releases the lock).
  bool asked = eventually([&] { return full_asks.load() >= 1; });
  BOOST_TEST_REQUIRE(asked);
  // Held back: its entry is not appended while the queue is full.
  BOOST_TEST(q.scheduled() == 2u);
  BOOST_TEST(seq == 0u);
  // The take (which needs the lock the producer gave up to wait) frees it.
  std::vector<entry> batch;
  std::string text;
  BOOST_TEST(q.take(batch, text).took);
  producer.join();
  BOOST_TEST(seq == 3u);
  BOOST_TEST(q.scheduled() == 3u);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_runners_and_non_waiting_pushes_go_past_capacity, fresh) {
  queue q{1, never_waits};
  push(q);
  BOOST_TEST(push(q, 0, false) == 2u); // may not wait: appended anyway
  is_runner = true;
  BOOST_TEST(push(q) == 3u); // a runner never waits
  q.wait_for_room();         // nor here
  is_runner = false;
  BOOST_TEST(q.untaken() == 3u);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_a_refusal_turns_away_a_waiting_producer, fresh) {
  queue q{1, never_waits};
  push(q);
  std::atomic<int> outcome{0}; // 1: refused, 2: appended
  std::thread producer([&] {
    try {
      push(q);
      outcome = 2;
    } catch (const refused&) {
      outcome = 1;
    }
  });
  bool asked = eventually([&] { return full_asks.load() >= 1; });
  BOOST_TEST_REQUIRE(asked);
  {
    std::lock_guard guard{q.mutex()};
    q.refuse_locked(false, true); // failed
  }
  producer.join();
  BOOST_TEST(outcome == 1);
  BOOST_TEST(q.scheduled() == 1u);
  BOOST_TEST(q.has_room()); // a push fails at once: it does not wait
  BOOST_CHECK_THROW(push(q, 0, false), refused);
  // A failure lasts until accepted again; a stop for good.
  {
    std::lock_guard guard{q.mutex()};
    q.accept_again_locked();
  }
  BOOST_TEST(push(q, 0, false) == 2u);
  {
    std::lock_guard guard{q.mutex()};
    q.refuse_locked(true, false);
    q.accept_again_locked();
    BOOST_TEST(q.stopping_locked());
  }
  BOOST_CHECK_THROW(push(q, 0, false), refused);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_wait_for_room_waits_until_a_take, fresh) {
  queue q{2, never_waits};
  q.wait_for_room(); // room: at once, without the lock
  BOOST_TEST(full_asks == 0);
  push(q);
  push(q);
  std::atomic<bool> done{false};
  std::thread producer([&] {
    q.wait_for_room();
    done = true;
  });
  bool asked = eventually([&] { return full_asks.load() >= 1; });
  BOOST_TEST_REQUIRE(asked);
  BOOST_TEST(!done);
  std::vector<entry> batch;
  std::string text;
  q.take(batch, text);
  producer.join();
  BOOST_TEST(done);
  // Room now vouched for up to taken + capacity: no lock, no ask.
  auto asks = full_asks.load();
  push(q);
  q.wait_for_room();
  BOOST_TEST(full_asks == asks);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_a_room_callback_is_stored_only_when_full, fresh) {
  queue q{1, never_waits};
  int called = 0;
  BOOST_TEST(!q.notify_when_room([&] { ++called; })); // room: not stored
  push(q);
  BOOST_TEST(q.notify_when_room([&] { ++called; }));
  std::vector<entry> batch;
  std::string text;
  auto t = q.take(batch, text);
  BOOST_TEST(t.wants_room);
  BOOST_TEST(called == 0); // the runner calls it, outside the lock
  q.call_room_callback();
  BOOST_TEST(called == 1);
  q.call_room_callback(); // once
  BOOST_TEST(called == 1);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_a_push_rings_a_runner_asleep_for_work, fresh) {
  queue q{8, never_waits};
  std::atomic<bool> woke{false};
  std::thread runner([&] {
    woke = q.sleep_until_work();
  });
  bool asleep = eventually([&] { return q.sleeping() == queue::for_work; });
  BOOST_TEST_REQUIRE(asleep);
  auto rings = q.rings();
  push(q);
  runner.join();
  BOOST_TEST(woke);
  BOOST_TEST(q.rings() == rings + 1);
  BOOST_TEST(q.sleeping() == queue::awake);
  // Awake: neither a push nor a ring touches the bell.
  push(q);
  q.ring();
  BOOST_TEST(q.rings() == rings + 1);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_a_stop_ends_the_runner_s_sleep_for_work, fresh) {
  queue q{8, never_waits};
  std::atomic<int> result{-1};
  std::thread runner([&] { result = q.sleep_until_work() ? 1 : 0; });
  bool asleep = eventually([&] { return q.sleeping() == queue::for_work; });
  BOOST_TEST_REQUIRE(asleep);
  {
    std::lock_guard guard{q.mutex()};
    q.refuse_locked(true, false);
  }
  q.ring();
  runner.join();
  BOOST_TEST(result == 0);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_a_push_leaves_a_runner_parked_at_a_gate_asleep, fresh) {
  queue q{8, never_waits};
  std::atomic<bool> gate_open{false};
  std::thread runner([&] { q.sleep_on_gate_until([&] { return gate_open.load(); }); });
  bool parked = eventually([&] { return q.sleeping() == queue::on_gate; });
  BOOST_TEST_REQUIRE(parked);
  auto rings = q.rings();
  push(q);
  BOOST_TEST(q.sleeping() == queue::on_gate); // still parked, not rung
  BOOST_TEST(q.rings() == rings);
  gate_open = true;
  q.ring(); // the gate's opener rings
  runner.join();
  BOOST_TEST(q.rings() == rings + 1);
  BOOST_TEST(q.sleeping() == queue::awake);
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_an_idle_runner_at_a_gate_is_left_for_the_next_push,
                        fresh) {
  queue q{8, never_waits};
  std::atomic<int> phase{0}; // the runner's gate "opens" at 1
  std::thread runner([&] { q.sleep_on_gate_until([&] { return phase.load() == 1; }); });
  bool parked = eventually([&] { return q.sleeping() == queue::on_gate; });
  BOOST_TEST_REQUIRE(parked);
  // Nothing queued: the runner now sleeps for work, and `under_lock` ran.
  bool ran = false;
  BOOST_TEST(q.settle_idle_runner([&] { ran = true; }));
  BOOST_TEST(ran);
  BOOST_TEST(q.sleeping() == queue::for_work);
  phase = 1;
  auto rings = q.rings();
  push(q); // rings it as it would any runner asleep for work
  runner.join();
  BOOST_TEST(q.rings() == rings + 1);
  // Something queued: the caller must ring.
  BOOST_TEST(!q.settle_idle_runner([] {}));
}

BOOST_FIXTURE_TEST_CASE(test_work_queue_sleep_for_work_unless_skips_the_sleep_when_ready, fresh) {
  queue q{8, never_waits};
  int slept = 0;
  auto sleep = [&](const std::atomic<uint32_t>&, uint32_t) { ++slept; };
  q.sleep_for_work_unless([] { return true; }, sleep);
  BOOST_TEST(slept == 0);
  q.sleep_for_work_unless([] { return false; }, sleep);
  BOOST_TEST(slept == 1);
  BOOST_TEST(q.sleeping() == queue::awake);
}
