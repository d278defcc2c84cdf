// The execution token on its own (actors/core/exec_token.hpp, issue 40 point 4):
// every cell of the hand-over state machine's table (docs/design.md), each
// driven through the token's interface by this thread alone. Several of
// these transitions happen in a device only when two runners' timing lines
// up (a runner woken while its token is lent, a borrower that parks the
// device at another wait before the runner looks, a helper that finds the
// runner spinning, a backstop ringing a wake-up someone already took up);
// here each is one call.
#define BOOST_TEST_MODULE test_exec_token
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <barrier>
#include <cstring>
#include <ostream>
#include <thread>
#include <vector>

#include "actors/core/exec_token.hpp"
#include "actors/core/gate.hpp"

namespace multidev::detail {
// The state by name in a failed check's message.
inline std::ostream& boost_test_print_type(std::ostream& os, exec_token::state_t st) {
  static const char* const names[] = {"held", "lendable", "lent", "returned"};
  return os << (st <= exec_token::returned ? names[st] : "?");
}
} // namespace multidev::detail

namespace {
namespace d = multidev::detail;
using token = d::exec_token;

/// A token in `st`, reached by the transitions a device takes.
void drive_to(token& t, token::state_t st) {
  switch (st) {
  case token::held:
    return;
  case token::lendable:
    t.lend();
    return;
  case token::lent:
    t.lend();
    BOOST_TEST_REQUIRE(t.try_borrow());
    return;
  case token::returned:
    t.lend();
    BOOST_TEST_REQUIRE(t.try_borrow());
    t.give_back();
    return;
  }
}
} // namespace

BOOST_AUTO_TEST_CASE(test_exec_token_starts_held_by_its_runner) {
  token t;
  BOOST_TEST(t.state() == token::held);
  BOOST_TEST(std::strcmp(t.state_name(), "runner") == 0);
  BOOST_TEST(t.parks() == 0u);
  BOOST_TEST(t.deferred() == 0u);
}

// -- lend ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_exec_token_held_lend_parks_it_lendable) {
  token t;
  d::gate g;
  auto n = t.park_at(&g);
  t.lend();
  BOOST_TEST(n == 1u);
  BOOST_TEST(t.parks() == 1u);
  BOOST_TEST(t.parked_gate() == &g);
  BOOST_TEST(t.state() == token::lendable);
  BOOST_TEST(std::strcmp(t.state_name(), "lendable") == 0);
}

BOOST_AUTO_TEST_CASE(test_exec_token_lent_lend_leaves_the_device_parked_for_its_runner) {
  // A borrower that finds the device parked at another pending gate (or
  // still at its own: `relend`) leaves it lendable.
  token t;
  d::gate first, second;
  auto mine = t.park_at(&first);
  t.lend();
  BOOST_TEST_REQUIRE(t.try_borrow());
  t.park_at(&second);
  t.lend();
  BOOST_TEST(t.state() == token::lendable);
  BOOST_TEST(t.parked_gate() == &second);
  // The runner parked at `first` sees a new park: it takes the token back
  // to look, though its own wait has not ended.
  BOOST_TEST(t.may_take_back(mine, [] { return false; }));
}

// -- borrow -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_exec_token_lendable_borrow_lends_it) {
  token t;
  drive_to(t, token::lendable);
  BOOST_TEST(t.try_borrow());
  BOOST_TEST(t.state() == token::lent);
  BOOST_TEST(t.lent_now());
  BOOST_TEST(std::strcmp(t.state_name(), "lent") == 0);
}

BOOST_AUTO_TEST_CASE(test_exec_token_borrow_fails_unless_lendable) {
  for (auto st : {token::held, token::lent, token::returned}) {
    token t;
    drive_to(t, st);
    BOOST_TEST(!t.try_borrow(), "state " << int(st));
    BOOST_TEST(!t.try_borrow_unless_spinning(), "state " << int(st));
    BOOST_TEST(t.state() == st);
  }
}

BOOST_AUTO_TEST_CASE(test_exec_token_a_helper_leaves_a_spinning_runner_its_token) {
  token t;
  t.set_spinning(true); // the runner spins at its wait
  drive_to(t, token::lendable);
  BOOST_TEST(t.spinning());
  BOOST_TEST(!t.try_borrow_unless_spinning());
  BOOST_TEST(t.state() == token::lendable);
  // A claimer (the wait's opener) may take it all the same.
  BOOST_TEST(t.try_borrow());
  t.give_back();
  // Once the runner sleeps, a helper may.
  token u;
  u.set_spinning(true);
  drive_to(u, token::lendable);
  u.set_spinning(false);
  BOOST_TEST(u.try_borrow_unless_spinning());
  BOOST_TEST(u.state() == token::lent);
}

