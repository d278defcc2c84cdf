// Recorded rounds (issue 41): `backend::record` captures a step's calls
// without running them, `backend::replay` runs them again, with slots,
// rebound in-round waits, provenance in failures, cancel, recover and
// shutdown as for ordinary work. Runs on the cpu driver and again on the
// fake one (test_rounds_fake), whose items complete on a driver thread.
#define BOOST_TEST_MODULE rounds
#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>

#include "actors/backend_impl.hpp"
#include "actors/round_state.hpp"
#include "multidev/multidev.hpp"
#include "multidev/protocol.hpp"
#include "test_support.hpp"

using namespace multidev;
using namespace test_support;

namespace {

/// A node of `n` floats allocated on `ctx`'s device.
std::pair<context, tnode> node_on(backend& b, const context& ctx, int id, std::size_t n) {
  tnode t{id, "n" + std::to_string(id), n * sizeof(float), memory_mode::on_device};
  return {b.alloc_node(ctx, t), t};
}

buffer_arg buf(const context& c, const tnode& t) {
  return buffer_arg{c.buffers.at(t), t.size_in_bytes};
}

/// The sum `checksum` kept under `name`, once `e` (the checksum's event) is done.
double sum_when(backend& b, const event& e, const std::string& name) {
  sync(b, e);
  auto res = b.result(name);
  BOOST_TEST_REQUIRE(res.has_value());
  return res->sum;
}

/// `(key value)` in a device's debug info, the value as an atom.
std::string info_field(const sexp& s, const std::string& key) {
  auto* f = s.find(key);
  BOOST_REQUIRE_MESSAGE(f != nullptr, "no field " << key << " in " << s.to_string());
  BOOST_REQUIRE(f->items().size() >= 2u);
  return f->items()[1].as_atom();
}

} // namespace

BOOST_AUTO_TEST_CASE(test_rounds_record_runs_nothing_and_each_replay_runs_it_once) {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto before0 = b.all_work(d0), before1 = b.all_work(d1);
  std::atomic<int> ran0{0}, ran1{0};
  auto r = b.record("step", [&] {
    b.schedule_task(d0, {"a", [&] { ++ran0; }});
    auto a = b.all_work(d0);
    b.will_wait_for(b.make_context(d1), a);
    b.schedule_task(d1, {"b", [&] { ++ran1; }});
    b.schedule_task(d0, {"c", [&] { ++ran0; }});
  });
  BOOST_TEST(r.name() == "step");
  BOOST_TEST(r.size() == 4u);
  // Nothing was scheduled: the devices' schedules did not move.
  BOOST_TEST(b.all_work(d0) == before0);
  BOOST_TEST(b.all_work(d1) == before1);
  BOOST_TEST(ran0.load() == 0);

  std::vector<replay_events> evs;
  for (int i = 0; i < 3; ++i)
    evs.push_back(b.replay(r));
  for (const auto& [d, e] : evs.back().all_work())
    sync(b, e);
  BOOST_TEST(ran0.load() == 6);
  BOOST_TEST(ran1.load() == 3);
  BOOST_TEST(r.replays() == 3u);

  // One event per item, in record order: on each device the seqs grow in
  // record order and from one replay to the next (replays queue).
  for (const auto& ev : evs) {
    BOOST_TEST(ev.size() == 4u);
    BOOST_TEST(ev.item(0).key() == d0.key());
    BOOST_TEST(ev.item(1).key() == d1.key());
    BOOST_TEST(ev.item(2).key() == d1.key());
    BOOST_TEST(ev.item(3).key() == d0.key());
    BOOST_TEST(ev.item(0).seq() < ev.item(3).seq());
    BOOST_TEST(ev.item(1).seq() < ev.item(2).seq());
    BOOST_TEST(ev.all_work().size() == 2u);
    BOOST_TEST(ev.all_work_of(d0) == ev.item(3));
    BOOST_TEST(ev.all_work_of(d1) == ev.item(2));
    for (const auto& e : ev.items())
      BOOST_TEST(b.is_done(e));
  }
  BOOST_TEST(evs[0].item(3).seq() < evs[1].item(0).seq());
  BOOST_TEST(evs[1].item(2).seq() < evs[2].item(1).seq());
}

