// Recorded rounds replayed on the nodes (issue 41 point 2 across nodes): a
// round whose items all run on attached nodes' devices goes to each node
// once (`round_put`) and is then replayed by one `round_run` per node; a
// wait between two nodes' devices is opened by the awaited node's
// `round_done`, sent node to node. Two nodes and a client in this process
// (three actor systems over 127.0.0.1, as `multidev node` processes and a
// client are), so that the kernels the nodes run can be the test's own:
// a note in a shared log, a hold on a flag.
#define BOOST_TEST_MODULE rounds_on_nodes
#include <boost/test/unit_test.hpp>

#include <functional>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "messages/tsan.hpp"
#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace multidev;
using namespace std::chrono_literals;
using test_support::contains;
using test_support::expect_throw;

namespace {

/// What the nodes' `test_note` tasks wrote, in the order they ran.
struct note_log {
  std::mutex mu;
  std::vector<std::string> notes;
  void add(std::string s) {
    std::lock_guard g{mu};
    notes.push_back(std::move(s));
  }
  std::vector<std::string> take() {
    std::lock_guard g{mu};
    return std::move(notes);
  }
};
note_log& the_log() {
  static note_log l;
  return l;
}
/// What `test_hold` waits for (under `hold_mu`; the kernel keeps it alive
/// while it waits, so a test may let go of it while a hold is starting),
/// and how many holds started waiting.
std::mutex hold_mu;
std::shared_ptr<test_support::latch_gate> hold_gate;
std::atomic<int> holds_started{0};

/// A new gate for `test_hold`s to wait on.
std::shared_ptr<test_support::latch_gate> hold_here() {
  auto g = std::make_shared<test_support::latch_gate>();
  std::lock_guard guard{hold_mu};
  hold_gate = g;
  return g;
}

/// `test_hold`s no longer wait.
void release_hold() {
  std::lock_guard guard{hold_mu};
  hold_gate.reset();
}

void register_test_kernels() {
  static const bool done = [] {
    kernel_def note;
    note.params = {arg_kind::string};
    note.body = [](kernel_call& c) { the_log().add(c.string(0)); };
    note.doc = "test_note TEXT: adds TEXT to the test's log";
    register_kernel("test_note", std::move(note));
    kernel_def hold;
    hold.body = [](kernel_call&) {
      ++holds_started;
      std::shared_ptr<test_support::latch_gate> g;
      {
        std::lock_guard guard{hold_mu};
        g = hold_gate;
      }
      if (g)
        g->wait();
      the_log().add("held");
    };
    hold.doc = "test_hold: waits for the test's gate";
    register_kernel("test_hold", std::move(hold));
    kernel_def maybe;
    maybe.params = {arg_kind::integer};
    maybe.body = [](kernel_call& c) {
      if (c.integer(0) != 0)
        throw std::runtime_error("a planned failure");
    };
    maybe.doc = "test_maybe_fail N: throws when N is not 0";
    register_kernel("test_maybe_fail", std::move(maybe));
    return true;
  }();
  (void)done;
}

task_spec note(std::string text) { return {"test_note", {std::move(text)}}; }

/// Waits for every device's work of replay `ev`.
void sync_all(const backend& c, const replay_events& ev) {
  for (const auto& [d, e] : ev.all_work())
    test_support::sync(c, e);
}

/// Replays `r` 3 times, its slot `first` set to "<text> k" in replay k,
/// then waits for all of them; the replays' events.
std::vector<replay_events> replay_thrice(backend& c, multidev::round& r, round_slot first,
                                         const std::string& text) {
  std::vector<replay_events> evs;
  for (int k = 1; k <= 3; ++k) {
    r.arg(first) = text + " " + std::to_string(k);
    evs.push_back(c.replay(r));
  }
  for (const auto& ev : evs)
    sync_all(c, ev);
  return evs;
}

/// The log of `replay_thrice`: "<text> k", then `rest`, for k = 1..3.
std::vector<std::string> thrice(const std::string& text, const std::vector<std::string>& rest) {
  std::vector<std::string> want;
  for (int k = 1; k <= 3; ++k) {
    want.push_back(text + " " + std::to_string(k));
    want.insert(want.end(), rest.begin(), rest.end());
  }
  return want;
}

/// Nodes a (two devices) and b (one) and a client that attached both: three
/// actor systems of this process. Built and destroyed on the test's thread.
struct nodes_here {
  /// `memory_limit`: each session's quota on both nodes (0: the default);
  /// `attach`: how the client attaches them.
  explicit nodes_here(backend_options node_opts = {}, std::size_t memory_limit = 0,
                      node_attach_options attach = test_support::test_attach_options())
      : memory_limit_(memory_limit) {
    register_test_kernels();
    for (auto* cfg : {&cfg_a, &cfg_b, &cfg_c}) {
      configure_system(*cfg);
      cfg->set("scheduler.max-threads", std::size_t{2});
    }
    sys_a.emplace(cfg_a);
    sys_b.emplace(cfg_b);
    sys_c.emplace(cfg_c);
    auto oa = node_opts, ob = node_opts;
    oa.num_devices = 2;
    ob.num_devices = 1;
    node_a.emplace(*sys_a, oa);
    node_b.emplace(*sys_b, ob);
    client.emplace(*sys_c, backend_options{.num_devices = 1});
    actor_a = serve(*node_a, "a");
    actor_b = serve(*node_b, "b");
    auto da = attach_node(*client, "127.0.0.1", port_a, attach);
    auto db = attach_node(*client, "127.0.0.1", port_b, attach);
    a0 = da.at(0);
    a1 = da.at(1);
    b0 = db.at(0);
  }
  ~nodes_here() {
    client.reset();
    for (auto& n : {actor_a, actor_b})
      caf::anon_send_exit(n, caf::exit_reason::user_shutdown);
    node_a.reset();
    node_b.reset();
  }

  caf::actor serve(backend& node, const char* name) {
    auto n = spawn_node_actor(node, name, {}, memory_limit_);
    auto port = publish_node(n, 0, "127.0.0.1");
    BOOST_TEST_REQUIRE(bool(port));
    (name[0] == 'a' ? port_a : port_b) = *port;
    return caf::actor_cast<caf::actor>(n);
  }

  /// Node `n`'s debug text.
  std::string debug(const caf::actor& n) {
    caf::scoped_actor self{*sys_c};
    std::string text;
    self->request(n, 10s, atoms::debug_atom::value)
      .receive(
        [&](std::string& t) {
          detail::tsan_acquire(t.data()); // the node's handler released it there
          text = std::move(t);
        },
               [&](caf::error& e) { BOOST_ERROR("debug: " << sys_c->render(e)); });
    return text;
  }

  /// Ends the client's session on node `n` as the node sees it (a
  /// `detach` from the client's system), the client not told: its next
  /// renewal, not due for its lease's third, would find it out.
  void end_session_unbeknown(const caf::actor& n) {
    auto text = debug(n);
    auto at = text.find("(session (id ");
    BOOST_TEST_REQUIRE(at != std::string::npos, text);
    auto id = std::stoull(text.substr(at + 13));
    caf::scoped_actor self{*sys_c};
    self->request(n, 10s, atoms::detach_atom::value, uint64_t{id})
      .receive([](bool ended) { BOOST_TEST_REQUIRE(ended); },
               [&](caf::error& e) { BOOST_ERROR("detach: " << sys_c->render(e)); });
  }

  /// Until node `n`'s debug text holds `text` (bounded: reports `what`).
  void await_debug(const caf::actor& n, const std::string& text, std::string_view what) {
    test_support::bounded(
      [&] {
        while (!contains(debug(n), text))
          std::this_thread::sleep_for(1ms);
      },
      what);
  }

  /// Fills `d`'s queue (of capacity 4): a held item (`hold_gate`), running,
  /// and 4 notes queued behind it on its node. (Queued before the hold
  /// runs, the runner would take them out with it, leaving room.)
  void fill_past_capacity(const device& d, const caf::actor& node) {
    auto started = holds_started.load();
    client->schedule_named(d, {"test_hold", {}});
    test_support::bounded(
      [&] {
        while (holds_started.load() == started)
          std::this_thread::sleep_for(1ms);
      },
      "the hold starting");
    for (int i = 0; i < 4; ++i)
      client->schedule_named(d, note("fill"));
    await_debug(node, "(queued 5)", "the node's queue filling"); // the held item too
  }

