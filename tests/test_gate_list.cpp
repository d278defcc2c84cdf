// The gate list on its own (actors/core/gate_list.hpp, issue 40 point 4): what
// the wait graph, debug info and shutdown see of a device's queued waits.
// This thread holds the list's lock (a local mutex stands in for the
// device's waiters lock).
#define BOOST_TEST_MODULE test_gate_list
#include <boost/test/unit_test.hpp>

#include <memory>
#include <mutex>
#include <vector>

#include "actors/core/gate.hpp"
#include "actors/core/gate_list.hpp"

namespace {
namespace d = multidev::detail;

std::vector<d::gate*> alive(const d::gate_list& l) {
  std::vector<d::gate*> out;
  l.find_locked([&](std::shared_ptr<d::gate> g) {
    out.push_back(g.get());
    return false;
  });
  return out;
}
} // namespace

BOOST_AUTO_TEST_CASE(test_gate_list_lists_live_gates_in_order_and_counts_waits) {
  d::gate_list l;
  std::mutex mu;
  std::lock_guard guard{mu};
  auto a = std::make_shared<d::gate>();
  auto b = std::make_shared<d::gate>();
  l.add_locked(a);
  l.add_locked(b);
  BOOST_TEST(l.pushed() == 2u);
  BOOST_TEST(l.pending_waits() == 2u);
  BOOST_TEST((alive(l) == std::vector<d::gate*>{a.get(), b.get()}));
  l.count_passed();
  BOOST_TEST(l.passed() == 1u);
  BOOST_TEST(l.pending_waits() == 1u);
  // A gate gone is no longer listed, though its entry stays until pruned.
  a.reset();
  BOOST_TEST((alive(l) == std::vector<d::gate*>{b.get()}));
  BOOST_TEST(l.size_locked() == 2u);
  // A push that failed uncounts its gate.
  auto c = std::make_shared<d::gate>();
  l.add_locked(c);
  l.take_back_locked();
  BOOST_TEST(l.pushed() == 2u);
}

BOOST_AUTO_TEST_CASE(test_gate_list_find_stops_at_the_first_match) {
  d::gate_list l;
  std::vector<std::shared_ptr<d::gate>> gs;
  for (int i = 0; i < 3; ++i) {
    gs.push_back(std::make_shared<d::gate>());
    l.add_locked(gs.back());
  }
  int calls = 0;
  bool found = l.find_locked([&](const std::shared_ptr<d::gate>& g) {
    ++calls;
    return g == gs[1];
  });
  BOOST_TEST(found);
  BOOST_TEST(calls == 2);
  BOOST_TEST(!l.find_locked([](const std::shared_ptr<d::gate>&) { return false; }));
}

BOOST_AUTO_TEST_CASE(test_gate_list_prunes_gates_gone_only_once_it_doubled) {
  d::gate_list l;
  std::vector<std::shared_ptr<d::gate>> live;
  // 64 entries, all but 10 gone: not pruned before the 65th add.
  for (int i = 0; i < 64; ++i) {
    auto g = std::make_shared<d::gate>();
    l.add_locked(g);
    if (i < 10)
      live.push_back(std::move(g));
  }
  BOOST_TEST(l.size_locked() == 64u);
  auto g = std::make_shared<d::gate>();
  l.add_locked(g); // prunes the 54 gone, then lists it
  live.push_back(g);
  BOOST_TEST(l.size_locked() == 11u);
  BOOST_TEST(alive(l).size() == 11u);
  // The next pruning waits for max(64, 2 * 11) entries: none before.
  for (int i = 0; i < 52; ++i)
    l.add_locked(std::make_shared<d::gate>()); // gone at once
  BOOST_TEST(l.size_locked() == 63u);
  l.add_locked(std::make_shared<d::gate>());
  BOOST_TEST(l.size_locked() == 64u);
  l.add_locked(std::make_shared<d::gate>()); // 64 listed: prunes first
  BOOST_TEST(l.size_locked() == 12u);
  BOOST_TEST(l.pushed() == 119u); // counted however pruned
}

BOOST_AUTO_TEST_CASE(test_gate_list_records_where_the_device_is_parked) {
  d::gate_list l;
  BOOST_TEST(l.parked_on() == nullptr);
  d::gate g;
  l.set_parked_on(&g);
  BOOST_TEST(l.parked_on() == &g);
  l.set_parked_on(nullptr);
  BOOST_TEST(l.parked_on() == nullptr);
}
