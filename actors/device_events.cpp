// Progress and waiters: what is done, who is told, and blocking syncs.
#include "actors/device_core.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace multidev::detail {

void device_core::fail_waiters(const char* fallback) noexcept {
  static const std::string unformatted =
    "device failed (its reason could not be formatted: out of memory)";
  std::string err;
  try {
    err = fmt::format("{}: {}", name_, error().value_or(fallback));
  } catch (...) {
    fire(UINT64_MAX, &unformatted);
    return;
  }
  fire(UINT64_MAX, &err);
}

uint64_t device_core::finished() const noexcept {
  return progress_.load(std::memory_order_acquire) & ~fail_bit;
}

bool device_core::failed_now() const noexcept {
  return (progress_.load(std::memory_order_acquire) & fail_bit) != 0;
}

bool device_core::is_done(uint64_t seq) const noexcept {
  return (progress_.load(std::memory_order_acquire) & ~fail_bit) >= seq;
}

bool device_core::is_failed(uint64_t seq) const noexcept {
  auto p = progress_.load(std::memory_order_acquire);
  return (p & fail_bit) != 0 && (p & ~fail_bit) < seq;
}

void device_core::check_scheduled(uint64_t seq, const char* what) const {
  auto s = scheduled();
  if (seq > s)
    throw std::invalid_argument(fmt::format(
      "{}: seq {} was never scheduled on {} (it has scheduled {} so far)", what, seq,
      name_, s));
}

void device_core::invoke(waiter& w, const std::string* error) noexcept {
  try {
    w(error);
  } catch (...) {
    // A waiter's own failure is its business: the others still fire.
  }
}

void device_core::fire(uint64_t upto, const std::string* error) noexcept {
  // The due waiters' nodes move to a local map: no allocation, so nothing
  // can throw half-way and strand a waiter.
  std::multimap<uint64_t, waiter> due;
  {
    std::lock_guard guard{waiters_mu_};
    auto end = upto == UINT64_MAX ? waiters_.end() : waiters_.upper_bound(upto);
    while (waiters_.begin() != end)
      due.insert(waiters_.extract(waiters_.begin()));
    min_waiter_.store(waiters_.empty() ? UINT64_MAX : waiters_.begin()->first,
                      std::memory_order_seq_cst);
  }
  // A seq at or below progress is done, forever, for every observer: even
  // when this fires because the device failed, the waiters of seqs that
  // finished before the failure (a waiter that registered while `complete`
  // was looking the other way) are told done.
  auto finished_now = finished();
  for (auto& [seq, w] : due)
    invoke(w, seq <= finished_now ? nullptr : error);
}

void device_core::add_waiter_unchecked(uint64_t seq, waiter w) {
  std::lock_guard guard{waiters_mu_};
  waiters_.emplace(seq, std::move(w));
  min_waiter_.store(waiters_.begin()->first, std::memory_order_seq_cst);
}

void device_core::when_done(uint64_t seq, waiter w) {
  {
    std::unique_lock guard{waiters_mu_};
    auto p = progress_.load(std::memory_order_seq_cst);
    if ((p & ~fail_bit) < seq && (p & fail_bit) == 0 && !closed_) {
      waiters_.emplace(seq, std::move(w));
      min_waiter_.store(waiters_.begin()->first, std::memory_order_seq_cst);
      // Re-check: the runner may have advanced between our load and store
      // without seeing the new minimum. Either it fires us, or we fire here.
      p = progress_.load(std::memory_order_seq_cst);
      guard.unlock();
      if (p & fail_bit)
        fail_waiters("failed");
      else if (p >= seq)
        fire(p, nullptr);
      return;
    }
  }
  if ((progress_.load() & ~fail_bit) >= seq) {
    invoke(w, nullptr);
  } else {
    auto err = fmt::format("{}: {}", name_, error().value_or("device is shut down"));
    invoke(w, &err);
  }
}

void device_core::sync(uint64_t seq) {
  if (is_done(seq))
    return;
  check_scheduled(seq, "sync");
  if (current_runner == this && !is_failed(seq))
    throw deadlock_error(fmt::format(
      "sync on {} seq {} from a task of the same device, which has finished "
      "only up to seq {}: waiting would deadlock",
      name_, seq, finished()));
  if (!is_failed(seq)) {
    // Shared: the waiter may still be notifying after we saw the value.
    struct signal {
      std::atomic<uint32_t> flag{0};
      std::string reason; // written before flag becomes 2
    };
    auto sig = std::make_shared<signal>();
    when_done(seq, [sig](const std::string* error) {
      if (error)
        sig->reason = *error;
      sig->flag.store(error ? 2 : 1);
      sig->flag.notify_one();
    });
    uint32_t v;
    while ((v = sig->flag.load()) == 0)
      sig->flag.wait(0);
    if (v == 1 || is_done(seq))
      return;
    throw device_error(name_, reason_of(sig->reason));
  }
  if (is_done(seq))
    return;
  throw device_error(name_, error().value_or("device is shut down"));
}

std::string device_core::reason_of(std::string_view error) const {
  if (error.starts_with(name_) && error.substr(name_.size()).starts_with(": "))
    error.remove_prefix(name_.size() + 2);
  return std::string{error};
}

std::optional<std::string> device_core::error() const {
  std::lock_guard guard{mu_};
  if (failed_)
    return error_;
  return std::nullopt;
}

void device_core::check() const {
  if (auto e = error())
    throw device_error(name_, *e);
}

} // namespace multidev::detail
