// The runner trace (issue 7 item 6): off by default; when on, every item a
// runner handles is recorded with its seq, kind, description and times, gates
// with the event they awaited, in a ring of fixed size whose overwritten
// records are counted; a reader copies it while the runner goes on; a
// nameless task is called task#<seq> in the trace and in error messages.
// White-box where a test needs the core (when_done) or the ring itself.
// Issue 39 point 3: the public writers of a backend's Chrome trace and SVG
// timeline, host threads' waits in the trace, and MULTIDEV_TRACE.
#define BOOST_TEST_MODULE trace
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>
#include <nlohmann/json.hpp>

#include "actors/core/device_core.hpp"
#include "actors/core/trace.hpp"
#include "test_support.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <sstream>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace multidev {
// For Boost.Test's messages.
std::ostream& operator<<(std::ostream& os, trace_kind k) {
  return os << to_string(k);
}
} // namespace multidev

using multidev::backend;
using multidev::backend_options;
using multidev::device;
using multidev::device_error;
using multidev::device_trace;
using multidev::task;
using multidev::trace_kind;
using multidev::trace_record;
using test_support::block_runner;
using test_support::contains;
using test_support::field_of;
using test_support::sync;

namespace {

backend_options traced(std::size_t capacity, int devices = 2) {
  return backend_options{.num_devices = devices, .scheduler_threads = 2,
                         .trace_capacity = capacity};
}

/// Checks what holds for every copy of a trace in which each item is
/// recorded once: consecutive seqs, times in order, `dropped` = the records
/// before the first one.
void check_well_formed(const device_trace& t) {
  BOOST_TEST(t.records.size() <= t.capacity);
  if (t.records.empty())
    return;
  BOOST_TEST(t.dropped == t.records.front().seq - 1);
  for (std::size_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    BOOST_TEST(r.start_ns <= r.end_ns, "seq " << r.seq);
    if (i > 0) {
      BOOST_TEST(r.seq == t.records[i - 1].seq + 1);
      BOOST_TEST(r.start_ns >= t.records[i - 1].end_ns, "seq " << r.seq);
    }
  }
}

std::string joined(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs)
    out += (out.empty() ? "" : ", ") + x;
  return out;
}

const trace_record& at_seq(const device_trace& t, uint64_t seq) {
  for (const auto& r : t.records)
    if (r.seq == seq)
      return r;
  BOOST_FAIL("no record of seq " << seq << " in the trace of " << t.device);
  throw std::logic_error("unreachable");
}

} // namespace

