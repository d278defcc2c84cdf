// Transfers issued from several host threads at once (SPEC §5.7; the public
// header promises every `backend` member may be called from any thread):
// concurrent `from_host`, `to_host` and `device_to_device` on one node must
// behave as some serial order of the calls. A copy that does not wait for a
// writer still running, or a writer that does not wait for a copy still
// reading, shows up as a torn buffer: every write fills the whole node with
// one value, so a read that is not uniform saw two writes at once.
#define BOOST_TEST_MODULE transfer_threads
#include <boost/test/unit_test.hpp>

#include <fmt/format.h>

#include <multidev/multidev.hpp>

#include "test_support.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

using multidev::backend;
using multidev::context;
using multidev::event;
using multidev::memory_mode;
using multidev::merge_buffer_use;
using multidev::tnode;

namespace {

constexpr int num_threads = 4;
constexpr int num_devices = 3;
// 32 KiB: a copy takes long enough to overlap another, yet the rounds run
// enough calls for a race to show within a few seconds on a busy 2-core box.
constexpr std::size_t words = 8 * 1024;
constexpr int rounds = 8;
constexpr int ops_per_thread = 6000;
constexpr int host_buffers = 8; // per thread, reused once their copy is done

/// What a write fills the node with: the writer and its own counter; 0 is
/// the initial contents.
uint32_t encode(int thread, uint32_t counter) {
  return (static_cast<uint32_t>(thread + 1) << 24) | counter;
}
int writer_of(uint32_t v) { return static_cast<int>(v >> 24) - 1; }
uint32_t counter_of(uint32_t v) { return v & 0xffffff; }

std::span<const std::byte> cbytes(const std::vector<uint32_t>& v) {
  return std::as_bytes(std::span{v});
}
std::span<std::byte> wbytes(std::vector<uint32_t>& v) {
  return std::as_writable_bytes(std::span{v});
}

/// The state the threads of one round share.
struct round_state {
  backend& b;
  tnode t;
  std::array<context, num_devices> ctx;
  /// Highest counter each thread has issued (its values are 1..issued).
  std::array<std::atomic<uint32_t>, num_threads> issued{};
  /// Copies into each device started / returned: a thread whose write and
  /// later read of a device saw none start in between knows nobody else
  /// copied an older value over its write.
  std::array<std::atomic<uint64_t>, num_devices> copies_started{}, copies_done{};
  std::mutex mu;
  std::vector<std::string> errors; // the first few
  std::atomic<int> violations{0};

