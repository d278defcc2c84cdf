// Waits for other devices' events: gates in the queue, how they are
// pushed, resolved and cancelled.
#include "actors/core/device_core.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include "actors/core/spin.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define MULTIDEV_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define MULTIDEV_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define MULTIDEV_POISON(p, n) ((void)(p), (void)(n))
#define MULTIDEV_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace multidev::detail {

namespace {
/// A cause for a failed gate whose real cause could not be copied; made at
/// load time, since it stands in when memory runs out.
const std::shared_ptr<const failure> unknown_cause_ = std::make_shared<const failure>(
  failure{failure::kind::failed, {}, {}, 0, "failed (its cause could not be recorded)", {}});
const std::shared_ptr<const failure>& unknown_cause() {
  return unknown_cause_;
}

/// Freed blocks of `Size` bytes, kept for the next allocation of that size.
/// A host scheduling waits allocates a gate for each, and the gates are
/// freed elsewhere or in bulk (when `gates_` is pruned): glibc served those
/// from its slow path, never from its per-thread cache (callgrind, a
/// prebuilt chain: ~290 instructions a gate, a fifth of a `will_wait_for`).
/// Process-wide, under a spin lock; at most `max_blocks` kept. Never
/// destroyed: a gate may be freed during static destruction. Under
/// AddressSanitizer a kept block is poisoned, so a use after free still
/// reports.
template <std::size_t Size>
class block_cache {
public:
  static block_cache& get() {
    static auto* cache = new block_cache;
    return *cache;
  }
  void* take() {
    {
      std::lock_guard guard{mu_};
      if (!free_.empty()) {
        auto* p = free_.back();
        free_.pop_back();
        MULTIDEV_UNPOISON(p, Size);
        return p;
      }
    }
    return ::operator new(Size);
  }
  void give(void* p) noexcept {
    {
      std::lock_guard guard{mu_};
      if (free_.size() < free_.capacity()) { // reserved: never allocates
        MULTIDEV_POISON(p, Size);
        free_.push_back(p);
        return;
      }
    }
    ::operator delete(p, Size);
  }

private:
  static constexpr std::size_t max_blocks = 1024;
  block_cache() {
    try {
      free_.reserve(max_blocks);
    } catch (...) {
      // Out of memory: no cache; every block is freed.
    }
  }
  spin_mutex mu_;
  std::vector<void*> free_;
};

/// Allocates single objects (the block `allocate_shared` makes: a gate and
/// its reference counts) from the `block_cache` of their size.
template <class T>
struct gate_allocator {
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
  gate_allocator() = default;
  template <class U>
  gate_allocator(const gate_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n != 1)
      return std::allocator<T>{}.allocate(n);
    return static_cast<T*>(block_cache<sizeof(T)>::get().take());
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n != 1)
      std::allocator<T>{}.deallocate(p, n);
    else
      block_cache<sizeof(T)>::get().give(p);
  }
  template <class U>
  bool operator==(const gate_allocator<U>&) const noexcept {
    return true;
  }
};
} // namespace

std::shared_ptr<gate> make_gate() {
  return std::allocate_shared<gate>(gate_allocator<gate>{});
}

const std::shared_ptr<const failure>& unknown_gate_cause() noexcept {
  return unknown_cause();
}

