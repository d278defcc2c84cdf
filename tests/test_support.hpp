// Helpers shared by the tests in tests/test_*.cpp: one copy of each, so that a
// fix to how a test bounds a blocking call reaches every test at once.
//
// Every helper that waits is bounded (30 s unless told otherwise): a bug that
// makes the backend hang must fail the run with a message naming what hung,
// never stall it until CTest's own timeout kills it without one.
//
// Include after `#define BOOST_TEST_MODULE ...` and <boost/test/unit_test.hpp>.
#pragma once

#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace test_support {

/// How long any single blocking step of a test may take before it counts as
/// a hang.
inline constexpr std::chrono::seconds hang_limit{30};

/// Runs `f` on another thread and returns its result (or rethrows its
/// exception). Bounds the call to `limit`: if it has not finished by then the
/// test reports `what` as hung (BOOST_ERROR, and on stderr) and the process
/// exits with status 3. Exiting is the only safe way out: the stuck future
/// cannot be abandoned (its destructor would block) nor cancelled.
template <class F>
decltype(auto) bounded(F&& f, std::string_view what = "operation",
                       std::chrono::seconds limit = hang_limit) {
  auto fut = std::async(std::launch::async, std::forward<F>(f));
  if (fut.wait_for(limit) != std::future_status::ready) {
    BOOST_ERROR(what << ": still blocked after " << limit.count() << " s (hang)");
    std::fprintf(stderr, "FATAL: %.*s: still blocked after %lld s (hang)\n",
                 static_cast<int>(what.size()), what.data(),
                 static_cast<long long>(limit.count()));
    std::fflush(nullptr);
    std::_Exit(3);
  }
  return fut.get();
}

