// The host copy's hot path (issue 11, case 4): a `from_host`/`to_host` of a
// small node builds no description and allocates nothing on the calling
// thread once its device has run a few copies, because the runner hands
// each copy's extra (the pool it holds, the copy's pointers, its names) back
// for reuse. Reuse must not leak one item's name, kind or held value into the
// next: the tests check what the trace and the errors say of each item, and
// that what an item held is released.
//
// This binary replaces the global operator new to count the allocations
// made by the calling thread while counting is on.
#define BOOST_TEST_MODULE hot_path
// The replaced operator new and delete below use malloc and free, which GCC
// cannot see through when it inlines them into the standard allocators.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
/// Allocations made on this thread while `counting` is set.
thread_local bool counting = false;
thread_local long allocations = 0;
/// Of those, the ones of over-aligned types (an order's or a wait's extra).
thread_local long aligned_allocations = 0;
/// The bytes those asked for.
thread_local std::size_t bytes_allocated = 0;
} // namespace

void* operator new(std::size_t n) {
  if (counting) {
    ++allocations;
    bytes_allocated += n;
  }
  if (void* p = std::malloc(n == 0 ? 1 : n))
    return p;
  throw std::bad_alloc{};
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (counting) {
    ++allocations;
    ++aligned_allocations;
    bytes_allocated += n;
  }
  auto align = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align))
    return p;
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace multidev;
using test_support::sync;

namespace {

/// The allocations `f` makes on this thread.
template <class F>
long allocations_in(F&& f) {
  allocations = 0;
  aligned_allocations = 0;
  bytes_allocated = 0;
  counting = true;
  f();
  counting = false;
  return allocations;
}

/// One device with a node of `n` floats placed on it and written from `host`.
struct one_node {
  one_node(int id, const char* label, std::size_t n, float value)
    : t(test_support::node(id, label, n)), host(n, value),
      c(b.init_from_host(b.make_context(d), t, std::as_bytes(std::span{host}))) {}
  backend b{backend_options{.num_devices = 1}};
  device d = b.get_device(0);
  tnode t;
  std::vector<float> host;
  context c;
};

backend_options traced(std::size_t capacity) {
  backend_options o;
  o.num_devices = 1;
  o.trace_capacity = capacity;
  return o;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_hot_path_host_copies_allocate_nothing_once_warm) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  // A label longer than a string's inline room: a description built on the
  // hot path would allocate.
  auto t = test_support::node(1, "a label longer than fifteen", 1024);
  std::vector<float> host(1024, 1.5f), back(1024, 0.0f);
  auto c = b.init_from_host(b.make_context(d), t, std::as_bytes(std::span{host}));
  sync(b, b.all_work(d));
  // The runner hands copies' extras back 16 at a time as it takes a batch;
  // each copy is synced here, so each is a batch of its own: from the 18th
  // copy on, every copy reuses an extra.
  constexpr std::size_t warm_up = 18;
  std::vector<long> counts;
  for (int i = 0; i < 60; ++i) {
    counts.push_back(allocations_in([&] {
      if (i % 2 == 0)
        BOOST_TEST_REQUIRE(b.from_host(c, t, std::as_bytes(std::span{host})));
      else
        BOOST_TEST_REQUIRE(b.to_host(c, t, std::as_writable_bytes(std::span{back})));
    }));
    sync(b, b.all_work(d));
  }
  for (std::size_t i = warm_up; i < counts.size(); ++i)
    BOOST_TEST(counts[i] == 0, "copy " << i << " allocated " << counts[i] << " time(s)");
  BOOST_TEST(back == host);
}

