// Memory and data movement (SPEC §4 "Nodes, linking and transfers", §5.6-7):
// round trips, node allocation, the constant cache, writer/reader ordering
// across devices, the merge buffer, and bad input.
#define BOOST_TEST_MODULE transfers
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace bdata = boost::unit_test::data;
using namespace std::chrono_literals;
using multidev::backend;
using multidev::buffer_loc;
using multidev::context;
using multidev::event;
using multidev::link_arg;
using multidev::memory_mode;
using multidev::merge_buffer_use;
using multidev::tnode;
using test_support::make_backend;
using test_support::node;
using test_support::read_back;
using test_support::scheduled_count;
using test_support::sync;

namespace {

void sync_all(backend& b, int n) {
  for (int i = 0; i < n; ++i) {
    auto d = b.get_device(i);
    sync(b, b.all_work(d));
  }
}

std::vector<std::byte> random_bytes(std::size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  while (i < n) {
    // splitmix64
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int k = 0; k < 8 && i < n; ++k, ++i)
      v[i] = static_cast<std::byte>((z >> (8 * k)) & 0xff);
  }
  return v;
}

std::span<const std::byte> cbytes(const std::vector<float>& v) {
  return std::as_bytes(std::span{v});
}
std::span<std::byte> wbytes(std::vector<float>& v) {
  return std::as_writable_bytes(std::span{v});
}

/// A task that holds its runner until released (or 30 s pass), so a test can
/// keep a device busy deterministically. Released at scope exit.
struct latch {
  std::shared_ptr<std::atomic<bool>> open = std::make_shared<std::atomic<bool>>(false);
  latch() = default;
  latch(const latch&) = delete;
  ~latch() { release(); }
  void release() { open->store(true); }
  multidev::task as_task() const {
    auto o = open;
    return multidev::task{"latch", [o] {
                            auto until = std::chrono::steady_clock::now() + 30s;
                            while (!o->load() && std::chrono::steady_clock::now() < until)
                              std::this_thread::sleep_for(100us);
                          },
                          nullptr};
  }
};

bool all_equal(const std::vector<float>& v, float x) {
  for (float y : v)
    if (y != x)
      return false;
  return true;
}

bool same_event(const std::optional<event>& a, const event& b) {
  return a && a->core() == b.core() && a->seq() == b.seq();
}

const std::vector<std::size_t> round_trip_sizes = {
  0, 1, 3, 4, 7, 63, 64, 65, 4097, (std::size_t{1} << 20) + 3, std::size_t{64} << 20};

} // namespace

// -- round trips ------------------------------------------------------------------

BOOST_DATA_TEST_CASE(test_transfers_round_trip_host_device_device_host_is_bit_exact,
                     bdata::make(round_trip_sizes), size) {
  auto b = make_backend(3);
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  tnode t{7, "payload", size, memory_mode::on_device};
  auto src = random_bytes(size, size + 17);

  auto c0 = b.init_from_host(b.make_context(d0), t, src);
  BOOST_TEST_REQUIRE(c0.buffers.contains(t));
  auto c1 = b.init_from_device(t, b.make_context(d1), c0);
  BOOST_TEST_REQUIRE(c1.buffers.contains(t));
  auto c2 = b.alloc_node(b.make_context(d2), t);
  auto copy = b.device_to_device(t, merge_buffer_use::no, c2, c1);
  BOOST_TEST_REQUIRE(copy.has_value());

  std::vector<std::byte> out0(size, std::byte{0x5a}), out1(size, std::byte{0xa5}),
    out2(size, std::byte{0x3c});
  BOOST_TEST_REQUIRE(b.to_host(c2, t, out2));
  BOOST_TEST_REQUIRE(b.to_host(c1, t, out1));
  BOOST_TEST_REQUIRE(b.to_host(c0, t, out0));
  sync(b, b.all_work(d2));
  sync(b, b.all_work(d1));
  sync(b, b.all_work(d0));
  BOOST_TEST((out0 == src), "device 0 copy differs for size " << size);
  BOOST_TEST((out1 == src), "device 1 copy differs for size " << size);
  BOOST_TEST((out2 == src), "host -> 0 -> 1 -> 2 -> host differs for size " << size);

  // Back again, 2 -> 0 over fresh bytes on device 2, and re-running the
  // returned copy routine moves the data again.
  if (size > 0) {
    auto again = random_bytes(size, size + 99);
    BOOST_TEST_REQUIRE(b.from_host(c2, t, again));
    auto back = b.device_to_device(t, merge_buffer_use::no, c0, c2);
    BOOST_TEST_REQUIRE(back.has_value());
    std::vector<std::byte> out(size);
    BOOST_TEST_REQUIRE(b.to_host(c0, t, out));
    sync(b, b.all_work(d0));
    BOOST_TEST((out == again), "2 -> 0 differs for size " << size);

    // Re-run the 1 -> 2 copy: device 2 gets device 1's bytes (the original) back.
    b.run(*copy);
    std::vector<std::byte> out_rerun(size);
    BOOST_TEST_REQUIRE(b.to_host(c2, t, out_rerun));
    sync(b, b.all_work(d2));
    BOOST_TEST((out_rerun == src), "re-run copy differs for size " << size);
  }
}

