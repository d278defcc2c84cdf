#pragma once
/// \file
/// `event`: a point in one device's schedule (OCANNL's `event`).

#include <cstdint>
#include <memory>
#include <string>

#include "multidev/fwd.hpp"
#include "multidev/sexp.hpp"

namespace multidev {

/// A point in one device's schedule: done once that device's runner has
/// finished everything scheduled up to and including `seq()`. Copyable handle
/// (like a Realm event); waiting on it never spins.
class event {
public:
  /// An event that is already done (seq 0 of no device).
  event() = default;
  event(std::shared_ptr<detail::device_core> core, uint64_t seq);

  /// Never blocks. A failed event is not done.
  bool is_done() const;
  /// Whether the event can never complete because its device failed or shut
  /// down before reaching it.
  bool is_failed() const;
  /// Blocks the calling thread until done. Throws `device_error` when the event
  /// failed, `deadlock_error` when called from a task of the same device on an
  /// event still ahead of it.
  void sync() const;

  uint64_t seq() const noexcept { return seq_; }
  /// The owning device's name; empty for the default (done) event.
  std::string device_name() const;
  const std::shared_ptr<detail::device_core>& core() const noexcept { return core_; }

private:
  std::shared_ptr<detail::device_core> core_;
  uint64_t seq_ = 0;
};

sexp to_sexp(const event& e);

} // namespace multidev
