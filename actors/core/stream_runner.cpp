// The runner of an asynchronous driver (stream_runner.hpp).
#include "actors/core/stream_runner.hpp"

#include "actors/core/device_core.hpp"
#include "actors/core/trace.hpp"

namespace multidev::detail {

stream_runner::stream_runner(device_runner& runner) noexcept
  : runner_(runner), core_(runner.core_) {}

bool stream_runner::ended(const gate& g) const noexcept {
  auto st = g.state.load(std::memory_order_seq_cst);
  return st == gate::open || st == gate::failed ||
         core_.window_.started() + 1 <= core_.outcomes_.dropped_upto(std::memory_order_seq_cst);
}

bool stream_runner::startable() {
  if (!core_.window_.has_room(barrier_))
    return false;
  if (next_ < batch_.size()) {
    auto* g = batch_[next_].as_gate();
    if (!g || ended(*g) || g == on_device_)
      return true;
    if (g != asked_ || core_.window_.take_reask()) {
      asked_ = g;
      if (order_on_device(*g))
        on_device_ = g;
    }
    return g == on_device_;
  }
  return core_.queue_.has_untaken();
}

bool stream_runner::idle() const noexcept {
  return core_.window_.idle() && next_ == batch_.size();
}

void stream_runner::park(const gate* g) noexcept {
  if (parked_ == g)
    return;
  if (g && core_.trace_) [[unlikely]]
    parked_ns_ = core_.trace_->clock().now();
  core_.gates_.set_parked_on(parked_ = g);
}

void stream_runner::run() {
  for (;;) {
    core_.window_.settle_gated();
    if (core_.window_.retirable())
      core_.window_.retire_ready();
    if (startable()) {
      start_next();
      continue;
    }
    if (idle()) {
      // Wait for work like the synchronous runner.
      auto queued = [&] { return core_.queue_.has_untaken(); };
      if (!spin_until(queued, 16) && !core_.queue_.sleep_until_work())
        return;
      continue;
    }
    if (next_ < batch_.size())
      if (auto* g = batch_[next_].as_gate(); g && !ended(*g))
        park(g);
    auto ready = [&] {
      return core_.window_.settle_gated() || core_.window_.retirable() || startable() || idle();
    };
    if (spin_until(ready, 16))
      continue;
    // Sleep until a completion, a gate or a cancel rings, or a producer
    // (which tests the runner's mark under the queue's lock) brings work. A
    // stop rings too, and is seen once idle. Polled, as in sleep_until_work.
    core_.queue_.sleep_for_work_unless(ready, [](const auto& bell, uint32_t seen) {
      bell_sleep_polled(bell, seen);
    });
  }
}

void stream_runner::start_next() {
  if (next_ == batch_.size()) {
    batch_.clear();
    next_ = 0;
    runner_.take_batch(batch_);
    return;
  }
  auto& it = batch_[next_++];
  int64_t waited_since = 0;
  bool gate_on_device = false;
  if (auto* g = it.as_gate()) {
    waited_since = parked_ == g ? parked_ns_ : 0;
    park(nullptr);
    gate_on_device = g == on_device_ && !ended(*g);
    on_device_ = asked_ = nullptr; // a later gate may reuse the address
    if (g->state.load() == gate::failed)
      barrier_ = core_.window_.started() + 1;
  }
  if (it.extra.is_text()) [[unlikely]] {
    // The item outlives its batch in the window: its description leaves
    // the batch's text with it. Out of memory, it goes nameless.
    try {
      it.extra = extra_ptr{named_extra::make(runner_.text_of(it), nullptr, it.extra.text_kind())};
    } catch (...) {
      it.extra = extra_ptr{};
    }
  }
  core_.life_.check_lease();
  core_.window_.start(std::move(it), waited_since, gate_on_device);
}

bool stream_runner::serve_started_until(device_core& core, const std::atomic<uint32_t>& flag,
                                        std::chrono::steady_clock::time_point deadline) noexcept {
  for (;;) {
    core.window_.resolve_settled();
    if (flag.load(std::memory_order_seq_cst) != 0)
      return true;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return false;
    // As run sleeps: whoever ends a gate, reports an item or resolves the
    // awaited seq (the sync's resolver) rings once the runner is marked
    // asleep.
    core.queue_.sleep_for_work_unless(
      [&] { return flag.load(std::memory_order_seq_cst) != 0 || core.window_.resolve_settled(); },
      [&](const auto& bell, uint32_t seen) {
        if (deadline == std::chrono::steady_clock::time_point::max())
          bell_sleep(bell, seen);
        else
          bell_sleep_for(bell, seen, deadline - now);
      });
  }
}

bool stream_runner::order_on_device(const gate& g) {
  if (g.remote)
    return false;
  auto owner = g.owner.lock();
  // Streams of one driver instance only (one backend's devices).
  if (!owner || owner.get() == &core_ || &owner->drv() != core_.driver_.get())
    return false;
  // The wake may come after this loop ended: it holds the core, which
  // outlives its driver's streams, not this object.
  return core_.driver_->order_after(core_.ordinal_, owner->ordinal(), g.owner_seq,
                                    [&core = core_] {
                                      core.window_.ask_again();
                                      core.queue_.ring();
                                    });
}

} // namespace multidev::detail