BOOST_AUTO_TEST_CASE(test_hot_path_reused_extras_keep_each_item_its_own_name_and_kind) {
  backend b{traced(64)};
  auto d = b.get_device(0);
  auto t = test_support::node(7, "y", 16);
  auto unlabelled = test_support::node(8, "", 16);
  std::vector<float> host(16, 3.0f);
  auto c = b.init_from_host(b.make_context(d), t, std::as_bytes(std::span{host})); // seq 1
  c = b.init_from_host(c, unlabelled, std::as_bytes(std::span{host}));             // seq 2
  sync(b, b.all_work(d));
  b.from_host(c, t, std::as_bytes(std::span{host}));          // seq 3
  sync(b, b.all_work(d));
  b.from_host(c, unlabelled, std::as_bytes(std::span{host})); // seq 4
  sync(b, b.all_work(d));
  // These reuse the copies' extras: none may be named or kinded as a copy.
  b.schedule_task(d, task{"described", [] {}, {}});                      // seq 5
  sync(b, b.all_work(d));
  b.schedule_task(d, task{{}, [] {}, std::make_shared<int>(1)});         // seq 6
  sync(b, b.all_work(d));
  b.schedule_task(d, task{{}, [] {}, {}, trace_kind::memset});           // seq 7
  sync(b, b.all_work(d));
  b.to_host(c, t, std::as_writable_bytes(std::span{host}));              // seq 8
  sync(b, b.all_work(d));
  // A nameless task whose extra is a reused copy's fails under its own name.
  b.schedule_task(d, task{{}, [] { throw std::runtime_error("boom"); },
                          std::make_shared<int>(2)}); // seq 9
  auto failing = b.all_work(d);
  auto err = test_support::sync_error(b, failing, "sync on the failed task");
  BOOST_TEST_REQUIRE(err.has_value());
  BOOST_TEST(err->origin_task() == "task#9", err->what());

  auto tr = b.trace(d);
  const std::vector<std::pair<trace_kind, std::string>> want = {
    {trace_kind::copy, "from_host 'y' (#7)"}, {trace_kind::copy, "from_host #8"},
    {trace_kind::copy, "from_host 'y' (#7)"}, {trace_kind::copy, "from_host #8"},
    {trace_kind::task, "described"},          {trace_kind::task, "task#6"},
    {trace_kind::memset, "task#7"},           {trace_kind::copy, "to_host 'y' (#7)"},
    {trace_kind::task, "task#9"},
  };
  BOOST_TEST_REQUIRE(tr.records.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto& r = tr.records[i];
    BOOST_TEST(r.seq == i + 1);
    BOOST_TEST((r.kind == want[i].first), "seq " << r.seq << ": " << to_string(r.kind));
    BOOST_TEST(r.description == want[i].second, "seq " << r.seq);
  }
}

BOOST_AUTO_TEST_CASE(test_hot_path_a_described_task_allocates_nothing_once_its_queue_has_grown) {
  // Issue 36 point 4: a task with a description took the extra sized and
  // aligned for orders and waits (192 bytes aligned to 64, ~300 bytes of
  // heap each with its entry, and an aligned allocation, which glibc
  // serves from neither its thread cache nor its fast bins), made anew for
  // every task. Its description now goes where its entry goes (the queue's
  // text, which keeps its room as the queue's vector does): nothing is
  // allocated for it once the queue has held as much. A task that holds a
  // value takes one plain allocation, well within the 128 bytes a
  // description may add to a queued task.
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  const std::string name = "matmul 'layer_3.weights' (#1042)"; // past a string's inline room
  // The queue's buffers grown first (the producer and the runner swap
  // them), so that a push below allocates only for its own item.
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 64; ++i)
      b.schedule_task(d, task{name, [] {}, {}});
    sync(b, b.all_work(d));
  }
  for (int i = 0; i < 40; ++i) {
    task t{name, [] {}, {}, i % 2 ? trace_kind::memset : trace_kind::task};
    auto n = allocations_in([&] { b.schedule_task(d, std::move(t)); });
    BOOST_TEST(n == 0, "described task " << i << " allocated " << n << " time(s), "
                                         << aligned_allocations << " aligned, "
                                         << bytes_allocated << " bytes");
    sync(b, b.all_work(d));
  }
  for (int i = 0; i < 8; ++i) {
    BOOST_TEST_CONTEXT("described task " << i << " holding a value") {
      task t{name, [] {}, std::make_shared<int>(i)};
      auto n = allocations_in([&] { b.schedule_task(d, std::move(t)); });
      BOOST_TEST(n == 1);
      BOOST_TEST(aligned_allocations == 0);
      BOOST_TEST(bytes_allocated + 16 <= 128u); // 16: malloc's header, at most
      sync(b, b.all_work(d));
    }
  }
  // The control: a bare closure allocates nothing.
  BOOST_TEST(allocations_in([&] { b.schedule_task(d, task{{}, [] {}, {}}); }) == 0);
  sync(b, b.all_work(d));
}