BOOST_AUTO_TEST_CASE(test_rounds_capture_refuses_what_cannot_be_replayed) {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  backend other{on_test_driver(backend_options{.num_devices = 1})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto ctx0 = b.make_context(d0);
  auto [c, t] = node_on(b, ctx0, 1, 4);
  std::array<std::byte, 16> host{};
  auto refused = [&](auto call, const std::string& needle) {
    expect_throw<std::invalid_argument>([&] { b.record("bad", call); }, needle);
  };
  auto before = b.all_work(d0);
  refused([&] { b.sync(before); }, "sync: cannot be recorded in round 'bad'");
  refused([&] { b.await(d0); }, "await: cannot be recorded in round 'bad'");
  refused([&] { b.to_host(c, t, host); }, "to_host: cannot be recorded in round 'bad'");
  refused([&] { b.from_host(c, t, host); }, "from_host: cannot be recorded in round 'bad'");
  refused([&] { b.cancel(d0); }, "cancel: cannot be recorded in round 'bad'");
  refused([&] { b.recover(d0); }, "recover: cannot be recorded in round 'bad'");
  refused([&] { b.flush(d0); }, "flush: cannot be recorded in round 'bad'");
  refused([&] { b.sync_device(d0); }, "sync_device: cannot be recorded in round 'bad'");
  refused([&] { b.alloc_node(ctx0, tnode{2, "x", 16, memory_mode::on_device}); },
          "alloc_node: cannot be recorded in round 'bad'");
  refused([&] { b.record("inner", [] {}); },
          "record: this thread is already recording round 'bad'; rounds do not nest");
  auto ok = b.record("ok", [&] { b.schedule_task(d0, {"t", [] {}}); });
  refused([&] { b.replay(ok); }, "replay: cannot be recorded in round 'bad'");
  refused([&] { other.schedule_task(other.get_device(0), {"t", [] {}}); },
          "schedule_task: this thread is recording round 'bad' of another backend");
  refused([&] { b.all_work(d1); }, "all_work: cannot be recorded in round 'bad': nothing was "
                                   "recorded on " + d1.name());
  refused([&] { b.schedule_named(d0, task_spec{"no_such_kernel", {}}); }, "no_such_kernel");

  // A wait on an event made outside the round: refused while pending...
  auto release = block_runner(b, d0);
  b.schedule_task(d0, {"pending", [] {}});
  auto pending = b.all_work(d0);
  refused([&] { b.will_wait_for(b.make_context(d1), pending); },
          "will_wait_for: cannot be recorded in round 'bad': ");
  release->open();
  sync(b, pending);
  // ... and recorded once resolved.
  auto w = b.record("resolved", [&] { b.will_wait_for(b.make_context(d1), pending); });
  BOOST_TEST(w.size() == 1u);

  // A recorded event is no point of any schedule: waiting on it outside its
  // round, or in another round, is refused.
  event recorded;
  auto r = b.record("r", [&] { recorded = b.schedule_named(d0, {"spin_ns", {int64_t{0}}}); });
  expect_throw<std::invalid_argument>([&] { b.sync(recorded); }, "no device of this process");
  refused([&] { b.will_wait_for(b.make_context(d1), recorded); },
          "is not an event recorded in round 'bad'");

  // A refused capture leaves this thread recording nothing: work runs again.
  std::atomic<bool> ran{false};
  b.schedule_task(d0, {"after", [&] { ran = true; }});
  sync(b, b.all_work(d0));
  BOOST_TEST(ran.load());
  // An empty round and another backend's round are refused by replay.
  expect_throw<std::invalid_argument>([&] { b.replay(multidev::round{}); }, "empty round");
  expect_throw<std::invalid_argument>([&] { other.replay(r); },
                                      "round 'r' was recorded by another backend");
}

BOOST_AUTO_TEST_CASE(test_rounds_slot_argument_is_read_by_each_replay) {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  constexpr std::size_t n = 8;
  auto [c0, t] = node_on(b, b.make_context(d0), 1, n);
  auto [c1, t1] = node_on(b, b.make_context(d1), 1, n);
  event filled, summed;
  auto r = b.record("step", [&] {
    filled = b.schedule_named(d0, {"fill", {buf(c0, t), 1.0}});
    b.will_wait_for(c1, filled); // a named task is no node's writer: order the copy
    b.device_to_device(t, merge_buffer_use::no, c1, c0);
    summed = b.schedule_named(d1, {"checksum", {buf(c1, t), std::string{"sum"}}});
  });
  BOOST_TEST(r.size() == 4u);
  auto s = r.slot(filled, 1);
  auto sum_after = [&](const replay_events& ev) { return sum_when(b, ev.of(summed), "sum"); };
  BOOST_TEST(sum_after(b.replay(r)) == 1.0 * n);
  r.arg(s) = 2.5;
  BOOST_TEST(sum_after(b.replay(r)) == 2.5 * n);
  r.arg(s) = 3; // an int for a float
  BOOST_TEST(sum_after(b.replay(r)) == 3.0 * n);
  BOOST_TEST(std::get<int64_t>(r.arg(s).value()) == 3);

  // A value of a kind the kernel does not take there is refused and the old kept.
  expect_throw<std::invalid_argument>([&] { r.arg(s) = std::string{"x"}; }, "fill");
  BOOST_TEST(std::get<int64_t>(std::as_const(r).arg(s)) == 3);
  // Only a named task's scalars can be slots.
  expect_throw<std::invalid_argument>([&] { r.slot(filled, 0); }, "is a buffer");
  expect_throw<std::invalid_argument>([&] { r.slot(filled, 2); }, "has 2 arguments, not 3");
  expect_throw<std::invalid_argument>([&] { r.arg(round_slot{0, 0}); }, "is not a slot");
}

BOOST_AUTO_TEST_CASE(test_rounds_in_round_wait_rebinds_to_each_replays_event) {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  event a, after;
  auto r = b.record("step", [&] {
    a = b.schedule_named(d0, {"spin_ns", {int64_t{0}}});
    b.will_wait_for(b.make_context(d1), a);
    after = b.schedule_named(d1, {"spin_ns", {int64_t{0}}});
  });
  auto first = b.replay(r);
  sync(b, first.of(after));
  // The second replay's wait is on its own `a`, which the held runner of
  // d0 keeps pending: d1's gate stays closed (bound to the first replay's
  // `a`, done, it would be no gate at all).
  auto release = block_runner(b, d0);
  auto second = b.replay(r);
  BOOST_TEST(second.of(a) != first.of(a));
  BOOST_TEST(second.of(a).seq() > first.of(a).seq());
  BOOST_TEST(field_of(b.get_debug_info(d1), "pending_waits") == "1");
  BOOST_TEST(!b.is_done(second.of(after)));
  release->open();
  sync(b, second.of(after));
  BOOST_TEST(b.is_done(second.of(a)));
}

BOOST_AUTO_TEST_CASE(test_rounds_failure_names_replay_round_and_item_and_spares_the_next) {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  std::atomic<bool> fail{false};
  std::atomic<int> independent{0};
  event grad, dependent;
  auto r = b.record("step", [&] {
    b.schedule_task(d0, {"grad", [&] {
                           if (fail)
                             throw std::runtime_error("boom");
                         }});
    grad = b.all_work(d0);
    b.schedule_task(d1, {"independent", [&] { ++independent; }});
    auto alone = b.all_work(d1);
    b.will_wait_for(b.make_context(d1), grad);
    dependent = b.schedule_named(d1, {"spin_ns", {int64_t{0}}});
    (void)alone;
  });
  r.name_item(grad, "grad 3");
  auto ok = b.replay(r);
  sync(b, ok.all_work_of(d1));
  fail = true;
  auto bad = b.replay(r);
  auto text = expect_throw<device_error>([&] { bounded([&] { b.sync(bad.of(grad)); }); },
                                         "replay 2 of round 'step', item 'grad 3': boom");
  // A data dependency carries the failure (with its provenance) ...
  expect_throw<device_error>([&] { bounded([&] { b.sync(bad.of(dependent)); }); },
                             "replay 2 of round 'step', item 'grad 3': boom");
  // ... the independent item of the same replay is done.
  BOOST_TEST((b.state(bad.item(1)) == event_state::done));
  // The failed device refuses work as for ordinary work; recovered, the
  // next replay runs whole.
  BOOST_TEST(b.recover(d0));
  BOOST_TEST(b.recover(d1));
  fail = false;
  auto next = b.replay(r);
  for (const auto& e : next.items())
    sync(b, e);
  BOOST_TEST(independent.load() == 3);
  BOOST_TEST(r.replays() == 3u);

  // A named kernel's failure carries it too.
  auto f = b.record("named", [&] { b.schedule_named(d1, {"fail", {std::string{"bad step"}}}); });
  auto fe = b.replay(f);
  expect_throw<device_error>([&] { bounded([&] { b.sync(fe.item(0)); }); },
                             "replay 1 of round 'named', item 'fail 0': bad step");
}

BOOST_AUTO_TEST_CASE(test_rounds_cancel_mid_replay_drops_queued_replays_only) {
  backend b{on_test_driver(backend_options{.num_devices = 1})};
  auto d0 = b.get_device(0);
  std::atomic<int> ran{0};
  auto r = b.record("step", [&] {
    for (int i = 0; i < 4; ++i)
      b.schedule_task(d0, {"t", [&] { ++ran; }});
  });
  auto release = block_runner(b, d0);
  std::vector<replay_events> queued;
  for (int i = 0; i < 5; ++i)
    queued.push_back(b.replay(r));
  b.cancel(d0);
  release->open();
  for (const auto& ev : queued)
    for (const auto& e : ev.items()) {
      expect_throw<cancelled_error>([&] { bounded([&] { b.sync(e); }); }, "cancel");
      BOOST_TEST((b.state(e) == event_state::cancelled));
    }
  BOOST_TEST(ran.load() == 0);
  auto after = b.replay(r);
  sync(b, after.all_work_of(d0));
  BOOST_TEST(ran.load() == 4);
}

BOOST_AUTO_TEST_CASE(test_rounds_shutdown_with_replays_in_flight_neither_hangs_nor_crashes) {
  for (auto policy : {backend_options::destroy_policy::drain,
                      backend_options::destroy_policy::cancel}) {
    auto ran = std::make_shared<std::atomic<int>>(0);
    std::promise<void> open;
    auto b = std::make_unique<backend>(
      on_test_driver(backend_options{.num_devices = 2, .on_destroy = policy}));
    auto d0 = b->get_device(0), d1 = b->get_device(1);
    auto r = b->record("step", [&] {
      b->schedule_task(d0, {"t", [ran] { ++*ran; }});
      b->will_wait_for(b->make_context(d1), b->all_work(d0));
      b->schedule_named(d1, {"spin_ns", {int64_t{1000}}});
    });
    b->schedule_task(d0, blocker(open.get_future().share()));
    for (int i = 0; i < 50; ++i)
      b->replay(r);
    // The blocker is released while (or before) the teardown runs: either
    // way the backend must go within the bound.
    auto gone = std::async(std::launch::async, [&] { b.reset(); });
    open.set_value();
    bounded([&] { gone.get(); }, "destroying a backend with replays in flight");
    if (policy == backend_options::destroy_policy::drain)
      BOOST_TEST(ran->load() == 50);
    else
      BOOST_TEST(ran->load() <= 50);
    BOOST_TEST(r.replays() == 50u);
  }
}

BOOST_AUTO_TEST_CASE(test_rounds_pool_calls_and_memset_are_replayed_in_order) {
  backend b{on_test_driver(backend_options{.num_devices = 1})};
  auto d0 = b.get_device(0);
  constexpr int pool = 7;
  constexpr std::size_t bytes = 8 * sizeof(float);
  buffer_arg whole{buffer_loc{pool, 0}, bytes};
  auto r = b.record("pools", [&] {
    b.alloc_pool(d0, pool, bytes, 64);
    b.schedule_named(d0, {"fill", {whole, 2.0}});
    b.memset_zero(d0, pool, 0, 4 * sizeof(float));
    b.schedule_named(d0, {"checksum", {whole, std::string{"pools"}}});
    b.free_pool(d0, pool);
  });
  BOOST_TEST(r.size() == 5u);
  BOOST_TEST(b.get_used_memory(d0) == 0u); // nothing allocated by the record
  for (int i = 0; i < 2; ++i) {
    auto ev = b.replay(r);
    sync(b, ev.all_work_of(d0));
    auto res = b.result("pools");
    BOOST_REQUIRE(res.has_value());
    BOOST_TEST(res->sum == 2.0 * 4);
  }
  // On the devices, all pushed at once (the pool calls' table changes made
  // as their steps are); no round actor was made for it (that is for
  // rounds with nodes' devices; spawning one ties this thread to the
  // backend's actor system).
  BOOST_TEST(r.state()->plan.usable);
  BOOST_TEST(!b.impl().here_rounds);
  BOOST_TEST(b.get_used_memory(d0) == 0u); // each replay's pool released
  // An item refused at replay names the replay, round and item; those before it stay.
  auto bad = b.record("bad", [&] { b.memset_zero(d0, 99, 0, 4); });
  expect_throw<std::invalid_argument>([&] { b.replay(bad); },
                                      "replay: replay 1 of round 'bad', item 'memset_zero 99 0'");
}

// A round's memsets replay on the devices too, as the orders `memset_zero`
// pushes: in the device's order with its tasks, named and traced as the
// call's, their pool looked up at each replay (a freed one refuses the
// replay whole, naming the item).
BOOST_AUTO_TEST_CASE(test_rounds_memsets_replay_on_the_devices) {
  auto o = on_test_driver(backend_options{.num_devices = 2});
  o.trace_capacity = 64;
  backend b{o};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  constexpr int pool = 7;
  constexpr std::size_t bytes = 8 * sizeof(float);
  buffer_arg whole{buffer_loc{pool, 0}, bytes};
  b.alloc_pool(d0, pool, bytes, 64);
  b.alloc_pool(d1, pool, bytes, 64);
  auto ctx1 = b.make_context(d1);
  auto r = b.record("zero", [&] {
    b.schedule_named(d0, {"fill", {whole, 2.0}});
    b.memset_zero(d0, pool, 0, 4 * sizeof(float));
    auto sum = b.schedule_named(d0, {"checksum", {whole, std::string{"zero0"}}});
    b.memset_zero(d1, pool, 4, 8);
    b.will_wait_for(ctx1, sum);
    b.schedule_named(d1, {"checksum", {whole, std::string{"zero1"}}});
  });
  b.schedule_named(d1, {"fill", {whole, 1.0}});
  for (int i = 0; i < 2; ++i) {
    auto ev = b.replay(r);
    BOOST_TEST(r.state()->plan.usable); // on the devices, not call by call
    sync(b, ev.all_work_of(d0));
    sync(b, ev.all_work_of(d1));
    BOOST_REQUIRE(b.result("zero0").has_value());
    BOOST_TEST(b.result("zero0")->sum == 2.0 * 4);
    BOOST_REQUIRE(b.result("zero1").has_value());
    BOOST_TEST(b.result("zero1")->sum == 1.0 * 6); // floats 1 and 2 zeroed
    BOOST_TEST(b.is_done(ev.item(1)));
  }
  auto tr = b.trace(d0);
  BOOST_TEST_REQUIRE(tr.records.size() >= 3u);
  const auto& zero = tr.records[tr.records.size() - 2];
  BOOST_TEST((zero.kind == trace_kind::memset));
  BOOST_TEST(zero.description == "memset_zero pool 7 [0, 16)");
  // Its pool freed: the replay is refused whole, naming the item.
  b.free_pool(d1, pool);
  sync(b, b.all_work(d1));
  auto d0_before = b.all_work(d0).seq(), d1_before = b.all_work(d1).seq();
  expect_throw<std::invalid_argument>(
    [&] { b.replay(r); }, "replay: replay 3 of round 'zero', item 'memset_zero 7 3': memset_zero");
  BOOST_TEST(b.all_work(d0).seq() == d0_before);
  BOOST_TEST(b.all_work(d1).seq() == d1_before);
}

// A round's pool calls replay on the devices: each changes the pool table
// as its step is made (so the steps after it see the pool), with an order
// releasing the pool replaced or freed once the work before it is done, as
// the calls do. A replay refused whole (a pool call the device refuses
// now, another item that does not bind) leaves every table as it was; one
// on a failed device goes call by call, as the calls would run.
BOOST_AUTO_TEST_CASE(test_rounds_pool_calls_replay_on_the_devices_whole_or_not_at_all) {
  auto o = on_test_driver(backend_options{.num_devices = 2});
  o.trace_capacity = 64;
  backend b{o};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  constexpr int pool = 9;
  constexpr std::size_t bytes = 8 * sizeof(float);
  buffer_arg whole{buffer_loc{pool, 0}, bytes};
  b.alloc_pool(d0, 3, 64, 64); // freed by the round
  auto r = b.record("pools", [&] {
    b.alloc_pool(d0, pool, bytes, 64);
    b.schedule_named(d0, {"fill", {whole, 1.0}});
    b.schedule_named(d0, {"checksum", {whole, std::string{"pools"}}});
    b.free_pool(d0, pool);
    b.free_pool(d0, 3);
    b.schedule_task(d1, {"other", [] {}});
  });
  auto ev = b.replay(r);
  BOOST_TEST(r.state()->plan.usable);
  sync(b, ev.all_work_of(d0));
  BOOST_REQUIRE(b.result("pools").has_value());
  BOOST_TEST(b.result("pools")->sum == 8.0);
  BOOST_TEST(b.is_done(ev.item(0)));
  BOOST_TEST(b.get_used_memory(d0) == 0u);
  auto tr = b.trace(d0);
  BOOST_TEST_REQUIRE(tr.records.size() >= 5u);
  const auto* last = &tr.records[tr.records.size() - 5];
  BOOST_TEST((last[0].kind == trace_kind::pool));
  BOOST_TEST(last[0].description == "alloc_pool 9");
  BOOST_TEST(last[3].description == "free_pool 9");
  BOOST_TEST(last[4].description == "free_pool 3");

  // Pool 3 is gone: the second replay is refused whole, naming the item;
  // pool 9's allocation is undone and nothing was queued.
  auto d0_before = b.all_work(d0).seq(), d1_before = b.all_work(d1).seq();
  expect_throw<std::invalid_argument>([&] { b.replay(r); },
                                      "replay: replay 2 of round 'pools', item 'free_pool 3 4'");
  BOOST_TEST(b.all_work(d0).seq() == d0_before);
  BOOST_TEST(b.all_work(d1).seq() == d1_before);
  BOOST_TEST(b.get_used_memory(d0) == 0u);
  expect_throw<std::invalid_argument>([&] { b.memset_zero(d0, pool, 0, 4); }, "pool 9");

  // A named task on d1 that does not bind (d1 has no pool 9), made after
  // d0's pool calls changed its table: they are undone too (pool 3 is
  // d0's again, pool 9 not), and nothing was queued.
  b.alloc_pool(d0, 3, 64, 64);
  auto unbound = b.record("unbound", [&] {
    b.alloc_pool(d0, pool, bytes, 64);
    b.free_pool(d0, 3);
    b.schedule_named(d1, {"fill", {whole, 1.0}});
  });
  d0_before = b.all_work(d0).seq();
  expect_throw<std::invalid_argument>([&] { b.replay(unbound); },
                                      "replay: replay 1 of round 'unbound', item 'fill 2'");
  BOOST_TEST(b.all_work(d0).seq() == d0_before);
  BOOST_TEST(b.all_work(d1).seq() == d1_before);
  BOOST_TEST(b.get_used_memory(d0) == 64u);
  b.memset_zero(d0, 3, 0, 64); // still in the table
  expect_throw<std::invalid_argument>([&] { b.memset_zero(d0, pool, 0, 4); }, "pool 9");

  // d1 failed: its queue refuses the push, where a free_pool call there
  // would release the pool at once; such a round goes call by call, as
  // the calls would run: d0's items are queued, the task on d1 refused.
  b.alloc_pool(d1, 4, 64, 64);
  auto teardown = b.record("teardown", [&] { b.free_pool(d1, 4); });
  b.schedule_task(d1, {"boom", [] { throw std::runtime_error("boom"); }});
  expect_throw<device_error>([&] { bounded([&] { b.sync(b.all_work(d1)); }); }, "boom");
  b.replay(teardown); // released at once on the failed device, as the call does
  BOOST_TEST(b.get_used_memory(d1) == 0u);
  expect_throw<device_error>([&] { b.replay(r); }, "boom");
  sync(b, b.all_work(d0));
  BOOST_TEST(b.result("pools")->sum == 8.0);
  BOOST_TEST(b.get_used_memory(d0) == 0u); // pools 9 and 3 freed by the calls
  BOOST_TEST(b.recover(d1));
  b.alloc_pool(d0, 3, 64, 64);
  auto again = b.replay(r);
  sync(b, again.all_work_of(d0));
  sync(b, again.all_work_of(d1));
  BOOST_TEST(b.is_done(again.item(5)));
  BOOST_TEST(b.get_used_memory(d0) == 0u);
}

BOOST_AUTO_TEST_CASE(test_rounds_replay_on_an_attached_device_of_another_actor_system) {
  // Node A's device a0, attached to backend b of another actor system: a
  // round allocates a pool there, fills and sums it (a slot sets the
  // value), and b's local device waits for the sum inside the round.
  auto make_system = [](caf::actor_system_config& cfg) {
    cfg.load<caf::io::middleman>();
    register_types(cfg);
    cfg.set("scheduler.max-threads", size_t{2});
    return std::make_unique<caf::actor_system>(cfg);
  };
  caf::actor_system_config cfg_a, cfg_b;
  auto sys_a = make_system(cfg_a);
  auto a = std::make_unique<backend>(*sys_a, backend_options{.num_devices = 1});
  auto port = sys_a->middleman().publish(device_actor_of(*a, a->get_device(0)), 0, "127.0.0.1");
  BOOST_REQUIRE(static_cast<bool>(port));
  auto sys_b = make_system(cfg_b);
  auto b = std::make_unique<backend>(*sys_b, backend_options{.num_devices = 1});
  {
    watchdog guard{"a round on an attached device"};
    auto actor = sys_b->middleman().remote_actor<device_actor>("127.0.0.1", *port);
    BOOST_REQUIRE(static_cast<bool>(actor));
    auto a0 = attach_device(*b, *actor);
    auto l0 = b->get_device(0);
    constexpr std::size_t n = 16;
    buffer_arg whole{buffer_loc{5, 0}, n * sizeof(float)};
    std::atomic<int> after{0};
    event filled, summed;
    auto r = b->record("remote", [&] {
      b->alloc_pool(a0, 5, n * sizeof(float), 64);
      filled = b->schedule_named(a0, {"fill", {whole, 1.0}});
      summed = b->schedule_named(a0, {"checksum", {whole, std::string{"rsum"}}});
      b->will_wait_for(b->make_context(l0), summed);
      b->schedule_task(l0, {"after the sum", [&] { ++after; }});
    });
    auto s = r.slot(filled, 1);
    for (double v : {1.0, 4.0}) {
      r.arg(s) = v;
      auto ev = b->replay(r);
      BOOST_TEST(ev.size() == 5u);
      BOOST_TEST((ev.item(1).key() == a0.key()));
      BOOST_TEST(ev.item(1).seq() < ev.item(2).seq());
      sync(*b, ev.all_work_of(l0));
      auto res = b->result(a0, "rsum");
      BOOST_REQUIRE(res.has_value());
      BOOST_TEST(res->sum == v * n);
    }
    BOOST_TEST(after.load() == 2);
    // A closure cannot travel to a0: refused when recorded.
    expect_throw<std::invalid_argument>(
      [&] { b->record("bad", [&] { b->schedule_task(a0, {"t", [] {}}); }); },
      "is a device of another process");
  }
  watchdog guard{"shutting down both systems"};
  b.reset();
  sys_b.reset();
  a.reset();
  sys_a.reset();
}

BOOST_AUTO_TEST_CASE(test_rounds_backend_keeps_a_dropped_round_until_its_replays_resolve) {
  backend b{on_test_driver(backend_options{.num_devices = 1})};
  auto d0 = b.get_device(0);
  std::weak_ptr<const detail::round_state> gone;
  event failed;
  {
    auto release = block_runner(b, d0);
    auto r = b.record("dropped", [&] {
      b.schedule_task(d0, {"late", [] { throw std::runtime_error("late failure"); }});
    });
    gone = r.state();
    failed = b.replay(r).item(0);
    // The handle goes while the item is queued: its failure still names the round.
    r = multidev::round{};
    BOOST_TEST(!gone.expired());
    release->open();
  }
  expect_throw<device_error>([&] { bounded([&] { b.sync(failed); }); },
                             "replay 1 of round 'dropped', item 'late 0': late failure");
  BOOST_TEST(b.recover(d0));
  // Once resolved, the next replay (of any round) lets it go.
  auto other = b.record("other", [&] { b.schedule_task(d0, {"t", [] {}}); });
  sync(b, b.replay(other).item(0));
  BOOST_TEST(gone.expired());
}

BOOST_AUTO_TEST_CASE(test_rounds_remap_moves_a_round_to_another_local_device) {
  // A round on d0 (a pool it allocates, a fill whose value is a slot, a
  // checksum, a closure) and on d2 (a wait for the checksum, a task that
  // reads it) replayed with d0 mapped to d1: d0's items run on d1 and d0
  // gets nothing; the slot, the in-round wait and the provenance hold.
  backend b{on_test_driver(backend_options{.num_devices = 3})};
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  constexpr std::size_t n = 16;
  buffer_arg whole{buffer_loc{5, 0}, n * sizeof(float)};
  std::atomic<int> ran{0};
  std::atomic<double> seen{0};
  event filled, summed;
  auto r = b.record("moved", [&] {
    b.alloc_pool(d0, 5, n * sizeof(float), 64);
    filled = b.schedule_named(d0, {"fill", {whole, 1.0}});
    summed = b.schedule_named(d0, {"checksum", {whole, std::string{"moved_sum"}}});
    b.schedule_task(d0, {"count", [&] { ++ran; }});
    b.will_wait_for(b.make_context(d2), summed);
    b.schedule_task(d2, {"read the sum", [&] { seen = b.result("moved_sum").value().sum; }});
  });
  auto s = r.slot(filled, 1);
  auto before0 = b.all_work(d0);
  for (double v : {2.0, 3.0}) {
    r.arg(s) = v;
    auto ev = b.replay(r, {{d0, d1}});
    for (const auto& [d, e] : ev.all_work()) // first: nothing outlives a failed check
      sync(b, e);
    BOOST_TEST(seen.load() == v * n); // d2 waited for this replay's checksum, on d1
    BOOST_TEST_REQUIRE(ev.size() == r.size());
    for (std::size_t i : {0, 1, 2, 3})
      BOOST_TEST((ev.item(i).key() == d1.key()), "item " << i);
    BOOST_TEST((ev.item(5).key() == d2.key()));
    BOOST_TEST((ev.all_work_of(d1).key() == d1.key()));
    expect_throw<std::invalid_argument>([&] { ev.all_work_of(d0); }, "does not touch");
  }
  BOOST_TEST(ran.load() == 2);
  BOOST_TEST(b.all_work(d0).seq() == before0.seq());
  {
    // Its closures keep the remapped replays call by call (an image would
    // run copies of them).
    std::lock_guard guard{r.state()->images_mu};
    BOOST_TEST(r.state()->images.empty());
  }
  // Mapped back (d0 -> d0 is no move), it runs on d0 again. Every device
  // of the replay is synced: d2's task reads `b` and `seen`, which must
  // outlive it (TSan caught ~backend racing it when only d0 was synced).
  for (const auto& [d, e] : b.replay(r, {{d0, d0}}).all_work())
    sync(b, e);
  BOOST_TEST(ran.load() == 3);
  BOOST_TEST(seen.load() == 3.0 * n);
  BOOST_TEST(b.all_work(d0).seq() > before0.seq());

  // A moved item's failure carries its provenance.
  auto f = b.record("moved failure", [&] { b.schedule_named(d0, {"fail", {std::string{"bad step"}}}); });
  auto fe = b.replay(f, {{d0, d1}});
  BOOST_TEST((fe.item(0).key() == d1.key()));
  expect_throw<device_error>([&] { bounded([&] { b.sync(fe.item(0)); }); },
                             "replay 1 of round 'moved failure', item 'fail 0': bad step");
  BOOST_TEST(b.recover(d1));
}

BOOST_AUTO_TEST_CASE(test_rounds_remap_moves_a_copy_and_a_wait_with_their_device) {
  // d0 fills node t; d1 waits for it, copies it over and sums it. With d1
  // mapped to d2, which holds t at the same place, the wait and the copy
  // move with their device: d2 gets d0's values and sums them, d1 nothing.
  backend b{on_test_driver(backend_options{.num_devices = 3})};
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  constexpr std::size_t n = 8;
  auto [c0, t] = node_on(b, b.make_context(d0), 1, n);
  auto c1 = node_on(b, b.make_context(d1), 1, n).first;
  auto c2 = node_on(b, b.make_context(d2), 1, n).first;
  BOOST_TEST_REQUIRE((c2.buffers.at(t) == c1.buffers.at(t)));
  event filled, summed;
  auto r = b.record("copied", [&] {
    filled = b.schedule_named(d0, {"fill", {buf(c0, t), 1.0}});
    b.will_wait_for(c1, filled);
    b.device_to_device(t, merge_buffer_use::no, c1, c0);
    summed = b.schedule_named(d1, {"checksum", {buf(c1, t), std::string{"copied_sum"}}});
  });
  auto s = r.slot(filled, 1);
  auto before1 = b.all_work(d1).seq();
  for (double v : {5.0, 6.0}) {
    r.arg(s) = v;
    auto ev = b.replay(r, {{d1, d2}});
    BOOST_TEST((ev.item(0).key() == d0.key()));
    for (std::size_t i : {1, 2, 3})
      BOOST_TEST((ev.item(i).key() == d2.key()), "item " << i);
    sync(b, ev.of(summed));
    auto res = b.result("copied_sum");
    BOOST_TEST_REQUIRE(res.has_value());
    BOOST_TEST(res->sum == v * n);
    BOOST_TEST(read_back(b, c2, t) == std::vector<float>(n, static_cast<float>(v)));
  }
  BOOST_TEST(b.all_work(d1).seq() == before1);
  // No closure, no routine: the round as moved (its image) replayed on the
  // devices, as the round's own replays do.
  auto& st = *r.state();
  std::lock_guard guard{st.images_mu};
  BOOST_TEST_REQUIRE(st.images.size() == 1u);
  BOOST_TEST(st.images[0].second->plan.usable);
  BOOST_TEST((st.images[0].second->devices == std::vector<device>{d0, d2}));
}

BOOST_AUTO_TEST_CASE(test_rounds_remap_moves_a_copys_source_that_holds_no_item) {
  // d1 copies t from d0 and sums it; d0 holds no item of the round. With
  // d0 mapped to d2 the copy reads d2's t (7s), not d0's (1s); with d1
  // moved too, a remap of its own (not the first one's image).
  backend b{on_test_driver(backend_options{.num_devices = 4})};
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2), d3 = b.get_device(3);
  constexpr std::size_t n = 8;
  auto [c0, t] = node_on(b, b.make_context(d0), 1, n);
  auto c1 = node_on(b, b.make_context(d1), 1, n).first;
  auto c2 = node_on(b, b.make_context(d2), 1, n).first;
  auto c3 = node_on(b, b.make_context(d3), 1, n).first;
  BOOST_TEST_REQUIRE((c2.buffers.at(t) == c0.buffers.at(t)));
  BOOST_TEST_REQUIRE((c3.buffers.at(t) == c1.buffers.at(t)));
  sync(b, b.schedule_named(d0, {"fill", {buf(c0, t), 1.0}}));
  sync(b, b.schedule_named(d2, {"fill", {buf(c2, t), 7.0}}));
  event summed;
  auto r = b.record("pulled", [&] {
    b.device_to_device(t, merge_buffer_use::no, c1, c0);
    summed = b.schedule_named(d1, {"checksum", {buf(c1, t), std::string{"pulled_sum"}}});
  });
  auto sum_of = [&](const replay_events& ev) { return sum_when(b, ev.of(summed), "pulled_sum"); };
  BOOST_TEST(sum_of(b.replay(r)) == 1.0 * n);
  for (int k = 0; k < 2; ++k)
    BOOST_TEST(sum_of(b.replay(r, {{d0, d2}})) == 7.0 * n);
  BOOST_TEST(sum_of(b.replay(r, {{d0, d2}, {d1, d3}})) == 7.0 * n);
  BOOST_TEST(read_back(b, c3, t) == std::vector<float>(n, 7.0f));
  BOOST_TEST(sum_of(b.replay(r, {{d1, d3}})) == 1.0 * n);
  // A source mapped onto the copy's own destination is refused as any two
  // devices of the round on one.
  expect_throw<std::invalid_argument>([&] { b.replay(r, {{d0, d1}}); }, "would both run on");
}

