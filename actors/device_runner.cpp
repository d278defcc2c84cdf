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
      if (trace_) [[unlikely]]
        execute_traced(batch[i], i == 0);
      else
        execute(batch[i]);
    }
    batch.clear();
  }
}

void device_core::execute(item& it) {
  auto seq = ++executed_; // runner-only count of items resolved
  // Cancelled, killed, or behind a failure: resolved without running.
  if (seq <= drop_upto_.load(std::memory_order_acquire)) [[unlikely]] {
    drop(it, seq);
    return;
  }
  if (auto* gp = it.as_gate()) {
    auto& g = *gp;
    {
      std::lock_guard guard{waiters_mu_};
      parked_on_ = &g;
    }
    // A cancel or kill while parked ends the wait too (it rings the bell).
    auto ended = [&] {
      auto st = g.state.load(std::memory_order_seq_cst);
      return st == gate::open || st == gate::failed ||
             seq <= drop_upto_.load(std::memory_order_seq_cst);
    };
    spin_until(ended);
    for (;;) {
      auto b = bell_.load();
      sleeping_.store(true, std::memory_order_seq_cst);
      if (ended())
        break;
      bell_.wait(b);
    }
    sleeping_.store(false, std::memory_order_relaxed);
    {
      std::lock_guard guard{waiters_mu_};
      parked_on_ = nullptr;
    }
    if (g.state.load() != gate::open && seq <= drop_upto_.load()) {
      drop(it, seq); // counts the gate off
      return;
    }
    gates_pending_.fetch_sub(1);
    if (g.state.load() == gate::failed) {
      poison(seq, [&] {
        // The awaited event's cause, with this wait in front of its path.
        auto f = std::make_shared<failure>();
        if (g.cause)
          *f = *g.cause;
        else
          f->message = "failed (its cause could not be recorded)";
        f->path.insert(f->path.begin(), failure_hop{name_, g.owner_label(), g.owner_seq});
        return f;
      });
      return;
    }
  } else if (it.work) {
    try {
      it.work();
    } catch (const std::exception& e) {
      poison(seq, [&] {
        return std::make_shared<failure>(failure{failure::kind::failed, name_,
                                                 task_name(it, seq), seq, e.what(), {}});
      });
      return;
    } catch (...) {
      poison(seq, [&] {
        return std::make_shared<failure>(failure{failure::kind::failed, name_,
                                                 task_name(it, seq), seq,
                                                 "unknown exception", {}});
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

std::string device_core::task_name(const item& it, uint64_t seq) {
  if (auto* g = it.as_gate())
    return "wait for " + g->what();
  if (!it.extra || it.extra->description.empty())
    return nameless_task_name(seq);
  return it.extra->description;
}

std::string device_core::describe(const item& it, uint64_t seq) {
  if (auto* g = it.as_gate())
    return "'wait for " + g->what() + "'";
  if (!it.extra || it.extra->description.empty())
    return nameless_task_name(seq);
  return "'" + it.extra->description + "'";
}

void device_core::drop(item& it, uint64_t seq) noexcept {
  if (it.as_gate())
    gates_pending_.fetch_sub(1);
  failure_ptr cause;
  {
    std::lock_guard guard{mu_};
    // The first segment that covers seq; those behind it are spent.
    while (!drops_.empty() && drops_.front().first < seq)
      drops_.pop_front();
    if (!drops_.empty())
      cause = drops_.front().second;
  }
  if (trace_) [[unlikely]]
    trace_dropped(it, seq);
  it.work = nullptr;
  if (it.extra)
    it.extra->keep_alive.reset();
  resolve_bad(seq, std::move(cause));
}

void device_core::resolve_bad(uint64_t seq, failure_ptr cause) noexcept {
  if (!cause)
    cause = oom_cause_;
  try {
    std::lock_guard guard{bad_mu_};
    // Consecutive seqs with one cause share a range (a cancel of thousands
    // of items is one entry).
    auto extend = !bad_.empty() && std::prev(bad_.end())->second.last + 1 == seq &&
                  std::prev(bad_.end())->second.cause == cause;
    if (extend)
      std::prev(bad_.end())->second.last = seq;
    else
      bad_.emplace(seq, bad_range{seq, std::move(cause)});
    bad_max_.store(seq, std::memory_order_release);
  } catch (...) {
    // Out of memory recording the outcome: the seq must still resolve, and
    // must not read as done. The previous range grows over it.
    std::lock_guard guard{bad_mu_};
    if (!bad_.empty())
      std::prev(bad_.end())->second.last = seq;
    bad_max_.store(seq, std::memory_order_release);
  }
  complete(seq);
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

template <class MakeCause>
void device_core::poison(uint64_t seq, MakeCause make) noexcept {
  // Runs on the runner, outside any handler: nothing here may throw. A cause
  // that cannot be made (out of memory) becomes a preallocated one.
  if (trace_) [[unlikely]]
    trace_done(true);
  failure_ptr cause;
  try {
    cause = make();
  } catch (...) {
    cause = oom_cause_;
  }
  {
    std::lock_guard guard{mu_};
    if (!killed_) {
      failed_ = true;
      failed_flag_.store(true, std::memory_order_release);
      error_ = cause;
    }
    // What is queued behind the failure fails with it, in order.
    try {
      drop_locked(cause);
    } catch (...) {
      // No memory for the segment: those items then resolve with a generic
      // cause, but they still resolve.
    }
    room_.notify_all();
  }
  resolve_bad(seq, std::move(cause));
  call_room_callback();
}

} // namespace multidev::detail
