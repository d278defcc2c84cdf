// Progress and outcomes: what is done, what failed or was cancelled and why,
// who is told, and blocking syncs.
#include "actors/core/device_events.hpp"

#include "actors/core/device_core.hpp"
#include "actors/core/trace.hpp"
#include "actors/wait_graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stdexcept>

namespace multidev::detail {

namespace {
/// How a resolver tells a blocked `sync_until` the outcome. Shared: the
/// resolver may still be notifying after the sync saw the value.
struct sync_signal {
  std::atomic<uint32_t> flag{0}; // 1: done, 2: failed (cause set before)
  device_core::failure_ptr cause;
  // For a wait with a deadline (the atomic wait has no timeout).
  std::mutex mu;
  std::condition_variable cv;
  bool timed = false;
};

/// The resolver a `sync_until` registers; named, so that a sync that gives
/// up at its deadline can find its own among the seq's waiters and drop it.
struct sync_resolver {
  std::shared_ptr<sync_signal> sig;
  /// Set for a task syncing on its own runner thread (see `sync_until`):
  /// that runner is rung instead of the flag notified. It outlives the
  /// resolver, which it holds.
  device_core* serve = nullptr;
  void operator()(const failure* cause) const {
    if (cause) {
      // The cause lives in the device's table (or a static); share it.
      sig->cause = std::shared_ptr<const failure>(std::make_shared<failure>(*cause));
    }
    if (sig->timed) {
      std::lock_guard guard{sig->mu};
      sig->flag.store(cause ? 2 : 1);
      sig->cv.notify_all();
      return;
    }
    sig->flag.store(cause ? 2 : 1);
    if (serve) {
      serve->runner().wake_runner();
      return;
    }
    sig->flag.notify_one();
  }
};
} // namespace

void work_submission::check_scheduled(uint64_t seq, const char* what) const {
  auto s = core().queue_.scheduled();
  if (seq > s)
    throw std::invalid_argument(fmt::format(
      "{}: seq {} was never scheduled on {} (it has scheduled {} so far)", what, seq,
      core().name_, s));
}

void device_events::fire(uint64_t upto, const failure* beyond) noexcept {
  // The due waiters' nodes move to a local map: no allocation, so nothing
  // can throw half-way and strand a waiter. Due gate waiters are taken one
  // at a time (the first with the resolvers, the rest after), for the same
  // reason.
  outcome_board::waiter_list due;
  gate_waiter gw;
  bool has_gate;
  // Whether another gate waiter was due when the last one was taken: for
  // a firing of done items the list is looked at again only then. One that
  // registers later for a seq this covers is resolved by its own
  // registration (`when_resolved_as` reads the progress after it enters), so
  // the second lock a firing took, which a hop of a chain paid every time,
  // found nothing there.
  bool more;
  {
    std::lock_guard guard{outcomes_.waiters_mutex()};
    outcomes_.take_due_locked(upto, beyond != nullptr, due);
    has_gate = gate_waiters_.take_due_locked(upto, beyond != nullptr, gw, more);
    gate_waiters_.update_min_locked(outcomes_, true);
  }
  // Each seq gets its own outcome: a seq resolved done is done for every
  // observer, even when this fires because the device failed later.
  auto resolved = outcomes_.finished();
  failure_ptr hold;
  for (auto& [seq, r] : due)
    outcome_board::invoke(r, outcomes_.outcome_for(seq, resolved, beyond, hold));
  while (has_gate) {
    const auto* c = outcomes_.outcome_for(gw.seq, resolved, beyond, hold);
    if (c || !(core_.runner().handover().try_claim(gw) ||
               (runners_may_defer() && core_.runner().handover().try_defer(gw))))
      gate_waiters::resolve(gw, c);
    if (!more && !beyond)
      break;
    gw = gate_waiter{};
    std::lock_guard guard{outcomes_.waiters_mutex()};
    has_gate = gate_waiters_.take_due_locked(upto, beyond != nullptr, gw, more);
    if (has_gate)
      gate_waiters_.update_min_locked(outcomes_, true);
  }
}

void device_events::add_waiter_unchecked(uint64_t seq, waiter w) {
  std::lock_guard guard{outcomes_.waiters_mutex()};
  outcomes_.add_locked(seq, [w = std::move(w)](const failure* cause) mutable {
    if (!cause) {
      w(nullptr);
      return;
    }
    auto text = cause->describe();
    w(&text);
  });
  gate_waiters_.update_min_locked(outcomes_);
}

template <class Enter, class Resolve>
void device_events::when_resolved_as(uint64_t seq, Enter&& enter, Resolve&& resolve) {
  {
    std::unique_lock guard{outcomes_.waiters_mutex()};
    if (outcomes_.accepts_locked(seq)) {
      enter();
      gate_waiters_.update_min_locked(outcomes_);
      // Re-check: the runner may have advanced between our load and store
      // without seeing the new minimum. Either it fires us, or we fire here.
      auto p = outcomes_.progress_now();
      guard.unlock();
      if (p >= seq)
        fire(p);
      return;
    }
  }
  if (outcomes_.finished() >= seq) {
    auto cause = outcomes_.cause_of(seq);
    resolve(cause.get());
  } else {
    auto cause = core_.life().device_failure("device is shut down");
    resolve(cause.get());
  }
}

void device_events::when_resolved(uint64_t seq, resolver r) {
  when_resolved_as(
    seq, [&] { outcomes_.add_locked(seq, std::move(r)); },
    [&](const failure* cause) { outcome_board::invoke(r, cause); });
}

void device_events::when_resolved(gate_waiter&& w) {
  const auto seq = w.seq;
  when_resolved_as(
    seq, [&] { gate_waiters_.add_locked(std::move(w)); },
    [&](const failure* cause) { gate_waiters::resolve(w, cause); });
}

std::size_t device_events::drop_waiters(const std::function<bool(const resolver&)>& pred) {
  std::lock_guard guard{outcomes_.waiters_mutex()};
  auto n = outcomes_.drop_waiters_locked(pred);
  gate_waiters_.update_min_locked(outcomes_);
  return n;
}

bool device_events::drop_waiter(uint64_t seq, const std::function<bool(const resolver&)>& pred) {
  std::lock_guard guard{outcomes_.waiters_mutex()};
  if (!outcomes_.drop_waiter_locked(seq, pred))
    return false;
  gate_waiters_.update_min_locked(outcomes_);
  return true;
}

void device_events::when_done(uint64_t seq, waiter w) {
  when_resolved(seq, [w = std::move(w)](const failure* cause) mutable {
    if (!cause) {
      w(nullptr);
      return;
    }
    auto text = cause->describe();
    w(&text);
  });
}

void device_events::sync(uint64_t seq) {
  sync_until(seq, std::chrono::steady_clock::time_point::max());
}

void device_events::sync_until(uint64_t seq, std::chrono::steady_clock::time_point deadline,
                             const char* what) {
  if (outcomes_.is_done(seq))
    return;
  core_.check_scheduled(seq, what);
  if (seq > outcomes_.finished()) {
    // A task may wait for its device's earlier items (on an asynchronous
    // driver they may have run and not yet be resolved), never for its own.
    if (current_runner == &core_ && (!core_.window_.async() || seq >= current_item))
      throw deadlock_error(fmt::format(
        "{} on {} seq {} from a task of the same device, which has finished "
        "only up to seq {}: waiting would deadlock",
        what, core_.name(), seq, outcomes_.finished()));
    // Registered in the wait graph while blocked; from a task, registering
    // refuses a wait that closes a cycle of runners.
    blocked_wait w;
    if (const auto* r = current_runner) {
      w.runner = r;
      w.item = r->runner().running_item();
    }
    w.owner = &core_;
    w.owner_name = core_.name();
    w.seq = seq;
    w.what = what;
    blocked_scope blocked{std::move(w)};
    // With tracing on, a host thread's wait goes in the trace (a task's
    // shows as its item).
    auto* spans = current_runner == nullptr && core_.trace_ ? &core_.trace_->host_spans() : nullptr;
    host_wait_scope traced{spans, what, core_.name(), seq};
    // A runner that left this device's runner asleep, to run its items
    // itself later, may be long in coming: this wait needs them now.
    core_.runner().handover().ring_deferred();
    auto sig = std::make_shared<sync_signal>();
    bool timed = deadline != std::chrono::steady_clock::time_point::max();
    // A task on this device's own runner thread (an asynchronous driver that
    // runs work as it submits it): the runner must go on settling the items
    // already started while it waits (`serve_started_until`), so the
    // resolver rings it.
    device_core* serve = core_.window_.async() && home_runner == &core_ ? &core_ : nullptr;
    sig->timed = timed && !serve;
    when_resolved(seq, sync_resolver{sig, serve});
    auto start = std::chrono::steady_clock::now();
    // Deregistered: a sync that gives up leaves nothing behind (a loop of
    // short syncs on a pending event would otherwise pile up one waiter
    // each, until the event resolves). One already firing is left to fire;
    // the signal outlives it.
    auto passed_deadline = [&] {
      drop_waiter(seq, [&sig](const resolver& r) {
        const auto* mine = r.target<sync_resolver>();
        return mine != nullptr && mine->sig == sig;
      });
      auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
      // Followed into other processes, whose answers it waits for a moment.
      auto chain = follow_chain(core_, seq, std::chrono::steady_clock::now() + explain_budget);
      return timeout_error(fmt::format("{} on {} seq {} passed its deadline after {:.3f} s: {}",
                                       what, core_.name(), seq, waited.count(), chain),
                           chain);
    };
    uint32_t v;
    if (serve) {
      if (!stream_runner::serve_started_until(core_, sig->flag, deadline))
        throw passed_deadline();
      v = sig->flag.load();
    } else if (timed) {
      std::unique_lock lock{sig->mu};
      if (!sig->cv.wait_until(lock, deadline, [&] { return sig->flag.load() != 0; })) {
        lock.unlock();
        throw passed_deadline();
      }
      v = sig->flag.load();
    } else {
      while ((v = sig->flag.load()) == 0)
        sig->flag.wait(0);
    }
    if (v == 1)
      return;
    throw_failure(sig->cause);
  }
  if (auto cause = outcomes_.cause_of(seq))
    throw_failure(std::move(cause));
}

std::string device_life::reason_of(std::string_view error) const {
  // "<name>: <reason>", or "<name> waited for ..." (a failure with a path).
  if (error.starts_with(name_)) {
    auto rest = error.substr(name_.size());
    if (rest.starts_with(": "))
      error.remove_prefix(name_.size() + 2);
    else if (rest.starts_with(" waited for "))
      error.remove_prefix(name_.size() + 1);
  }
  return std::string{error};
}

device_life::failure_ptr device_life::device_failure(std::string message) const {
  auto f = std::make_shared<failure>();
  f->device = name_;
  f->message = std::move(message);
  return f;
}

std::optional<std::string> device_life::error() const {
  std::lock_guard guard{queue_.mutex()};
  if (queue_.failed_locked() && error_)
    return error_->describe_reason();
  if (queue_.failed_locked())
    return std::string{"failed"};
  return std::nullopt;
}

void device_life::check() const {
  failure_ptr e;
  {
    std::lock_guard guard{queue_.mutex()};
    if (!queue_.failed_locked())
      return;
    e = error_;
  }
  if (e)
    throw device_error(e);
  throw device_error(name_, "failed");
}

} // namespace multidev::detail
