// The fake asynchronous driver: host memory, and per device a stream thread
// that runs submitted work in order, after scripted delays, and reports each
// completion from that thread.
#include "devices/fake/fake_driver.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>

namespace multidev::detail {

struct fake_driver::lane {
  explicit lane(int ordinal) : rng(static_cast<unsigned>(ordinal) + 1) {}

  mutable std::mutex mu;
  std::condition_variable work_cv;            // the stream thread sleeps on it
  mutable std::condition_variable changed_cv; // wait_until sleeps on it
  std::deque<std::pair<uint64_t, std::function<void()>>> queue; // submitted, not started
  std::deque<std::pair<uint64_t, std::exception_ptr>> ready;    // to report, in order
  std::map<uint64_t, std::exception_ptr> held;
  std::map<uint64_t, std::string> failures;
  completion_sink* sink = nullptr; // set while a stream is open
  bool paused = false;
  bool hold = false;
  bool stop = false;
  fake_stream_stats st;
  std::minstd_rand rng;
  std::thread worker;
};

namespace {

int64_t delay_from_env() {
  constexpr int64_t fallback = 50;
  auto* text = std::getenv("MULTIDEV_FAKE_DELAY_US");
  if (text == nullptr || *text == '\0')
    return fallback;
  char* end = nullptr;
  auto v = std::strtoll(text, &end, 10);
  return (*end == '\0' && v >= 0) ? v : fallback;
}

/// The stream thread: reports what is ready, otherwise runs the next item.
void serve(fake_driver::lane& l, const std::atomic<int64_t>& max_delay_us) {
  std::unique_lock lk{l.mu};
  for (;;) {
    l.work_cv.wait(lk, [&] {
      return !l.ready.empty() || (!l.queue.empty() && (!l.paused || l.stop)) ||
             (l.stop && l.queue.empty());
    });
    if (!l.ready.empty()) {
      auto [seq, error] = std::move(l.ready.front());
      l.ready.pop_front();
      ++l.st.reported;
      l.changed_cv.notify_all();
      auto* sink = l.sink;
      lk.unlock();
      sink->completed(seq, std::move(error));
      lk.lock();
      ++l.st.returned;
      l.changed_cv.notify_all();
      continue;
    }
    if (l.queue.empty()) { // closing: report what is still held, then end
      if (l.held.empty())
        return;
      for (auto& h : l.held)
        l.ready.emplace_back(h.first, std::move(h.second));
      l.held.clear();
      continue;
    }
    auto [seq, work] = std::move(l.queue.front());
    l.queue.pop_front();
    ++l.st.started;
    l.changed_cv.notify_all();
    std::optional<std::string> fail;
    if (auto f = l.failures.find(seq); f != l.failures.end()) {
      fail = std::move(f->second);
      l.failures.erase(f);
    }
    // Half of the items run at once, the others after up to max_delay.
    auto bound = max_delay_us.load(std::memory_order_relaxed);
    auto delay = bound > 0 ? static_cast<int64_t>(l.rng() % static_cast<uint64_t>(2 * bound + 1)) - bound
                           : 0;
    lk.unlock();
    if (delay > 0)
      std::this_thread::sleep_for(std::chrono::microseconds{delay});
    std::exception_ptr error;
    if (fail) {
      error = std::make_exception_ptr(std::runtime_error(*fail));
    } else {
      try {
        work();
      } catch (...) {
        error = std::current_exception();
      }
    }
    work = nullptr; // what the work holds goes before it is reported
    lk.lock();
    if (l.hold)
      l.held.emplace(seq, std::move(error));
    else
      l.ready.emplace_back(seq, std::move(error));
    l.changed_cv.notify_all();
  }
}

class fake_stream final : public stream {
public:
  explicit fake_stream(fake_driver::lane& l) : lane_(l) {}

  ~fake_stream() override {
    {
      std::lock_guard guard{lane_.mu};
      lane_.stop = true;
    }
    lane_.work_cv.notify_all();
    lane_.worker.join(); // it ends once everything submitted is reported
    std::lock_guard guard{lane_.mu};
    lane_.sink = nullptr;
    lane_.stop = false;
  }