  std::size_t memory_limit_ = 0;
  caf::actor_system_config cfg_a, cfg_b, cfg_c;
  std::optional<caf::actor_system> sys_a, sys_b, sys_c;
  std::optional<backend> node_a, node_b, client;
  caf::actor actor_a, actor_b;
  uint16_t port_a = 0, port_b = 0;
  device a0, a1, b0;
};

/// Attach options that renew the lease rarely: the client does not find
/// out that a session ended on a node (`end_session_unbeknown`) before its
/// next messages reach the node.
node_attach_options quiet_attach() {
  auto quiet = test_support::test_attach_options();
  quiet.lease = std::chrono::minutes{10};
  quiet.renew_every = std::chrono::minutes{5};
  return quiet;
}

/// Node options with queues of 4 entries (`nodes_here::fill_past_capacity`).
backend_options small_queues() {
  backend_options opts;
  opts.queue_capacity = 4;
  return opts;
}

/// Syncs `e` on `b`, bounded.
void sync(backend& b, const event& e) {
  test_support::bounded([&] { b.sync(e); }, "sync");
}

/// Every item of replay `ev` is done.
void expect_items_done(backend& c, const replay_events& ev) {
  for (std::size_t i = 0; i < ev.size(); ++i) {
    sync(c, ev.item(i));
    BOOST_TEST(c.is_done(ev.item(i)), "item " << i);
  }
}

/// Replays `r` three times; every item of the last is done, node a holds
/// the round's part and ran the three, and the named checksums `on_node`
/// (of a0) and `here` (of this process) summed `node_sum` and `here_sum`.
void replay_thrice_and_expect_sums(nodes_here& n, const multidev::round& r, const std::string& on_node,
                                   double node_sum, const std::string& here, double here_sum) {
  auto& c = *n.client;
  replay_events ev;
  for (int k = 0; k < 3; ++k)
    ev = c.replay(r);
  expect_items_done(c, ev);
  BOOST_TEST(contains(n.debug(n.actor_a), "(rounds (parts 1) (replays 3) (early 0) (dropped 0))"),
             n.debug(n.actor_a));
  auto node_result = c.result(n.a0, on_node);
  BOOST_REQUIRE(node_result.has_value());
  BOOST_TEST(node_result->sum == node_sum);
  auto here_result = c.result(here);
  BOOST_REQUIRE(here_result.has_value());
  BOOST_TEST(here_result->sum == here_sum);
}

/// Both nodes' debug text holds `rounds` (their `(rounds ...)` counts).
void expect_rounds_on_both(nodes_here& n, const std::string& rounds) {
  for (const auto& node : {n.actor_a, n.actor_b}) {
    auto text = n.debug(node);
    BOOST_TEST(contains(text, rounds), text);
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_replay_runs_in_order_across_nodes) {
  // a0 notes, b0 waits for it and notes, a1 waits for b0 and notes, a0
  // waits for a1 (a wait inside node a) and notes: every replay is
  // a0 -> b0 -> a1 -> a0, two edges between the nodes each way per replay.
  nodes_here n;
  auto& c = *n.client;
  the_log().take();
  event first;
  auto r = c.record("step", [&] {
    first = c.schedule_named(n.a0, note("a0 first"));
    c.will_wait_for(c.make_context(n.b0), first);
    auto on_b = c.schedule_named(n.b0, note("b0"));
    c.will_wait_for(c.make_context(n.a1), on_b);
    auto on_a1 = c.schedule_named(n.a1, note("a1"));
    c.will_wait_for(c.make_context(n.a0), on_a1);
    c.schedule_named(n.a0, note("a0 last"));
  });
  auto evs = replay_thrice(c, r, r.slot(first, 0), "a0 first");
  BOOST_TEST(the_log().take() == thrice("a0 first", {"b0", "a1", "a0 last"}),
             boost::test_tools::per_element());
  // Each item's event names its device, and replays take consecutive seqs
  // on each device: a0 has 3 entries a replay (two notes, a wait).
  BOOST_TEST((evs[0].item(0).key() == n.a0.key()));
  BOOST_TEST((evs[0].item(2).key() == n.b0.key()));
  BOOST_TEST((evs[0].item(4).key() == n.a1.key()));
  BOOST_TEST(evs[1].item(6).seq() == evs[0].item(6).seq() + 3);
  BOOST_TEST(evs[2].all_work_of(n.b0).seq() == evs[1].all_work_of(n.b0).seq() + 2);
  expect_items_done(c, evs[2]);
  // One round_run per node per replay: the nodes say so.
  expect_rounds_on_both(n, "(rounds (parts 1) (replays 3) (early 0) (dropped 0))");
  // The round's last handle goes: the nodes let go of its parts.
  evs.clear();
  r = multidev::round{};
  for (const auto& node : {n.actor_a, n.actor_b})
    BOOST_TEST(test_support::eventually(
                 [&] { return contains(n.debug(node), "(rounds (parts 0) (replays 3)"); }),
               n.debug(node));
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_replays_order_with_the_calls) {
  // A wait sent before the replay (a `depend`, not answered yet) comes
  // before its entries on b0; a call made after it comes after them.
  nodes_here n;
  auto& c = *n.client;
  the_log().take();
  auto r = c.record("on b", [&] { c.schedule_named(n.b0, note("replayed")); });
  c.replay(r); // the part goes to b once
  sync(c, c.all_work(n.b0));
  the_log().take();
  auto gate = hold_here();
  auto held = c.schedule_named(n.a0, {"test_hold", {}});
  c.will_wait_for(c.make_context(n.b0), held);
  auto ev = c.replay(r);
  c.schedule_named(n.b0, note("after"));
  gate->open();
  sync(c, c.all_work(n.b0));
  release_hold();
  BOOST_TEST(the_log().take() == (std::vector<std::string>{"held", "replayed", "after"}),
             boost::test_tools::per_element());
  sync(c, ev.item(0));
  BOOST_TEST(c.is_done(ev.item(0)));
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_failure_reaches_the_waiting_node_with_provenance) {
  nodes_here n;
  auto& c = *n.client;
  the_log().take();
  event maybe;
  auto r = c.record("step", [&] {
    maybe = c.schedule_named(n.a0, {"test_maybe_fail", {int64_t{0}}});
    c.will_wait_for(c.make_context(n.b0), maybe);
    c.schedule_named(n.b0, note("after a0"));
  });
  auto slot = r.slot(maybe, 0);
  sync(c, c.replay(r).all_work_of(n.b0));
  r.arg(slot) = 1;
  auto ev = c.replay(r);
  auto on_a = expect_throw<device_error>([&] { sync(c, ev.item(0)); },
                                         "replay 2 of round 'step', item '");
  BOOST_TEST(contains(on_a, "a planned failure"), on_a);
  // b0 waited on it: it fails with a0's failure, named as the client names a0.
  auto on_b = expect_throw<device_error>([&] { sync(c, ev.item(2)); }, "a planned failure");
  BOOST_TEST(contains(on_b, "replay 2 of round 'step'"), on_b);
  BOOST_TEST(contains(on_b, "waited for " + n.a0.name() + " seq "), on_b);
  // Recovered, the next replay runs whole.
  BOOST_TEST(c.recover(n.a0));
  BOOST_TEST(c.recover(n.b0));
  r.arg(slot) = 0;
  the_log().take();
  sync(c, c.replay(r).all_work_of(n.b0));
  BOOST_TEST(the_log().take() == std::vector<std::string>{"after a0"},
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_replay_refused_by_a_failed_device_says_so) {
  nodes_here n;
  auto& c = *n.client;
  auto r = c.record("step", [&] {
    auto e = c.schedule_named(n.a0, note("a0"));
    c.will_wait_for(c.make_context(n.b0), e);
    c.schedule_named(n.b0, note("b0"));
  });
  sync(c, c.replay(r).all_work_of(n.b0));
  auto failed = c.schedule_named(n.a0, {"fail", {std::string{"down on purpose"}}});
  BOOST_CHECK_THROW(sync(c, failed), device_error);
  // Node a refuses the whole replay; b0's wait on it fails instead of
  // waiting forever, and the events of a's items say why.
  auto ev = c.replay(r);
  expect_throw<device_error>([&] { ev.item(0); }, "replay 2 of round 'step' on node a");
  auto waited = expect_throw<device_error>([&] { sync(c, ev.item(2)); },
                                           "replay 2 of round 'step' failed on node a");
  BOOST_TEST(contains(waited, "down on purpose"), waited);
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_node_gone_fails_the_waits_on_it) {
  nodes_here n;
  auto& c = *n.client;
  auto gate = hold_here();
  auto r = c.record("step", [&] {
    auto e = c.schedule_named(n.a0, {"test_hold", {}});
    c.will_wait_for(c.make_context(n.b0), e);
    c.schedule_named(n.b0, note("b0"));
  });
  auto ev = c.replay(r);
  auto on_b = ev.item(2); // pushed on b: its wait holds it
  // Node a's actor stops (its sessions end; the held item cannot be
  // stopped, so a0's item is never told): b hears the actor go and fails
  // the wait instead of holding it forever.
  caf::anon_send_exit(n.actor_a, caf::exit_reason::user_shutdown);
  expect_throw<device_error>([&] { sync(c, on_b); }, "node a went down");
  gate->open();
  release_hold();
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_notice_from_the_wrong_node_is_dropped) {
  // The client (admitted to b's session) claims a0's item is done: b takes
  // a notice only from the node its part names for the item.
  nodes_here n;
  auto& c = *n.client;
  auto gate = hold_here();
  the_log().take();
  auto r = c.record("step", [&] {
    auto e = c.schedule_named(n.a0, {"test_hold", {}});
    c.will_wait_for(c.make_context(n.b0), e);
    c.schedule_named(n.b0, note("b0"));
  });
  auto ev = c.replay(r);
  auto on_b = ev.item(2);
  // The session's id on b is 1 (its first); the round is the client's.
  auto text = n.debug(n.actor_b);
  BOOST_TEST_REQUIRE(contains(text, "(session (id 1)"), text);
  caf::scoped_actor self{*n.sys_c};
  std::vector<round_notice> lie;
  for (uint64_t round = 0; round < 65; ++round) { // whatever the client's round id is
    round_notice x;
    x.round = round;
    x.replay = 1;
    lie.push_back(x);
  }
  self->send(n.actor_b, atoms::round_done_atom::value, uint64_t{1}, lie);
  // Ordered after the lie (one sender, one receiver): b's answer to debug.
  text = n.debug(n.actor_b);
  BOOST_TEST(contains(text, "(dropped 65)"), text);
  BOOST_TEST(contains(text, "(queued 2)"), text); // b0's wait and note: still waiting
  gate->open();
  sync(c, on_b);
  release_hold();
  BOOST_TEST(the_log().take() == (std::vector<std::string>{"held", "b0"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_malformed_part_is_refused_naming_the_field) {
  nodes_here n;
  auto& c = *n.client;
  // Attach once, so that session 1 on a is the client's.
  auto r = c.record("step", [&] { c.schedule_named(n.a0, note("a0")); });
  sync(c, c.replay(r).all_work_of(n.a0));
  caf::scoped_actor self{*n.sys_c};
  auto put = [&](round_part p) {
    std::string text;
    self->request(n.actor_a, 10s, atoms::round_put_atom::value, uint64_t{1}, std::move(p))
      .receive([&](bool) { text = "accepted"; },
               [&](caf::error& e) { text = n.sys_c->render(e); });
    return text;
  };
  round_part good;
  good.round = 1000;
  good.name = "bad";
  good.devices = {0, 1};
  good.steps.push_back(round_step{0, 0, -1, 0, 0, "t", {}, note("x")});
  good.steps.push_back(round_step{1, 1, 0, 0, 0, "w", {}, {}});
  BOOST_TEST(put(good) == "accepted");
  auto p = good;
  p.round = 1001;
  p.steps[1].wait_on = 1; // itself
  BOOST_TEST(contains(put(p), "step 1 waits on step 1, not an earlier one"));
  p = good;
  p.round = 1002;
  p.steps[0].lane = 7;
  BOOST_TEST(contains(put(p), "step 0 is on device 7, the part has 2"));
  p = good;
  p.round = 1003;
  p.devices = {0, 9};
  BOOST_TEST(contains(put(p), "device 1 is ordinal 9, the session has 2 devices"));
  p = good;
  p.round = 1004;
  p.steps[1].wait_on = -2;
  p.steps[1].peer = 3;
  BOOST_TEST(contains(put(p), "step 1 waits on peer 3, the part has 0"));
  p = good;
  p.round = 1005;
  p.peers.push_back(round_peer{n.actor_a, 1, "itself", "", 0});
  BOOST_TEST(contains(put(p), "peer 0 is this node itself"));
  p = good;
  p.round = 1007;
  p.steps[0].op = 6;
  BOOST_TEST(contains(put(p), "step 0 has op 6, not 0 (a task), 1 (a memset), 2 (an alloc_pool), "
                              "3 (a free_pool), 4 (a copy's send) or 5 (a copy's write)"));
  p = good;
  p.round = 1013;
  p.steps[0].op = round_step::alloc;
  p.steps[0].spec = task_spec{{}, {buffer_arg{buffer_loc{5, 0}, 64}}};
  p.steps[0].alignment = 64;
  p.steps[0].mode = 42;
  BOOST_TEST(contains(put(p), "step 0: alloc: pool 5: mode 42 is not a memory mode"));
  p.round = 1014;
  p.steps[0].mode = -1;
  p.steps[0].alignment = uint64_t{1} << 40;
  BOOST_TEST(contains(put(p), "step 0: alloc: pool 5: alignment 1099511627776 exceeds the limit"));
  p.round = 1015;
  p.steps[0].alignment = 64;
  p.steps[0].spec = task_spec{{}, {buffer_arg{buffer_loc{5, 8}, 64}}};
  BOOST_TEST(contains(put(p), "step 0 is an alloc_pool at offset 8, not 0"));
  p.round = 1016;
  p.steps[0].op = round_step::free;
  p.steps[0].spec = task_spec{"fill", {buffer_arg{buffer_loc{5, 0}, 0}}};
  BOOST_TEST(
    contains(put(p), "step 0 is a free_pool but not one buffer argument and no kernel"));
  p.round = 1017;
  p.steps[0].spec = task_spec{{}, {buffer_arg{buffer_loc{5, 0}, 0}}};
  BOOST_TEST(put(p) == "accepted");
  p = good;
  p.round = 1008;
  p.steps[0].op = round_step::zero; // with the note's kernel and string
  BOOST_TEST(contains(put(p), "step 0 is a memset but not one buffer argument and no kernel"));
  p = good;
  p.round = 1011;
  p.steps[1].op = round_step::zero; // a wait
  p.steps[1].spec = task_spec{{}, {buffer_arg{buffer_loc{1, 0}, 4}}};
  BOOST_TEST(contains(put(p), "step 1 is a memset but not one buffer argument and no kernel"));
  p = good;
  p.round = 1012;
  p.steps[0].op = round_step::zero;
  p.steps[0].spec = task_spec{{}, {buffer_arg{buffer_loc{1, 0}, 4}, int64_t{3}}};
  BOOST_TEST(contains(put(p), "step 0 is a memset but not one buffer argument and no kernel"));
  p = good;
  p.round = 1009;
  p.steps[0].op = round_step::zero;
  p.steps[0].spec = task_spec{{}, {buffer_arg{buffer_loc{1, 0}, 4}}};
  BOOST_TEST(put(p) == "accepted");
  p.round = 1010;
  p.slot_steps = {0};
  p.slot_args = {0};
  BOOST_TEST(contains(put(p), "slot 0 names argument 0 of step 0, which has no such argument"));
  // A copy's ends: a send on device 0, a wait for it and the write on 1.
  auto end = [](uint8_t op, uint32_t lane, std::size_t size) {
    round_step s{5, lane, -1, 0, 0, "copy 5", {}, task_spec{{}, {buffer_arg{buffer_loc{1, 0}, size}}}};
    s.op = op;
    return s;
  };
  round_part copy;
  copy.round = 1020;
  copy.name = "copy";
  copy.devices = {0, 1};
  copy.steps = {end(round_step::send, 0, 4), round_step{5, 1, 0, 0, 0, "copy 5", {}, {}},
                end(round_step::write, 1, 4)};
  BOOST_TEST(put(copy) == "accepted");
  p = copy;
  p.round = 1021;
  p.steps.erase(p.steps.begin() + 1);
  BOOST_TEST(contains(put(p), "step 1 writes the bytes of item 5 with no earlier wait for them "
                              "on its device"));
  p = copy;
  p.round = 1022;
  p.steps.resize(1);
  BOOST_TEST(contains(put(p), "step 0 sends item 5, which no write here and no peer takes"));
  p = copy;
  p.round = 1023;
  p.steps[2] = end(round_step::write, 1, 8);
  BOOST_TEST(contains(put(p), "step 2 writes 8 bytes of item 5, whose send (step 0) reads 4"));
  p = copy;
  p.round = 1024;
  p.steps = {end(round_step::write, 1, 4)};
  BOOST_TEST(contains(put(p), "step 0 writes item 5, which no step here awaits from a peer"));
  p = copy;
  p.round = 1025;
  p.steps.push_back(end(round_step::write, 0, 4));
  BOOST_TEST(contains(put(p), "steps 2 and 3 are both the write of item 5"));
  p = copy;
  p.round = 1026;
  p.steps[0].lane = 1;
  BOOST_TEST(contains(put(p), "step 1 waits on step 0 of its own device"));
  p = copy;
  p.round = 1027;
  p.steps[2].spec.kernel = "fill";
  BOOST_TEST(contains(put(p), "step 2 is a copy's write but not one buffer argument and no kernel"));
  p = copy;
  p.round = 1028;
  p.peers.push_back(round_peer{n.actor_b, 1, "b", "", 0});
  p.notify_steps = {0};
  p.notify_peers = {0};
  BOOST_TEST(contains(put(p), "step 0 sends item 5 to 2 takers (the part's write or one peer)"));
  BOOST_TEST(contains(put(good), "holds a part of round 1000 already"));
  // Only the session's client sends it rounds: node b's system is refused.
  {
    caf::scoped_actor other{*n.sys_b};
    std::string text;
    auto p2 = good;
    p2.round = 1006;
    other->request(n.actor_a, 10s, atoms::round_put_atom::value, uint64_t{1}, p2)
      .receive([&](bool) { text = "accepted"; },
               [&](caf::error& e) { text = n.sys_b->render(e); });
    BOOST_TEST(contains(text, "only its client may renew, detach, vouch or send it rounds"),
               text);
  }
  // A replay with the wrong number of slot values, and one out of order.
  auto run = [&](uint64_t round, uint64_t replay, std::vector<wire_arg> slots) {
    std::string text;
    self->request(n.actor_a, 10s, atoms::round_run_atom::value, uint64_t{1}, round, replay,
                  std::move(slots))
      .receive([&](std::vector<uint64_t>&) { text = "ran"; },
               [&](caf::error& e) { text = n.sys_c->render(e); });
    return text;
  };
  BOOST_TEST(contains(run(1000, 1, {wire_arg{}}), "1 slot values for 0 slots"));
  BOOST_TEST(run(1000, 2, {}) == "ran");
  BOOST_TEST(contains(run(1000, 2, {}), "replay 2 of round 'bad' comes after replay 2"));
  BOOST_TEST(contains(run(2000, 1, {}), "holds no part of round 2000"));
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_replays_behind_a_full_queue_wait_in_order) {
  // A node's queue of 4 entries: the replays wait for room on the node, in
  // order, without holding the node's actor (b's notices still come).
  backend_options opts;
  opts.queue_capacity = 4;
  nodes_here n{opts};
  auto& c = *n.client;
  auto gate = hold_here();
  the_log().take();
  auto r = c.record("step", [&] {
    for (int i = 0; i < 6; ++i)
      c.schedule_named(n.b0, note("b" + std::to_string(i)));
  });
  c.schedule_named(n.b0, {"test_hold", {}});
  std::vector<replay_events> evs;
  for (int k = 0; k < 3; ++k)
    evs.push_back(c.replay(r));
  gate->open();
  sync(c, evs.back().all_work_of(n.b0));
  release_hold();
  std::vector<std::string> want{"held"};
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 6; ++i)
      want.push_back("b" + std::to_string(i));
  BOOST_TEST(the_log().take() == want, boost::test_tools::per_element());
}

// -- rounds that run here too ---------------------------------------------------
// A round on this process's devices and the nodes': this process takes part
// as a node does (host_rounds), its part pushed whole by the replaying
// thread, one `round_run` per node, and the edges between it and the nodes
// go as `round_done` both ways.

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_round_here_and_on_nodes_is_one_message_per_node) {
  nodes_here n;
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  the_log().take();
  event first;
  auto r = c.record("mixed", [&] {
    first = c.schedule_named(h0, note("h0 first"));
    c.will_wait_for(c.make_context(n.a0), first);
    auto on_a = c.schedule_named(n.a0, note("a0"));
    c.will_wait_for(c.make_context(n.b0), on_a);
    auto on_b = c.schedule_named(n.b0, note("b0"));
    c.will_wait_for(c.make_context(h0), on_b);
    c.schedule_named(h0, note("h0 last"));
  });
  auto evs = replay_thrice(c, r, r.slot(first, 0), "h0 first");
  BOOST_TEST(the_log().take() == thrice("h0 first", {"a0", "b0", "h0 last"}),
             boost::test_tools::per_element());
  BOOST_TEST((evs[0].item(0).key() == h0.key()));
  BOOST_TEST((evs[0].item(2).key() == n.a0.key()));
  // h0 takes 3 entries a replay (two notes, a wait), a0 and b0 2 each.
  BOOST_TEST(evs[1].item(6).seq() == evs[0].item(6).seq() + 3);
  BOOST_TEST(evs[2].all_work_of(n.a0).seq() == evs[1].all_work_of(n.a0).seq() + 2);
  expect_items_done(c, evs[2]);
  // One round_run per node per replay, not the items call by call.
  expect_rounds_on_both(n, "(rounds (parts 1) (replays 3) (early 0) (dropped 0))");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_failures_cross_between_here_and_the_nodes) {
  nodes_here n;
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  the_log().take();
  event here, there;
  auto r = c.record("mixed", [&] {
    here = c.schedule_named(h0, {"test_maybe_fail", {int64_t{0}}});
    c.will_wait_for(c.make_context(n.a0), here);
    c.schedule_named(n.a0, note("a0 after h0"));
    there = c.schedule_named(n.b0, {"test_maybe_fail", {int64_t{0}}});
    c.will_wait_for(c.make_context(h0), there);
    c.schedule_named(h0, note("h0 after b0"));
  });
  auto here_slot = r.slot(here, 0);
  auto there_slot = r.slot(there, 0);
  for (int k = 0; k < 2; ++k) // no failure: both notes
    sync_all(c, c.replay(r));
  BOOST_TEST(the_log().take().size() == 4u);
  // h0's item fails: a0's wait on it fails with it, named as we name h0.
  r.arg(here_slot) = 1;
  auto ev = c.replay(r);
  auto on_a = expect_throw<device_error>([&] { sync(c, ev.item(2)); }, "a planned failure");
  BOOST_TEST(contains(on_a, "replay 3 of round 'mixed'"), on_a);
  // (Named `a/<h0>` here: node a, in this process too, takes h0's name
  // for one of its own; a node in another process names it `<host:pid>/<h0>`,
  // which comes back as h0's name.)
  BOOST_TEST(contains(on_a, h0.name() + " seq "), on_a);
  BOOST_TEST(c.recover(h0));
  BOOST_TEST(c.recover(n.a0));
  sync(c, ev.item(3));
  // b0's item fails: h0's wait on it fails with it, named as we name b0.
  r.arg(here_slot) = 0;
  r.arg(there_slot) = 1;
  ev = c.replay(r);
  auto on_h = expect_throw<device_error>([&] { sync(c, ev.item(5)); }, "a planned failure");
  BOOST_TEST(contains(on_h, "replay 4 of round 'mixed'"), on_h);
  BOOST_TEST(contains(on_h, "waited for " + n.b0.name() + " seq "), on_h);
  sync(c, ev.item(2)); // a0's note: h0's item was done
  BOOST_TEST(c.recover(n.b0));
  BOOST_TEST(c.recover(h0));
  // Recovered, the next replay runs whole.
  r.arg(there_slot) = 0;
  the_log().take();
  sync_all(c, c.replay(r));
  auto notes = the_log().take();
  std::sort(notes.begin(), notes.end());
  BOOST_TEST(notes == (std::vector<std::string>{"a0 after h0", "h0 after b0"}),
             boost::test_tools::per_element());
}

/// A round whose item on `held` (a node's device) is held while this
/// process's device waits on it, replayed once and its node's answer in;
/// then `lose` loses that node, its item still held: the wait here fails
/// with `why` instead of holding the device until the item ends.
void expect_the_wait_here_fails(nodes_here& n, const device& held,
                                const std::function<void()>& lose, const std::string& why) {
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  auto gate = hold_here();
  auto r = c.record("mixed", [&] {
    auto e = c.schedule_named(held, {"test_hold", {}});
    c.will_wait_for(c.make_context(h0), e);
    c.schedule_named(h0, note("h0 after the node"));
  });
  auto ev = c.replay(r);
  (void)ev.item(0); // the node's answer is in: it pushed the replay
  lose();
  expect_throw<device_error>([&] { sync(c, ev.item(2)); }, why);
  gate->open();
  release_hold();
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_node_gone_fails_the_waits_here_on_it) {
  // Node a's actor stops: this process hears the actor go.
  nodes_here n;
  expect_the_wait_here_fails(
    n, n.a0, [&] { caf::anon_send_exit(n.actor_a, caf::exit_reason::user_shutdown); },
    "node a went down");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_node_detached_fails_the_waits_here_on_it) {
  // The client detaches b: b's actor stays up (no actor goes down), but
  // the client's link to it closes, which calls this process's part.
  nodes_here n;
  expect_the_wait_here_fails(n, n.b0, [&] { detach_node(*n.client, "b"); },
                             "this process lost it");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_replay_refused_where_the_session_ended_fails_the_waits_on_it) {
  nodes_here n({}, 0, quiet_attach());
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  auto r = c.record("step", [&] {
    auto e = c.schedule_named(n.b0, note("b0"));
    c.will_wait_for(c.make_context(n.a0), e);
    c.schedule_named(n.a0, note("a0 after b0"));
    c.will_wait_for(c.make_context(h0), e);
    c.schedule_named(h0, note("h0 after b0"));
  });
  sync_all(c, c.replay(r));
  n.end_session_unbeknown(n.actor_b);
  auto ev = c.replay(r);
  // b refuses the replay, without reaching its part, so it tells no one:
  // the client tells node a and this process's part, whose waits on b's
  // item fail instead of hanging.
  auto on_b = expect_throw<device_error>([&] { sync(c, ev.item(0)); }, "session ended");
  BOOST_TEST(contains(on_b, "replay 2 of round 'step' on node b"), on_b);
  for (auto i : {2u, 4u}) {
    auto waited = expect_throw<device_error>([&] { sync(c, ev.item(i)); },
                                             "replay 2 of round 'step' failed on node b");
    BOOST_TEST(contains(waited, "session ended"), waited);
  }
  BOOST_TEST(contains(n.debug(n.actor_a), "(rounds (parts 1) (replays 2)"), n.debug(n.actor_a));
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_refusal_is_told_before_the_slowest_node_answers) {
  // Node a's queue is full (its replay waits for room behind a held item)
  // while node b refuses the replay: this process's wait on b's item fails
  // at once, not once a answers (a's room may depend on that very wait).
  nodes_here n(small_queues(), 0, quiet_attach());
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  auto r = c.record("step", [&] {
    auto e = c.schedule_named(n.b0, note("b0"));
    c.will_wait_for(c.make_context(h0), e);
    c.schedule_named(h0, note("h0 after b0"));
    c.schedule_named(n.a0, note("a0"));
  });
  sync_all(c, c.replay(r));
  auto gate = hold_here();
  n.fill_past_capacity(n.a0, n.actor_a);
  n.end_session_unbeknown(n.actor_b);
  auto ev = c.replay(r);
  expect_throw<device_error>([&] { sync(c, ev.item(2)); },
                             "replay 2 of round 'step' failed on node b");
  BOOST_TEST(contains(n.debug(n.actor_a), "(replays 1)"), n.debug(n.actor_a));
  gate->open();
  sync(c, ev.item(3)); // a's part, once it had room
  release_hold();
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_replay_waiting_for_room_is_refused_when_the_session_ends) {
  // Node a holds the replay for room when its session ends: it answers
  // the replay with the end (a promise dropped would answer nothing, and
  // the client would find out only at its next renewal), and b's wait on
  // a's item fails with it.
  nodes_here n(small_queues(), 0, quiet_attach());
  auto& c = *n.client;
  auto r = c.record("step", [&] {
    auto e = c.schedule_named(n.a0, note("a0"));
    c.will_wait_for(c.make_context(n.b0), e);
    c.schedule_named(n.b0, note("b0 after a0"));
  });
  sync_all(c, c.replay(r));
  auto gate = hold_here();
  n.fill_past_capacity(n.a0, n.actor_a);
  auto ev = c.replay(r);
  n.await_debug(n.actor_a, "(deferred_replays 1)", "node a deferring the replay");
  n.end_session_unbeknown(n.actor_a);
  auto on_a = expect_throw<device_error>(
    [&] { test_support::bounded([&] { (void)ev.item(0); }, "node a's answer"); },
    "replay 2 refused");
  BOOST_TEST(contains(on_a, "the client detached"), on_a);
  expect_throw<device_error>([&] { sync(c, ev.item(2)); },
                             "replay 2 of round 'step' failed on node a");
  gate->open();
  release_hold();
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_two_clients_replay_their_rounds_on_the_same_nodes) {
  // A second client, of its own actor system, attaches both nodes too: each
  // client's rounds live in its own sessions there, and the two replay at
  // once, their notices between the nodes kept apart by session.
  nodes_here n;
  caf::actor_system_config cfg_d;
  configure_system(cfg_d);
  cfg_d.set("scheduler.max-threads", std::size_t{2});
  caf::actor_system sys_d{cfg_d};
  std::optional<backend> other;
  other.emplace(sys_d, backend_options{.num_devices = 1});
  auto da = attach_node(*other, "127.0.0.1", n.port_a, test_support::test_attach_options());
  auto db = attach_node(*other, "127.0.0.1", n.port_b, test_support::test_attach_options());
  the_log().take();
  constexpr int replays = 20;
  auto chain = [&](backend& c, const device& a0, const device& b0, const std::string& who) {
    event at_a;
    auto r = c.record("step", [&] {
      at_a = c.schedule_named(a0, note(who + " a0"));
      c.will_wait_for(c.make_context(b0), at_a);
      auto at_b = c.schedule_named(b0, note(who + " b0"));
      c.will_wait_for(c.make_context(a0), at_b);
    });
    auto slot = r.slot(at_a, 0);
    replay_events last;
    for (int k = 1; k <= replays; ++k) {
      r.arg(slot) = who + " a0 " + std::to_string(k);
      last = c.replay(r);
    }
    sync_all(c, last);
  };
  std::thread second{[&] { chain(*other, da.at(0), db.at(0), "d"); }};
  chain(*n.client, n.a0, n.b0, "c");
  second.join();
  auto log = the_log().take();
  for (const std::string who : {"c", "d"}) {
    std::vector<std::string> mine, want;
    for (const auto& s : log)
      if (s.starts_with(who + " "))
        mine.push_back(s);
    for (int k = 1; k <= replays; ++k) {
      want.push_back(who + " a0 " + std::to_string(k));
      want.push_back(who + " b0");
    }
    BOOST_TEST(mine == want, boost::test_tools::per_element());
  }
  // Each node: two sessions, each replayed its part 20 times, and let it
  // go once the round was gone (`round_drop`, not waited for).
  auto sessions_done = [](const std::string& text) {
    std::size_t found = 0;
    const std::string each = "(rounds (parts 0) (replays 20) (early 0) (dropped 0))";
    for (auto at = text.find(each); at != std::string::npos; at = text.find(each, at + 1))
      ++found;
    return found;
  };
  for (const auto& node : {n.actor_a, n.actor_b})
    BOOST_TEST(test_support::eventually([&] { return sessions_done(n.debug(node)) == 2; }),
               n.debug(node));
  other.reset();
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_closure_here_replays_with_the_nodes) {
  // A closure cannot travel to a node, but one on this process's devices
  // takes part: it runs in place each replay, and a node waits on it.
  nodes_here n;
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  the_log().take();
  std::atomic<int> runs{0};
  std::atomic<bool> fail{false};
  event e;
  auto r = c.record("mixed", [&] {
    c.schedule_task(h0, {"count", [&] {
                                    if (fail.load())
                                      throw std::runtime_error("the closure failed");
                                    the_log().add("closure " + std::to_string(++runs));
                                  }});
    e = c.all_work(h0); // the closure's item
    c.will_wait_for(c.make_context(n.a0), e);
    c.schedule_named(n.a0, note("a0"));
  });
  r.name_item(e, "count");
  replay_events ev;
  for (int k = 0; k < 3; ++k)
    ev = c.replay(r);
  sync(c, ev.all_work_of(n.a0));
  // The closures in order, and each replay's a0 after its closure.
  auto log = the_log().take();
  std::vector<std::string> closures;
  std::size_t a0s = 0;
  for (const auto& s : log) {
    if (s == "a0") {
      ++a0s;
      BOOST_TEST(closures.size() >= a0s, "a0 of replay " << a0s << " before its closure");
    } else {
      closures.push_back(s);
    }
  }
  BOOST_TEST(a0s == 3u);
  BOOST_TEST(closures == (std::vector<std::string>{"closure 1", "closure 2", "closure 3"}),
             boost::test_tools::per_element());
  BOOST_TEST(contains(n.debug(n.actor_a), "(rounds (parts 1) (replays 3) (early 0) (dropped 0))"),
             n.debug(n.actor_a));
  // It fails: a0's wait on it fails with its provenance.
  fail = true;
  ev = c.replay(r);
  auto on_a = expect_throw<device_error>([&] { sync(c, ev.item(2)); }, "the closure failed");
  BOOST_TEST(contains(on_a, "replay 4 of round 'mixed', item 'count'"), on_a);
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_routine_here_replays_with_the_nodes) {
  // A routine (link + run) on this process's device takes part too, as
  // `run` pushes it: its node's writer is the replay's routine.
  nodes_here n;
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  the_log().take();
  tnode y{1, "y", 4 * sizeof(float), memory_mode::on_device};
  auto ch = c.alloc_node(c.make_context(h0), y);
  c.run(c.link(ch, "fill", {y, 1.0}));
  auto r = c.record("mixed", [&] {
    c.run(c.link(ch, "scale", {y, 2.0}));
    c.will_wait_for(c.make_context(n.a0), c.all_work(h0));
    c.schedule_named(n.a0, note("a0"));
  });
  replay_events ev;
  for (int k = 0; k < 3; ++k)
    ev = c.replay(r);
  sync(c, ev.all_work_of(n.a0));
  BOOST_TEST(the_log().take() == (std::vector<std::string>{"a0", "a0", "a0"}),
             boost::test_tools::per_element());
  BOOST_TEST(contains(n.debug(n.actor_a), "(rounds (parts 1) (replays 3) (early 0) (dropped 0))"),
             n.debug(n.actor_a));
  BOOST_TEST(test_support::read_back(c, ch, y) == std::vector<float>(4, 8.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_memsets_replay_on_the_nodes_and_here) {
  // A memset on a node's device is a step of its part (an order as
  // `memset_zero` pushes it, its pool looked up on the node at each
  // replay), one here of this process's part: the round still replays as
  // one message per node.
  nodes_here n;
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  constexpr int pool = 7;
  constexpr std::size_t bytes = 8 * sizeof(float);
  buffer_arg whole{buffer_loc{pool, 0}, bytes};
  c.alloc_pool(n.a0, pool, bytes, 64);
  c.alloc_pool(n.a0, pool + 1, 4, 64);
  c.alloc_pool(h0, pool, bytes, 64);
  c.schedule_named(h0, {"fill", {whole, 1.0}});
  auto r = c.record("zero", [&] {
    c.schedule_named(n.a0, {"fill", {whole, 2.0}});
    c.memset_zero(n.a0, pool, 0, 4 * sizeof(float));
    auto sum = c.schedule_named(n.a0, {"checksum", {whole, std::string{"node zero"}}});
    c.memset_zero(h0, pool, 4, 8);
    c.will_wait_for(c.make_context(h0), sum);
    c.schedule_named(h0, {"checksum", {whole, std::string{"here zero"}}});
    c.memset_zero(n.a0, pool + 1, 0, 4);
  });
  replay_thrice_and_expect_sums(n, r, "node zero", 2.0 * 4,
                                "here zero", 1.0 * 6); // here: floats 1 and 2 zeroed
  // A memset's pool freed on the node: the node refuses its part of the
  // next replay, naming the memset.
  c.free_pool(n.a0, pool + 1);
  sync(c, c.all_work(n.a0));
  auto bad = c.replay(r);
  expect_throw<device_error>([&] { (void)bad.all_work_of(n.a0); },
                             "a: replay 4 of round 'zero' on node a: node a: replay: replay 4 of "
                             "round 'zero', item 'memset_zero 8 6': memset_zero");
  // h0's part of it waited on the node's checksum: it fails with that cause.
  expect_throw<device_error>([&] { sync(c, bad.all_work_of(h0)); },
                             "replay 4 of round 'zero' failed on node a: node a: replay: replay 4 "
                             "of round 'zero', item 'memset_zero 8 6': memset_zero");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_pool_calls_replay_on_the_nodes_within_the_quota) {
  // A round's alloc_pool and free_pool on a node's device are steps of its
  // part (the node's table changed as the step is made, the release
  // ordered with the work), checked against the session's memory quota as
  // the `alloc` message is; here too: the round still replays as one
  // message per node.
  nodes_here n{{}, 4096};
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  constexpr int pool = 7;
  constexpr std::size_t bytes = 8 * sizeof(float);
  buffer_arg whole{buffer_loc{pool, 0}, bytes};
  auto r = c.record("pools", [&] {
    c.alloc_pool(n.a0, pool, bytes, 64);
    c.schedule_named(n.a0, {"fill", {whole, 2.0}});
    auto sum = c.schedule_named(n.a0, {"checksum", {whole, std::string{"node pools"}}});
    c.free_pool(n.a0, pool);
    c.alloc_pool(h0, pool, bytes, 64);
    c.schedule_named(h0, {"fill", {whole, 1.0}});
    c.will_wait_for(c.make_context(h0), sum);
    c.schedule_named(h0, {"checksum", {whole, std::string{"here pools"}}});
    c.free_pool(h0, pool);
  });
  replay_thrice_and_expect_sums(n, r, "node pools", 2.0 * 8, "here pools", 1.0 * 8);
  BOOST_TEST(c.get_used_memory(n.a0) == 0u);
  BOOST_TEST(c.get_used_memory(h0) == 0u);

  // Past the session's quota: the node refuses its part, naming the item
  // and the limit, and its tables are as before the replay.
  auto big = c.record("big", [&] {
    c.alloc_pool(n.a0, 8, 1024, 64);
    c.alloc_pool(n.a1, 9, 8192, 64);
  });
  auto bad = c.replay(big);
  expect_throw<device_error>([&] { (void)bad.all_work_of(n.a0); },
                             "replay 1 of round 'big', item 'alloc_pool 9 1': session 1 of node "
                             "a: alloc_pool 9 of 8192 bytes refused: the session holds 1024 "
                             "bytes and its memory limit is 4096 bytes");
  BOOST_TEST(c.get_used_memory(n.a0) == 0u);
  BOOST_TEST(c.get_used_memory(n.a1) == 0u);
  expect_throw<std::invalid_argument>([&] { c.memset_zero(n.a0, 8, 0, 4); }, "pool 8");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_round_here_let_go_while_another_replays_does_not_hang) {
  // Round A (here and on a node) is let go once its work is done; replaying
  // round B then lets go of A's part here while it holds this process's
  // part lock (A's plan goes as the backend stops keeping it): that drop
  // must not take the lock again.
  nodes_here n;
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  auto mixed = [&](const char* name) {
    return c.record(name, [&] {
      auto e = c.schedule_named(h0, note(std::string{name} + " h0"));
      c.will_wait_for(c.make_context(n.a0), e);
      c.schedule_named(n.a0, note(std::string{name} + " a0"));
    });
  };
  {
    auto a = mixed("A");
    sync_all(c, c.replay(a));
  }
  auto b = mixed("B");
  test_support::bounded([&] {
    for (int k = 0; k < 3; ++k)
      sync_all(c, c.replay(b));
  });
  // A's part went from node a too; B's stays.
  BOOST_TEST(test_support::eventually(
               [&] { return contains(n.debug(n.actor_a), "(rounds (parts 1) (replays 4)"); }),
             n.debug(n.actor_a));
}

/// `t` allocated on `d` by `c`: the context that holds it, and the whole
/// node as a kernel's buffer argument.
std::pair<context, buffer_arg> placed(backend& c, const device& d, const tnode& t) {
  auto ctx = c.alloc_node(c.make_context(d), t);
  buffer_arg arg{ctx.buffers.at(t), t.size_in_bytes};
  return {std::move(ctx), arg};
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_copies_replay_on_the_nodes_one_message_per_node) {
  // A copy between two devices of one node (a0 -> a1) and one between two
  // nodes (a0 -> b0, 1 MiB and a bit: two notices of bytes) are steps of
  // the nodes' parts: a read on a0 in a0's order, a write in the
  // destination's order after a wait for the bytes (in node a's part; from
  // node a, node to node). The round replays as one message per node, and
  // each replay copies what its own iota wrote.
  nodes_here n;
  auto& c = *n.client;
  // (3 MiB took 55 s under ThreadSanitizer, past the session's lease of 3 s:
  // 1 MiB and a bit, two parts, takes 2 s.)
  constexpr std::size_t floats = (std::size_t{1} << 18) + 64;
  auto t = test_support::node(1, "t", floats);
  auto [ca0, on_a0] = placed(c, n.a0, t);
  auto [ca1, on_a1] = placed(c, n.a1, t);
  auto [cb0, on_b0] = placed(c, n.b0, t);
  event iota;
  auto r = c.record("copies", [&] {
    iota = c.schedule_named(n.a0, {"iota", {on_a0, 0.0}});
    c.schedule_named(n.a0, {"checksum", {on_a0, std::string{"a0"}}});
    c.device_to_device(t, merge_buffer_use::no, ca1, ca0);
    c.device_to_device(t, merge_buffer_use::no, cb0, ca0);
    c.schedule_named(n.a1, {"checksum", {on_a1, std::string{"a1"}}});
    c.schedule_named(n.b0, {"checksum", {on_b0, std::string{"b0"}}});
  });
  auto start = r.slot(iota, 1);
  replay_events ev;
  uint64_t last_hash = 0;
  for (int k = 1; k <= 3; ++k) {
    r.arg(start) = 1000.0 * k;
    ev = c.replay(r);
    expect_items_done(c, ev);
    auto a0 = c.result(n.a0, "a0"), a1 = c.result(n.a1, "a1"), b0 = c.result(n.b0, "b0");
    BOOST_TEST_REQUIRE((a0 && a1 && b0));
    BOOST_TEST(a0->count == floats);
    BOOST_TEST(a0->hash != last_hash, "replay " << k); // this replay's iota
    last_hash = a0->hash;
    BOOST_TEST((*a1 == *a0), "replay " << k);
    BOOST_TEST((*b0 == *a0), "replay " << k);
  }
  // The copies' events are their writes, on the destinations.
  BOOST_TEST((ev.item(2).key() == n.a1.key()));
  BOOST_TEST((ev.item(3).key() == n.b0.key()));
  expect_rounds_on_both(n, "(rounds (parts 1) (replays 3) (early 0) (dropped 0))");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_copy_fails_with_its_source_and_is_waited_on_across_nodes) {
  // a0 fails before its copies read: the writes on a1 (same node) and b0
  // (node b) fail with a0's failure, and a1's wait on b0's copy (node b to
  // node a) carries it on; recovered, the next replay copies again.
  nodes_here n;
  auto& c = *n.client;
  auto t = test_support::node(1, "t", 16);
  auto [ca0, on_a0] = placed(c, n.a0, t);
  auto ca1 = placed(c, n.a1, t).first;
  auto [cb0, at_b0] = placed(c, n.b0, t);
  event maybe, to_b;
  auto r = c.record("step", [&] {
    c.schedule_named(n.a0, {"fill", {on_a0, 3.0}});
    maybe = c.schedule_named(n.a0, {"test_maybe_fail", {int64_t{0}}});
    c.device_to_device(t, merge_buffer_use::no, ca1, ca0);
    c.device_to_device(t, merge_buffer_use::no, cb0, ca0);
    to_b = c.all_work(n.b0);
    c.will_wait_for(c.make_context(n.a1), to_b);
    c.schedule_named(n.a1, note("a1 after b0's copy"));
    c.schedule_named(n.b0, {"checksum", {at_b0, std::string{"b0"}}});
  });
  auto fail = r.slot(maybe, 0);
  the_log().take();
  sync_all(c, c.replay(r));
  BOOST_TEST(the_log().take() == std::vector<std::string>{"a1 after b0's copy"},
             boost::test_tools::per_element());
  r.arg(fail) = 1;
  auto ev = c.replay(r);
  auto on_a1 = expect_throw<device_error>([&] { sync(c, ev.item(2)); }, "a planned failure");
  BOOST_TEST(contains(on_a1, "replay 2 of round 'step'"), on_a1);
  auto on_b0 = expect_throw<device_error>([&] { sync(c, ev.item(3)); }, "a planned failure");
  BOOST_TEST(contains(on_b0, "waited for " + n.a0.name() + " seq "), on_b0);
  for (const auto& d : {n.a0, n.a1, n.b0})
    BOOST_TEST(c.recover(d));
  r.arg(fail) = 0;
  auto again = c.replay(r);
  sync_all(c, again);
  auto b0 = c.result(n.b0, "b0");
  BOOST_TEST_REQUIRE(b0.has_value());
  BOOST_TEST(b0->sum == 3.0 * 16);
  BOOST_TEST(the_log().take() == std::vector<std::string>{"a1 after b0's copy"},
             boost::test_tools::per_element());
}

/// Node a's system (a peer of the rounds on b: its session there admits it)
/// sending b notices of a copy's bytes for item `item` of replay `replay`:
/// `parts` (offset, size) of `fill` bytes, for each round id the client's
/// may be (0 to 64).
void send_bytes_as_node_a(nodes_here& n, uint64_t replay, uint32_t item,
                          const std::vector<std::pair<uint64_t, std::size_t>>& parts,
                          char fill = 'x') {
  caf::scoped_actor liar{*n.sys_a};
  std::vector<round_notice> notices;
  for (uint64_t round = 0; round < 65; ++round)
    for (auto [offset, size] : parts) {
      round_notice x;
      x.round = round;
      x.replay = replay;
      x.item = item;
      x.offset = offset;
      x.bytes.assign(size, fill);
      notices.push_back(std::move(x));
    }
  liar->send(n.actor_b, atoms::round_done_atom::value, uint64_t{1}, std::move(notices));
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_peer_that_lies_about_a_copys_bytes_fails_the_copy) {
  // Node a's system sends b bytes of replay 1's copy twice over, then (b0
  // recovered) past the end of replay 2's, before a0 has read: b fails
  // each copy naming what came, and the real bytes that follow are
  // dropped; replay 3 copies.
  nodes_here n;
  auto& c = *n.client;
  auto gate = hold_here();
  auto t = test_support::node(1, "t", 16);
  auto [ca0, on_a0] = placed(c, n.a0, t);
  auto [cb0, on_b0] = placed(c, n.b0, t);
  auto r = c.record("copy", [&] {
    c.schedule_named(n.a0, {"test_hold", {}});
    c.schedule_named(n.a0, {"fill", {on_a0, 2.0}});
    c.device_to_device(t, merge_buffer_use::no, cb0, ca0);
  });
  auto text = n.debug(n.actor_b);
  BOOST_TEST_REQUIRE(contains(text, "(session (id 1)"), text);
  auto first = c.replay(r);
  auto copied = first.item(2); // b replied: pushed
  send_bytes_as_node_a(n, 1, 2, {{0, 8}, {4, 8}});
  expect_throw<device_error>([&] { sync(c, copied); },
                             "node a sent bytes [4, 12) of copy 2 of replay 1 of round 'copy', "
                             "some of which had come already (8 of its 64 bytes had come)");
  BOOST_TEST(c.recover(n.b0));
  auto second = c.replay(r);
  copied = second.item(2);
  send_bytes_as_node_a(n, 2, 2, {{0, t.size_in_bytes + 1}});
  expect_throw<device_error>([&] { sync(c, copied); },
                             "node a sent bytes [0, 65) of copy 2 of replay 2 of round 'copy', "
                             "past its 64 bytes");
  BOOST_TEST(c.recover(n.b0));
  gate->open();
  sync(c, second.all_work_of(n.a0));
  release_hold();
  // a's real bytes came for waits failed already: dropped, counted (with
  // the notices for other round ids: 64 * 3).
  BOOST_TEST(test_support::eventually([&] { return contains(n.debug(n.actor_b), "(dropped 194)"); }),
             n.debug(n.actor_b));
  auto third = c.replay(r);
  sync(c, third.item(2));
  auto sum = c.schedule_named(n.b0, {"checksum", {buffer_arg{cb0.buffers.at(t), t.size_in_bytes},
                                                  std::string{"b0"}}});
  sync(c, sum);
  auto b0 = c.result(n.b0, "b0");
  BOOST_TEST_REQUIRE(b0.has_value());
  BOOST_TEST(b0->sum == 2.0 * 16);
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_copys_bytes_may_come_before_their_replay_and_out_of_order) {
  // Bytes of replay 2's copy come to b before b has pushed replay 2, their
  // second half first: b holds them, and the replay's write takes them
  // whole (here node a's system sends zeros before a0 has read its 2s: b0
  // gets the zeros; a's own bytes, later, are dropped).
  nodes_here n;
  auto& c = *n.client;
  auto t = test_support::node(1, "t", 16);
  auto [ca0, on_a0] = placed(c, n.a0, t);
  auto [cb0, on_b0] = placed(c, n.b0, t);
  auto r = c.record("copy", [&] {
    c.schedule_named(n.a0, {"test_hold", {}});
    c.schedule_named(n.a0, {"fill", {on_a0, 2.0}});
    c.device_to_device(t, merge_buffer_use::no, cb0, ca0);
    c.schedule_named(n.b0, {"checksum", {on_b0, std::string{"b0"}}});
  });
  sync_all(c, c.replay(r)); // the parts are on the nodes
  auto b0 = c.result(n.b0, "b0");
  BOOST_TEST_REQUIRE(b0.has_value());
  BOOST_TEST(b0->sum == 2.0 * 16);
  send_bytes_as_node_a(n, 2, 2, {{32, 32}, {0, 32}}, '\0');
  BOOST_TEST(test_support::eventually([&] { return contains(n.debug(n.actor_b), "(early 2)"); }),
             n.debug(n.actor_b));
  auto gate = hold_here();
  auto ev = c.replay(r);
  sync(c, ev.item(3)); // b0's checksum, behind the write of the early bytes
  b0 = c.result(n.b0, "b0");
  BOOST_TEST_REQUIRE(b0.has_value());
  BOOST_TEST(b0->sum == 0.0);
  BOOST_TEST(b0->count == 16u);
  gate->open();
  sync(c, ev.all_work_of(n.a0));
  release_hold();
  BOOST_TEST(test_support::eventually([&] {
               auto text = n.debug(n.actor_b);
               return contains(text, "(early 0) (dropped 129)");
             }),
             n.debug(n.actor_b));
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_copies_between_here_and_the_nodes_replay_with_the_nodes) {
  // A copy from node a's device to this process's h0 and one from h0 to
  // node b's, in one round: steps of this process's part and the nodes'
  // (the bytes node to process to node), one message per node a replay.
  // The write on h0 is t's writer there after each replay, as after the
  // call (`updating_for`).
  nodes_here n;
  auto& c = *n.client;
  auto h0 = c.get_device(0);
  auto t = test_support::node(1, "t", 256);
  auto [ca0, on_a0] = placed(c, n.a0, t);
  auto [ch0, on_h0] = placed(c, h0, t);
  auto [cb0, on_b0] = placed(c, n.b0, t);
  event iota;
  auto r = c.record("through here", [&] {
    iota = c.schedule_named(n.a0, {"iota", {on_a0, 0.0}});
    c.schedule_named(n.a0, {"checksum", {on_a0, std::string{"a0"}}});
    c.device_to_device(t, merge_buffer_use::no, ch0, ca0);
    c.schedule_named(h0, {"checksum", {on_h0, std::string{"h0"}}});
    c.device_to_device(t, merge_buffer_use::no, cb0, ch0);
    c.schedule_named(n.b0, {"checksum", {on_b0, std::string{"b0"}}});
  });
  auto start = r.slot(iota, 1);
  uint64_t last_hash = 0;
  for (int k = 1; k <= 3; ++k) {
    r.arg(start) = 10.0 * k;
    auto ev = c.replay(r);
    expect_items_done(c, ev);
    auto written = h0.updating_for(t);
    BOOST_TEST_REQUIRE(written.has_value());
    BOOST_TEST((*written == ev.item(2)), "replay " << k);
    BOOST_TEST((ev.item(2).key() == h0.key()));
    auto a0 = c.result(n.a0, "a0"), here = c.result("h0"), b0 = c.result(n.b0, "b0");
    BOOST_TEST_REQUIRE((a0 && here && b0));
    BOOST_TEST(a0->hash != last_hash, "replay " << k);
    last_hash = a0->hash;
    BOOST_TEST((*here == *a0), "replay " << k);
    BOOST_TEST((*b0 == *a0), "replay " << k);
  }
  expect_rounds_on_both(n, "(rounds (parts 1) (replays 3) (early 0) (dropped 0))");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_copy_into_a_merge_buffer_replays_on_the_nodes_once_it_fits) {
  // A gradient copied from a0 into b0's merge buffer, which b0 does not
  // have yet: the first replay goes call by call (its copy makes the merge
  // buffer, as the call does), the next ones on the nodes, writing it in
  // place; each adds this replay's gradient.
  nodes_here n;
  auto& c = *n.client;
  auto g = test_support::node(1, "g", 16);
  auto [ca0, on_a0] = placed(c, n.a0, g);
  auto [cb0, on_b0] = placed(c, n.b0, g);
  BOOST_TEST(n.b0.merge_buffer_capacity() == 0u);
  event grad;
  auto r = c.record("merge", [&] {
    grad = c.schedule_named(n.a0, {"fill", {on_a0, 0.0}});
    c.schedule_named(n.b0, {"fill", {on_b0, 1.0}});
    c.device_to_device(g, merge_buffer_use::copy, cb0, ca0);
    c.schedule_named(n.b0, {"add_from_merge", {on_b0, on_b0}});
    c.schedule_named(n.b0, {"checksum", {on_b0, std::string{"b0"}}});
  });
  auto value = r.slot(grad, 1);
  for (int k = 1; k <= 3; ++k) {
    r.arg(value) = double(k);
    expect_items_done(c, c.replay(r));
    auto b0 = c.result(n.b0, "b0");
    BOOST_TEST_REQUIRE(b0.has_value());
    BOOST_TEST(b0->sum == 16.0 * (1 + k), "replay " << k);
  }
  BOOST_TEST(n.b0.merge_buffer_capacity() == g.size_in_bytes);
  expect_rounds_on_both(n, "(rounds (parts 1) (replays 2) (early 0) (dropped 0))");
}

BOOST_AUTO_TEST_CASE(test_rounds_on_nodes_a_remapped_replay_goes_on_the_nodes_too) {
  // A round on a0 and a1 (a1 waits for a0's item), remapped a0 -> b0 (as
  // after a0's node was lost): the round as moved replays on the nodes, one
  // message per node, b0 -> a1 node to node (not call by call), under the
  // round's replay numbers and with each replay's slot values; the round's
  // recorded events give the moved items' events.
  nodes_here n;
  auto& c = *n.client;
  event maybe, last;
  auto r = c.record("moved", [&] {
    maybe = c.schedule_named(n.a0, {"test_maybe_fail", {int64_t{0}}});
    c.will_wait_for(c.make_context(n.a1), maybe);
    last = c.schedule_named(n.a1, note("a1 after a0"));
  });
  auto fail = r.slot(maybe, 0);
  the_log().take();
  sync_all(c, c.replay(r)); // replay 1, on a0 and a1
  const device_remap to_b{{n.a0, n.b0}};
  for (int k = 2; k <= 3; ++k) {
    auto ev = c.replay(r, to_b);
    BOOST_TEST((ev.of(maybe).key() == n.b0.key()));
    BOOST_TEST((ev.of(last).key() == n.a1.key()));
    sync_all(c, ev);
  }
  BOOST_TEST(the_log().take() == std::vector<std::string>(3, "a1 after a0"),
             boost::test_tools::per_element());
  auto text_b = n.debug(n.actor_b);
  BOOST_TEST(contains(text_b, "(rounds (parts 1) (replays 2)"), text_b);
  // Replay 4 fails on b0 (its slot set since, and the item named: the
  // round as moved is made again): named with the round, the replay and
  // the item; a1's wait on it, across the nodes, fails with it.
  r.arg(fail) = 1;
  r.name_item(maybe, "the maybe");
  auto ev = c.replay(r, to_b);
  auto on_b0 = expect_throw<device_error>([&] { sync(c, ev.of(maybe)); }, "a planned failure");
  BOOST_TEST(contains(on_b0, "replay 4 of round 'moved', item 'the maybe'"), on_b0);
  expect_throw<device_error>([&] { sync(c, ev.of(last)); }, "a planned failure");
  BOOST_TEST(r.replays() == 4u);
  BOOST_TEST(the_log().take().empty());
}
