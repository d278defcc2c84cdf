// The producer side of a device's queue: appending, backpressure, flow
// control for producers that must not block, and waking the runner.
#include "actors/core/device_core.hpp"

#include <fmt/format.h>

#include <cstring>
#include <new>
#include <stdexcept>

namespace multidev::detail {

// Inlined into its callers: a bare closure's push is the hot path, and a
// call of its own cost it ~20 instructions (callgrind, 186 against 165 a
// push).
template <class MakeExtra>
[[gnu::always_inline]] inline uint64_t device_core::enqueue(std::function<void()>&& work,
                                                            MakeExtra&& make_extra,
                                                            bool may_wait) {
  bool wake;
  uint64_t seq;
  {
    std::lock_guard guard{mu_};
    // The vector's size and capacity are each a division (an entry is 40
    // bytes): read once.
    auto n = queue_.size();
    if (may_wait && n >= capacity_) [[unlikely]]
      n = wait_for_room_held(); // returns at once on a runner thread
    if (failed_ || stopping_) [[unlikely]]
      throw_refusal_locked();
    extra_ptr extra = make_extra();
    extras_queued_ += extra.order_or_wait() != nullptr;
    auto cap = queue_.capacity(); // unchanged by this push when n < cap
    // Built in its slot: a closure moved once, not into an item and again.
    queue_.emplace_back(std::move(work), std::move(extra));
    // The next entries' lines were last read by the runner (the buffers swap
    // back and forth): ask for them now, so the transfer overlaps this push.
    if (auto ahead = n + 1 + prefetch_items; ahead < cap)
      prefetch_for_write(queue_.data() + ahead);
    seq = scheduled_.load(std::memory_order_relaxed) + 1;
    scheduled_.store(seq, std::memory_order_release);
    // The runner sets sleeping_ for an empty queue under mu_, so a plain
    // load suffices to skip the read-modify-write on the common path. A
    // runner parked on a wait is left asleep (see sleeping_).
    // Compare-and-swap, not exchange: a runner that woke meanwhile and
    // parked on a wait must keep its on_gate, or the wait's ring is lost.
    auto expected = uint8_t{for_work};
    wake = sleeping_.load(std::memory_order_relaxed) == for_work &&
           sleeping_.compare_exchange_strong(expected, awake);
  }
  if (wake)
    ring_bell();
  return seq;
}

std::unique_ptr<device_core::item_extra> device_core::reused_extra() {
  {
    std::lock_guard guard{spare_mu_};
    if (!spare_.empty()) {
      auto x = std::move(spare_.back());
      spare_.pop_back();
      // The runner read the next one last: ask for the two lines a push
      // writes now, so their transfer overlaps this push, not the next.
      if (!spare_.empty()) {
        auto* next = reinterpret_cast<const char*>(spare_.back().get());
        prefetch_for_write(next);
        prefetch_for_write(next + 64);
      }
      return x;
    }
  }
  return std::make_unique<item_extra>();
}

void device_core::recycle(item& it) noexcept {
  it.work = nullptr; // its closure points into the extra
  // Only what must not outlive the item, and only when set: the other
  // fields stay as they are for the producer to overwrite, their lines
  // untouched here. An order's pool is let go of later, with the other
  // spent orders' (`let_go_of_spent_pools`: at a hand-back, a release, idle).
  if (auto& x = *it.extra.order_or_wait(); x.g)
    x.g.reset(); // a wait's gate goes with the wait
  auto x = it.extra.take_order_or_wait();
  try {
    spent_.push_back(std::move(x));
  } catch (...) {
    // Out of memory: freed instead (x, as it goes).
  }
}

device_core::named_extra* device_core::named_extra::make(std::string_view description,
                                                         std::shared_ptr<const void> keep_alive,
                                                         trace_kind kind) {
  if (description.size() > UINT32_MAX)
    throw std::length_error("a task description of 4 GiB or more");
  auto* x = new (::operator new(sizeof(named_extra) + description.size()))
    named_extra(std::move(keep_alive), kind, static_cast<uint32_t>(description.size()));
  std::memcpy(reinterpret_cast<char*>(x + 1), description.data(), description.size());
  return x;
}

void device_core::named_extra::destroy(named_extra* x) noexcept {
  x->~named_extra();
  ::operator delete(static_cast<void*>(x));
}

void device_core::extra_ptr::destroy() noexcept {
  if (auto* n = named())
    named_extra::destroy(n);
  else
    delete order_or_wait();
}

device_core::extra_ptr device_core::append_text(std::string_view description, trace_kind kind) {
  auto offset = queue_text_.size();
  if (description.size() > extra_ptr::max_text ||
      offset + description.size() > extra_ptr::max_text_end) [[unlikely]]
    return {};
  queue_text_.append(description);
  return extra_ptr::text(offset, description.size(), kind);
}

uint64_t device_core::push_order(const order& o, trace_kind kind, std::string_view label,
                                 std::shared_ptr<const void> hold) {
  auto extra = reused_extra();
  extra->keep_alive = std::move(hold);
  extra->op = o;
  extra->kind = kind; // the description is unused
  extra->node_label.assign(label);
  // The closure holds the order by address (the item owns it, and moving the
  // item moves only the pointer): two pointers fit std::function's own room,
  // where the order's values would take an allocation of their own.
  auto work = [kind, drv = driver_.get(), op = &extra->op]() -> std::function<void()> {
    if (kind == trace_kind::copy)
      return [drv, op] { drv->copy(op->dst, op->src, op->bytes); };
    if (kind == trace_kind::memset)
      return [drv, op] { drv->zero(op->dst, op->bytes); };
    return {};
  };
  return enqueue(work(), [&] { return extra_ptr{std::move(extra)}; }, false);
}

uint64_t device_core::enqueue_wait(std::shared_ptr<gate> g) {
  // A wait's extra is reused, as an order's is (see recycle).
  auto extra = reused_extra();
  extra->keep_alive.reset();
  extra->op.what = ""; // not an order
  extra->g = std::move(g);
  extra->kind = trace_kind::gate;
  // A wait never waits for room: will_wait_for returns at once, and an
  // actor handler must not block.
  return enqueue(nullptr, [&] { return extra_ptr{std::move(extra)}; }, false);
}

uint64_t device_core::push(task&& t, bool may_wait) {
  // A bare closure, the common case, carries nothing else: no extra.
  if (t.description.empty() && !t.keep_alive && t.kind == trace_kind::task) [[likely]]
    return enqueue(std::move(t.work), [] { return extra_ptr{}; }, may_wait);
  // A described task: its text goes into the queue's (see extra_ptr),
  // unless it holds a value (released as it resolves) or its text is too
  // long to place there; then it takes a named_extra, freed if the push
  // throws.
  extra_ptr named;
  if (t.keep_alive || t.description.size() > extra_ptr::max_text) [[unlikely]]
    named = extra_ptr{named_extra::make(t.description, std::move(t.keep_alive), t.kind)};
  return enqueue(
    std::move(t.work),
    [&] {
      if (named)
        return std::move(named);
      if (auto e = append_text(t.description, t.kind)) [[likely]]
        return e;
      // The queue's text is full (1 TiB): an allocation of its own.
      return extra_ptr{named_extra::make(t.description, nullptr, t.kind)};
    },
    may_wait);
}

void device_core::throw_if_failed() const {
  std::lock_guard guard{mu_};
  if (failed_)
    throw refusal_locked();
}

std::size_t device_core::wait_for_room_held() {
  std::unique_lock lk{mu_, std::adopt_lock};
  try {
    wait_for_room_locked(lk);
  } catch (...) {
    lk.release(); // still held: the caller's guard unlocks it
    throw;
  }
  lk.release();
  return queue_.size();
}

void device_core::throw_refusal_locked() const {
  throw refusal_locked();
}

device_error device_core::refusal_locked() const {
  if (killed_)
    return device_error(name_, fmt::format("{}; no new work is accepted",
                                           error_ ? error_->message : "killed"));
  if (failed_) {
    // The cause as it is: the device refuses work until `recover`.
    return error_ ? device_error(error_) : device_error(name_, "failed");
  }
  return device_error(name_, "device is shut down; no new work is accepted");
}

void device_core::wait_for_room_locked(std::unique_lock<spin_mutex>& lk) {
  // Backpressure: wait for room, never drop. Runner threads (of any device)
  // and actor handlers never wait: a runner waiting for room in a queue
  // parked on its own next event, or an actor that must first process the
  // reply opening that queue's gate, would wait forever.
  if (has_room_locked() || current_runner != nullptr) // the common case first
    return;
  while (!has_room_locked()) {
    ++producers_waiting_;
    room_.wait(lk);
    --producers_waiting_;
  }
}

void device_core::wait_for_room() {
  // Without the lock while the last look still vouches for room: a host copy
  // checks room before it takes its records' locks and pushes, and taking
  // mu_ twice took the queue's line from the runner (polling scheduled_
  // beside it) twice.
  if (current_runner != nullptr ||
      scheduled_.load(std::memory_order_relaxed) < room_until_.load(std::memory_order_relaxed))
    return;
  std::unique_lock lk{mu_};
  wait_for_room_locked(lk);
  // Here, not in wait_for_room_locked: a bare push calls that one, and
  // reading taken_ (on the runner's line) there cost every push.
  room_until_.store(taken_ + capacity_, std::memory_order_relaxed);
}

bool device_core::has_room() const noexcept {
  std::lock_guard guard{mu_};
  return has_room_locked();
}

bool device_core::notify_when_room(std::function<void()> cb) {
  std::lock_guard guard{mu_};
  if (has_room_locked())
    return false;
  room_cb_ = std::move(cb);
  return true;
}

void device_core::call_room_callback() noexcept {
  std::function<void()> cb;
  {
    std::lock_guard guard{mu_};
    cb.swap(room_cb_);
  }
  if (cb) {
    try {
      cb();
    } catch (...) {
      // A producer that cannot be told keeps its work deferred; it asks again
      // on its next message.
    }
  }
}

void device_core::ring() {
  // Looks before it writes: a runner that is awake (the common case for a
  // wait opened while its device runs) costs no locked instruction here.
  // Safe against a runner going to sleep: it stores sleeping_ (seq_cst)
  // before it looks at what it waits for, and whoever rings stored that
  // (seq_cst) before this load, so one of the two sees the other.
  if (sleeping_.load(std::memory_order_seq_cst) != awake &&
      sleeping_.exchange(awake, std::memory_order_seq_cst) != awake)
    ring_bell();
}

void device_core::ring_bell() {
  bell_ring(bell_);
}

} // namespace multidev::detail