// -- alloc_node and the constant cache -------------------------------------------

BOOST_AUTO_TEST_CASE(test_alloc_node_takes_deterministic_pool_ids_and_returns_child) {
  auto b = make_backend(2);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  BOOST_TEST(d0.next_pool_id() == 1);
  BOOST_TEST(d1.next_pool_id() == 1);
  auto base0 = b.get_used_memory(d0);

  tnode a = node(1, "a", 16), bb = node(2, "b", 32), c = node(3, "c", 5);
  auto root = b.make_context(d0);
  auto ca = b.alloc_node(root, a);
  BOOST_TEST_REQUIRE(ca.parent != nullptr);
  BOOST_TEST(ca.parent->buffers.empty());
  BOOST_TEST((ca.device == d0));
  BOOST_TEST_REQUIRE(ca.buffers.contains(a));
  BOOST_TEST((ca.buffers.at(a) == buffer_loc{1, 0}));
  BOOST_TEST(d0.next_pool_id() == 2);

  auto cab = b.alloc_node(ca, bb);
  BOOST_TEST_REQUIRE(cab.parent != nullptr);
  BOOST_TEST(cab.parent->buffers.size() == 1u);
  BOOST_TEST(cab.parent->buffers.contains(a));
  BOOST_TEST(cab.buffers.size() == 2u);
  BOOST_TEST((cab.buffers.at(a) == buffer_loc{1, 0}));
  BOOST_TEST((cab.buffers.at(bb) == buffer_loc{2, 0}));
  BOOST_TEST(d0.next_pool_id() == 3);
  BOOST_TEST(b.get_used_memory(d0) >= base0 + a.size_in_bytes + bb.size_in_bytes);

  // Pool ids count per device.
  auto d1a = b.alloc_node(b.make_context(d1), a);
  BOOST_TEST((d1a.buffers.at(a) == buffer_loc{1, 0}));
  BOOST_TEST(d1.next_pool_id() == 2);
  BOOST_TEST(d0.next_pool_id() == 3);

  // A node the context already holds takes no new pool.
  auto again = b.alloc_node(cab, a);
  BOOST_TEST((again.buffers.at(a) == buffer_loc{1, 0}));
  BOOST_TEST(d0.next_pool_id() == 3);

  // The merge buffer is pool 0 and takes no id from next_pool_id; the next
  // node still gets 3.
  auto copy = b.device_to_device(a, merge_buffer_use::copy, cab, d1a);
  BOOST_TEST_REQUIRE(copy.has_value());
  BOOST_TEST(d0.next_pool_id() == 3);
  auto cabc = b.alloc_node(cab, c);
  BOOST_TEST((cabc.buffers.at(c) == buffer_loc{3, 0}));
  BOOST_TEST(d0.next_pool_id() == 4);
  for (const auto& [t, loc] : cabc.buffers)
    BOOST_TEST(loc.pool_id != 0, "node " << t.label << " placed in pool 0");

  // The allocated node is usable at its full size (5 floats).
  std::vector<float> v{1, 2, 3, 4, 5};
  BOOST_TEST_REQUIRE(b.from_host(cabc, c, cbytes(v)));
  BOOST_TEST((read_back(b, cabc, c) == v));
}

BOOST_AUTO_TEST_CASE(test_alloc_node_effectively_constant_uploaded_once_per_device) {
  auto b = make_backend(2);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  tnode k = node(11, "k", 64, memory_mode::effectively_constant);
  std::vector<float> data(64);
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(i) * 1.5f;

  BOOST_TEST(!d0.constant_buffer(k).has_value());
  auto c1 = b.init_from_host(b.make_context(d0), k, cbytes(data));
  sync(b, b.all_work(d0));
  BOOST_TEST_REQUIRE(c1.buffers.contains(k));
  auto loc = c1.buffers.at(k);
  BOOST_TEST_REQUIRE(d0.constant_buffer(k).has_value());
  BOOST_TEST((*d0.constant_buffer(k) == loc));
  auto used = b.get_used_memory(d0);
  auto next = d0.next_pool_id();
  auto sched = scheduled_count(b, d0);

  // A second context on the same device reuses the cached buffer: no new
  // pool, no upload.
  auto c2 = b.init_from_host(b.make_context(d0), k, cbytes(data));
  BOOST_TEST_REQUIRE(c2.buffers.contains(k));
  BOOST_TEST((c2.buffers.at(k) == loc));
  BOOST_TEST(b.get_used_memory(d0) == used);
  BOOST_TEST(d0.next_pool_id() == next);
  BOOST_TEST(scheduled_count(b, d0) == sched);
  BOOST_TEST((*d0.constant_buffer(k) == loc));
  BOOST_TEST((read_back(b, c2, k) == data));

  // alloc_node alone also reuses it.
  auto c3 = b.alloc_node(b.make_context(d0), k);
  BOOST_TEST((c3.buffers.at(k) == loc));
  BOOST_TEST(d0.next_pool_id() == next);

  // Another device gets its own copy.
  BOOST_TEST(!d1.constant_buffer(k).has_value());
  auto e1 = b.init_from_host(b.make_context(d1), k, cbytes(data));
  BOOST_TEST_REQUIRE(d1.constant_buffer(k).has_value());
  BOOST_TEST((e1.buffers.at(k) == *d1.constant_buffer(k)));
  BOOST_TEST(d1.next_pool_id() == 2);
  BOOST_TEST((read_back(b, e1, k) == data));

  // A non-constant node is never cached.
  tnode v = node(12, "v", 8);
  auto cv = b.alloc_node(b.make_context(d0), v);
  BOOST_TEST(!d0.constant_buffer(v).has_value());
  auto cv2 = b.alloc_node(b.make_context(d0), v);
  BOOST_TEST((cv.buffers.at(v) != cv2.buffers.at(v)));
}

