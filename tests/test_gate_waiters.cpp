// The gate waiters on their own (actors/core/gate_waiters.hpp, issue 40 point
// 1): local waits of other devices on one device's seqs, kept in seq order
// under the outcome board's waiter lock, taken when due, and resolved on the
// waiting device. This thread holds the board's lock where the list needs it.
#define BOOST_TEST_MODULE test_gate_waiters
#include <boost/test/unit_test.hpp>

#include <memory>
#include <mutex>
#include <vector>

#include "actors/core/device_core.hpp"
#include "actors/core/gate.hpp"
#include "actors/core/gate_waiters.hpp"
#include "actors/core/outcome_board.hpp"
#include "actors/core/result_board.hpp"
#include "devices/driver.hpp"

namespace {
namespace d = multidev::detail;

d::gate_waiter waiter_at(uint64_t seq) {
  return d::gate_waiter{seq, std::make_shared<d::gate>(), {}, nullptr};
}

/// Takes the due waiters' seqs, in the order taken.
std::vector<uint64_t> take_due(d::gate_waiters& l, uint64_t upto, bool all = false) {
  std::vector<uint64_t> out;
  d::gate_waiter w;
  bool more = true;
  while (more && l.take_due_locked(upto, all, w, more))
    out.push_back(w.seq);
  return out;
}
} // namespace

BOOST_AUTO_TEST_CASE(test_gate_waiters_keeps_seq_order_and_takes_only_due_ones) {
  d::outcome_board board{"owner"};
  std::lock_guard guard{board.waiters_mutex()};
  d::gate_waiters l;
  BOOST_TEST(l.first_locked() == UINT64_MAX);
  for (uint64_t s : {5, 7, 3, 7, 9, 1})
    l.add_locked(waiter_at(s));
  BOOST_TEST(l.size_locked() == 6u);
  BOOST_TEST(l.first_locked() == 1u);
  // Up to 6: 1, 3 and 5, in seq order; `more` stops the caller there.
  BOOST_TEST((take_due(l, 6) == std::vector<uint64_t>{1, 3, 5}));
  BOOST_TEST(l.first_locked() == 7u);
  BOOST_TEST(take_due(l, 6).empty());
  // `all` (shutdown) takes the rest, due or not.
  BOOST_TEST((take_due(l, 0, true) == std::vector<uint64_t>{7, 7, 9}));
  BOOST_TEST(l.size_locked() == 0u);
  BOOST_TEST(l.slots_locked() == 0u); // emptied: spent entries gone at once
  // The waiter taken is the one added, its gate with it.
  auto w = waiter_at(4);
  auto* g = w.g.get();
  l.add_locked(std::move(w));
  d::gate_waiter out;
  bool more;
  BOOST_TEST(l.take_due_locked(4, false, out, more));
  BOOST_TEST(out.g.get() == g);
  BOOST_TEST(!more);
}

BOOST_AUTO_TEST_CASE(test_gate_waiters_compacts_spent_entries_in_bulk) {
  d::outcome_board board{"owner"};
  std::lock_guard guard{board.waiters_mutex()};
  d::gate_waiters l;
  // A host ten waits ahead of the runner, for a long chain: the entries
  // taken are compacted away, so the list does not grow with the chain.
  uint64_t next = 1;
  for (; next <= 10; ++next)
    l.add_locked(waiter_at(next));
  std::size_t most = 0;
  for (uint64_t done = 1; done <= 10'000; ++done, ++next) {
    BOOST_TEST_REQUIRE((take_due(l, done) == std::vector<uint64_t>{done}));
    l.add_locked(waiter_at(next));
    most = std::max(most, l.slots_locked());
  }
  BOOST_TEST(l.size_locked() == 10u);
  BOOST_TEST(most <= 2 * 64 + 10);
}

BOOST_AUTO_TEST_CASE(test_gate_waiters_minimum_covers_both_lists) {
  d::outcome_board board{"owner"};
  d::gate_waiters l;
  {
    std::lock_guard guard{board.waiters_mutex()};
    board.add_locked(8, [](const multidev::failure*) {});
    l.add_locked(waiter_at(5));
    l.update_min_locked(board);
  }
  // The board reports a waiter due once its progress reaches the least seq
  // waited for in either list.
  BOOST_TEST(!board.publish(4));
  BOOST_TEST(board.publish(5));
  {
    std::lock_guard guard{board.waiters_mutex()};
    BOOST_TEST((take_due(l, 5) == std::vector<uint64_t>{5}));
    l.update_min_locked(board, true); // a firing only raises it
  }
  BOOST_TEST(!board.publish(7));
  BOOST_TEST(board.publish(8));
  {
    std::lock_guard guard{board.waiters_mutex()};
    l.add_locked(waiter_at(6)); // a later registration lowers it again
    l.update_min_locked(board);
  }
  BOOST_TEST(board.publish(6));
}

BOOST_AUTO_TEST_CASE(test_gate_waiters_resolve_opens_or_fails_the_waiting_devices_gate) {
  auto core = std::make_shared<d::device_core>("waiter", 0, d::make_cpu_driver(1), 64,
                                               std::make_shared<d::result_board>());
  auto waiting = [&](uint64_t seq, bool order_only = false) {
    auto w = waiter_at(seq);
    w.g->order_only = order_only;
    w.waiter = core;
    w.waiter_at = core.get();
    return w;
  };
  multidev::failure boom;
  boom.device = "owner";
  boom.message = "boom";
  // Done: the gate opens.
  auto done = waiting(1);
  d::gate_waiters::resolve(done, nullptr);
  BOOST_TEST(done.g->state.load() == d::gate::open);
  // Failed: the gate fails with a copy of the cause (the owner's table
  // keeps its own).
  auto failed = waiting(2);
  d::gate_waiters::resolve(failed, &boom);
  BOOST_TEST(failed.g->state.load() == d::gate::failed);
  BOOST_TEST_REQUIRE(failed.g->cause != nullptr);
  BOOST_TEST(failed.g->cause->message == "boom");
  BOOST_TEST(failed.g->cause.get() != &boom);
  // An ordering-only wait opens however the awaited seq resolved.
  auto ordered = waiting(3, true);
  d::gate_waiters::resolve(ordered, &boom);
  BOOST_TEST(ordered.g->state.load() == d::gate::open);
  // A waiting device gone: nothing to open.
  auto orphan = waiter_at(4);
  {
    auto gone = std::make_shared<d::device_core>("gone", 1, d::make_cpu_driver(1), 64,
                                                 std::make_shared<d::result_board>());
    orphan.waiter = gone;
    orphan.waiter_at = gone.get();
  }
  d::gate_waiters::resolve(orphan, nullptr);
  BOOST_TEST(orphan.g->state.load() == d::gate::pending);
}
