// Waits for other devices' events: gates in the queue, how they are
// pushed, resolved and cancelled.
#include "actors/device_core.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace multidev::detail {

bool device_core::push_wait(const std::shared_ptr<device_core>& owner, uint64_t seq) {
  if (owner.get() == this || owner->is_done(seq))
    return false;
  owner->check_scheduled(seq, "will_wait_for");
  auto g = std::make_shared<gate>();
  g->owner = owner;
  g->owner_seq = seq;
  push_gate(g);
  // The callback may run at once, on this thread, or later on owner's runner.
  std::weak_ptr<device_core> self = weak_from_this();
  try {
    owner->when_done(seq, [self, g](const std::string* error) {
      if (auto me = self.lock())
        me->resolve_gate(*g, error);
    });
  } catch (...) {
    // The gate is queued: left pending, it would hold this device forever.
    static const std::string reason = "could not register the wait (out of memory)";
    resolve_gate(*g, &reason);
    throw;
  }
  return true;
}

std::string gate::what() const noexcept {
  try {
    if (auto o = owner.lock())
      return fmt::format("{} seq {}", o->name(), owner_seq);
    return label.empty() ? fmt::format("seq {} of a device gone", owner_seq) : label;
  } catch (...) {
    return {};
  }
}

std::shared_ptr<gate> device_core::push_gate(std::shared_ptr<gate> g) {
  {
    // Registered before the push: `shutdown` sets stopping_ before it collects
    // these, so a gate is either collected (and maybe cancelled) or refused.
    std::lock_guard guard{waiters_mu_};
    // Resolved gates are pruned only when the list has doubled since the last
    // pruning: a host running far ahead of a chain keeps thousands pending,
    // and a scan per push would make scheduling the chain quadratic.
    if (gates_.size() >= gates_prune_at_) {
      std::erase_if(gates_, [](const auto& w) {
        auto p = w.lock();
        return !p || p->state.load() != gate::pending;
      });
      gates_prune_at_ = std::max<std::size_t>(64, 2 * gates_.size());
    }
    gates_.push_back(g);
  }
  gates_pending_.fetch_add(1);
  try {
    // A wait never waits for room: will_wait_for returns at once, and an
    // actor handler must not block.
    g->seq = enqueue(task{}, g, false);
  } catch (...) {
    gates_pending_.fetch_sub(1);
    throw;
  }
  return g;
}

void device_core::resolve_gate(gate& g, const std::string* error) noexcept {
  // `resolving` makes the first resolution win and publishes `error` before
  // the final state; the runner only acts on open or failed. Nothing between
  // the two may throw, or the gate would stay half-open forever.
  int expected = gate::pending;
  if (!g.state.compare_exchange_strong(expected, gate::resolving))
    return;
  if (error) {
    try {
      g.error = *error;
    } catch (...) {
      g.error.clear(); // the runner reports the failure without its reason
    }
    g.state.store(gate::failed, std::memory_order_seq_cst);
  } else {
    g.state.store(gate::open, std::memory_order_seq_cst);
  }
  ring();
}

void device_core::cancel_gates(bool (*which)(const gate&), const std::string& why) {
  // Candidates are copied out first and judged without the lock: judging may
  // take the last reference to an owner core, whose destructor joins its
  // runner, which may be inside our when_done, waiting for this very lock.
  std::vector<std::shared_ptr<gate>> pending;
  {
    std::lock_guard guard{waiters_mu_};
    for (auto& w : gates_)
      if (auto g = w.lock(); g && g->state.load() == gate::pending)
        pending.push_back(std::move(g));
  }
  for (auto& g : pending)
    if (which(*g))
      resolve_gate(*g, &why);
}

void device_core::cancel_unanswerable_waits() {
  // A local wait opens only if its owner drains too. An owner in another
  // backend, or one already gone, may never get there: joining behind it
  // could block forever. Owners that are stopping too drain (the backend
  // asks every device to stop before it cancels anything).
  static const std::string why = "the wait was cancelled at shutdown";
  cancel_gates(
    [](const gate& g) {
      if (g.remote)
        return true;
      auto o = g.owner.lock();
      return !o || !o->stopping();
    },
    why);
}

void device_core::cancel_remote_waits(const std::string& why) {
  cancel_gates([](const gate& g) { return g.remote; }, why);
}

} // namespace multidev::detail
