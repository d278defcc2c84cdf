// The extras cache on its own (actors/core/extra_cache.hpp, issue 40 point 1):
// orders' and waits' extras kept by the runner as their items resolve,
// handed back to producers in groups, and the pools they hold let go of.
// This thread plays both the runner and the producer.
#define BOOST_TEST_MODULE test_extra_cache
#include <boost/test/unit_test.hpp>

#include <memory>
#include <set>
#include <vector>

#include "actors/core/extra_cache.hpp"
#include "actors/core/gate.hpp"
#include "actors/core/item.hpp"

namespace {
namespace d = multidev::detail;

/// An order's (or, with `g`, a wait's) queue entry around `x`.
d::item item_of(std::unique_ptr<d::item_extra> x) {
  d::item it;
  it.work = [] {};
  it.extra = d::extra_ptr{std::move(x)};
  return it;
}

/// An extra for a host copy into a pool `pool` stands for.
std::unique_ptr<d::item_extra> copy_extra(d::extra_cache& c, std::shared_ptr<const void> pool) {
  auto x = c.take();
  static std::byte dst[8];
  x->op.what = "from_host";
  x->op.dst = dst;
  x->keep_alive = std::move(pool);
  x->g.reset();
  return x;
}
} // namespace

BOOST_AUTO_TEST_CASE(test_extra_cache_hands_back_spent_extras_in_groups_for_reuse) {
  d::extra_cache c;
  std::set<d::item_extra*> made;
  std::vector<d::item> items;
  for (std::size_t i = 0; i < d::extra_cache::hand_back_extras; ++i) {
    auto x = c.take(); // nothing spare yet: new ones
    made.insert(x.get());
    items.push_back(item_of(std::move(x)));
  }
  BOOST_TEST(made.size() == d::extra_cache::hand_back_extras);
  for (std::size_t i = 0; i + 1 < items.size(); ++i) {
    c.recycle(items[i]);
    BOOST_TEST(!items[i].work); // its closure pointed into the extra
    BOOST_TEST(!items[i].extra); // the cache owns the extra now
  }
  // One short of a group: kept spent, not handed back.
  c.hand_back_if_due();
  BOOST_TEST(c.spare_count() == 0u);
  BOOST_TEST(c.spent_count() == d::extra_cache::hand_back_extras - 1);
  c.recycle(items.back());
  c.hand_back_if_due();
  BOOST_TEST(c.spent_count() == 0u);
  BOOST_TEST(c.spare_count() == d::extra_cache::hand_back_extras);
  // Producers get the same extras back, each once.
  std::set<d::item_extra*> taken;
  std::vector<std::unique_ptr<d::item_extra>> hold;
  for (std::size_t i = 0; i < d::extra_cache::hand_back_extras; ++i) {
    hold.push_back(c.take());
    taken.insert(hold.back().get());
  }
  BOOST_TEST((taken == made));
  BOOST_TEST(c.spare_count() == 0u);
  hold.push_back(c.take()); // a new one once the spare ones are gone
  BOOST_TEST(made.count(hold.back().get()) == 0u);
}

BOOST_AUTO_TEST_CASE(test_extra_cache_lets_go_of_a_waits_gate_at_once_and_a_copys_pool_with_its_group) {
  d::extra_cache c;
  auto pool = std::make_shared<int>(1);
  std::weak_ptr<int> pool_alive = pool;
  auto g = std::make_shared<d::gate>();
  std::weak_ptr<d::gate> gate_alive = g;
  auto copy = item_of(copy_extra(c, std::move(pool)));
  auto wait_x = c.take();
  wait_x->op.what = ""; // not an order
  wait_x->g = std::move(g);
  auto wait = item_of(std::move(wait_x));
  c.recycle(wait);
  BOOST_TEST(gate_alive.expired()); // a wait's gate goes with the wait
  c.recycle(copy);
  BOOST_TEST(!pool_alive.expired()); // a copy's pool stays held while spent...
  c.let_go_of_spent_pools();
  BOOST_TEST(pool_alive.expired()); // ...until the runner lets go of the group's
  BOOST_TEST(c.spent_count() == 2u); // the extras themselves stay spent

  // Handed back, a spare extra holds neither.
  auto pool2 = std::make_shared<int>(2);
  std::weak_ptr<int> pool2_alive = pool2;
  std::vector<d::item> more;
  for (std::size_t i = 0; i < d::extra_cache::hand_back_extras; ++i)
    more.push_back(item_of(copy_extra(c, pool2)));
  pool2.reset();
  for (auto& it : more)
    c.recycle(it);
  BOOST_TEST(!pool2_alive.expired());
  c.hand_back_if_due();
  BOOST_TEST(pool2_alive.expired());
  for (std::size_t n = c.spare_count(); n > 0; --n) {
    auto x = c.take();
    BOOST_TEST(!x->keep_alive);
    BOOST_TEST(!x->g);
  }
}

BOOST_AUTO_TEST_CASE(test_extra_cache_release_hold_keeps_a_copys_pool_and_a_release_lets_go_of_all) {
  d::extra_cache c;
  auto a = std::make_shared<int>(1), b = std::make_shared<int>(2);
  std::weak_ptr<int> a_alive = a, b_alive = b;
  // A copy that ran: its pool stays held (until its group is handed back).
  auto copy = item_of(copy_extra(c, std::move(a)));
  c.release_hold(copy);
  BOOST_TEST(!a_alive.expired());
  c.recycle(copy);
  BOOST_TEST(!a_alive.expired());
  // A release (an order without a destination): the spent copies let go of
  // their pools first, then it lets go of its own, before its event is done.
  auto release_x = c.take();
  release_x->op = {};
  release_x->op.what = "free_pool";
  release_x->keep_alive = std::move(b);
  auto release = item_of(std::move(release_x));
  c.release_hold(*release.extra.order_or_wait());
  BOOST_TEST(a_alive.expired());
  BOOST_TEST(b_alive.expired());

  // A wait's keep_alive, and a described task's, go at once.
  auto w = std::make_shared<int>(3);
  std::weak_ptr<int> w_alive = w;
  auto wait_x = c.take();
  wait_x->op.what = "";
  wait_x->keep_alive = std::move(w);
  auto wait = item_of(std::move(wait_x));
  c.release_hold(wait);
  BOOST_TEST(w_alive.expired());
  auto t = std::make_shared<int>(4);
  std::weak_ptr<int> t_alive = t;
  d::item described;
  described.extra = d::extra_ptr{d::named_extra::make("task", std::move(t), multidev::trace_kind::task)};
  c.release_hold(described);
  BOOST_TEST(t_alive.expired());
}

BOOST_AUTO_TEST_CASE(test_extra_cache_hands_back_a_whole_burst_and_trims_it_when_idle) {
  d::extra_cache c;
  constexpr std::size_t burst = 3 * d::extra_cache::spare_extras_max;
  std::vector<d::item> items;
  for (std::size_t i = 0; i < burst; ++i)
    items.push_back(item_of(c.take()));
  for (auto& it : items)
    c.recycle(it);
  // All of them, past the limit: a producer ahead of the runner reuses them.
  c.hand_back_if_due();
  BOOST_TEST(c.spare_count() == burst);
  BOOST_TEST(c.spent_count() == 0u);
  // Idle: what is beyond the limit is freed.
  c.trim_spare_extras();
  BOOST_TEST(c.spare_count() == d::extra_cache::spare_extras_max);
  c.trim_spare_extras();
  BOOST_TEST(c.spare_count() == d::extra_cache::spare_extras_max);
}