// -- ordering ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_device_to_device_waits_for_last_writer_on_source) {
  auto b = make_backend(3);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  tnode t = node(1, "t", 1024);
  auto c0 = b.alloc_node(b.make_context(d0), t);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  b.run(b.link(c0, "fill", {t, 1.0}));
  b.run(b.link(c1, "fill", {t, 0.0}));
  sync_all(b, 2);

  latch hold;
  b.schedule_task(d0, hold.as_task());
  auto w = b.run(b.link(c0, "fill", {t, 7.0}));
  BOOST_TEST(same_event(d0.updating_for(t), w));
  auto copy = b.device_to_device(t, merge_buffer_use::no, c1, c0);
  BOOST_TEST_REQUIRE(copy.has_value());
  auto ce = d1.updating_for(t);
  BOOST_TEST_REQUIRE(ce.has_value());
  BOOST_TEST(ce->device_name() == d1.name());
  std::this_thread::sleep_for(20ms);
  // The writer cannot have run: the copy must still be waiting for it.
  BOOST_TEST(!w.is_done());
  BOOST_TEST(!ce->is_done());
  hold.release();
  sync(b, *ce);
  BOOST_TEST(w.is_done());
  BOOST_TEST(all_equal(read_back(b, c1, t), 7.0f));
}

BOOST_AUTO_TEST_CASE(test_device_to_device_later_source_writer_waits_for_pending_copy) {
  auto b = make_backend(3);
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  tnode t = node(1, "t", 1024);
  auto c0 = b.alloc_node(b.make_context(d0), t);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  auto c2 = b.alloc_node(b.make_context(d2), t);
  b.run(b.link(c0, "fill", {t, 1.0}));
  b.run(b.link(c2, "fill", {t, 0.0}));
  sync_all(b, 3);

  latch hold1, hold2;
  b.schedule_task(d1, hold1.as_task());
  b.schedule_task(d2, hold2.as_task());
  BOOST_TEST_REQUIRE(b.device_to_device(t, merge_buffer_use::no, c1, c0).has_value());
  // A copy into device 2's merge buffer reads device 0's `t` too.
  auto mcopy = b.device_to_device(t, merge_buffer_use::copy, c2, c0);
  BOOST_TEST_REQUIRE(mcopy.has_value());
  auto w = b.run(b.link(c0, "fill", {t, 2.0}));
  std::this_thread::sleep_for(20ms);
  // Both copies are held behind the latches; the overwrite must wait.
  BOOST_TEST(!w.is_done());
  hold1.release();
  sync(b, b.all_work(d1));
  std::this_thread::sleep_for(5ms);
  BOOST_TEST(!w.is_done()); // still one pending reader (device 2)
  hold2.release();
  b.run(b.link(mcopy->context, "add_from_merge", {t, t}));
  sync(b, w);
  BOOST_TEST(all_equal(read_back(b, c1, t), 1.0f));
  BOOST_TEST(all_equal(read_back(b, c2, t), 1.0f)); // 0 + merge buffer (1)
  BOOST_TEST(all_equal(read_back(b, c0, t), 2.0f));
}

BOOST_AUTO_TEST_CASE(test_device_to_device_destination_waits_for_its_pending_readers) {
  // A copy into device 1 of `t` must not overwrite device 1's `t` while a copy
  // 1 -> 2 of it is still pending.
  auto b = make_backend(3);
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  tnode t = node(1, "t", 512);
  auto c0 = b.alloc_node(b.make_context(d0), t);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  auto c2 = b.alloc_node(b.make_context(d2), t);
  b.run(b.link(c0, "fill", {t, 5.0}));
  b.run(b.link(c1, "fill", {t, 3.0}));
  sync_all(b, 3);
  latch hold;
  b.schedule_task(d2, hold.as_task());
  BOOST_TEST_REQUIRE(b.device_to_device(t, merge_buffer_use::no, c2, c1).has_value());
  BOOST_TEST_REQUIRE(b.device_to_device(t, merge_buffer_use::no, c1, c0).has_value());
  auto into1 = d1.updating_for(t);
  BOOST_TEST_REQUIRE(into1.has_value());
  std::this_thread::sleep_for(20ms);
  BOOST_TEST(!into1->is_done());
  hold.release();
  BOOST_TEST(all_equal(read_back(b, c2, t), 3.0f));
  BOOST_TEST(all_equal(read_back(b, c1, t), 5.0f));
}