BOOST_AUTO_TEST_CASE(test_exec_token_two_borrowers_one_wins) {
  for (int round = 0; round < 200; ++round) {
    token t;
    drive_to(t, token::lendable);
    std::atomic<int> won{0};
    std::barrier go(2);
    auto borrow = [&](bool help) {
      go.arrive_and_wait();
      if (help ? t.try_borrow_unless_spinning() : t.try_borrow())
        won.fetch_add(1);
    };
    std::thread a(borrow, false), b(borrow, true);
    a.join();
    b.join();
    BOOST_TEST_REQUIRE(won == 1);
    BOOST_TEST_REQUIRE(t.state() == token::lent);
  }
}

// -- give back ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_exec_token_lent_give_back_returns_it) {
  token t;
  drive_to(t, token::lent);
  t.give_back();
  BOOST_TEST(t.state() == token::returned);
  BOOST_TEST(std::strcmp(t.state_name(), "returned") == 0);
}

// -- take back ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_exec_token_take_back_from_lendable_or_returned) {
  for (auto st : {token::lendable, token::returned}) {
    token t;
    drive_to(t, st);
    t.defer(7); // a wake-up some runner deferred
    BOOST_TEST(t.try_take_back(), "state " << int(st));
    BOOST_TEST(t.state() == token::held);
    BOOST_TEST(t.deferred() == 0u); // taken up with the token
  }
}

BOOST_AUTO_TEST_CASE(test_exec_token_a_runner_woken_while_lent_does_not_take_it) {
  token t;
  drive_to(t, token::lent);
  t.defer(7);
  BOOST_TEST(!t.try_take_back());
  BOOST_TEST(t.state() == token::lent);
  BOOST_TEST(t.deferred() == 7u); // still the backstop's
}

BOOST_AUTO_TEST_CASE(test_exec_token_take_back_while_held_changes_nothing) {
  token t;
  BOOST_TEST(t.try_take_back());
  BOOST_TEST(t.state() == token::held);
}

// -- when the waiting runner takes it back --------------------------------------

BOOST_AUTO_TEST_CASE(test_exec_token_may_take_back_follows_state_park_and_wait) {
  d::gate g;
  bool ended = false;
  auto wait_ended = [&] { return ended; };
  {
    token t; // lendable, still its park, wait pending: no
    auto mine = t.park_at(&g);
    t.lend();
    BOOST_TEST(!t.may_take_back(mine, wait_ended));
    ended = true; // its wait ended: yes
    BOOST_TEST(t.may_take_back(mine, wait_ended));
    ended = false;
    BOOST_TEST_REQUIRE(t.try_borrow()); // lent: no, whatever the wait
    ended = true;
    BOOST_TEST(!t.may_take_back(mine, wait_ended));
    BOOST_TEST(t.lent_now());
    ended = false;
    t.give_back(); // returned: yes, whatever the wait
    BOOST_TEST(t.may_take_back(mine, wait_ended));
    BOOST_TEST(!t.lent_now());
  }
  {
    token t; // held (never lent): no
    BOOST_TEST(!t.may_take_back(t.parks(), [] { return true; }));
  }
}

// -- deferred wake-ups --------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_exec_token_a_deferred_wake_up_is_cleared_once) {
  token t;
  t.defer(5);
  BOOST_TEST(t.deferred() == 5u);
  BOOST_TEST(!t.clear_deferral(4)); // an older stamp: not its to ring
  BOOST_TEST(t.deferred() == 5u);
  BOOST_TEST(t.clear_deferral(5));
  BOOST_TEST(t.deferred() == 0u);
  BOOST_TEST(!t.clear_deferral(5)); // rung once
  // Taken up by whoever takes the token: the backstop's later ring finds
  // nothing to do.
  t.defer(6);
  t.take_up_deferral();
  BOOST_TEST(t.deferred() == 0u);
  BOOST_TEST(!t.clear_deferral(6));
  t.take_up_deferral(); // none: no change
  BOOST_TEST(t.deferred() == 0u);
}

// -- counters and the test hook -------------------------------------------------

BOOST_AUTO_TEST_CASE(test_exec_token_counts_items_run_by_others_and_deferred_wakes) {
  token t;
  t.count_run_by_others(3);
  t.count_run_by_others(2);
  t.count_deferred_wake();
  BOOST_TEST(t.run_by_others() == 5u);
  BOOST_TEST(t.deferred_wakes() == 1u);
}

BOOST_AUTO_TEST_CASE(test_exec_token_hold_after_wake_holds_the_runner_until_released) {
  token t;
  t.wait_if_held_after_wake(); // off: returns at once
  t.hold_after_wake(true);
  std::atomic<bool> passed{false};
  std::thread runner([&] {
    t.wait_if_held_after_wake();
    passed = true;
  });
  BOOST_TEST(!passed); // it cannot pass while held
  t.hold_after_wake(false);
  runner.join();
  BOOST_TEST(passed);
}
