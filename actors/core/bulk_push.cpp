// A bulk push (bulk_push.hpp): one replay's entries on several devices.
#include "actors/core/bulk_push.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "actors/core/device_core.hpp"

namespace multidev::detail {

void bulk_push::wait_for_room(std::span<device_core* const> lanes) {
  for (auto* c : lanes)
    c->wait_for_room();
}

void bulk_push::lock_all(std::span<device_core* const> lanes) {
  for (auto l : order_)
    lanes[l]->queue_.mutex().lock();
}

void bulk_push::unlock_all(std::span<device_core* const> lanes) noexcept {
  for (auto l : order_)
    lanes[l]->queue_.mutex().unlock();
}

void bulk_push::push(std::span<device_core* const> lanes, std::span<const bulk_step> steps,
                     std::span<bulk_task> tasks, std::span<uint64_t> ends,
                     std::span<const std::shared_ptr<gate>> external, bool may_wait) {
  const auto n = steps.size();
  order_.resize(lanes.size());
  for (uint32_t l = 0; l < lanes.size(); ++l)
    order_[l] = l;
  std::sort(order_.begin(), order_.end(),
            [&lanes](uint32_t a, uint32_t b) { return lanes[a] < lanes[b]; });
  count_.assign(lanes.size(), 0);
  wake_.assign(lanes.size(), 0);
  extra_.resize(n);
  gates_.resize(n);
  seqs_.resize(n);
  auto& seqs = seqs_;
  // Outside the locks: what allocates (a wait's gate and extra, a task's
  // named extra). Cleared on every way out.
  struct clear_scratch {
    bulk_push& p;
    ~clear_scratch() {
      for (auto& e : p.extra_)
        e.reset();
      for (auto& g : p.gates_)
        g.reset();
    }
  } clear{*this};
  std::size_t next_external = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& s = steps[i];
    auto& c = *lanes[s.lane];
    if (s.wait_on == bulk_step::external) {
      const auto& g = external[next_external++];
      extra_[i] = extra_ptr{c.wait_extra(g)};
      gates_[i] = g;
    } else if (s.wait_on >= 0) {
      auto g = make_gate();
      g->owner = lanes[steps[static_cast<std::size_t>(s.wait_on)].lane]->weak_from_this();
      g->order_only = s.order_only;
      extra_[i] = extra_ptr{c.wait_extra(g)};
      gates_[i] = std::move(g);
    } else if (auto& t = tasks[i]; t.order) {
      auto [work, extra] = c.order_entry(*t.order, t.kind, {}, std::move(t.keep_alive));
      t.work = std::move(work);
      extra_[i] = extra_ptr{std::move(extra)};
    } else if (t.keep_alive || t.description.size() > extra_ptr::max_text) {
      extra_[i] = extra_ptr{named_extra::make(t.description, std::move(t.keep_alive), t.kind)};
    }
  }
  // The wait steps grouped by lane, in step order (a counting sort): lane
  // `l`'s are `waits_[wait_at_[l] .. wait_at_[l + 1])`.
  wait_at_.assign(lanes.size() + 1, 0);
  for (const auto& st : steps)
    if (st.wait_on != -1)
      ++wait_at_[st.lane + 1];
  for (std::size_t l = 0; l < lanes.size(); ++l)
    wait_at_[l + 1] += wait_at_[l];
  waits_.resize(wait_at_.back());
  fill_.assign(wait_at_.begin(), wait_at_.end() - 1);
  for (std::size_t i = 0; i < n; ++i)
    if (steps[i].wait_on != -1)
      waits_[fill_[steps[i].lane]++] = i;
  if (may_wait)
    wait_for_room(lanes);
  lock_all(lanes);
  std::exception_ptr refused;
  std::size_t appended = 0;
  try {
    for (auto l : order_)
      if (lanes[l]->queue_.failed_locked() || lanes[l]->queue_.stopping_locked())
        lanes[l]->life_.throw_refusal_locked();
    // Every seq first, so a wait's gate is whole before anything is seen.
    for (std::size_t i = 0; i < n; ++i) {
      auto l = steps[i].lane;
      seqs[i] = lanes[l]->queue_.scheduled_locked() + ++count_[l];
    }
    for (std::size_t i = 0; i < n; ++i)
      if (steps[i].wait_on >= 0)
        gates_[i]->owner_seq = seqs[static_cast<std::size_t>(steps[i].wait_on)];
    // The gates into their devices' gate lists, before their entries are
    // visible (as push_gate): shutdown sees them, or this push is refused.
    for (uint32_t l = 0; l < lanes.size(); ++l) {
      if (wait_at_[l] == wait_at_[l + 1])
        continue;
      auto& c = *lanes[l];
      std::lock_guard guard{c.outcomes_.waiters_mutex()};
      for (auto k = wait_at_[l]; k < wait_at_[l + 1]; ++k) {
        auto i = waits_[k];
        c.gates_.add_locked(gates_[i]);
        gates_[i]->seq.store(seqs[i], std::memory_order_relaxed); // listed
      }
    }
    for (std::size_t i = 0; i < n; ++i, ++appended) {
      auto& q = lanes[steps[i].lane]->queue_;
      if (gates_[i]) {
        q.append_locked(std::function<void()>{}, std::move(extra_[i]));
        continue;
      }
      auto& t = tasks[i];
      if (!extra_[i] && (!t.description.empty() || t.kind != trace_kind::task))
        extra_[i] = work_submission::described_extra(q.text_locked(), t.description, t.kind);
      q.append_locked(std::move(t.work), std::move(extra_[i]));
    }
  } catch (...) {
    refused = std::current_exception();
    // Back out what went in: the entries (newest first, per lane), then the
    // gate lists' counts (their weak entries expire with the gates).
    for (std::size_t i = appended; i-- > 0;)
      lanes[steps[i].lane]->queue_.unappend_locked();
  }
  if (refused) {
    for (uint32_t l = 0; l < lanes.size(); ++l) {
      if (wait_at_[l] == wait_at_[l + 1])
        continue;
      auto& c = *lanes[l];
      std::lock_guard guard{c.outcomes_.waiters_mutex()};
      for (auto k = wait_at_[l]; k < wait_at_[l + 1]; ++k)
        if (gates_[waits_[k]]->seq.load() != 0)
          c.gates_.take_back_locked();
    }
    unlock_all(lanes);
    std::rethrow_exception(refused);
  }
  for (uint32_t l = 0; l < lanes.size(); ++l) {
    auto& q = lanes[l]->queue_;
    ends[l] = q.scheduled_locked() + count_[l];
    if (count_[l] != 0)
      wake_[l] = q.publish_locked(count_[l]);
  }
  unlock_all(lanes);
  // Each wait with its owner: the owner's runner may fire it at once (or
  // it is already due, and fires here).
  for (std::size_t i = 0; i < n; ++i) {
    auto& g = gates_[i];
    if (!g || steps[i].wait_on < 0)
      continue; // a task, or an external gate (the caller's to settle)
    auto& c = *lanes[steps[i].lane];
    auto& owner = *lanes[steps[static_cast<std::size_t>(steps[i].wait_on)].lane];
    gate_waiter w{g->owner_seq, g, c.weak_from_this(), &c};
    try {
      owner.events_.when_resolved(std::move(w));
    } catch (...) {
      // Queued: left pending, it would hold this device forever.
      static const std::string reason = "could not register the wait (out of memory)";
      c.resolve_gate(*g, &reason);
    }
  }
  for (uint32_t l = 0; l < lanes.size(); ++l)
    if (wake_[l])
      lanes[l]->queue_.ring_bell();
}

} // namespace multidev::detail