// -- failure and write-after-read (issue 36 point 9) -------------------------------
//
// A writer of a node waits for the copies still reading it on other devices
// (write-after-read) only so it does not overwrite bytes being read: a reader
// that failed or was cancelled no longer reads them, so its failure must not
// fail the writer. A read-after-write wait (the copy's source writer) still
// carries failure.

namespace {

/// Device 0's `t` holds 1.0, device 1 holds a buffer for it; nothing pending.
struct war_fixture {
  backend b = make_backend(2);
  multidev::device d0 = b.get_device(0), d1 = b.get_device(1);
  tnode t = node(1, "a", 256);
  context c0 = b.alloc_node(b.make_context(d0), t);
  context c1 = b.alloc_node(b.make_context(d1), t);
  war_fixture() {
    b.run(b.link(c0, "fill", {t, 1.0}));
    sync_all(b, 2);
  }
  /// Queues the copy of `t` from device 0 to device 1; returns its event.
  event queue_copy() {
    BOOST_TEST_REQUIRE(b.device_to_device(t, merge_buffer_use::no, c1, c0).has_value());
    auto e = d1.updating_for(t);
    BOOST_TEST_REQUIRE(e.has_value());
    return *e;
  }
  /// Syncs on `e`, which must succeed; the error it threw otherwise.
  std::string sync_ok(const event& e) {
    try {
      sync(b, e);
      return "done";
    } catch (const std::exception& x) {
      return x.what();
    }
  }
};

/// A latch task that throws `boom` once released, failing its device.
multidev::task failing_latch(const latch& l) {
  auto o = l.open;
  return multidev::task{"failing latch", [o] {
                          auto until = std::chrono::steady_clock::now() + 30s;
                          while (!o->load() && std::chrono::steady_clock::now() < until)
                            std::this_thread::sleep_for(100us);
                          throw std::runtime_error("boom");
                        },
                        nullptr};
}

} // namespace

BOOST_FIXTURE_TEST_CASE(test_writer_after_a_cancelled_reader_runs, war_fixture) {
  latch hold;
  b.schedule_task(d1, hold.as_task()); // device 1 held: the copy stays queued
  auto read = queue_copy();
  b.cancel(d1);
  auto w = b.run(b.link(c0, "fill", {t, 2.0})); // waits for the (cancelled) reader
  hold.release();
  BOOST_CHECK_THROW(sync(b, read), multidev::cancelled_error);
  BOOST_TEST(sync_ok(w) == "done");
  BOOST_TEST(all_equal(read_back(b, c0, t), 2.0f));
}

BOOST_FIXTURE_TEST_CASE(test_writer_after_a_reader_on_a_failed_device_runs, war_fixture) {
  latch hold;
  b.schedule_task(d1, failing_latch(hold)); // device 1 fails once released
  auto read = queue_copy();
  auto w = b.run(b.link(c0, "fill", {t, 2.0})); // queued while the reader is pending
  hold.release();
  auto err = test_support::sync_error(b, read, "the copy behind the failure");
  BOOST_TEST_REQUIRE(err.has_value());
  BOOST_TEST(err->original_message() == "boom");
  BOOST_TEST(sync_ok(w) == "done");
  BOOST_TEST(all_equal(read_back(b, c0, t), 2.0f));
}

BOOST_FIXTURE_TEST_CASE(test_writer_after_recover_ignores_the_failed_reader, war_fixture) {
  latch hold;
  b.schedule_task(d1, failing_latch(hold));
  auto read = queue_copy();
  hold.release();
  BOOST_TEST_REQUIRE(test_support::sync_error(b, read, "the copy behind the failure").has_value());
  BOOST_TEST_REQUIRE(b.recover(d1));
  // The failed copy is still the last reader of device 0's `a`: the next
  // writer there must not inherit its failure.
  auto w = b.run(b.link(c0, "fill", {t, 3.0}));
  BOOST_TEST(sync_ok(w) == "done");
  BOOST_TEST(all_equal(read_back(b, c0, t), 3.0f));
  // Device 1 works again and reads the new value.
  BOOST_TEST_REQUIRE(b.device_to_device(t, merge_buffer_use::no, c1, c0).has_value());
  BOOST_TEST(all_equal(read_back(b, c1, t), 3.0f));
}

BOOST_FIXTURE_TEST_CASE(test_copy_of_a_failed_writer_still_fails, war_fixture) {
  // Read-after-write carries failure: device 0 fails, so its writer of `a`
  // never completes, and the copy that reads it (a writer of device 1's `a`)
  // fails with the origin's error.
  latch hold;
  b.schedule_task(d0, failing_latch(hold));
  auto producer = b.run(b.link(c0, "fill", {t, 4.0}));
  auto read = queue_copy();
  hold.release();
  auto err = test_support::sync_error(b, read, "the copy of the failed writer");
  BOOST_TEST_REQUIRE(err.has_value());
  BOOST_TEST(err->original_message() == "boom");
  BOOST_TEST(err->origin_device() == d0.name());
  BOOST_TEST(!b.is_done(producer));
}

