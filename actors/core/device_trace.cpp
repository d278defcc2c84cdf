// The runner trace of a device core: the records of the items the runner
// resolves (`device_runner::trace_done`, `trace_dropped`), and copying the
// records out for the public API and debug info.
#include "actors/core/device_core.hpp"

#include <algorithm>

#include "actors/backend_impl.hpp"
#include "actors/core/trace.hpp"

namespace multidev::detail {

void device_runner::trace_dropped(const item& it, uint64_t seq) noexcept {
  auto& ring = *core_.trace_;
  trace_ring::entry e{seq, trace_kind::cancel, 0, 0, true, 0};
  if (ring.running()) {
    e.start_ns = ring.running_start_ns();
    e.end_ns = ring.running_end_ns();
  } else {
    e.start_ns = e.end_ns = ring.clock().now_relaxed();
  }
  ring.take_running();
  std::string description;
  try {
    description = "not run: " + task_name(it, seq);
  } catch (...) {
  }
  ring.write(e, description, {});
}

void device_runner::trace_done(uint64_t seq, bool failed) noexcept {
  auto& ring = *core_.trace_;
  if (!ring.running())
    return;
  trace_ring::entry e{seq, trace_kind::task, ring.running_start_ns(), ring.running_end_ns(),
                      failed, 0};
  auto* it = static_cast<const item*>(ring.take_running());
  if (!it->extra) {
    ring.write(e); // a bare closure: the hot path
    return;
  }
  // Out of line, so that a bare closure's path sets up none of this.
  [&]() __attribute__((noinline)) {
    if (it->extra.is_text()) {
      e.kind = it->extra.text_kind();
      ring.write(e, text_of(*it), {});
      return;
    }
    if (auto* n = it->extra.named()) {
      e.kind = n->kind();
      ring.write(e, n->description(), {});
      return;
    }
    auto* g = it->as_gate();
    if (!g) {
      e.kind = it->extra.order_or_wait()->kind;
      std::string description; // an order's, built now
      try {
        description = core_.resolving().description_of(*it);
      } catch (...) {
        // Out of memory: the record goes without its text.
      }
      ring.write(e, description, {});
      return;
    }
    e.kind = trace_kind::gate;
    e.awaited_seq = g->owner_seq;
    std::string awaited, description;
    try {
      auto owner = g->owner.lock();
      awaited = owner ? owner->name() : g->label;
      description = "wait for " + g->what();
    } catch (...) {
      // Out of memory: the record goes without its texts.
    }
    ring.write(e, description, awaited);
  }();
}

device_trace device_inspector::trace() const {
  if (trace_)
    return trace_->snapshot(core_.name());
  device_trace t;
  t.device = core_.name();
  return t;
}

std::string device_inspector::running_description(uint64_t seq) const {
  return trace_ ? trace_->running_text(seq) : std::string{};
}

} // namespace multidev::detail

namespace multidev {

device_trace backend::trace(const device& d) const {
  return detail::record_of(d).ep().trace(); // a device of another process: by message
}

} // namespace multidev