BOOST_AUTO_TEST_CASE(test_trace_records_every_kind_with_seq_times_and_awaited_event) {
  backend b{traced(64)};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto t = test_support::node(1, "x", 16);
  std::vector<float> host(16, 2.0f);
  // d0 is held, so that d1's waits are real gates.
  auto release = block_runner(b, d0);                        // d0 seq 1
  b.alloc_pool(d0, 100, 64, 64);                             // not an item
  b.memset_zero(d0, 100, 0, 64);                             // d0 seq 2
  b.schedule_task(d0, task{"described", [] {}, {}});         // d0 seq 3
  auto e3 = b.all_work(d0);
  b.schedule_task(d0, task{{}, [] {}, {}});                  // d0 seq 4
  b.free_pool(d0, 100);                                      // d0 seq 5
  auto c0 = b.alloc_node(b.make_context(d0), t);
  b.from_host(c0, t, std::as_bytes(std::span{host}));        // d0 seq 6
  auto c1 = b.alloc_node(b.make_context(d1), t);
  b.will_wait_for(c1, e3);                                   // d1 seq 1
  b.device_to_device(t, multidev::merge_buffer_use::no, c1, c0); // d1 seq 2 (gate), 3
  BOOST_TEST(b.trace(d0).records.size() == 0u); // nothing finished yet
  release->open();
  sync(b, b.all_work(d1));
  sync(b, b.all_work(d0));

  auto t0 = b.trace(d0);
  BOOST_TEST(t0.device == d0.name());
  BOOST_TEST(t0.capacity == 64u);
  BOOST_TEST(t0.dropped == 0u);
  BOOST_TEST_REQUIRE(t0.records.size() == 6u);
  check_well_formed(t0);
  const std::vector<std::pair<trace_kind, std::string>> want0 = {
    {trace_kind::task, "blocker"},
    {trace_kind::memset, "memset_zero pool 100 [0, 64)"},
    {trace_kind::task, "described"},
    {trace_kind::task, "task#4"},
    {trace_kind::pool, "free_pool 100"},
    {trace_kind::copy, "from_host 'x' (#1)"},
  };
  for (std::size_t i = 0; i < want0.size(); ++i) {
    const auto& r = t0.records[i];
    BOOST_TEST(r.seq == i + 1);
    BOOST_TEST(r.kind == want0[i].first, "seq " << r.seq << ": " << to_string(r.kind));
    BOOST_TEST(r.description == want0[i].second);
    BOOST_TEST(!r.failed);
    BOOST_TEST(r.awaited_device.empty());
  }

  auto t1 = b.trace(d1);
  BOOST_TEST_REQUIRE(t1.records.size() == 3u);
  check_well_formed(t1);
  const auto& wait = t1.records[0];
  BOOST_TEST(wait.kind == trace_kind::gate);
  BOOST_TEST(wait.awaited_device == d0.name());
  BOOST_TEST(wait.awaited_seq == 3u);
  BOOST_TEST(contains(wait.description, "wait for " + d0.name() + " seq 3"));
  const auto& copy_wait = t1.records[1];
  BOOST_TEST(copy_wait.kind == trace_kind::gate);
  BOOST_TEST(copy_wait.awaited_device == d0.name());
  BOOST_TEST(copy_wait.awaited_seq == 6u); // the from_host that wrote x
  BOOST_TEST(t1.records[2].kind == trace_kind::copy);
  BOOST_TEST(contains(t1.records[2].description, "device_to_device 'x' (#1)"));
  // The gate on d1 opened only after d0's seq 3 was done, so d1 waited at
  // least as long as d0 took to get there from when d1 reached the gate.
  BOOST_TEST(wait.end_ns >= at_seq(t0, 3).start_ns);
}

BOOST_AUTO_TEST_CASE(test_trace_record_is_there_once_its_event_is_done_and_times_it) {
  // A record is written before its event is done, so a host that synced on
  // the event finds it, with times inside what the host saw.
  backend b{traced(16, 1)};
  auto d = b.get_device(0);
  for (int round = 0; round < 50; ++round) {
    auto before = multidev::trace_clock_ns();
    b.schedule_task(d, task{{}, [] {}, {}});
    sync(b, b.all_work(d));
    auto after = multidev::trace_clock_ns();
    auto t = b.trace(d);
    BOOST_TEST_REQUIRE(!t.records.empty());
    const auto& r = t.records.back();
    BOOST_TEST_REQUIRE(r.seq == static_cast<uint64_t>(round + 1));
    // Scheduled after `before`, the task starts after it, even when the
    // runner's previous item ended long before.
    BOOST_TEST(before <= r.start_ns);
    BOOST_TEST(r.end_ns <= after);
  }
}