namespace {

/// The host model of one randomized schedule: every device holds every node.
struct model {
  static constexpr int devices = 3;
  static constexpr int nodes = 4;
  static constexpr std::size_t n = 257;
  std::vector<float> v[devices][nodes];
};

} // namespace

BOOST_DATA_TEST_CASE(test_transfers_randomized_writer_reader_order_matches_host,
                     bdata::xrange(0, 48), seed) {
  constexpr int D = model::devices, N = model::nodes;
  constexpr auto n = model::n;
  auto b = make_backend(D);
  std::vector<multidev::device> dev;
  std::vector<tnode> ts;
  for (int j = 0; j < N; ++j)
    ts.push_back(node(j + 1, "n" + std::to_string(j), n));
  std::vector<context> ctx;
  for (int i = 0; i < D; ++i) {
    dev.push_back(b.get_device(i));
    auto c = b.make_context(dev[i]);
    for (auto& t : ts)
      c = b.alloc_node(c, t);
    ctx.push_back(c);
  }
  model m;
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 7919 + 1);
  auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<uint64_t>(k)); };
  auto iota_host = [](std::vector<float>& x, double start) {
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(start + static_cast<double>(i));
  };
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < N; ++j) {
      double start = 1000.0 * i + 100.0 * j;
      b.run(b.link(ctx[i], "iota", {ts[j], start}));
      m.v[i][j].resize(n);
      iota_host(m.v[i][j], start);
    }

  std::map<std::tuple<int, int, int>, multidev::routine> copies; // (node, dst, src)
  struct snapshot {
    std::vector<float> got, want;
    std::string what;
  };
  std::deque<snapshot> snaps;
  const double factors[] = {-1.0, 0.5, 2.0};
  const double alphas[] = {1.0, -1.0, 0.5, 2.0};
  int copies_made = 0;
  for (int step = 0; step < 90; ++step) {
    if (rng() % 4 == 0) {
      auto ns = static_cast<int64_t>(rng() % 150000);
      b.run(b.link(ctx[pick(D)], "spin_ns", {ns}));
    }
    int d = pick(D), j = pick(N);
    auto& y = m.v[d][j];
    std::optional<event> wrote;
    switch (pick(7)) {
      case 0: {
        double val = static_cast<double>(pick(64)) - 32.0;
        wrote = b.run(b.link(ctx[d], "fill", {ts[j], val}));
        for (auto& x : y)
          x = static_cast<float>(val);
        break;
      }
      case 1: {
        double start = static_cast<double>(pick(1000));
        wrote = b.run(b.link(ctx[d], "iota", {ts[j], start}));
        iota_host(y, start);
        break;
      }
      case 2: {
        double f = factors[pick(3)];
        wrote = b.run(b.link(ctx[d], "scale", {ts[j], f}));
        for (auto& x : y)
          x *= static_cast<float>(f);
        break;
      }
      case 3: {
        int k = (j + 1 + pick(N - 1)) % N;
        double a = alphas[pick(4)];
        wrote = b.run(b.link(ctx[d], "axpy", {ts[j], a, ts[k]}));
        auto af = static_cast<float>(a);
        const auto& x = m.v[d][k];
        for (std::size_t i = 0; i < n; ++i)
          y[i] += af * x[i];
        break;
      }
      case 4:
      case 5: {
        int src = (d + 1 + pick(D - 1)) % D;
        auto key = std::make_tuple(j, d, src);
        auto it = copies.find(key);
        if (it != copies.end() && rng() % 2 == 0) {
          wrote = b.run(it->second); // re-run the returned copy routine
        } else {
          auto r = b.device_to_device(ts[j], merge_buffer_use::no, ctx[d], ctx[src]);
          BOOST_TEST_REQUIRE(r.has_value());
          copies.insert_or_assign(key, *r);
          auto u = dev[d].updating_for(ts[j]);
          BOOST_TEST_REQUIRE(u.has_value());
          BOOST_TEST(u->device_name() == dev[d].name());
          wrote = *u;
        }
        ++copies_made;
        y = m.v[src][j];
        break;
      }
      case 6: {
        // A mid-stream read to the host: must see exactly the state so far.
        auto& s = snaps.emplace_back();
        s.got.assign(n, -7777.0f);
        s.want = y;
        s.what = "snapshot of " + ts[j].label + " on device " + std::to_string(d) +
                 " at step " + std::to_string(step);
        BOOST_TEST_REQUIRE(b.to_host(ctx[d], ts[j], wbytes(s.got)));
        break;
      }
    }
    if (wrote)
      BOOST_TEST(same_event(dev[d].updating_for(ts[j]), *wrote),
                 "updating_for is not the latest writer at step " << step);
  }
  sync_all(b, D);
  for (auto& s : snaps)
    BOOST_TEST((s.got == s.want), s.what << " (seed " << seed << ")");
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < N; ++j) {
      auto got = read_back(b, ctx[i], ts[j]);
      BOOST_TEST((got == m.v[i][j]),
                 "node " << j << " on device " << i << " differs (seed " << seed << ")");
    }
  for (int i = 0; i < D; ++i) {
    b.sync_device(dev[i]);
    for (auto& t : ts)
      BOOST_TEST(!dev[i].updating_for(t).has_value());
  }
  BOOST_TEST(copies_made > 0);
}

