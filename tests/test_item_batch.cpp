// The runner's batch on its own (actors/core/batch.hpp, issue 40 point 1):
// the entries a runner took, where it stands in them, their descriptions'
// text, and the batch a claim sets aside while its last item still runs
// (`hand_over::try_claim`). This thread stands in for the token holder.
#define BOOST_TEST_MODULE test_item_batch
#include <boost/test/unit_test.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/core/batch.hpp"

namespace {
namespace d = multidev::detail;

/// Appends a described task to `b` as a producer and the queue would: its
/// description in the batch's text, its extra pointing there.
d::item& add_described(d::item_batch& b, std::string_view description, int* ran) {
  auto offset = b.text().size();
  b.text().append(description);
  b.items().push_back(d::item{[ran] { ++*ran; },
                              d::extra_ptr::text(offset, description.size(),
                                                 multidev::trace_kind::task)});
  return b.items().back();
}
} // namespace

BOOST_AUTO_TEST_CASE(test_item_batch_runs_its_entries_in_order_and_starts_over_when_cleared) {
  d::item_batch b;
  BOOST_TEST(!b.has_next());
  int ran = 0;
  add_described(b, "first", &ran);
  add_described(b, "second", &ran);
  b.taken(false);
  BOOST_TEST(!b.has_extras());
  BOOST_TEST(b.size() == 2u);
  BOOST_TEST(b.has_next());
  BOOST_TEST(b.text_of(b.next()) == "first");
  b.take_next().work();
  BOOST_TEST(b.pos() == 1u);
  BOOST_TEST(b.text_of(b.next()) == "second");
  b.take_next().work();
  BOOST_TEST(ran == 2);
  BOOST_TEST(!b.has_next());
  b.clear();
  BOOST_TEST(b.size() == 0u);
  BOOST_TEST(b.pos() == 0u);
  BOOST_TEST(!b.has_next());
  // An order's or a wait's extra among the entries: the runner looks ahead.
  b.taken(true);
  BOOST_TEST(b.has_extras());
}

BOOST_AUTO_TEST_CASE(test_item_batch_set_aside_keeps_the_running_item_while_the_next_batch_runs) {
  d::item_batch b;
  int ran = 0;
  add_described(b, "running", &ran);
  b.taken(false);
  // The last item of the batch runs; a claim takes the next batch early.
  auto& running = b.take_next();
  BOOST_TEST(!b.has_next());
  BOOST_TEST(!b.has_set_aside());
  b.set_aside();
  BOOST_TEST(b.has_set_aside());
  BOOST_TEST(b.pos() == 0u);
  // The queue's take swaps its vector and text in: both come empty.
  BOOST_TEST(b.items().empty());
  BOOST_TEST(b.text().empty());
  add_described(b, "next", &ran);
  b.taken(false);
  // The running entry was not moved or freed by the take: it still runs.
  running.work();
  BOOST_TEST(ran == 1);
  BOOST_TEST(b.has_next());
  BOOST_TEST(b.text_of(b.next()) == "next");
  // Its item done, the runner lets go of the set-aside batch; the new one
  // is untouched.
  b.clear_set_aside();
  BOOST_TEST(!b.has_set_aside());
  BOOST_TEST(b.size() == 1u);
  BOOST_TEST(b.text_of(b.next()) == "next");
  b.take_next().work();
  BOOST_TEST(ran == 2);
  // A second claim finds the set-aside buffers empty again, with their room.
  b.set_aside();
  BOOST_TEST(b.items().empty());
  BOOST_TEST(b.text().empty());
  BOOST_TEST(b.has_set_aside());
}