BOOST_AUTO_TEST_CASE(test_rounds_remap_checks_refuse_before_anything_is_scheduled) {
  // Each check of replay(r, remap) refuses with the round and the device
  // named, and nothing of the replay is scheduled.
  backend b{on_test_driver(backend_options{.num_devices = 3})};
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  b.alloc_pool(d0, 7, 64, 64); // made outside the round: a target needs its own
  auto r = b.record("checked", [&] {
    b.schedule_named(d0, {"fill", {buffer_arg{buffer_loc{7, 0}, 64}, 1.0}});
    b.schedule_named(d2, {"spin_ns", {int64_t{0}}});
  });
  backend other{on_test_driver(backend_options{.num_devices = 1})};
  auto odd = b.make_device(dev{d1.dev().driver + "_other", 7}, d1.get_runner(), 7);
  auto seqs = [&] {
    return std::array<uint64_t, 3>{b.all_work(d0).seq(), b.all_work(d1).seq(),
                                   b.all_work(d2).seq()};
  };
  auto before = seqs();
  auto refused = [&](const device_remap& m, const std::string& needle) {
    auto what = expect_throw<std::invalid_argument>([&] { b.replay(r, m); }, needle);
    BOOST_TEST(contains(what, "remap of round 'checked'"), what);
  };
  refused({{d0, device{}}}, "pair 0 holds an empty device handle");
  refused({{d0, d1}, {d0, d2}}, d0.name() + " is mapped twice (to " + d1.name());
  refused({{d0, d2}}, d2.name() + " and " + d0.name() + " would both run on " + d2.name());
  refused({{d0, d1}, {d2, d1}}, " would both run on " + d1.name());
  refused({{d0, other.get_device(0)}},
          "target " + other.get_device(0).name() + " of " + d0.name()
            + " is not a device of this backend");
  refused({{d0, odd}}, "target " + odd.name() + " of " + d0.name() + " has driver '"
                         + odd.dev().driver + "'");
  refused({{d0, d1}}, "item 'fill 0' uses pool 7 of " + d0.name() + ", but its target "
                        + d1.name() + " has no pool 7");
  BOOST_TEST(r.replays() == 0u);
  BOOST_TEST((seqs() == before));

  // A routine is pinned to its device's pools: it does not move.
  auto [c0, t] = node_on(b, b.make_context(d0), 1, 4);
  auto linked = b.record("linked", [&] { b.run(b.link(c0, "fill", {t, 1.0})); });
  auto text = expect_throw<std::invalid_argument>([&] { b.replay(linked, {{d0, d1}}); },
                                                  "is a routine linked on " + d0.name());
  BOOST_TEST(contains(text, "round 'linked'"), text);
  BOOST_TEST((seqs() == before));

  // A swap is no merge; an entry for a device the round does not touch is
  // ignored. Once d1 has pool 7, the move runs.
  b.alloc_pool(d1, 7, 64, 64);
  auto ev = b.replay(r, {{d0, d1}, {d2, d0}, {odd, d2}});
  BOOST_TEST((ev.item(0).key() == d1.key()));
  BOOST_TEST((ev.item(1).key() == d0.key()));
  sync(b, ev.all_work_of(d1));
  sync(b, ev.all_work_of(d0));
  BOOST_TEST(r.replays() == 1u);
  // A pool the round allocates on the device before using it needs none on the target.
  auto own = b.record("own pool", [&] {
    b.alloc_pool(d0, 9, 64, 64);
    b.memset_zero(d0, 9, 0, 64);
    b.free_pool(d0, 9);
    b.memset_zero(d0, 9, 0, 64); // freed by the round before: refused on a target
  });
  expect_throw<std::invalid_argument>([&] { b.replay(own, {{d0, d2}}); },
                                      "item 'memset_zero 9 3' uses pool 9 of " + d0.name());
}