// -- updating_for ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_updating_for_records_latest_writer_and_sync_device_forgets) {
  auto b = make_backend(2);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  tnode t = node(1, "t", 256), u = node(2, "u", 256);
  auto c0 = b.alloc_node(b.alloc_node(b.make_context(d0), t), u);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  BOOST_TEST(!d0.updating_for(t).has_value());
  b.run(b.link(c0, "fill", {u, 0.0}));
  sync(b, b.all_work(d0));

  latch hold;
  b.schedule_task(d0, hold.as_task());
  auto e1 = b.run(b.link(c0, "fill", {t, 2.0}));
  BOOST_TEST(same_event(d0.updating_for(t), e1));
  auto e2 = b.run(b.link(c0, "scale", {t, 3.0}));
  BOOST_TEST(same_event(d0.updating_for(t), e2));
  BOOST_TEST(e2.seq() > e1.seq());
  // Readers are not writers: checksum, to_host and axpy's X leave `t` alone.
  b.run(b.link(c0, "checksum", {t, std::string{"upd"}}));
  std::vector<float> host(256);
  BOOST_TEST_REQUIRE(b.to_host(c0, t, wbytes(host)));
  auto eu = b.run(b.link(c0, "axpy", {u, 1.0, t}));
  BOOST_TEST(same_event(d0.updating_for(t), e2));
  BOOST_TEST(same_event(d0.updating_for(u), eu));
  BOOST_TEST(!d0.updating_for(t)->is_done());
  // The copy's writer record lives on the destination.
  BOOST_TEST_REQUIRE(b.device_to_device(t, merge_buffer_use::no, c1, c0).has_value());
  auto ec = d1.updating_for(t);
  BOOST_TEST_REQUIRE(ec.has_value());
  BOOST_TEST(ec->device_name() == d1.name());
  BOOST_TEST(same_event(d0.updating_for(t), e2));
  hold.release();

  b.sync_device(d0);
  BOOST_TEST(e2.is_done());
  BOOST_TEST(!d0.updating_for(t).has_value());
  BOOST_TEST(!d0.updating_for(u).has_value());
  b.sync_device(d1);
  BOOST_TEST(ec->is_done());
  BOOST_TEST(!d1.updating_for(t).has_value());
  BOOST_TEST(all_equal(read_back(b, c1, t), 6.0f));
  BOOST_TEST(all_equal(host, 6.0f));
  BOOST_TEST(all_equal(read_back(b, c0, u), 6.0f));
  auto sum = b.result("upd");
  BOOST_TEST_REQUIRE(sum.has_value());
  BOOST_TEST(sum->sum == 6.0 * 256);
}