BOOST_AUTO_TEST_CASE(test_hot_path_described_tasks_keep_each_its_own_name_kind_and_value) {
  // Described tasks' texts share their batch's buffer, which the runner
  // swaps with the queue's and reuses: none may read another's text or
  // kind, whether it runs alone or in a batch of many, nameless (a kind or
  // a value alone), holding a value, or with a text too long for the
  // buffer's places (past 65,535 bytes: an allocation of its own).
  backend b{traced(256)};
  auto d = b.get_device(0);
  std::vector<std::pair<trace_kind, std::string>> want;
  std::vector<std::weak_ptr<int>> watches;
  auto schedule = [&](int i) {
    auto text = i % 7 == 3    ? std::string(100 + i, 'x') + std::to_string(i)
                : i % 5 == 4  ? std::string{}
                : i % 11 == 6 ? std::string(70'000, 'y') + std::to_string(i)
                              : "t" + std::to_string(i);
    auto kind = i % 3 == 0 ? trace_kind::memset : trace_kind::task;
    auto held = i % 2 ? std::make_shared<int>(i) : nullptr;
    watches.push_back(held);
    b.schedule_task(d, task{text, [] {}, std::move(held), kind});
    auto seq = b.all_work(d).seq();
    want.emplace_back(kind, text.empty() ? "task#" + std::to_string(seq) : text);
  };
  // One at a time: each a batch of its own.
  for (int i = 0; i < 40; ++i) {
    schedule(i);
    sync(b, b.all_work(d));
    BOOST_TEST(watches.back().expired(), "task " << i << ": its value outlived its event");
  }
  // A burst behind a held runner: one batch, the texts side by side.
  auto release = test_support::block_runner(b, d);
  want.emplace_back(trace_kind::task, "blocker");
  for (int i = 40; i < 100; ++i)
    schedule(i);
  release->open();
  sync(b, b.all_work(d));
  for (std::size_t i = 0; i < watches.size(); ++i)
    BOOST_TEST(watches[i].expired(), "task " << i << ": its value outlived its event");
  // One that fails is named as it was named.
  b.schedule_task(d, task{"the failing one", [] { throw std::runtime_error("boom"); }, {}});
  auto err = test_support::sync_error(b, b.all_work(d), "sync on the failed task");
  BOOST_TEST_REQUIRE(err.has_value());
  BOOST_TEST(err->origin_task() == "the failing one", err->what());
  want.emplace_back(trace_kind::task, "the failing one");

  auto tr = b.trace(d);
  BOOST_TEST_REQUIRE(tr.records.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto& r = tr.records[i];
    BOOST_TEST((r.kind == want[i].first), "record " << i << ": " << to_string(r.kind));
    BOOST_TEST((r.description == want[i].second), "record " << i << ": '"
                                                   << r.description.substr(0, 40) << "'");
  }
}

BOOST_AUTO_TEST_CASE(test_hot_path_reused_extras_release_what_their_items_held) {
  one_node n{3, "z", 1024, 0.5f};
  auto& [b, d, t, host, c] = n;
  for (int i = 0; i < 4; ++i)
    b.from_host(c, t, std::as_bytes(std::span{host}));
  sync(b, b.all_work(d));
  // The node's pool, held by each copy until it was done, goes with free_pool.
  auto used = b.get_used_memory(d);
  BOOST_TEST_REQUIRE(used >= t.size_in_bytes);
  b.free_pool(d, c.buffers.at(t).pool_id);
  sync(b, b.all_work(d));
  BOOST_TEST(b.get_used_memory(d) == used - t.size_in_bytes);
  // A task that throws keeps its value until the runner is done with it,
  // and no longer: its extra is kept for reuse, the value is not.
  auto held = std::make_shared<int>(5);
  std::weak_ptr<int> watch = held;
  b.schedule_task(d, task{{}, [] { throw std::runtime_error("boom"); }, std::move(held)});
  auto err = test_support::sync_error(b, b.all_work(d), "sync on the failed task");
  BOOST_TEST(err.has_value());
  BOOST_TEST(test_support::eventually([&] { return watch.expired(); }),
             "the failed task's keep_alive is still held");
}

BOOST_AUTO_TEST_CASE(test_hot_path_pool_calls_allocate_only_the_pool_once_warm) {
  // alloc_pool + memset_zero + free_pool of a small pool (`pool_calls` in
  // `multidev bench`): the zeroing and the release reuse extras as copies
  // do, their names are built only when asked, and the CPU driver reuses the
  // freed block; what is left is the pool's own record (the pool with its
  // count, the driver's allocation, the table's node).
  backend b{traced(256)};
  auto d = b.get_device(0);
  constexpr int pool_id = 40;
  constexpr long pool_records = 3;
  std::vector<long> counts;
  for (int i = 0; i < 40; ++i) {
    counts.push_back(allocations_in([&] {
      b.alloc_pool(d, pool_id, 4096, 64);
      b.memset_zero(d, pool_id, 64, 128);
      b.free_pool(d, pool_id);
    }));
    sync(b, b.all_work(d));
  }
  for (std::size_t i = 18; i < counts.size(); ++i)
    BOOST_TEST(counts[i] <= pool_records, "cycle " << i << " allocated " << counts[i] << " time(s)");
  // A replaced pool is released in its turn, named as before.
  b.alloc_pool(d, pool_id, 4096, 64);
  b.alloc_pool(d, pool_id, 8192, 64);
  sync(b, b.all_work(d));
  auto tr = b.trace(d);
  BOOST_TEST_REQUIRE(tr.records.size() >= 3u);
  const auto& zero = tr.records[tr.records.size() - 3];
  const auto& freed = tr.records[tr.records.size() - 2];
  const auto& replaced = tr.records.back();
  BOOST_TEST((zero.kind == trace_kind::memset));
  BOOST_TEST(zero.description == "memset_zero pool 40 [64, 192)");
  BOOST_TEST((freed.kind == trace_kind::pool));
  BOOST_TEST(freed.description == "free_pool 40");
  BOOST_TEST((replaced.kind == trace_kind::pool));
  BOOST_TEST(replaced.description == "release replaced pool 40");
  BOOST_TEST(b.get_used_memory(d) == 8192u);
}

BOOST_AUTO_TEST_CASE(test_hot_path_a_wait_allocates_at_most_its_entry_once_warm) {
  // A local will_wait_for (`will_wait_for_chain`, the fan DAGs). The awaited
  // device keeps the wait in a list of its own, with no resolver and no map
  // node: those two were allocated here and freed by the other runner on
  // every wait. The gate's memory is one a gate freed before (make_gate's
  // cache). The queue entry's extra (over-aligned) is usually one the runner
  // handed back; it hands them back 16 at a time, so a wait may find none.
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto c1 = b.make_context(d1);
  std::vector<long> counts, entries;
  for (int i = 0; i < 100; ++i) {
    // d0 held, so that every wait is registered rather than skipped as done.
    auto release = test_support::block_runner(b, d0);
    auto e = b.all_work(d0);
    counts.push_back(allocations_in([&] { b.will_wait_for(c1, e); }));
    entries.push_back(aligned_allocations);
    release->open();
    sync(b, b.all_work(d1));
  }
  // Warm after 70 waits: the lists that keep the waits grow by doubling,
  // keeping their room; d1's list of its gates holds each gate's memory
  // until it is pruned, at 64 entries, which frees the gates to the cache.
  for (std::size_t i = 70; i < counts.size(); ++i) {
    BOOST_TEST(counts[i] - entries[i] == 0,
               "wait " << i << " allocated " << counts[i] - entries[i]
                       << " time(s) besides its entry");
    BOOST_TEST(entries[i] <= 1, "wait " << i << " allocated " << entries[i] << " entries");
  }
}

BOOST_AUTO_TEST_CASE(test_hot_path_waits_registered_out_of_order_open_in_seq_order) {
  // d1 waits for d0's second task, then d2 for its first: the first must
  // open d2 while the second still runs, whatever the order they came in.
  backend b{backend_options{.num_devices = 3}};
  auto d0 = b.get_device(0);
  auto c1 = b.make_context(b.get_device(1));
  auto c2 = b.make_context(b.get_device(2));
  auto first = std::make_shared<test_support::latch_gate>();
  auto second = std::make_shared<test_support::latch_gate>();
  b.schedule_task(d0, {"first", [first] { first->wait(); }});
  auto e_first = b.all_work(d0);
  b.schedule_task(d0, {"second", [second] { second->wait(); }});
  auto e_second = b.all_work(d0);
  b.will_wait_for(c1, e_second);
  b.schedule_task(c1.device, {"after second", [] {}});
  b.will_wait_for(c2, e_first);
  b.schedule_task(c2.device, {"after first", [] {}});
  first->open();
  // Bounded: a wait stuck behind the later one would time out here.
  BOOST_CHECK_NO_THROW(b.all_work(c2.device)
                         .sync(std::chrono::steady_clock::now() + std::chrono::seconds{30}));
  BOOST_TEST(!b.all_work(c1.device).is_done());
  second->open();
  sync(b, b.all_work(c1.device));
  BOOST_TEST(b.all_work(c1.device).is_done());
}

BOOST_AUTO_TEST_CASE(test_hot_path_a_burst_of_copies_hands_back_every_extra_until_idle) {
  // A producer ahead of the runner allocates an extra for each copy beyond
  // the spares. Had the runner freed what it handed back beyond 1,024 while
  // the producer still allocated, the two would contend for the allocator's
  // lock on every copy. It hands back all of them while it has work, and
  // trims the spares to 1,024 only once it is idle.
  one_node n{1, "burst", 256, 2.5f};
  auto& [b, d, t, host, c] = n;
  sync(b, b.all_work(d));
  auto spare = [&] { return std::stoul(test_support::field_of(b.get_debug_info(d), "spare_extras")); };
  constexpr std::size_t burst = 3000;
  auto release = test_support::block_runner(b, d);
  for (std::size_t i = 0; i < burst; ++i)
    BOOST_TEST_REQUIRE(b.from_host(c, t, std::as_bytes(std::span{host})));
  // The runner runs the burst, then `second`, which holds it until `third`
  // is queued: it takes `third` (handing the burst's extras back) without
  // going idle in between, and `third` holds it while we look.
  auto second_started = std::make_shared<test_support::latch_gate>();
  auto second_release = std::make_shared<test_support::latch_gate>();
  auto third_started = std::make_shared<test_support::latch_gate>();
  auto third_release = std::make_shared<test_support::latch_gate>();
  b.schedule_task(d, {"second", [=] {
                        second_started->open();
                        second_release->wait();
                      }});
  release->open();
  BOOST_TEST_REQUIRE(second_started->wait());
  b.schedule_task(d, {"third", [=] {
                        third_started->open();
                        third_release->wait();
                      }});
  second_release->open();
  BOOST_TEST_REQUIRE(third_started->wait());
  BOOST_TEST(spare() >= burst);
  third_release->open();
  sync(b, b.all_work(d));
  // Idle: trimmed (the runner trims before it sleeps).
  BOOST_TEST(test_support::eventually([&] { return spare() <= 1024u; }));
}

// A pool freed or replaced while host copies on it are still queued outlives
// them: each copy holds it until it is done, and its release is queued
// behind them. Either keeps it alive; with neither, the counts below fail
// (and under ASan, the copy into freed memory).
BOOST_AUTO_TEST_CASE(test_hot_path_a_pool_freed_or_replaced_behind_queued_copies_outlives_them) {
  one_node n{4, "p", 1024, 2.5f};
  auto& [b, d, t, host, c] = n;
  sync(b, b.all_work(d));
  const int id = c.buffers.at(t).pool_id;
  const auto bytes = t.size_in_bytes;
  std::vector<float> other(1024, -1.0f), back(1024, 0.0f), back2(1024, 0.0f);
  for (bool replace : {false, true}) {
    auto used = b.get_used_memory(d);
    auto release = test_support::block_runner(b, d);
    BOOST_TEST_REQUIRE(b.from_host(c, t, std::as_bytes(std::span{other})));
    BOOST_TEST_REQUIRE(b.to_host(c, t, std::as_writable_bytes(std::span{back})));
    if (replace)
      b.alloc_pool(d, id, bytes, 64); // the node's pool, replaced
    else
      b.free_pool(d, id);
    // Still counted: held by the queued copies.
    BOOST_TEST(b.get_used_memory(d) == used + (replace ? bytes : 0));
    release->open();
    sync(b, b.all_work(d));
    BOOST_TEST(back == other, (replace ? "replaced" : "freed"));
    BOOST_TEST(b.get_used_memory(d) == used - (replace ? 0 : bytes));
    if (!replace) {
      BOOST_CHECK_THROW(b.from_host(c, t, std::as_bytes(std::span{host})), std::invalid_argument);
      b.alloc_pool(d, id, bytes, 64);
      BOOST_TEST_REQUIRE(b.from_host(c, t, std::as_bytes(std::span{host})));
      BOOST_TEST_REQUIRE(b.to_host(c, t, std::as_writable_bytes(std::span{back2})));
      sync(b, b.all_work(d));
      BOOST_TEST(back2 == host);
    }
  }
}

BOOST_AUTO_TEST_CASE(test_hot_path_a_replay_on_the_devices_allocates_at_most_its_waits_entries) {
  // A recorded round of closures and waits on two devices (issue 41 point
  // 2: a replay allocates nothing on the hot path): once warm, replaying it
  // allocates nothing on the replaying thread but, at most, a wait entry's
  // extra when the runner has handed none back yet (as a single wait:
  // test_hot_path_a_wait_allocates_at_most_its_entry_once_warm).
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto c0 = b.make_context(d0);
  auto c1 = b.make_context(d1);
  std::atomic<int> ran{0};
  auto r = b.record("step", [&] {
    for (int s = 0; s < 4; ++s) {
      b.schedule_task(d0, {"t0", [&ran] { ++ran; }});
      b.will_wait_for(c1, b.all_work(d0));
      b.schedule_task(d1, {"t1", [&ran] { ++ran; }});
      b.will_wait_for(c0, b.all_work(d1));
    }
  });
  std::vector<long> counts, entries;
  for (int i = 0; i < 120; ++i) {
    replay_events ev;
    counts.push_back(allocations_in([&] { ev = b.replay(r); }));
    entries.push_back(aligned_allocations);
    sync(b, ev.all_work_of(d0));
    sync(b, ev.all_work_of(d1));
  }
  for (std::size_t i = 90; i < counts.size(); ++i)
    BOOST_TEST(counts[i] - entries[i] == 0,
               "replay " << i << " allocated " << counts[i] - entries[i]
                         << " time(s) besides its waits' entries");
  BOOST_TEST(ran.load() == 120 * 8);
}