// Two host threads replaying one round at once (the plan is shared, the
// scratch per thread): every replay runs whole, once, each device's part
// in its order, and the replays' numbers are all distinct.
BOOST_AUTO_TEST_CASE(test_rounds_two_threads_replay_one_round_at_once) {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  std::atomic<int> first{0}, second{0}, out_of_order{0};
  auto r = b.record("shared", [&] {
    b.schedule_task(d0, {"first", [&] { ++first; }});
    b.will_wait_for(b.make_context(d1), b.all_work(d0));
    b.schedule_task(d1, {"second", [&] {
                           // d1's item of a replay runs after d0's of it: never more
                           // seconds than firsts.
                           if (++second > first.load())
                             ++out_of_order;
                         }});
  });
  constexpr int per_thread = 300;
  auto replay_many = [&] {
    for (int k = 0; k < per_thread; ++k)
      b.replay(r);
  };
  std::thread other{replay_many};
  replay_many();
  other.join();
  sync(b, b.all_work(d0));
  sync(b, b.all_work(d1));
  BOOST_TEST(r.state()->plan.usable);
  BOOST_TEST(first.load() == 2 * per_thread);
  BOOST_TEST(second.load() == 2 * per_thread);
  BOOST_TEST(out_of_order.load() == 0);
  BOOST_TEST(r.replays() == uint64_t{2 * per_thread});
  BOOST_TEST(info_field(b.get_debug_info(d1), "pending_waits") == "0");
}