BOOST_AUTO_TEST_CASE(test_trace_record_is_written_before_its_event_resolves) {
  // Waiters run on the runner as the event resolves: each must find the
  // item's record already there, done or failed.
  backend b{traced(16, 1)};
  auto d = b.get_device(0);
  auto core = d.get_runner().core();
  auto release = block_runner(b, d); // seq 1
  b.schedule_task(d, task{"ok", [] {}, {}});                                  // seq 2
  b.schedule_task(d, task{"bad", [] { throw std::runtime_error("no"); }, {}}); // seq 3
  auto seen = std::make_shared<std::vector<std::string>>();
  // The runner stores an event's outcome before it runs the event's waiters,
  // so `await` may return while the last one still runs: `seen` is read
  // once both have counted down.
  auto looked = std::make_shared<std::latch>(2);
  auto look = [core, seen, looked](uint64_t seq) {
    return [core, seen, looked, seq](const std::string* error) {
      for (const auto& r : core->inspect().trace().records)
        if (r.seq == seq)
          seen->push_back(r.description + (r.failed ? " failed" : "") +
                          (error ? " (event failed)" : ""));
      looked->count_down();
    };
  };
  core->events().when_done(2, look(2));
  core->events().when_done(3, look(3));
  release->open();
  BOOST_CHECK_THROW(test_support::bounded([&] { b.await(d); }), device_error);
  test_support::bounded([&] { looked->wait(); }, "the waiters");
  BOOST_TEST(*seen == (std::vector<std::string>{"ok", "bad failed (event failed)"}),
             joined(*seen));
}

BOOST_AUTO_TEST_CASE(test_trace_is_off_by_default) {
  backend b{backend_options{.num_devices = 1, .scheduler_threads = 2}};
  auto d = b.get_device(0);
  b.schedule_task(d, task{"work", [] {}, {}});
  sync(b, b.all_work(d));
  auto t = b.trace(d);
  BOOST_TEST(t.capacity == 0u);
  BOOST_TEST(t.records.empty());
  BOOST_TEST(t.dropped == 0u);
  BOOST_TEST(t.device == d.name());
  BOOST_TEST(b.get_debug_info(d).find("trace") == nullptr);
}

BOOST_AUTO_TEST_CASE(test_trace_ring_keeps_the_last_items_and_counts_dropped) {
  backend b{traced(8, 1)};
  auto d = b.get_device(0);
  for (int i = 0; i < 20; ++i)
    b.schedule_task(d, task{i % 2 ? "odd" : "", [] {}, {}});
  sync(b, b.all_work(d));
  auto t = b.trace(d);
  BOOST_TEST(t.capacity == 8u);
  BOOST_TEST(t.dropped == 12u);
  BOOST_TEST_REQUIRE(t.records.size() == 8u);
  check_well_formed(t);
  BOOST_TEST(t.records.front().seq == 13u);
  BOOST_TEST(t.records.back().seq == 20u);
  BOOST_TEST(t.records.front().description == "task#13");
  BOOST_TEST(t.records.back().description == "odd");

  // Debug info shows the last items and the counts.
  auto info = b.get_debug_info(d);
  auto* trace = info.find("trace");
  BOOST_TEST_REQUIRE(trace != nullptr);
  BOOST_TEST(field_of(*trace, "capacity") == "8");
  BOOST_TEST(field_of(*trace, "recorded") == "20");
  BOOST_TEST(field_of(*trace, "dropped") == "12");
  auto* last = trace->find("last");
  BOOST_TEST_REQUIRE(last != nullptr);
  BOOST_TEST(last->items().size() == 9u); // the atom and 8 items
  BOOST_TEST(contains(last->items().back().to_string(), "(seq 20)"));
}