bool work_submission::push_wait(const std::shared_ptr<device_core>& owner, uint64_t seq,
                                wait_kind kind) {
  auto& c = core();
  if (owner.get() == &c || owner->outcomes().is_done(seq))
    return false;
  // An ordering-only wait on an item that failed or was cancelled: nothing
  // to wait for.
  if (kind == wait_kind::order && seq <= owner->outcomes().finished())
    return false;
  if (auto s = owner->queue().scheduled(); seq > s)
    throw std::invalid_argument(fmt::format(
      "will_wait_for: seq {} was never scheduled on {} (it has scheduled {} so far); a wait "
      "on work not yet scheduled could close a cycle of waits, so it is refused",
      seq, owner->name(), s));
  auto g = make_gate();
  g->owner = owner;
  g->owner_seq = seq;
  g->order_only = kind == wait_kind::order;
  push_gate(g);
  // Two references: the queue entry's and the owner's waiter. `g` moves
  // into the waiter rather than being copied, and the waiter into the
  // owner's list: a host scheduling waits took five locked instructions on
  // the gate's count a wait where one does.
  gate_waiter w{seq, std::move(g), c.weak_from_this(), &c};
  // The gate may open at once, on this thread, or later on owner's runner.
  try {
    owner->events_.when_resolved(std::move(w));
  } catch (...) {
    // The gate is queued: left pending, it would hold this device forever.
    // `w` still holds it (`when_resolved` moves from it only once stored).
    static const std::string reason = "could not register the wait (out of memory)";
    c.resolve_gate(*w.g, &reason);
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

void work_submission::push_gate(const std::shared_ptr<gate>& g) {
  auto& c = core();
  {
    // Registered before the push: `shutdown` stops the queue before it collects
    // these, so a gate is either collected (and maybe cancelled) or refused.
    std::lock_guard guard{c.outcomes_.waiters_mutex()};
    c.gates_.add_locked(g);
  }
  try {
    g->seq = enqueue_wait(g);
  } catch (...) {
    std::lock_guard guard{c.outcomes_.waiters_mutex()};
    c.gates_.take_back_locked();
    throw;
  }
}

std::vector<std::shared_ptr<gate>> device_inspector::pending_gates(const gate** parked) const {
  std::vector<std::shared_ptr<gate>> out;
  std::lock_guard guard{core_.outcomes().waiters_mutex()};
  out.reserve(gates_.size_locked());
  // A failed gate the runner has not reached yet is still a wait (it will
  // fail this device); one it has passed is history.
  auto passed = core_.outcomes().finished();
  gates_.find_locked([&](std::shared_ptr<gate> g) {
    if (g->state.load() != gate::open) {
      auto at = g->seq.load();
      if (at == 0 || at > passed)
        out.push_back(std::move(g));
    }
    return false;
  });
  if (parked)
    *parked = gates_.parked_on(std::memory_order_acquire);
  return out;
}

std::string gate::owner_label() const {
  if (!owner_name.empty())
    return owner_name;
  if (auto o = owner.lock())
    return o->name();
  return label.empty() ? std::string{"a device gone"} : label;
}

bool gate::settle(const std::shared_ptr<const failure>& why) noexcept {
  // `resolving` makes the first resolution win and publishes the cause
  // before the final state; the runner only acts on open or failed.
  // Opening publishes nothing else: one compare-and-swap.
  int expected = gate::pending;
  if (!state.compare_exchange_strong(expected, why ? gate::resolving : gate::open))
    return false;
  if (why) {
    cause = why;
    state.store(gate::failed, std::memory_order_seq_cst);
  }
  return true;
}

std::shared_ptr<const failure> gate::owner_failure(const std::string& message) const noexcept {
  // A message only (a CAF error rendered, a cancellation): the awaited
  // device is its origin.
  try {
    auto f = std::make_shared<failure>();
    f->device = owner_label();
    f->message = message;
    if (f->message.starts_with(f->device + ": "))
      f->message.erase(0, f->device.size() + 2);
    return f;
  } catch (...) {
    return unknown_cause();
  }
}

void device_core::resolve_gate(gate& g, const failure_ptr& cause) noexcept {
  if (g.settle(cause))
    queue_.ring();
}

void device_core::resolve_gate(gate& g, const std::string* error) noexcept {
  resolve_gate(g, error ? g.owner_failure(*error) : failure_ptr{});
}

void device_life::cancel_gates(bool (*which)(const gate&), const std::string& why) {
  // Candidates are copied out first and judged without the lock: judging may
  // take the last reference to an owner core, whose destructor joins its
  // runner, which may be inside our when_done, waiting for this very lock.
  std::vector<std::shared_ptr<gate>> pending;
  {
    std::lock_guard guard{outcomes_.waiters_mutex()};
    gates_.find_locked([&](std::shared_ptr<gate> g) {
      if (g->state.load() == gate::pending)
        pending.push_back(std::move(g));
      return false;
    });
  }
  for (auto& g : pending)
    if (which(*g) && g->settle(g->owner_failure(why)))
      queue_.ring();
}

void device_life::cancel_unanswerable_waits() {
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
      return !o || !o->life().stopping();
    },
    why);
}

void device_life::cancel_remote_waits(const std::string& why) {
  cancel_gates([](const gate& g) { return g.remote; }, why);
}

} // namespace multidev::detail
