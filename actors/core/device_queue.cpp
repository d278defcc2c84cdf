// The submission path (submission.hpp), the producer side of a device's
// queue: appending, backpressure, flow control for producers that must not
// block, and waking the runner. Its waits: device_gates.cpp.
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
[[gnu::always_inline]] inline uint64_t work_submission::enqueue(std::function<void()>&& work,
                                                                MakeExtra&& make_extra,
                                                                bool may_wait) {
  auto& c = core();
  return c.queue_.push(may_wait, std::move(work), make_extra,
                       [&c] { c.life_.throw_refusal_locked(); });
}

named_extra* named_extra::make(std::string_view description,
                                                         std::shared_ptr<const void> keep_alive,
                                                         trace_kind kind) {
  if (description.size() > UINT32_MAX)
    throw std::length_error("a task description of 4 GiB or more");
  auto* x = new (::operator new(sizeof(named_extra) + description.size()))
    named_extra(std::move(keep_alive), kind, static_cast<uint32_t>(description.size()));
  std::memcpy(reinterpret_cast<char*>(x + 1), description.data(), description.size());
  return x;
}

void named_extra::destroy(named_extra* x) noexcept {
  x->~named_extra();
  ::operator delete(static_cast<void*>(x));
}

void extra_ptr::destroy() noexcept {
  if (auto* n = named())
    named_extra::destroy(n);
  else
    delete order_or_wait();
}

extra_ptr work_submission::append_text(std::string& text, std::string_view description,
                                      trace_kind kind) {
  auto offset = text.size();
  if (description.size() > extra_ptr::max_text ||
      offset + description.size() > extra_ptr::max_text_end) [[unlikely]]
    return {};
  text.append(description);
  return extra_ptr::text(offset, description.size(), kind);
}

uint64_t work_submission::push_order(const order& o, trace_kind kind, std::string_view label,
                                     std::shared_ptr<const void> hold) {
  auto [work, extra] = order_entry(o, kind, label, std::move(hold));
  return enqueue(std::move(work), [&](std::string&) { return extra_ptr{std::move(extra)}; },
                 false);
}

std::pair<std::function<void()>, std::unique_ptr<item_extra>>
work_submission::order_entry(const order& o, trace_kind kind, std::string_view label,
                             std::shared_ptr<const void> hold) {
  auto& c = core();
  auto extra = c.extras_.take();
  extra->keep_alive = std::move(hold);
  extra->op = o;
  extra->kind = kind; // the description is unused
  extra->node_label.assign(label);
  // The closure holds the order by address (the item owns it, and moving the
  // item moves only the pointer): two pointers fit std::function's own room,
  // where the order's values would take an allocation of their own.
  auto work = [kind, drv = c.driver_.get(), op = &extra->op]() -> std::function<void()> {
    if (kind == trace_kind::copy)
      return [drv, op] { drv->copy(op->dst, op->src, op->bytes); };
    if (kind == trace_kind::memset)
      return [drv, op] { drv->zero(op->dst, op->bytes); };
    return {};
  };
  return {work(), std::move(extra)};
}

extra_ptr work_submission::described_extra(std::string& text, std::string_view description,
                                          trace_kind kind) {
  if (auto e = append_text(text, description, kind)) [[likely]]
    return e;
  // The queue's text is full (1 TiB): an allocation of its own.
  return extra_ptr{named_extra::make(description, nullptr, kind)};
}

std::unique_ptr<item_extra> work_submission::wait_extra(std::shared_ptr<gate> g) {
  // A wait's extra is reused, as an order's is (see extra_cache).
  auto extra = core().extras_.take();
  extra->keep_alive.reset();
  extra->op.what = ""; // not an order
  extra->g = std::move(g);
  extra->kind = trace_kind::gate;
  return extra;
}

uint64_t work_submission::enqueue_wait(std::shared_ptr<gate> g) {
  auto extra = wait_extra(std::move(g));
  // A wait never waits for room: will_wait_for returns at once, and an
  // actor handler must not block.
  return enqueue(nullptr, [&](std::string&) { return extra_ptr{std::move(extra)}; }, false);
}

uint64_t work_submission::push(task&& t, bool may_wait) {
  // A bare closure, the common case, carries nothing else: no extra.
  if (t.description.empty() && !t.keep_alive && t.kind == trace_kind::task) [[likely]]
    return enqueue(std::move(t.work), [](std::string&) { return extra_ptr{}; }, may_wait);
  // A described task: its text goes into the queue's (see extra_ptr),
  // unless it holds a value (released as it resolves) or its text is too
  // long to place there; then it takes a named_extra, freed if the push
  // throws.
  extra_ptr named;
  if (t.keep_alive || t.description.size() > extra_ptr::max_text) [[unlikely]]
    named = extra_ptr{named_extra::make(t.description, std::move(t.keep_alive), t.kind)};
  return enqueue(
    std::move(t.work),
    [&](std::string& text) {
      if (named)
        return std::move(named);
      return described_extra(text, t.description, t.kind);
    },
    may_wait);
}

void device_life::throw_if_failed() const {
  std::lock_guard guard{queue_.mutex()};
  if (queue_.failed_locked())
    throw refusal_locked();
}

void device_life::throw_refusal_locked() const {
  throw refusal_locked();
}

device_error device_life::refusal_locked() const {
  if (killed_)
    return device_error(name_, fmt::format("{}; no new work is accepted",
                                           error_ ? error_->message : "killed"));
  if (queue_.failed_locked()) {
    // The cause as it is: the device refuses work until `recover`.
    return error_ ? device_error(error_) : device_error(name_, "failed");
  }
  return device_error(name_, "device is shut down; no new work is accepted");
}

void work_submission::wait_for_room() {
  core().queue_.wait_for_room();
}

bool work_submission::has_room() const noexcept {
  return core().queue_.has_room();
}

bool work_submission::notify_when_room(std::function<void()> cb) {
  return core().queue_.notify_when_room(std::move(cb));
}

} // namespace multidev::detail
