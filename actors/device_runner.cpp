// The runner thread: takes batches off the queue, runs them in order,
// parks on gates, completes items and fails the device when a task throws.
#include "actors/device_core.hpp"

#include <fmt/format.h>

#include "actors/trace.hpp"

namespace multidev::detail {

namespace {
/// When fewer items than this are waiting, the runner pauses up to
/// `coalesce_pauses` times (about a microsecond) to take them in one batch.
constexpr uint64_t coalesce_items = 32;
constexpr int coalesce_pauses = 64;
} // namespace

void device_core::run() {
  current_runner = this;
  std::vector<item> batch;
  bool wants_room = false;
  auto pending = [&] { return scheduled_.load(std::memory_order_acquire) - taken_; };
  for (;;) {
    if (pending() == 0 && !spin_until([&] { return pending() != 0; }, 16)) {
      std::unique_lock lk{mu_};
      while (queue_.empty()) {
        if (stopping_)
          return;
        auto b = bell_.load();
        sleeping_.store(true, std::memory_order_seq_cst);
        lk.unlock();
        bell_.wait(b);
        sleeping_.store(false, std::memory_order_relaxed);
        lk.lock();
      }
    } else if (pending() < coalesce_items) {
      // A producer in a burst is appending right now: taking the lock for
      // each item would move its cache line back and forth on every push.
      // Reading scheduled_ pulls the producer's cache line, so look rarely.
      for (int i = 0; i < coalesce_pauses && pending() < coalesce_items; i += 16)
        for (int j = 0; j < 16; ++j)
          cpu_relax();
    }
    {
      std::lock_guard guard{mu_};
      if (queue_.empty()) {
        if (stopping_)
          return;
        continue;
      }
      batch.swap(queue_);
      taken_ += batch.size();
      if (producers_waiting_ > 0)
        room_.notify_all();
      wants_room = static_cast<bool>(room_cb_);
    }
    if (wants_room)
      call_room_callback();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      // The entries were just written on the producer's core: fetch ahead.
      if (i + prefetch_items < batch.size())
        __builtin_prefetch(&batch[i + prefetch_items], 0, 3);
      auto& it = batch[i];
      if (!failed_now()) {
        if (trace_) [[unlikely]]
          execute_traced(it, i == 0);
        else
          execute(it);
      } else if (it.as_gate())
        gates_pending_.fetch_sub(1);
    }
    batch.clear();
  }
}

void device_core::execute(item& it) {
  auto seq = ++executed_; // runner-only count of items run or skipped
  if (auto* gp = it.as_gate()) {
    auto& g = *gp;
    {
      std::lock_guard guard{waiters_mu_};
      parked_on_ = &g;
    }
    spin_until([&] {
      auto st = g.state.load(std::memory_order_acquire);
      return st == gate::open || st == gate::failed;
    });
    for (;;) {
      auto b = bell_.load();
      sleeping_.store(true, std::memory_order_seq_cst);
      auto st = g.state.load(std::memory_order_seq_cst);
      if (st == gate::open || st == gate::failed)
        break;
      bell_.wait(b);
    }
    sleeping_.store(false, std::memory_order_relaxed);
    {
      std::lock_guard guard{waiters_mu_};
      parked_on_ = nullptr;
    }
    gates_pending_.fetch_sub(1);
    if (g.state.load() == gate::failed) {
      poison([&] {
        if (g.error.empty())
          return fmt::format("waited for {}, which failed", g.what());
        // The owner's error starts with its name, which what() gives already.
        auto o = g.owner.lock();
        return fmt::format("waited for {}, which failed: {}", g.what(),
                           o ? o->reason_of(g.error) : g.error);
      });
      return;
    }
  } else if (it.work) {
    try {
      it.work();
    } catch (const std::exception& e) {
      poison([&] { return fmt::format("task {} failed: {}", describe(it, seq), e.what()); });
      return;
    } catch (...) {
      poison([&] {
        return fmt::format("task {} failed: unknown exception", describe(it, seq));
      });
      return;
    }
  }
  // Release what a described task held (a freed pool's memory, captured
  // buffers) before its event is done, so whoever syncs on it sees the memory
  // gone. A bare closure is left for batch.clear(): writing to the entry here
  // would pull its cache line back from the producer on every item.
  if (it.extra) {
    it.work = nullptr;
    it.extra->keep_alive.reset();
  }
  complete(seq);
}

std::string device_core::describe(const item& it, uint64_t seq) {
  if (auto* g = it.as_gate())
    return "'wait for " + g->what() + "'";
  if (!it.extra || it.extra->description.empty())
    return nameless_task_name(seq);
  return "'" + it.extra->description + "'";
}

void device_core::complete(uint64_t seq) {
  if (trace_) [[unlikely]]
    trace_done(false); // before the event is done, so whoever syncs sees it
  // Store-then-load against `when_done`'s store-then-load of min_waiter_ and
  // progress_ (Dekker): both sides need StoreLoad order, or a waiter that
  // registers at this very moment and this check could both miss each other,
  // and the event would stay unresolved -- forever if the next task waits for
  // whoever is waiting on this event.
  progress_.store(seq, std::memory_order_seq_cst);
  if (seq >= min_waiter_.load(std::memory_order_seq_cst))
    fire(seq, nullptr);
}

template <class MakeMessage>
void device_core::poison(MakeMessage make) noexcept {
  // Runs on the runner, outside any handler: nothing here may throw. A
  // message that cannot be formatted (out of memory) becomes a fixed text
  // short enough to need no allocation.
  if (trace_) [[unlikely]]
    trace_done(true);
  std::string message;
  try {
    message = make();
  } catch (...) {
    message = "task failed"; // fits the small-string buffer
  }
  std::vector<item> dropped;
  {
    std::lock_guard guard{mu_};
    if (failed_)
      return;
    failed_ = true;
    error_.swap(message);
    dropped.swap(queue_);
    taken_ += dropped.size(); // or the runner would see them as pending forever
    room_.notify_all();
  }
  progress_.fetch_or(fail_bit, std::memory_order_seq_cst);
  fail_waiters("task failed");
  for (auto& it : dropped)
    if (it.as_gate())
      gates_pending_.fetch_sub(1);
  call_room_callback();
}

} // namespace multidev::detail