// -- merge buffer -----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_merge_buffer_grows_and_add_from_merge_sums) {
  auto b = make_backend(3);
  auto d0 = b.get_device(0), d1 = b.get_device(1), d2 = b.get_device(2);
  tnode small = node(1, "small", 100), big = node(2, "big", 1000);
  tnode acc_small = node(3, "acc_small", 100), acc_big = node(4, "acc_big", 1000);
  auto c0 = b.make_context(d0);
  for (auto& t : {small, big, acc_small, acc_big})
    c0 = b.alloc_node(c0, t);
  auto c1 = b.alloc_node(b.alloc_node(b.make_context(d1), small), big);
  auto c2 = b.alloc_node(b.alloc_node(b.make_context(d2), small), big);
  BOOST_TEST(d0.merge_buffer_capacity() == 0u);
  BOOST_TEST(!d0.merge_buffer().has_value());
  BOOST_TEST(!d0.updating_for_merge_buffer().has_value());
  auto next = d0.next_pool_id();

  b.run(b.link(c0, "iota", {acc_small, 0.0}));
  b.run(b.link(c0, "iota", {acc_big, 0.0}));
  b.run(b.link(c1, "fill", {small, 10.0}));
  b.run(b.link(c1, "iota", {big, 1.0}));
  b.run(b.link(c2, "fill", {small, 100.0}));
  b.run(b.link(c2, "fill", {big, 0.5}));

  // small from device 1
  auto m1 = b.device_to_device(small, merge_buffer_use::copy, c0, c1);
  BOOST_TEST_REQUIRE(m1.has_value());
  BOOST_TEST(d0.merge_buffer_capacity() == small.size_in_bytes);
  BOOST_TEST(d0.merge_buffer().has_value());
  BOOST_TEST_REQUIRE(m1->context.merge_buffer_node.has_value());
  BOOST_TEST((*m1->context.merge_buffer_node == small));
  BOOST_TEST((m1->context.device == d0));
  auto held = d0.updating_for_merge_buffer();
  BOOST_TEST_REQUIRE(held.has_value());
  BOOST_TEST((held->first == small));
  BOOST_TEST(held->second.device_name() == d0.name());
  b.run(b.link(m1->context, "add_from_merge", {acc_small, small}));

  // big from device 1: grows
  auto m2 = b.device_to_device(big, merge_buffer_use::copy, c0, c1);
  BOOST_TEST_REQUIRE(m2.has_value());
  BOOST_TEST(d0.merge_buffer_capacity() == big.size_in_bytes);
  BOOST_TEST((*m2->context.merge_buffer_node == big));
  BOOST_TEST((d0.updating_for_merge_buffer()->first == big));
  b.run(b.link(m2->context, "add_from_merge", {acc_big, big}));

  // small from device 2: never shrinks
  auto m3 = b.device_to_device(small, merge_buffer_use::copy, c0, c2);
  BOOST_TEST_REQUIRE(m3.has_value());
  BOOST_TEST(d0.merge_buffer_capacity() == big.size_in_bytes);
  BOOST_TEST((d0.updating_for_merge_buffer()->first == small));
  b.run(b.link(m3->context, "add_from_merge", {acc_small, small}));

  // big from device 2
  auto m4 = b.device_to_device(big, merge_buffer_use::copy, c0, c2);
  BOOST_TEST_REQUIRE(m4.has_value());
  b.run(b.link(m4->context, "add_from_merge", {acc_big, big}));
  BOOST_TEST(d0.merge_buffer_capacity() == big.size_in_bytes);
  BOOST_TEST(d0.next_pool_id() == next); // pool 0 is not a node pool

  auto gs = read_back(b, c0, acc_small);
  auto gb = read_back(b, c0, acc_big);
  for (std::size_t i = 0; i < gs.size(); ++i)
    BOOST_TEST(gs[i] == static_cast<float>(i) + 110.0f, "acc_small[" << i << "]");
  for (std::size_t i = 0; i < gb.size(); ++i)
    BOOST_TEST(gb[i] == static_cast<float>(i) + (1.0f + static_cast<float>(i)) + 0.5f,
               "acc_big[" << i << "]");
  BOOST_TEST(d0.updating_for_merge_buffer()->second.is_done());
  // Merging into the merge buffer leaves device 0's own `small` and `big` alone.
  BOOST_TEST(!d0.updating_for(small).has_value());
  BOOST_TEST(!d0.updating_for(big).has_value());
}

BOOST_AUTO_TEST_CASE(test_merge_consumer_with_wrong_node_is_refused) {
  auto b = make_backend(2);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  tnode g = node(1, "g", 64), h = node(2, "h", 64);
  auto c0 = b.alloc_node(b.alloc_node(b.make_context(d0), g), h);
  auto c1 = b.alloc_node(b.alloc_node(b.make_context(d1), g), h);
  b.run(b.link(c0, "fill", {g, 1.0}));
  b.run(b.link(c1, "fill", {g, 2.0}));
  b.run(b.link(c1, "fill", {h, 40.0}));

  // A context without a merge node, or with another one: refused at link.
  try {
    b.link(c0, "add_from_merge", {g, g});
    BOOST_ERROR("link without a merge node did not throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("'g'") != std::string::npos, e.what());
  }
  auto mg = b.device_to_device(g, merge_buffer_use::copy, c0, c1);
  BOOST_TEST_REQUIRE(mg.has_value());
  try {
    b.link(mg->context, "add_from_merge", {g, h});
    BOOST_ERROR("link against the wrong merge node did not throw");
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    BOOST_TEST(msg.find("'h'") != std::string::npos, msg);
    BOOST_TEST(msg.find("'g'") != std::string::npos, msg);
  }

  // Linked correctly, but the merge buffer then receives `h`: run refuses.
  auto consumer = b.link(mg->context, "add_from_merge", {g, g});
  auto mh = b.device_to_device(h, merge_buffer_use::copy, c0, c1);
  BOOST_TEST_REQUIRE(mh.has_value());
  auto before = scheduled_count(b, d0);
  try {
    b.run(consumer);
    BOOST_ERROR("run with another node in the merge buffer did not throw");
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    BOOST_TEST(msg.find("'g'") != std::string::npos, msg);
    BOOST_TEST(msg.find("'h'") != std::string::npos, msg);
  }
  BOOST_TEST(scheduled_count(b, d0) == before);
  // The right consumer still works and the device is fine.
  b.run(b.link(mh->context, "add_from_merge", {g, h}));
  BOOST_TEST(all_equal(read_back(b, c0, g), 41.0f));
}

// -- bad input --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_transfers_absent_node_returns_false_or_nullopt) {
  auto b = make_backend(2);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  tnode t = node(1, "t", 16), missing = node(99, "missing", 16);
  auto c0 = b.alloc_node(b.make_context(d0), t);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  std::vector<float> host(16, 3.0f);
  auto before = scheduled_count(b, d0);
  BOOST_TEST(!b.from_host(c0, missing, cbytes(host)));
  BOOST_TEST(!b.to_host(c0, missing, wbytes(host)));
  BOOST_TEST(!b.device_to_device(missing, merge_buffer_use::no, c1, c0).has_value());
  BOOST_TEST(!b.device_to_device(missing, merge_buffer_use::copy, c1, c0).has_value());
  // Present on the source only, plain copy: the destination lacks it.
  auto only0 = b.alloc_node(c0, missing);
  BOOST_TEST(!b.device_to_device(missing, merge_buffer_use::no, c1, only0).has_value());
  BOOST_TEST(!b.device_to_device(t, merge_buffer_use::no, c1, b.make_context(d0)).has_value());
  BOOST_CHECK_THROW(b.init_from_device(missing, c1, c0), std::invalid_argument);
  BOOST_TEST(scheduled_count(b, d0) == before);
  BOOST_TEST(!d1.merge_buffer().has_value());
  // Still usable.
  BOOST_TEST(b.from_host(c0, t, cbytes(host)));
  BOOST_TEST(all_equal(read_back(b, c0, t), 3.0f));
}