// The device-side replay (a round whose items all run in this process):
// every entry is pushed at once, so a device that refuses work refuses the
// whole replay, and none of its other devices gets anything of it.
BOOST_AUTO_TEST_CASE(test_rounds_replay_on_the_devices_is_whole_or_refused) {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  std::atomic<int> ran{0};
  auto r = b.record("step", [&] {
    b.schedule_task(d0, {"first", [&] { ++ran; }});
    b.will_wait_for(b.make_context(d1), b.all_work(d0));
    b.schedule_task(d1, {"second", [&] { ++ran; }});
  });
  sync(b, b.replay(r).all_work_of(d1));
  BOOST_TEST(ran.load() == 2);
  // d1 fails outside the round: it refuses work until recovered.
  b.schedule_task(d1, {"boom", [] { throw std::runtime_error("boom"); }});
  expect_throw<device_error>([&] { bounded([&] { b.sync(b.all_work(d1)); }); }, "boom");
  auto d0_before = b.all_work(d0).seq(), d1_before = b.all_work(d1).seq();
  expect_throw<device_error>([&] { b.replay(r); }, "boom");
  // Nothing of the refused replay reached d0, whose part came first.
  BOOST_TEST(b.all_work(d0).seq() == d0_before);
  BOOST_TEST(b.all_work(d1).seq() == d1_before);
  BOOST_TEST(b.recover(d1));
  sync(b, b.replay(r).all_work_of(d1));
  BOOST_TEST(ran.load() == 4);
  // No wait is left counted as pending (the refused replay's gates were
  // taken back from d1's gate list).
  sync(b, b.all_work(d0));
  BOOST_TEST(info_field(b.get_debug_info(d1), "pending_waits") == "0");
}