BOOST_AUTO_TEST_CASE(test_trace_is_read_while_the_runner_runs) {
  constexpr int items = 30'000;
  constexpr int reads_before_start = 3;
  constexpr std::size_t capacity = 16; // small, so the runner laps readers
  backend b{traced(capacity, 1)};
  auto d = b.get_device(0);
  // Descriptions of every length, so that slots' strings are rewritten (and
  // reallocated) while they are copied.
  auto describe = [](uint64_t seq) -> std::string {
    if (seq == 1)
      return "start";
    if (seq % 3 == 0)
      return "task#" + std::to_string(seq);
    return "item " + std::to_string(seq) + std::string(seq % 41, 'x');
  };
  std::atomic<int> reads{0};
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::atomic<int> wrapped_reads{0};
  std::thread reader([&] {
    uint64_t newest = 0;
    while (!done.load()) {
      auto t = b.trace(d);
      bool ok = t.records.size() <= t.capacity;
      if (!t.records.empty()) {
        ok = ok && t.dropped == t.records.front().seq - 1;
        ok = ok && t.records.back().seq >= newest; // never goes back
        newest = t.records.back().seq;
        if (t.dropped > 0)
          wrapped_reads.fetch_add(1);
      }
      for (std::size_t i = 0; i < t.records.size(); ++i) {
        const auto& r = t.records[i];
        // The last record is "stop": the reader may copy it after the stop
        // task ran and before it sees `done`.
        auto expected = r.seq == items + 1 ? std::string{"stop"} : describe(r.seq);
        ok = ok && r.description == expected && r.start_ns <= r.end_ns;
        if (i > 0)
          ok = ok && r.seq == t.records[i - 1].seq + 1;
      }
      if (!ok)
        bad.fetch_add(1);
      reads.fetch_add(1);
    }
  });
  // The first task holds the runner until the reader is reading; the last
  // one stops it, so every read above overlaps the runner's work.
  b.schedule_task(d, task{"start", [&reads] {
                            if (!test_support::eventually(
                                  [&] { return reads.load() >= reads_before_start; }))
                              throw std::runtime_error("the reader never read");
                          },
                          {}});
  for (uint64_t seq = 2; seq <= items; ++seq) {
    auto text = describe(seq);
    b.schedule_task(d, task{seq % 3 == 0 ? std::string{} : text, [] {}, {}});
  }
  b.schedule_task(d, task{"stop", [&done] { done.store(true); }, {}});
  sync(b, b.all_work(d));
  reader.join();
  BOOST_TEST(bad.load() == 0);
  BOOST_TEST(reads.load() > reads_before_start);
  BOOST_TEST_MESSAGE("reads: " << reads.load() << ", of a wrapped ring: " << wrapped_reads.load());
  auto t = b.trace(d);
  check_well_formed(t);
  BOOST_TEST(t.records.back().description == "stop");
  BOOST_TEST(t.dropped == items + 1u - capacity);
}