/// Bounds a blocking step that must run on the calling thread (destroying an
/// actor system has to happen on the thread that used it: CAF 0.17 keeps a
/// thread-local reference to the system's logger, and `~actor_system` waits
/// for the logger to go), so `bounded` cannot be used. A helper thread reports
/// `what` as hung and exits the process with status 3 if this object is not
/// destroyed within `hang_limit`.
class watchdog {
public:
  explicit watchdog(std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this] {
      std::unique_lock lk{mu_};
      if (!cv_.wait_for(lk, hang_limit, [this] { return done_; })) {
        std::fprintf(stderr, "%s: still blocked after %lld s (hang)\n", what_.c_str(),
                     static_cast<long long>(hang_limit.count()));
        std::fflush(nullptr);
        std::_Exit(3);
      }
    });
  }
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
  ~watchdog() {
    {
      std::lock_guard lk{mu_};
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// Polls `pred` in real time, every `poll`, for up to `limit`; returns whether
/// it held. Bounded so that a state that never comes fails the check instead
/// of hanging the test.
template <class Pred>
bool eventually(Pred pred, std::chrono::seconds limit = hang_limit,
                std::chrono::microseconds poll = std::chrono::milliseconds{1}) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

/// A one-shot gate a task can park on. `wait` is bounded (30 s by default) and
/// returns whether the gate opened, so that a failing test never leaves a
/// runner stuck forever.
class latch_gate {
public:
  void open() {
    std::lock_guard g{mu_};
    open_ = true;
    cv_.notify_all();
  }
  bool wait(std::chrono::seconds limit = hang_limit) {
    std::unique_lock g{mu_};
    return cv_.wait_for(g, limit, [this] { return open_; });
  }
  bool is_open() {
    std::lock_guard g{mu_};
    return open_;
  }
  /// `wait` for a task, on a runner thread, where no Boost.Test macro may
  /// run: Boost.Test is not thread-safe, and a check in a task racing one on
  /// the test's thread corrupted its checkpoint string (ThreadSanitizer saw
  /// the race; under it, test_hand_over_help failed 2 runs in 60 with
  /// std::length_error). A time-out is recorded for the test to check on
  /// its own thread (`timed_out`).
  void wait_in_task(std::chrono::seconds limit = hang_limit) {
    if (!wait(limit))
      timed_out_.store(true);
  }
  bool timed_out() const { return timed_out_.load(); }

private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::atomic<bool> timed_out_{false};
};

/// Blocks the runner of `d` until the returned gate opens; returns once the
/// blocking task is running. Both the start and the hold are bounded by
/// `latch_gate::wait`: the runner is freed after 30 s even if the test never
/// opens the gate.
inline std::shared_ptr<latch_gate> block_runner(multidev::backend& b,
                                                const multidev::device& d) {
  auto release = std::make_shared<latch_gate>();
  auto started = std::make_shared<latch_gate>();
  b.schedule_task(d, {"blocker", [release, started] {
                        started->open();
                        release->wait();
                      }});
  BOOST_REQUIRE(started->wait());
  return release;
}

/// A task that blocks its runner until `open` is set. Bounded to 60 s (then it
/// throws, failing its device), so a broken test cannot leave a runner stuck.
inline multidev::task blocker(std::shared_future<void> open) {
  return multidev::task{"blocker", [open] {
                          if (open.wait_for(std::chrono::seconds{60})
                              != std::future_status::ready)
                            throw std::runtime_error("blocker was never released");
                        },
                        {}};
}

/// Whether `needle` occurs in `haystack`.
inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// Runs `f`, which must throw `E` with `needle` in its message; returns the
/// message (empty, with a test error, when it did not throw).
template <class E, class F>
std::string expect_throw(F f, const std::string& needle) {
  try {
    f();
  } catch (const E& e) {
    BOOST_TEST(contains(e.what(), needle), "'" << e.what() << "' lacks '" << needle << "'");
    return e.what();
  }
  BOOST_ERROR("did not throw; expected '" << needle << "'");
  return {};
}

/// The value of `(key value)` in `info` as an atom, or `<missing key>` (so a
/// check on it fails with a readable message instead of crashing).
inline std::string field_of(const multidev::sexp& info, const char* key) {
  auto* f = info.find(key);
  if (!f || f->items().size() < 2)
    return "<missing " + std::string{key} + ">";
  return f->items()[1].as_atom();
}

/// The driver a suite runs on: `MULTIDEV_TEST_DRIVER`, default `cpu`. CTest
/// runs the ordering, error and transfer suites a second time with `fake`,
/// whose items complete asynchronously on a driver thread.
inline std::string test_driver() {
  auto* name = std::getenv("MULTIDEV_TEST_DRIVER");
  return name && *name ? std::string{name} : std::string{"cpu"};
}

/// How the tests attach nodes: the defaults, with a lease of
/// `MULTIDEV_TEST_LEASE_MS` milliseconds when set. The ThreadSanitizer
/// preset sets 10 s: there a client slowed down by TSan, beside another
/// test and the nodes on two cores, once went 3 s without a renewal at a
/// test's start, and the node ended the session under it.
inline multidev::node_attach_options test_attach_options() {
  multidev::node_attach_options o;
  if (auto* ms = std::getenv("MULTIDEV_TEST_LEASE_MS"); ms && *ms)
    o.lease = std::chrono::milliseconds{std::atoll(ms)};
  return o;
}

/// `opts` on the suite's driver (`test_driver()`).
inline multidev::backend_options on_test_driver(multidev::backend_options opts) {
  opts.driver = test_driver();
  return opts;
}

/// A backend on the suite's driver (`cpu` unless `MULTIDEV_TEST_DRIVER`
/// says otherwise) with `devices` devices and two scheduler threads.
inline multidev::backend make_backend(int devices) {
  return multidev::backend{
    on_test_driver(multidev::backend_options{.num_devices = devices, .scheduler_threads = 2})};
}

/// `b.sync(e)`, bounded by `bounded` (30 s, then the process exits).
inline void sync(const multidev::backend& b, const multidev::event& e) {
  bounded([&] { b.sync(e); });
}

/// A node of `floats` floats.
inline multidev::tnode node(int id, const std::string& label, std::size_t floats,
                            multidev::memory_mode m = multidev::memory_mode::on_device) {
  return multidev::tnode{id, label, floats * sizeof(float), m};
}

/// The floats of node `t` in context `c`, copied to the host; waits (bounded)
/// for all of the device's work. Elements not written read -12345.
inline std::vector<float> read_back(multidev::backend& b, const multidev::context& c,
                                    const multidev::tnode& t) {
  std::vector<float> out(t.size_in_bytes / sizeof(float), -12345.0f);
  BOOST_TEST_REQUIRE(b.to_host(c, t, std::as_writable_bytes(std::span{out})));
  sync(b, b.all_work(c.device));
  return out;
}

/// The `scheduled` counter of `d`'s debug info.
inline int64_t scheduled_count(const multidev::backend& b, const multidev::device& d) {
  auto info = b.get_debug_info(d);
  auto* f = info.find("scheduled");
  BOOST_TEST_REQUIRE(f != nullptr);
  return std::stoll(f->items().at(1).as_atom());
}

// -- provenance: what a failure says about where it started ------------------

/// The device_error that `f` throws; none (and a test error) when it returns
/// or throws anything else.
inline std::optional<multidev::device_error> device_error_of(const std::function<void()>& f,
                                                      const std::string& what) {
  try {
    f();
    BOOST_ERROR(what << ": returned, but its event should have failed");
  } catch (const multidev::cancelled_error& e) {
    BOOST_ERROR(what << ": cancelled_error instead of a failure: " << e.what());
  } catch (const multidev::device_error& e) {
    return e;
  } catch (const std::exception& e) {
    BOOST_ERROR(what << ": threw something other than device_error: " << e.what());
  }
  return std::nullopt;
}

/// The device_error that `sync(b, e)` throws (see `device_error_of`).
inline std::optional<multidev::device_error> sync_error(const multidev::backend& b,
                                                        const multidev::event& e,
                                                        const std::string& what) {
  return device_error_of([&] { sync(b, e); }, what);
}

/// `"waited for D seq S, which waited for ..."`: the path as `what()` reads it.
inline std::string path_text(const std::vector<multidev::failure_hop>& hops) {
  std::string out;
  for (std::size_t i = 0; i < hops.size(); ++i)
    out += (i == 0 ? "waited for " : ", which waited for ") + hops[i].device + " seq "
           + std::to_string(hops[i].seq);
  return out;
}

/// What a failure's `what()` reads: `"<origin>: <reason>"`, or through
/// `hops`, `"<first waiter> waited for ..., which waited for ...: <reason>"`.
inline std::string chain_text(const std::string& origin,
                              const std::vector<multidev::failure_hop>& hops,
                              const std::string& reason) {
  return hops.empty() ? origin + ": " + reason
                      : hops.front().waiter + " " + path_text(hops) + ": " + reason;
}

/// `e`'s path is `want`, hop for hop and field for field.
inline void check_path(const multidev::device_error& e,
                       const std::vector<multidev::failure_hop>& want, const std::string& what) {
  BOOST_TEST_CONTEXT(what << ": " << e.what()) {
    BOOST_TEST_REQUIRE(e.path().size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      BOOST_TEST_CONTEXT("hop " << i) {
        BOOST_TEST(e.path()[i].waiter == want[i].waiter);
        BOOST_TEST(e.path()[i].device == want[i].device);
        BOOST_TEST(e.path()[i].seq == want[i].seq);
      }
    }
    // The device it is about is the first waiter, or the origin.
    BOOST_TEST(e.device_name() == (want.empty() ? e.origin_device() : want.front().waiter));
  }
}

/// A failure that started with task `task` throwing `message` on `origin`
/// (seq `seq`), seen through `hops`: the whole provenance, and `what()` word
/// for word.
inline void check_task_chain(const std::optional<multidev::device_error>& e,
                             const std::string& origin, const std::string& task, uint64_t seq,
                             const std::string& message,
                             const std::vector<multidev::failure_hop>& hops,
                             const std::string& what) {
  BOOST_TEST_REQUIRE(e.has_value(), what);
  BOOST_TEST_CONTEXT(what << ": " << e->what()) {
    BOOST_TEST((e->cause().origin_kind == multidev::failure::kind::failed));
    BOOST_TEST(e->origin_device() == origin);
    BOOST_TEST(e->origin_task() == task);
    BOOST_TEST(e->cause().seq == seq);
    BOOST_TEST(e->original_message() == message);
    BOOST_TEST(std::string{e->what()} ==
               chain_text(origin, hops, "task '" + task + "' failed: " + message));
  }
  check_path(*e, hops, what);
}

/// A failure that started with `origin` lost (its process gone), seen
/// through `hops`: no task, a message saying why, the path hop for hop.
inline void check_lost_chain(const std::optional<multidev::device_error>& e,
                             const std::string& origin,
                             const std::vector<multidev::failure_hop>& hops,
                             const std::string& what) {
  BOOST_TEST_REQUIRE(e.has_value(), what);
  BOOST_TEST_CONTEXT(what << ": " << e->what()) {
    BOOST_TEST((e->cause().origin_kind == multidev::failure::kind::failed));
    BOOST_TEST(e->origin_device() == origin);
    BOOST_TEST(e->origin_task().empty()); // the device was lost, not one of its tasks
    // A device attached alone: its actor went down; a node's (a session's):
    // the session ended once the node was lost for its lease and margin.
    BOOST_TEST((contains(e->original_message(), "down")
                || contains(e->original_message(), "session ended")));
    BOOST_TEST(!contains(e->original_message(), origin)); // not named twice
    BOOST_TEST(std::string{e->what()} == chain_text(origin, hops, e->original_message()));
  }
  check_path(*e, hops, what);
}

} // namespace test_support