// A replay on the devices makes its events on demand from each device's
// last seq: they are the events a replay call by call gives (the round's
// `by_calls` takes that path), seq for seq from each device's start, waits that
// need no entry (on the device's own work, on an event done before the
// round) included.
BOOST_AUTO_TEST_CASE(test_rounds_replay_events_on_the_devices_match_the_calls) {
  backend b{on_test_driver(backend_options{.num_devices = 3})};
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  b.schedule_task(d2, {"before", [] {}});
  auto done_before = b.all_work(d2);
  sync(b, done_before);
  auto r = b.record("mixed", [&] {
    b.schedule_task(d0, {"a", [] {}});
    b.will_wait_for(b.make_context(d0), b.all_work(d0)); // its own: no entry
    b.will_wait_for(b.make_context(d1), done_before);    // done: no entry
    b.will_wait_for(b.make_context(d1), b.all_work(d0)); // a gate
    b.schedule_named(d1, {"spin_ns", {int64_t{0}}});
    b.schedule_task(d2, {"c", [] {}});
    b.will_wait_for(b.make_context(d0), b.all_work(d1)); // a gate
    b.schedule_task(d0, {"d", [] {}});
  });
  auto offsets = [&](const replay_events& ev, const std::array<uint64_t, 3>& base) {
    std::vector<std::pair<uint32_t, uint64_t>> out;
    for (const auto& e : ev.items()) {
      auto k = e.key() == d0.key() ? 0 : e.key() == d1.key() ? 1 : 2;
      out.emplace_back(k, e.seq() - base[static_cast<std::size_t>(k)]);
    }
    for (const auto& d : {d0, d1, d2}) {
      auto k = d == d0 ? 0 : d == d1 ? 1 : 2;
      out.emplace_back(10 + k, ev.all_work_of(d).seq() - base[static_cast<std::size_t>(k)]);
    }
    return out;
  };
  auto bases = [&] {
    return std::array<uint64_t, 3>{b.all_work(d0).seq(), b.all_work(d1).seq(),
                                   b.all_work(d2).seq()};
  };
  // The runners held while each replay is pushed: a call-by-call wait on
  // an item already done pushes no gate, which would shift the seqs after
  // it (the replay on the devices always pushes one).
  auto replay_held = [&](auto&& replay, std::array<uint64_t, 3>& base) {
    std::vector<std::shared_ptr<latch_gate>> held;
    for (const auto& d : {d0, d1, d2})
      held.push_back(block_runner(b, d));
    base = bases();
    replay_events ev = replay();
    for (auto& h : held)
      h->open();
    for (const auto& [d, e] : ev.all_work())
      sync(b, e);
    return ev;
  };
  std::array<uint64_t, 3> base_calls{}, base_devices{};
  r.state()->by_calls = true;
  auto by_calls = replay_held([&] { return b.replay(r); }, base_calls);
  r.state()->by_calls = false;
  auto want = offsets(by_calls, base_calls);
  auto on_devices = replay_held([&] { return b.replay(r); }, base_devices);
  BOOST_TEST((offsets(on_devices, base_devices) == want));
  BOOST_TEST(on_devices.size() == r.size());
  for (std::size_t i = 0; i < on_devices.size(); ++i)
    BOOST_TEST((on_devices.item(i) == on_devices.items()[i]));
  expect_throw<std::invalid_argument>([&] { on_devices.item(r.size()); }, "no item 8");
  for (const auto& e : on_devices.items())
    BOOST_TEST(b.is_done(e));
}