BOOST_AUTO_TEST_CASE(test_trace_ring_is_copied_while_written) {
  // The ring alone, at full speed: every copy is a contiguous run of whole
  // records (run it under the sanitize preset, or TSan, for the races).
  multidev::detail::trace_ring ring{16};
  auto describe = [](uint64_t seq) {
    return "item " + std::to_string(seq) + std::string(seq % 41, 'x');
  };
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  int bad = 0;
  std::thread reader([&] {
    while (!done.load()) {
      auto t = ring.read();
      bool ok = t.records.empty() || t.dropped == t.records.front().seq - 1;
      for (std::size_t i = 0; i < t.records.size(); ++i) {
        const auto& r = t.records[i];
        ok = ok && r.description == describe(r.seq) && r.start_ns == 2 * int64_t(r.seq);
        if (i > 0)
          ok = ok && r.seq == t.records[i - 1].seq + 1;
      }
      bad += !ok;
      reads.fetch_add(1);
    }
  });
  // At least 200,000 records, and on until the reader has read 100 times.
  for (uint64_t seq = 1; seq <= 200'000 || (reads.load() < 100 && seq < 100'000'000); ++seq) {
    auto d = describe(seq);
    ring.write({seq, trace_kind::task, 2 * int64_t(seq), 2 * int64_t(seq) + 1, false, 0}, d,
               {});
  }
  done.store(true);
  reader.join();
  BOOST_TEST(bad == 0);
  BOOST_TEST(reads.load() >= 100);
  BOOST_TEST(ring.written() >= 200'000u);
}

BOOST_AUTO_TEST_CASE(test_trace_names_a_nameless_task_by_its_seq) {
  for (std::size_t capacity : {std::size_t{0}, std::size_t{16}}) {
    backend b{traced(capacity, 1)};
    auto d = b.get_device(0);
    b.schedule_task(d, task{"first", [] {}, {}});
    b.schedule_task(d, task{{}, [] {}, {}});
    b.schedule_task(d, task{{}, [] { throw std::runtime_error("boom"); }, {}});
    auto failed = b.all_work(d);
    std::string message;
    try {
      test_support::bounded([&] { b.sync(failed); });
    } catch (const device_error& e) {
      message = e.what();
    }
    BOOST_TEST(contains(message, "task task#3 failed: boom"), message);
    BOOST_TEST(!contains(message, "no description"), message);
    if (capacity == 0)
      continue;
    auto t = b.trace(d);
    BOOST_TEST_REQUIRE(t.records.size() == 3u);
    BOOST_TEST(t.records[1].description == "task#2");
    BOOST_TEST(!t.records[1].failed);
    BOOST_TEST(t.records[2].description == "task#3");
    BOOST_TEST(t.records[2].failed);
  }
}

BOOST_AUTO_TEST_CASE(test_trace_records_a_failed_wait) {
  backend b{traced(16)};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  auto release = block_runner(b, d0);                                        // d0 seq 1
  b.schedule_task(d0, task{"fails", [] { throw std::runtime_error("no"); }, {}}); // seq 2
  b.will_wait_for(b.make_context(d1), b.all_work(d0));                        // d1 seq 1
  release->open();
  BOOST_CHECK_THROW(test_support::bounded([&] { b.await(d1); }), device_error);
  auto t = b.trace(d1);
  BOOST_TEST_REQUIRE(t.records.size() == 1u);
  BOOST_TEST(t.records[0].kind == trace_kind::gate);
  BOOST_TEST(t.records[0].failed);
  BOOST_TEST(t.records[0].awaited_seq == 2u);
  BOOST_TEST(b.trace(d0).records.back().failed);
}

BOOST_AUTO_TEST_CASE(test_trace_records_cancelled_items_as_not_run) {
  backend b{traced(16, 1)};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);                  // seq 1
  b.schedule_task(d, task{"queued 2", [] {}, {}});    // seq 2
  b.schedule_task(d, task{{}, [] {}, {}});                // seq 3, nameless
  b.cancel(d);
  release->open();
  b.schedule_task(d, task{"after", [] {}, {}});       // seq 4
  sync(b, b.all_work(d));
  auto t = b.trace(d);
  BOOST_TEST_REQUIRE(t.records.size() == 4u);
  check_well_formed(t);
  for (int i : {1, 2}) {
    BOOST_TEST(t.records[i].kind == trace_kind::cancel);
    BOOST_TEST(t.records[i].failed);
  }
  BOOST_TEST(t.records[1].description == "not run: queued 2");
  BOOST_TEST(t.records[2].description == "not run: task#3");
  BOOST_TEST(t.records[3].kind == trace_kind::task);
  BOOST_TEST(t.records[3].description == "after");
  BOOST_TEST(!t.records[3].failed);
}

BOOST_AUTO_TEST_CASE(test_trace_prints_records_as_sexps) {
  for (auto k : {trace_kind::task, trace_kind::copy, trace_kind::memset, trace_kind::pool,
                 trace_kind::gate, trace_kind::cancel})
    BOOST_TEST((multidev::trace_kind_from_string(to_string(k)) == k), to_string(k));
  BOOST_TEST(!multidev::trace_kind_from_string("bogus"));
  trace_record r{.seq = 4, .kind = trace_kind::gate, .description = "wait for a seq 2",
                 .start_ns = 5, .end_ns = 9, .failed = true, .awaited_device = "a",
                 .awaited_seq = 2};
  auto s = to_sexp(r);
  BOOST_TEST(s.to_string()
             == "(item (seq 4) (kind gate) (description \"wait for a seq 2\") (start_ns 5) "
                "(end_ns 9) (failed true) (awaits (device a) (seq 2)))");
  BOOST_TEST((multidev::parse_sexp(s.to_string()) == s));
  device_trace t{.device = "dev", .capacity = 2, .records = {r}, .dropped = 1};
  BOOST_TEST(contains(to_sexp(t).to_string(), "(trace (device dev) (capacity 2) (dropped 1)"));
}

