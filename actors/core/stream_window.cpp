// An asynchronous driver's flight window (stream_window.hpp): placing items,
// the stream's side (running and reporting them), and resolving them in seq
// order through the device.
#include "actors/core/stream_window.hpp"

#include <mutex>

#include "actors/core/device_core.hpp"
#include "actors/core/trace.hpp"

namespace multidev::detail {

void stream_window::attach(std::unique_ptr<stream> s, std::size_t max_in_flight) {
  if (!s)
    return;
  size_ = max_in_flight == 0 ? 1 : max_in_flight;
  flights_ = std::make_unique<flight[]>(size_);
  stream_ = std::move(s);
}

void stream_window::start(item&& it, int64_t parked_ns, bool gate_on_device) {
  auto seq = started_.load(std::memory_order_relaxed) + 1;
  auto& f = flights_[seq % size_];
  f.it = std::move(it);
  f.seq = seq;
  f.skipped_on_stream = false;
  f.threw_on_stream = false;
  f.began_on_stream = false;
  f.error = nullptr;
  if (clock_) [[unlikely]] {
    f.start_ns = parked_ns != 0 ? parked_ns : clock_->now();
    f.end_ns = 0;
  }
  f.kind = f.it.as_gate() ? flight::gate : flight::task;
  if (seq <= outcomes_.dropped_upto(std::memory_order_acquire))
    f.kind = flight::dropped;
  bool submit = f.kind == flight::task && f.it.work;
  // Settled here unless submitted (or a gate ordered on the device, settled
  // when it ends). Published (with the slot) by started_.
  f.state.store(submit                                       ? flight::flying
                : gate_on_device && f.kind == flight::gate ? flight::gated
                                                           : flight::ran,
                std::memory_order_relaxed);
  started_.store(seq, std::memory_order_seq_cst);
  if (!submit)
    return;
  try {
    stream_->submit(seq, [this, fp = &f] { run_on_stream(*fp); });
  } catch (...) {
    // Not submitted (the driver refused it, or memory ran out): it fails.
    f.error = std::current_exception();
    f.state.store(flight::threw, std::memory_order_seq_cst);
  }
}

bool stream_window::resolve_settled() noexcept {
  bool any = false;
  while (settle_gated()) {
    retire_ready();
    any = true;
  }
  if (retirable()) {
    retire_ready();
    any = true;
  }
  return any;
}

void stream_window::run_on_stream(flight& f) {
  // Progress is read before the watermark: once the failed item is
  // resolved, the watermark it raised covers everything submitted before.
  auto failed_at = stream_failed_at_.load(std::memory_order_seq_cst);
  bool behind_failure = failed_at != 0 && f.seq > failed_at &&
                        outcomes_.progress_now() < failed_at;
  if (behind_failure || f.seq <= outcomes_.dropped_upto(std::memory_order_seq_cst)) {
    f.skipped_on_stream = true;
    return;
  }
  current_runner = device_;
  current_item = f.seq;
  f.began_on_stream = true;
  if (clock_) [[unlikely]]
    f.start_ns = clock_->now(); // the device takes it up
  try {
    f.it.work();
  } catch (...) {
    f.error = std::current_exception();
    f.threw_on_stream = true;
    stream_failed_at_.store(f.seq, std::memory_order_seq_cst);
  }
}

void stream_window::completed(uint64_t seq, std::exception_ptr error) noexcept {
  auto& f = flights_[seq % size_];
  if (clock_) [[unlikely]] {
    f.end_ns = clock_->now_relaxed();
    if (!f.began_on_stream)
      f.start_ns = f.end_ns;
  }
  if (error && !f.error)
    f.error = std::move(error);
  auto st = f.skipped_on_stream ? flight::skipped : f.error ? flight::threw : flight::ran;
  f.state.store(st, std::memory_order_seq_cst);
  retire_ready();
  owner_.window_changed(); // the window has room, or the runner resolves what is left
}

void stream_window::retire_ready() noexcept {
  std::lock_guard guard{retire_mu_};
  while (retirable()) {
    auto& f = flights_[(retired_.load(std::memory_order_relaxed) + 1) % size_];
    retire(f);
    retired_.store(f.seq, std::memory_order_seq_cst); // frees the slot
  }
}

void stream_window::retire(flight& f) noexcept {
  auto seq = f.seq;
  auto state = f.state.load(std::memory_order_acquire);
  switch (f.kind) {
  case flight::dropped:
    owner_.resolve_flight(f, verdict::dropped);
    break;
  case flight::gate: {
    auto& g = *f.it.as_gate();
    if (g.state.load() != gate::open && seq <= outcomes_.dropped_upto(std::memory_order_seq_cst)) {
      owner_.resolve_flight(f, verdict::dropped); // counts the gate off
      break;
    }
    if (g.state.load() == gate::failed) {
      owner_.resolve_flight(f, verdict::failed);
      failed_behind_ = started_.load(std::memory_order_seq_cst);
      break;
    }
    owner_.resolve_flight(f, verdict::done);
    break;
  }
  case flight::task:
    if (state == flight::threw && (f.threw_on_stream || seq > failed_behind_)) {
      owner_.resolve_flight(f, verdict::failed);
      // What was submitted behind it may have run, but is never done.
      failed_behind_ = started_.load(std::memory_order_seq_cst);
    } else if (state != flight::ran || seq <= failed_behind_) {
      owner_.resolve_flight(f, verdict::dropped); // skipped, or ran behind a failure
    } else {
      owner_.resolve_flight(f, verdict::done);
    }
    break;
  }
  f.it = item{};
  f.error = nullptr;
}

} // namespace multidev::detail