namespace {

/// Two devices of this process, and node t (4 floats) on each, 1.0 on d0.
struct node_on_two {
  backend b{on_test_driver(backend_options{.num_devices = 2})};
  device d0 = b.get_device(0), d1 = b.get_device(1);
  tnode t = test_support::node(1, "n1", 4);
  context c0 = b.alloc_node(b.make_context(d0), t);
  context c1 = b.alloc_node(b.make_context(d1), t);
  node_on_two() { b.run(b.link(c0, "fill", {t, 1.0})); }
};

} // namespace

// A round's routines (`link` + `run`) are replayed on the devices too, with
// what `run` does around its push: a routine comes after the copies still
// reading the node it overwrites, and becomes the node's writer.
BOOST_FIXTURE_TEST_CASE(test_rounds_routines_replay_on_the_devices_after_the_copies_reading_them,
                        node_on_two) {
  auto r = b.record("write", [&] {
    b.run(b.link(c0, "scale", {t, 3.0}));
    b.schedule_task(d0, {"after", [] {}});
  });
  BOOST_TEST(r.size() == 2u);
  auto first = b.replay(r);
  BOOST_TEST(r.state()->plan.usable); // on the devices, not call by call
  sync(b, first.all_work_of(d0));
  BOOST_TEST(read_back(b, c0, t) == std::vector<float>(4, 3.0f), boost::test_tools::per_element());
  // A copy of t from d0 to d1 waits behind d1's held runner: the replay's
  // routine, which overwrites t on d0, must wait for it to read.
  auto release = block_runner(b, d1);
  b.device_to_device(t, merge_buffer_use::no, c1, c0);
  auto second = b.replay(r);
  // d0 holds the wait for the copy, ahead of the replay's routine.
  BOOST_TEST(info_field(b.get_debug_info(d0), "pending_waits") == "1");
  BOOST_TEST(!b.is_done(second.item(0)));
  release->open();
  sync(b, second.all_work_of(d0));
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 3.0f), boost::test_tools::per_element());
  BOOST_TEST(read_back(b, c0, t) == std::vector<float>(4, 9.0f), boost::test_tools::per_element());
  // The replayed routine is t's writer on d0: a copy made while it waits
  // (d0 held) waits for it, and reads what it wrote.
  auto hold = block_runner(b, d0);
  auto third = b.replay(r);
  b.device_to_device(t, merge_buffer_use::no, c1, c0);
  BOOST_TEST(info_field(b.get_debug_info(d1), "pending_waits") == "1"); // on the routine
  hold->open();
  sync(b, third.all_work_of(d0));
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 27.0f), boost::test_tools::per_element());
  // A pool the routine holds freed: the replay is refused whole, naming it.
  b.free_pool(d0, c0.buffers.at(t).pool_id);
  auto d0_before = b.all_work(d0).seq(), d1_before = b.all_work(d1).seq();
  expect_throw<std::invalid_argument>([&] { b.replay(r); },
                                      "replay: replay 4 of round 'write', item 'run scale");
  BOOST_TEST(b.all_work(d1).seq() == d1_before);
  BOOST_TEST(b.all_work(d0).seq() == d0_before);
}