  void fail(std::string msg) {
    ++violations;
    std::lock_guard g{mu};
    if (errors.size() < 10)
      errors.push_back(std::move(msg));
  }
};

/// The value `buf` holds throughout, or nullopt when it is torn.
std::optional<uint32_t> uniform(const std::vector<uint32_t>& buf) {
  auto v = buf.front();
  if (std::any_of(buf.begin(), buf.end(), [v](uint32_t x) { return x != v; }))
    return std::nullopt;
  return v;
}

/// Whether `v` was written by some call (or is the initial contents).
bool produced(round_state& s, uint32_t v) {
  if (v == 0)
    return true;
  int w = writer_of(v);
  return w >= 0 && w < num_threads && counter_of(v) >= 1
         && counter_of(v) <= s.issued[static_cast<std::size_t>(w)].load();
}

void worker(round_state& s, int self, uint32_t seed) {
  auto& b = s.b;
  std::mt19937 rng{seed};
  std::vector<std::vector<uint32_t>> in(host_buffers, std::vector<uint32_t>(words));
  std::vector<event> in_done(host_buffers);
  std::vector<uint32_t> out(words);
  uint32_t counter = 0;
  // This thread's last write to each device. `quiet`: no copy into the
  // device was in flight when it was issued. If none has started by the time
  // a later read returns either, the read sees this write or another
  // thread's from_host, never this thread's own older value (which only a
  // copy could bring back).
  struct last_write {
    uint32_t value = 0;
    uint64_t copies_started = 0;
    bool quiet = false;
  };
  std::array<std::optional<last_write>, num_devices> mine;
  for (int i = 0; i < ops_per_thread; ++i) {
    auto x = static_cast<std::size_t>(rng() % num_devices);
    auto op = rng() % 10;
    if (op < 5) { // from_host
      auto slot = static_cast<std::size_t>(counter % host_buffers);
      b.sync(in_done[slot]); // the buffer's previous copy has been made
      uint32_t v = encode(self, ++counter);
      s.issued[static_cast<std::size_t>(self)].store(counter);
      std::fill(in[slot].begin(), in[slot].end(), v);
      auto done = s.copies_done[x].load();
      auto started = s.copies_started[x].load();
      if (!b.from_host(s.ctx[x], s.t, cbytes(in[slot])))
        s.fail("from_host: node not in context");
      in_done[slot] = b.all_work(s.ctx[x].device);
      mine[x] = last_write{v, started, done == started};
    } else {
      if (op >= 6) { // device_to_device into x, then read x
        auto y = (x + 1 + rng() % (num_devices - 1)) % num_devices;
        s.copies_started[x].fetch_add(1);
        if (!b.device_to_device(s.t, merge_buffer_use::no, s.ctx[x], s.ctx[y]))
          s.fail("device_to_device: node not in a context");
        s.copies_done[x].fetch_add(1);
      }
      // to_host, checked once the device is done: a torn copy into x is
      // seen unless a write overtook it
      std::fill(out.begin(), out.end(), 0xdeadbeefu);
      if (!b.to_host(s.ctx[x], s.t, wbytes(out)))
        s.fail("to_host: node not in context");
      auto started = s.copies_started[x].load();
      b.sync(b.all_work(s.ctx[x].device));
      auto v = uniform(out);
      if (!v) {
        auto bad = std::find_if(out.begin(), out.end(),
                                [&](uint32_t w) { return w != out.front(); });
        s.fail(fmt::format("thread {} op {}: torn read of device {}: word 0 is {:#x}, "
                           "word {} is {:#x}",
                           self, i, x, out.front(), bad - out.begin(), *bad));
      } else if (!produced(s, *v)) {
        s.fail(fmt::format("thread {} op {}: device {} holds {:#x}, which nobody wrote",
                           self, i, x, *v));
      } else if (auto& w = mine[x]; w && w->quiet && started == w->copies_started
                 && writer_of(*v) == self && *v != w->value) {
        s.fail(fmt::format("thread {} op {}: wrote {:#x} to device {} then read back "
                           "its own older {:#x}",
                           self, i, w->value, x, *v));
      }
    }
  }
  for (auto& e : in_done)
    b.sync(e);
}

/// One round on a fresh backend; returns how many checks failed, reporting
/// the first few.
int run_round(int round) {
  backend b{multidev::backend_options{.num_devices = num_devices, .scheduler_threads = 2}};
  round_state s{b, tnode{1, "x", words * sizeof(uint32_t), memory_mode::on_device}, {}};
  test_support::watchdog dog{fmt::format("transfer threads round {}", round)};
  std::vector<uint32_t> zeros(words, 0);
  for (std::size_t d = 0; d < num_devices; ++d)
    s.ctx[d] = b.init_from_host(b.make_context(b.get_device(static_cast<int>(d))), s.t,
                                cbytes(zeros));
  for (const auto& c : s.ctx)
    b.await(c.device); // `zeros` has been read
  std::vector<std::thread> ts;
  for (int i = 0; i < num_threads; ++i)
    ts.emplace_back([&s, i, round] {
      try {
        worker(s, i, static_cast<uint32_t>(round * 100 + i));
      } catch (const std::exception& e) {
        s.fail(fmt::format("thread {}: {}", i, e.what()));
      }
    });
  for (auto& t : ts)
    t.join();
  // What is left on each device is whole and was written by someone.
  for (std::size_t d = 0; d < num_devices; ++d) {
    std::vector<uint32_t> out(words);
    b.to_host(s.ctx[d], s.t, wbytes(out));
    b.sync(b.all_work(s.ctx[d].device));
    auto v = uniform(out);
    if (!v || !produced(s, *v))
      s.fail(fmt::format("device {} ends torn or with a value nobody wrote", d));
  }
  for (const auto& e : s.errors)
    BOOST_ERROR("round " << round << ": " << e);
  return s.violations.load();
}

} // namespace

BOOST_AUTO_TEST_CASE(test_transfer_threads_concurrent_copies_of_one_node_are_serializable) {
  int failed_rounds = 0, violations = 0;
  for (int r = 0; r < rounds; ++r) {
    int v = run_round(r);
    violations += v;
    failed_rounds += v > 0;
  }
  BOOST_TEST_MESSAGE(violations << " violations in " << failed_rounds << " of " << rounds
                                << " rounds");
  BOOST_TEST(violations == 0);
}