  void submit(uint64_t seq, std::function<void()> work) override {
    {
      std::lock_guard guard{lane_.mu};
      lane_.queue.emplace_back(seq, std::move(work));
      ++lane_.st.submitted;
      lane_.st.max_outstanding =
        std::max(lane_.st.max_outstanding, lane_.st.submitted - lane_.st.reported);
      lane_.changed_cv.notify_all();
    }
    lane_.work_cv.notify_one();
  }

private:
  fake_driver::lane& lane_;
};

} // namespace

fake_driver::fake_driver(std::optional<int> num_devices)
  : host_(make_cpu_driver(num_devices)), requested_(num_devices),
    max_delay_us_(delay_from_env()) {
}

fake_driver::~fake_driver() = default;

int fake_driver::device_count() const {
  return host_->device_count();
}

sexp fake_driver::properties() const {
  std::call_once(props_once_, [this] {
    auto devices = sexp::list({sexp::atom("devices")});
    for (int i = 0; i < device_count(); ++i)
      devices.push_back(sexp::list({sexp::atom("device"),
                                    sexp::field("ordinal", std::to_string(i)),
                                    sexp::field("kind", "fake"),
                                    sexp::field("memory", "host")}));
    props_ = sexp::list({sexp::atom(name_),
                         sexp::field("num_devices", std::to_string(device_count())),
                         sexp::field("max_delay_us", std::to_string(max_delay_us_.load())),
                         devices});
  });
  return props_;
}

std::unique_ptr<allocation> fake_driver::allocate(int ordinal, std::size_t size,
                                                  std::size_t alignment,
                                                  std::optional<memory_mode> mode) {
  return host_->allocate(ordinal, size, alignment, mode);
}

void fake_driver::zero(std::byte* p, std::size_t n) {
  host_->zero(p, n);
}

void fake_driver::copy(std::byte* dst, const std::byte* src, std::size_t n) {
  host_->copy(dst, src, n);
}

fake_driver::lane& fake_driver::lane_of(int ordinal) const {
  std::lock_guard guard{mu_};
  auto& l = lanes_[ordinal];
  if (!l)
    l = std::make_unique<lane>(ordinal);
  return *l;
}

std::unique_ptr<stream> fake_driver::open_stream(int ordinal, completion_sink& sink) {
  auto& l = lane_of(ordinal);
  std::lock_guard guard{l.mu};
  if (l.sink != nullptr)
    throw std::logic_error(fmt::format("fake driver: device {} already has a stream", ordinal));
  auto s = std::make_unique<fake_stream>(l);
  l.sink = &sink;
  l.worker = std::thread([&l, this] { serve(l, max_delay_us_); });
  return s;
}

void fake_driver::set_max_delay(std::chrono::microseconds d) {
  max_delay_us_.store(d.count() < 0 ? 0 : d.count());
}

void fake_driver::fail_at(int ordinal, uint64_t seq, std::string message) {
  auto& l = lane_of(ordinal);
  std::lock_guard guard{l.mu};
  l.failures[seq] = std::move(message);
}

void fake_driver::pause(int ordinal) {
  auto& l = lane_of(ordinal);
  std::lock_guard guard{l.mu};
  l.paused = true;
}

void fake_driver::resume(int ordinal) {
  auto& l = lane_of(ordinal);
  {
    std::lock_guard guard{l.mu};
    l.paused = false;
  }
  l.work_cv.notify_all();
}

void fake_driver::hold_completions(int ordinal, bool on) {
  auto& l = lane_of(ordinal);
  {
    std::lock_guard guard{l.mu};
    l.hold = on;
    if (on)
      return;
    for (auto& h : l.held)
      l.ready.emplace_back(h.first, std::move(h.second));
    l.held.clear();
    l.changed_cv.notify_all();
  }
  l.work_cv.notify_all();
}

bool fake_driver::deliver(int ordinal, uint64_t seq) {
  auto& l = lane_of(ordinal);
  {
    std::lock_guard guard{l.mu};
    auto h = l.held.find(seq);
    if (h == l.held.end())
      return false;
    l.ready.emplace_back(seq, std::move(h->second));
    l.held.erase(h);
    l.changed_cv.notify_all();
  }
  l.work_cv.notify_all();
  return true;
}

fake_stream_stats fake_driver::stats(int ordinal) const {
  auto& l = lane_of(ordinal);
  std::lock_guard guard{l.mu};
  auto s = l.st;
  s.held = l.held.size();
  return s;
}

bool fake_driver::wait_until(int ordinal,
                             const std::function<bool(const fake_stream_stats&)>& pred,
                             std::chrono::milliseconds limit) const {
  auto& l = lane_of(ordinal);
  std::unique_lock lk{l.mu};
  return l.changed_cv.wait_for(lk, limit, [&] {
    auto s = l.st;
    s.held = l.held.size();
    return pred(s);
  });
}

std::shared_ptr<driver> make_fake_driver(std::optional<int> num_devices) {
  return std::make_shared<fake_driver>(num_devices);
}

} // namespace multidev::detail