namespace {

/// A toy training step on 3 devices (test_rounds_copies_...): each device
/// adds w into g, device 0 sums the others' g through its merge buffer,
/// updates w, and w is copied back to the others; replayed `replays` times,
/// by the calls (the round's `by_calls`) or as the plan takes it. The w of every
/// device after, and whether the devices' plan took the round.
std::pair<std::vector<float>, bool> train_like(int replays, bool by_calls) {
  backend b{on_test_driver(backend_options{.num_devices = 3})};
  std::vector<device> d{b.get_device(0), b.get_device(1), b.get_device(2)};
  auto g = test_support::node(1, "g", 4), w = test_support::node(2, "w", 4);
  std::vector<context> ctx;
  for (const auto& dev : d)
    ctx.push_back(b.alloc_node(b.alloc_node(b.make_context(dev), g), w));
  for (const auto& c : ctx) {
    b.run(b.link(c, "fill", {w, 1.0}));
    b.run(b.link(c, "fill", {g, 0.0}));
  }
  // The merge buffer, grown before the round (a replay on the devices does
  // not grow it).
  b.device_to_device(g, merge_buffer_use::copy, ctx[0], ctx[1]);
  for (const auto& dev : d)
    sync(b, b.all_work(dev));
  auto r = b.record("step", [&] {
    std::vector<event> grad(3);
    for (int i = 0; i < 3; ++i)
      grad[static_cast<std::size_t>(i)] =
        b.schedule_named(d[static_cast<std::size_t>(i)],
                         {"axpy", {buf(ctx[static_cast<std::size_t>(i)], g), 1.0,
                                   buf(ctx[static_cast<std::size_t>(i)], w)}});
    for (std::size_t i = 1; i < 3; ++i) {
      b.will_wait_for(ctx[0], grad[i]);
      b.device_to_device(g, merge_buffer_use::copy, ctx[0], ctx[i]);
      b.schedule_named(d[0], {"add_from_merge", {buf(ctx[0], g), buf(ctx[0], g)}});
    }
    auto update = b.schedule_named(d[0], {"axpy", {buf(ctx[0], w), 0.5, buf(ctx[0], g)}});
    for (std::size_t i = 1; i < 3; ++i) {
      b.will_wait_for(ctx[i], update);
      b.device_to_device(w, merge_buffer_use::no, ctx[i], ctx[0]);
    }
  });
  for (int k = 0; k < replays; ++k) {
    r.state()->by_calls = by_calls;
    auto ev = b.replay(r);
    for (const auto& [dev, e] : ev.all_work())
      sync(b, e);
  }
  std::vector<float> out;
  for (const auto& c : ctx) {
    auto v = read_back(b, c, w);
    out.insert(out.end(), v.begin(), v.end());
  }
  return {out, !by_calls && r.state()->plan.usable};
}

} // namespace

// Copies between devices of this process replay on the devices too (a
// training step's merge and broadcast): the same values as the calls.
BOOST_AUTO_TEST_CASE(test_rounds_copies_replay_on_the_devices_as_the_calls_do) {
  auto [calls, unused] = train_like(4, true);
  auto [plan, usable] = train_like(4, false);
  BOOST_TEST(usable);
  BOOST_TEST(plan == calls, boost::test_tools::per_element());
  // The values move: w is not what it started as.
  BOOST_TEST(calls.front() != 1.0f);
}

// A replayed copy waits for its source's last writer from outside the
// round, as the call does; and for the round's own writer on another
// device (the edge the calls' bookkeeping makes between them is a wait
// step of the plan), with the same values.
BOOST_FIXTURE_TEST_CASE(test_rounds_a_replayed_copy_waits_for_the_writer_of_its_source,
                        node_on_two) {
  auto r = b.record("copy", [&] { b.device_to_device(t, merge_buffer_use::no, c1, c0); });
  sync(b, b.replay(r).all_work_of(d1));
  BOOST_TEST(r.state()->plan.usable);
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 1.0f), boost::test_tools::per_element());
  auto hold = block_runner(b, d0);
  b.run(b.link(c0, "fill", {t, 5.0})); // t's writer on d0, held
  auto ev = b.replay(r);
  BOOST_TEST(info_field(b.get_debug_info(d1), "pending_waits") == "1"); // on that writer
  hold->open();
  sync(b, ev.all_work_of(d1));
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 5.0f), boost::test_tools::per_element());

  auto both = b.record("write and copy", [&] {
    b.run(b.link(c0, "scale", {t, 2.0}));
    b.device_to_device(t, merge_buffer_use::no, c1, c0);
  });
  sync(b, b.replay(both).all_work_of(d1));
  BOOST_TEST(both.state()->plan.usable);
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 10.0f), boost::test_tools::per_element());
  // d0 held: the replay's copy on d1 waits for the replay's own scale (the
  // writer from before the replay is done).
  hold = block_runner(b, d0);
  auto second = b.replay(both);
  BOOST_TEST(info_field(b.get_debug_info(d1), "pending_waits") == "1");
  BOOST_TEST(!b.is_done(second.item(1)));
  hold->open();
  sync(b, second.all_work_of(d1));
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 20.0f), boost::test_tools::per_element());
  // The wait is a data one: the scale cancelled, the copy's device fails.
  hold = block_runner(b, d0);
  auto third = b.replay(both);
  b.cancel(d0);
  hold->open();
  expect_throw<device_error>([&] { sync(b, third.all_work_of(d1)); }, "cancelled");
  BOOST_TEST(b.recover(d1));
  // The next replay's copy waits for its own scale only, not for the
  // cancelled one before it (the calls would not either).
  auto fourth = b.replay(both);
  sync(b, fourth.all_work_of(d1));
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 40.0f), boost::test_tools::per_element());
}

// A round's routine that overwrites a node its own copy on another device
// reads first waits for that copy (write after read: the edge is a wait
// step of the plan, ordering only), as the calls do.
BOOST_FIXTURE_TEST_CASE(test_rounds_a_replayed_writer_waits_for_the_rounds_copy_reading_it,
                        node_on_two) {
  auto r = b.record("copy then write", [&] {
    b.device_to_device(t, merge_buffer_use::no, c1, c0);
    b.run(b.link(c0, "scale", {t, 2.0}));
  });
  sync(b, b.replay(r).all_work_of(d0));
  BOOST_TEST(r.state()->plan.usable);
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 1.0f), boost::test_tools::per_element());
  BOOST_TEST(read_back(b, c0, t) == std::vector<float>(4, 2.0f), boost::test_tools::per_element());
  // d1 held: the replay's scale on d0 waits for the replay's copy to read.
  auto hold = block_runner(b, d1);
  auto second = b.replay(r);
  BOOST_TEST(info_field(b.get_debug_info(d0), "pending_waits") == "1");
  BOOST_TEST(!b.is_done(second.item(1)));
  hold->open();
  sync(b, second.all_work_of(d0));
  sync(b, second.all_work_of(d1));
  BOOST_TEST(read_back(b, c1, t) == std::vector<float>(4, 2.0f), boost::test_tools::per_element());
  BOOST_TEST(read_back(b, c0, t) == std::vector<float>(4, 4.0f), boost::test_tools::per_element());
  // The wait is ordering only: the copy cancelled, the scale still runs.
  hold = block_runner(b, d1);
  auto third = b.replay(r);
  b.cancel(d1);
  hold->open();
  sync(b, third.all_work_of(d0));
  BOOST_TEST(b.is_done(third.item(1)));
  BOOST_TEST(read_back(b, c0, t) == std::vector<float>(4, 8.0f), boost::test_tools::per_element());
}
