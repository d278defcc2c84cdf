#pragma once
/// \file
/// A device and its parts: `dev` (the driver's handle), `runner` (its
/// stream), `device` (OCANNL's device record), `buffer_ptr`.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "multidev/event.hpp"
#include "multidev/fwd.hpp"
#include "multidev/sexp.hpp"
#include "multidev/types.hpp"

namespace multidev {

/// The driver's handle of one device (OCANNL's `dev`): which driver, which
/// ordinal. Cheap to copy.
struct dev {
  /// The driver's name (`"cpu"`, `"cuda"`, ...).
  std::string driver;
  /// The device's ordinal in its backend.
  int ordinal = 0;
  /// Member-wise equality.
  friend bool operator==(const dev&, const dev&) = default;
};

/// `(dev (driver ..) (ordinal ..))`.
sexp to_sexp(const dev& d);

/// A device's stream (OCANNL's `runner`): its FIFO work queue and the thread
/// that drains it. A handle; copies refer to the same runner. It reaches its
/// device through an endpoint: the device's core when the device lives in this
/// process, its actor when it lives in another (`attach_device`).
class runner {
public:
  runner() = default;
  /// A runner reached through `ep` (internal).
  explicit runner(std::shared_ptr<detail::endpoint> ep);
  /// Tasks scheduled and not yet finished (including a parked wait); a round
  /// trip to the device's actor when the device lives in another process.
  std::size_t queue_length() const;
  /// The device's global key; the default key for the default runner.
  const device_key& key() const noexcept;
  /// Whether the device lives in this process.
  bool is_local() const noexcept { return core_ != nullptr; }
  /// The device's core when it lives in this process, else null.
  const std::shared_ptr<detail::device_core>& core() const noexcept;
  /// How the device is reached (internal).
  const std::shared_ptr<detail::endpoint>& endpoint() const noexcept { return ep_; }
  /// `core().get()`, without the indirection (the hot path).
  detail::device_core* local_core() const noexcept { return core_; }
  /// Equal when both reach the same device the same way.
  friend bool operator==(const runner& x, const runner& y) { return x.ep_ == y.ep_; }

private:
  std::shared_ptr<detail::endpoint> ep_;
  detail::device_core* core_ = nullptr; // ep_'s core when local
};

/// `(runner (device ..) (queue_length ..))`; for a device of another process
/// `(runner (device ..) (node ..))` (printing makes no round trip); `(runner
/// none)` for the default runner.
sexp to_sexp(const runner& r);

/// The start of a pool's memory as the runner sees it. CPU devices use host
/// memory, so this is a plain pointer.
using buffer_ptr = std::byte*;

/// The address, as an atom.
sexp to_sexp(const buffer_ptr& p);

/// OCANNL's `device` record: a runner plus the bookkeeping that transfers use
/// (writers of nodes, merge buffer, constant cache, pool ids). A handle; copies
/// refer to the same record. The mutable fields are guarded inside.
class device {
public:
  device() = default;
  /// A handle of the record `rec` (internal; `backend::get_device` makes devices).
  explicit device(std::shared_ptr<detail::device_record> rec);

  /// The driver's handle: driver and ordinal.
  const multidev::dev& dev() const;
  /// The device's ordinal in its backend.
  int ordinal() const;
  /// Unique across every backend of the process. For a device of another
  /// process (`attach_device`), its id there: the key says which node.
  int device_id() const;
  /// The device's global key: its node and the device id of its runner there.
  const device_key& key() const;
  /// Whether the device lives in this process; an attached device of another
  /// process is driven by messages to its actor.
  bool is_local() const;
  /// The device's runner (a seq it replied with becomes an event of it).
  const multidev::runner& get_runner() const;
  /// `"<backend name>:<ordinal>:<device_id>"`.
  const std::string& name() const;

  /// Pool 0's base, once a merge buffer was allocated (never for a device
  /// of another process: its memory is not addressable here).
  std::optional<buffer_ptr> merge_buffer() const;
  /// The bytes of the merge buffer; 0 while there is none.
  std::size_t merge_buffer_capacity() const;
  /// The event of the last scheduled work on this device that writes `t`.
  std::optional<event> updating_for(const tnode& t) const;
  /// The node last copied into the merge buffer and that copy's event.
  std::optional<std::pair<tnode, event>> updating_for_merge_buffer() const;
  /// Where this device keeps its read-only copy of `t`, if it has one.
  std::optional<buffer_loc> constant_buffer(const tnode& t) const;
  /// The pool id the next node allocation takes (starts at 1; 0 is the merge buffer).
  int next_pool_id() const;

  /// Whether this is a device (not a default-constructed handle).
  explicit operator bool() const noexcept { return rec_ != nullptr; }
  /// Equal when both refer to the same record.
  friend bool operator==(const device& x, const device& y) { return x.rec_ == y.rec_; }
  /// The record (internal).
  const std::shared_ptr<detail::device_record>& record() const noexcept { return rec_; }

private:
  std::shared_ptr<detail::device_record> rec_;
};

/// `(device (name ..) (dev ..) (device_key ..) (ordinal ..) ...)`: the
/// device, its runner and its bookkeeping (the merge buffer, the writers of
/// nodes, the constant cache, the next pool id); `(device none)` for none.
sexp to_sexp(const device& d);

} // namespace multidev