BOOST_AUTO_TEST_CASE(test_trace_clock_runs_at_steady_clock_rate) {
  using std::chrono::steady_clock;
  auto s0 = steady_clock::now();
  auto t0 = multidev::trace_clock_ns();
  while (steady_clock::now() - s0 < std::chrono::milliseconds(20))
    std::this_thread::yield();
  auto t1 = multidev::trace_clock_ns();
  auto s1 = steady_clock::now();
  auto steady = std::chrono::duration_cast<std::chrono::nanoseconds>(s1 - s0).count();
  // Within 0.1 %, give or take a preemption between the reads.
  BOOST_TEST(t1 - t0 <= steady);
  BOOST_TEST(t1 - t0 >= steady - steady / 1000 - 200'000);
}

BOOST_AUTO_TEST_CASE(test_trace_clock_never_goes_back_between_threads) {
  // A time read after seeing another thread's time is not earlier: what
  // lets a host time its own events beside a runner's records.
  constexpr int hops = 20'000;
  std::atomic<int64_t> last{0};
  std::atomic<int> turn{0};
  std::atomic<int> backwards{0};
  auto player = [&](int me) {
    for (int i = me; i < hops; i += 2) {
      while (turn.load(std::memory_order_acquire) != i)
        std::this_thread::yield();
      auto now = multidev::trace_clock_ns();
      if (now < last.load(std::memory_order_relaxed))
        backwards.fetch_add(1);
      last.store(now, std::memory_order_relaxed);
      turn.store(i + 1, std::memory_order_release);
    }
  };
  std::thread other(player, 1);
  player(0);
  other.join();
  BOOST_TEST(backwards.load() == 0);
}

// -- Timelines and trace files (issue 39 point 3) ------------------------------

namespace {

/// The Chrome trace `text` as tracks: each complete slice's name with its
/// track's name, and the flows as (from track, to track).
struct chrome_tracks {
  std::multimap<std::string, std::string> track_of_slice;
  std::vector<std::pair<std::string, std::string>> flows;
};

chrome_tracks read_chrome_trace(const std::string& text) {
  auto doc = nlohmann::json::parse(text);
  std::map<int, std::string> thread;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      thread[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
  chrome_tracks out;
  std::map<uint64_t, std::string> flow_from;
  for (const auto& e : doc.at("traceEvents")) {
    auto ph = e.at("ph").get<std::string>();
    if (ph == "X")
      out.track_of_slice.emplace(e.at("name").get<std::string>(), thread[e.at("tid").get<int>()]);
    else if (ph == "s")
      flow_from[e.at("id").get<uint64_t>()] = thread[e.at("tid").get<int>()];
    else if (ph == "f")
      out.flows.emplace_back(flow_from[e.at("id").get<uint64_t>()], thread[e.at("tid").get<int>()]);
  }
  return out;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f{p};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A producer on device 0 and a consumer on device 1 that waits for it.
void produce_consume(backend& b) {
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  b.schedule_task(d0, task{"produce", [] {}, {}});
  b.will_wait_for(b.make_context(d1), b.all_work(d0));
  b.schedule_task(d1, task{"consume", [] {}, {}});
  sync(b, b.all_work(d1));
}

/// Opens `release` once a host thread is blocked in `what` (the wait
/// graph lists it), on a thread of its own; bounded.
std::thread open_once_blocked(const backend& b, std::shared_ptr<test_support::latch_gate> release,
                              std::string what) {
  return std::thread{[&b, release, what] {
    test_support::eventually([&] {
      return contains(b.get_global_debug_info().to_string(), "(waiter host) (kind " + what + ")");
    });
    release->open();
  }};
}

} // namespace

BOOST_AUTO_TEST_CASE(test_trace_write_chrome_trace_has_a_track_per_device_and_the_wait) {
  backend b{traced(64)};
  produce_consume(b);
  auto name0 = b.get_device(0).name(), name1 = b.get_device(1).name();
  std::ostringstream os;
  multidev::write_chrome_trace(b, os);
  auto tracks = read_chrome_trace(os.str());
  BOOST_TEST_REQUIRE(tracks.track_of_slice.count("produce") == 1u, os.str());
  BOOST_TEST_REQUIRE(tracks.track_of_slice.count("consume") == 1u, os.str());
  BOOST_TEST(tracks.track_of_slice.find("produce")->second == "device 0 (" + name0 + ")");
  BOOST_TEST(tracks.track_of_slice.find("consume")->second == "device 1 (" + name1 + ")");
  // The wait of device 1 for device 0: an arrow between their tracks.
  auto arrow = std::pair{"device 0 (" + name0 + ")", "device 1 (" + name1 + ")"};
  BOOST_TEST(std::count(tracks.flows.begin(), tracks.flows.end(), arrow) == 1);
  // To a file: the same trace.
  auto path = std::filesystem::temp_directory_path()
              / ("multidev-trace-" + std::to_string(getpid()) + ".json");
  multidev::write_chrome_trace(b, path.string());
  auto from_file = read_chrome_trace(read_file(path));
  std::filesystem::remove(path);
  BOOST_TEST(from_file.track_of_slice == tracks.track_of_slice);
  // The SVG: a lane per device, the slices, an arrow.
  std::ostringstream svg;
  multidev::write_timeline_svg(b, svg);
  BOOST_TEST(svg.str().starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  BOOST_TEST(contains(svg.str(), ">device 0 (" + name0 + ")<"));
  BOOST_TEST(contains(svg.str(), ">device 1 (" + name1 + ")<"));
  BOOST_TEST(contains(svg.str(), "<title>produce (task, seq 1): "));
  BOOST_TEST(contains(svg.str(), "marker-end=\"url(#arrow)\""));
  BOOST_TEST(svg.str().ends_with("</svg>\n"));
}

BOOST_AUTO_TEST_CASE(test_trace_writers_refuse_a_backend_without_tracing_and_name_a_bad_path) {
  backend off{traced(0)};
  produce_consume(off);
  std::ostringstream os;
  for (auto write : {+[](const backend& b, std::ostream& o) { multidev::write_chrome_trace(b, o); },
                     +[](const backend& b, std::ostream& o) { multidev::write_timeline_svg(b, o); }})
    try {
      write(off, os);
      BOOST_ERROR("wrote the trace of a backend without tracing");
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(contains(e.what(), "tracing is off"), e.what());
      BOOST_TEST(contains(e.what(), "trace_capacity"), e.what());
    }
  BOOST_TEST(os.str().empty());
  backend on{traced(16)};
  produce_consume(on);
  const std::string bad = "/nonexistent-multidev-dir/trace.json";
  try {
    multidev::write_chrome_trace(on, bad);
    BOOST_ERROR("wrote to " << bad);
  } catch (const std::runtime_error& e) {
    BOOST_TEST(contains(e.what(), "cannot write '" + bad + "'"), e.what());
  }
}

BOOST_AUTO_TEST_CASE(test_trace_a_host_sync_that_blocks_is_in_the_trace_and_the_timeline) {
  backend b{traced(64)};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  b.schedule_task(d, task{"held", [] {}, {}});
  auto e = b.all_work(d);
  auto before = multidev::trace_clock_ns();
  auto opener = open_once_blocked(b, release, "sync");
  sync(b, e); // blocks until the opener sees it blocked
  opener.join();
  auto after = multidev::trace_clock_ns();
  b.sync(e); // done: it does not block, and records nothing
  auto t = b.trace(d);
  BOOST_TEST_REQUIRE(t.host.size() == 1u, to_sexp(t).to_string());
  const auto& h = t.host[0];
  BOOST_TEST((h.kind == multidev::host_span_kind::wait));
  BOOST_TEST(h.seq == e.seq());
  BOOST_TEST(h.description == "sync " + d.name() + " seq " + std::to_string(e.seq()));
  BOOST_TEST(!h.failed);
  BOOST_TEST(h.thread > 0u);
  BOOST_TEST(before <= h.start_ns);
  BOOST_TEST(h.start_ns <= at_seq(t, e.seq()).end_ns); // it waited for "held" to end
  BOOST_TEST(at_seq(t, e.seq()).end_ns <= h.end_ns);
  BOOST_TEST(h.end_ns <= after);
  // On the timeline: a slice on the host thread's lane, with an arrow from "held".
  auto tl = multidev::make_timeline(b);
  std::size_t waits = 0;
  for (std::size_t i = 0; i < tl.slices.size(); ++i) {
    const auto& s = tl.slices[i];
    if (s.kind != "host")
      continue;
    ++waits;
    BOOST_TEST(tl.lanes[s.lane] == "host thread " + std::to_string(h.thread));
    BOOST_TEST(s.name == h.description);
    auto arrows = std::count_if(tl.flows.begin(), tl.flows.end(), [&](const auto& f) {
      return f.to_slice == i && tl.slices[f.from_slice].name == "held";
    });
    BOOST_TEST(arrows == 1);
  }
  BOOST_TEST(waits == 1u);
  // And in the Chrome trace.
  auto tracks = read_chrome_trace(multidev::chrome_trace_json(tl));
  BOOST_TEST(tracks.track_of_slice.count(h.description) == 1u);
}

BOOST_AUTO_TEST_CASE(test_trace_a_host_await_that_fails_is_a_failed_host_span) {
  backend b{traced(64, 1)};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  b.schedule_task(d, task{"boom", [] { throw std::runtime_error("boom"); }, {}});
  auto opener = open_once_blocked(b, release, "await");
  BOOST_CHECK_THROW(test_support::bounded([&] { b.await(d); }), device_error);
  opener.join();
  auto t = b.trace(d);
  BOOST_TEST_REQUIRE(t.host.size() == 1u, to_sexp(t).to_string());
  BOOST_TEST(t.host[0].failed);
  BOOST_TEST(contains(t.host[0].description, "await " + d.name()), t.host[0].description);
  BOOST_TEST(contains(to_sexp(t).to_string(), "(host (host_span (kind wait)"),
             to_sexp(t).to_string());
}

BOOST_AUTO_TEST_CASE(test_trace_multidev_trace_writes_a_file_per_backend_without_trace_settings) {
  auto dir = std::filesystem::temp_directory_path()
             / ("multidev-trace-env-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  BOOST_TEST_REQUIRE(setenv("MULTIDEV_TRACE", (dir / "run.json").c_str(), 1) == 0);
  {
    backend first{traced(0)};
    backend explicit_settings{traced(8)}; // its own trace settings: no file
    backend second{traced(0)};
    produce_consume(first);
    produce_consume(explicit_settings);
    produce_consume(second);
    BOOST_TEST(first.trace(first.get_device(0)).capacity == 65536u);
  }
  unsetenv("MULTIDEV_TRACE");
  for (const char* name : {"run.json", "run.1.json"}) {
    auto tracks = read_chrome_trace(read_file(dir / name));
    BOOST_TEST(tracks.track_of_slice.count("produce") == 1u, name);
    BOOST_TEST(tracks.track_of_slice.count("consume") == 1u, name);
  }
  BOOST_TEST(!std::filesystem::exists(dir / "run.2.json"));
  std::filesystem::remove_all(dir);
}