BOOST_AUTO_TEST_CASE(test_transfers_size_mismatch_throws_and_copies_nothing) {
  auto b = make_backend(1);
  auto d0 = b.get_device(0);
  tnode t = node(1, "t", 32);
  std::vector<float> orig(32);
  for (std::size_t i = 0; i < orig.size(); ++i)
    orig[i] = static_cast<float>(i) + 0.25f;
  auto c0 = b.init_from_host(b.make_context(d0), t, cbytes(orig));
  sync(b, b.all_work(d0));
  auto next = d0.next_pool_id();
  auto sched = scheduled_count(b, d0);

  std::vector<float> longer(33, 9.0f), shorter(31, 9.0f);
  for (auto* v : {&longer, &shorter}) {
    try {
      b.from_host(c0, t, cbytes(*v));
      BOOST_ERROR("from_host with " << v->size() * 4 << " bytes did not throw");
    } catch (const std::invalid_argument& e) {
      std::string msg = e.what();
      BOOST_TEST(msg.find("128") != std::string::npos, msg);
      BOOST_TEST(msg.find(std::to_string(v->size() * 4)) != std::string::npos, msg);
    }
    std::vector<float> out(v->size(), -1.0f);
    BOOST_CHECK_THROW(b.to_host(c0, t, wbytes(out)), std::invalid_argument);
    BOOST_TEST(all_equal(out, -1.0f)); // nothing written to the host either
    BOOST_CHECK_THROW(b.init_from_host(b.make_context(d0), t, cbytes(*v)),
                      std::invalid_argument);
  }
  BOOST_CHECK_THROW(b.init_from_host(c0, t, std::span<const std::byte>{}),
                    std::invalid_argument);
  BOOST_TEST(d0.next_pool_id() == next); // no pool for the refused init
  BOOST_TEST(scheduled_count(b, d0) == sched);
  // Destination bytes unchanged; device still usable.
  BOOST_TEST((read_back(b, c0, t) == orig));
  b.run(b.link(c0, "scale", {t, 2.0}));
  auto got = read_back(b, c0, t);
  for (std::size_t i = 0; i < got.size(); ++i)
    BOOST_TEST(got[i] == orig[i] * 2.0f);
}

BOOST_AUTO_TEST_CASE(test_transfers_freed_pool_is_refused_by_run) {
  auto b = make_backend(2);
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  tnode t = node(1, "t", 64), keep = node(2, "keep", 64);
  auto c0 = b.alloc_node(b.alloc_node(b.make_context(d0), t), keep);
  auto c1 = b.alloc_node(b.make_context(d1), t);
  auto pool = c0.buffers.at(t).pool_id;
  auto fill = b.link(c0, "fill", {t, 4.0});
  auto copy_out = b.device_to_device(t, merge_buffer_use::no, c1, c0);
  BOOST_TEST_REQUIRE(copy_out.has_value());
  sync_all(b, 2);
  b.free_pool(d0, pool);
  auto sched = scheduled_count(b, d0);
  try {
    b.run(fill);
    BOOST_ERROR("run after free_pool did not throw");
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    BOOST_TEST(msg.find("pool " + std::to_string(pool)) != std::string::npos, msg);
  }
  // The copy routine read the freed pool: refused too.
  BOOST_CHECK_THROW(b.run(*copy_out), std::invalid_argument);
  // Transfers and links that resolve the freed pool are refused.
  std::vector<float> host(64, 1.0f);
  BOOST_CHECK_THROW(b.from_host(c0, t, cbytes(host)), std::invalid_argument);
  BOOST_CHECK_THROW(b.to_host(c0, t, wbytes(host)), std::invalid_argument);
  BOOST_CHECK_THROW(b.device_to_device(t, merge_buffer_use::no, c1, c0), std::invalid_argument);
  BOOST_CHECK_THROW(b.link(c0, "fill", {t, 1.0}), std::invalid_argument);
  BOOST_TEST(scheduled_count(b, d0) == sched);
  // The device is fine: other nodes still work.
  b.run(b.link(c0, "fill", {keep, 8.0}));
  BOOST_TEST(all_equal(read_back(b, c0, keep), 8.0f));
  BOOST_TEST(b.get_debug_info(d0).find("error")->items().at(1).as_atom() == "none");
}
