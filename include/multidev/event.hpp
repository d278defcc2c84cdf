#pragma once
/// \file
/// `event`: a point in one device's schedule (OCANNL's `event`), as a value
/// that can live anywhere: the device's global key and a seq. Also
/// `device_key` and `node_ref`, which make up the key.

#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>

#include "multidev/fwd.hpp"
#include "multidev/sexp.hpp"

namespace multidev {

namespace detail {
struct event_access; // the runtime's own access to an event's parts
} // namespace detail

/// Which node (one actor system; a process, usually) a device lives on: the
/// text of its system's CAF node id (`"<host hash>#<pid>"`), interned in a
/// process-wide table, so copying and comparing one is a pointer copy and
/// compare; the text travels when a key is serialized. The default refers to
/// no node (empty text). (A "node" here is a place, not a tensor node.)
class node_ref {
public:
  node_ref() noexcept = default;
  /// Interns `text` (an empty `text` gives the empty name).
  explicit node_ref(std::string_view text);

  /// The node id's text; empty for the default name.
  const std::string& str() const noexcept;
  /// Whether this is the default, empty name.
  bool empty() const noexcept { return text_ == nullptr; }

  /// Equal when the texts are (a pointer compare).
  friend bool operator==(node_ref x, node_ref y) noexcept { return x.text_ == y.text_; }
  /// By text, so that the order is the same in every process.
  friend std::strong_ordering operator<=>(node_ref x, node_ref y) noexcept;

private:
  const std::string* text_ = nullptr; // interned, never freed
};

/// The node's text (`none` for the default).
std::ostream& operator<<(std::ostream& os, node_ref n);

/// A device's global key: the node it lives on and its device id there.
/// Device ids are unique per process, so a key names one device (one runner:
/// the devices `make_device` adds on a runner share its key) everywhere.
struct device_key {
  /// The node the device lives on.
  node_ref node;
  /// The device's id on that node.
  uint32_t device_id = 0;
  /// Member-wise equality.
  friend bool operator==(const device_key&, const device_key&) = default;
  /// Ordered by node, then device id.
  friend std::strong_ordering operator<=>(const device_key&, const device_key&) = default;
};

/// `(device_key (node <node>) (device_id <id>))`.
sexp to_sexp(const device_key& k);
/// `to_sexp(k)`, printed.
std::ostream& operator<<(std::ostream& os, const device_key& k);

/// A point in one device's schedule: done once that device's runner has
/// finished everything scheduled up to and including `seq()`. A value:
/// `(key, seq)` says which event it is, and events compare, hash and
/// serialize (`inspect` in `multidev/protocol.hpp`) by that pair alone. It
/// also caches how to reach its device (the device's endpoint: its core for a
/// device of this process, the device's actor for a device of another), so
/// the local fast path costs what it did before keys existed. Waiting on an
/// event never spins.
///
/// An event received from another process (deserialized) is resolved through
/// this process's registry of devices: the local devices, and the remote
/// devices some backend attached (`attach_device`). One whose device is in
/// neither still prints and compares; waiting on it throws
/// `std::invalid_argument`.
class event {
public:
  /// An event that is already done (seq 0 of no device).
  event() = default;
  /// Seq `seq` of the device `key` names, resolved through the registry.
  event(const device_key& key, uint64_t seq);
  /// Seq `seq` of `r`'s schedule (e.g. a seq a device actor replied with).
  event(const runner& r, uint64_t seq);
  /// Seq `seq` of the device `ep` reaches (internal).
  event(std::shared_ptr<detail::endpoint> ep, uint64_t seq);

  /// Never waits for the device; a failed event is not done. On an event of
  /// another process's device, a round trip to its actor unless the event is
  /// already known to be done.
  bool is_done() const;
  /// Whether the event can never complete because its device failed or shut
  /// down before reaching it (a round trip for another process's device).
  bool is_failed() const;
  /// Blocks the calling thread until done. Throws `device_error` when the event
  /// failed, `deadlock_error` when called from a task of the same device on an
  /// event still ahead of it.
  void sync() const;
  /// `sync` that gives up at `deadline`: throws `timeout_error`, whose
  /// message gives the chain of waits that holds the event (`"cpu:2 waits on
  /// event 17 of cpu:0, which is running its seq 4"`). The event is not
  /// affected. Throws as `sync` does otherwise.
  void sync(std::chrono::steady_clock::time_point deadline) const;

  /// The event's place in its device's schedule.
  uint64_t seq() const noexcept { return seq_; }
  /// The device the event belongs to.
  const device_key& key() const noexcept { return key_; }
  /// The owning device's name; empty for the default (done) event.
  std::string device_name() const;
  /// Whether the device lives in this process (its core is at hand).
  bool is_local() const noexcept;
  /// The local device's core; null for the default event and for devices of
  /// other processes.
  const std::shared_ptr<detail::device_core>& core() const noexcept;
  /// How the device is reached; null for the default event and for an event
  /// whose device this process does not know.
  std::shared_ptr<detail::endpoint> endpoint() const;

  /// Equal when key and seq are.
  friend bool operator==(const event& x, const event& y) noexcept {
    return x.seq_ == y.seq_ && x.key_ == y.key_;
  }
  /// Ordered by key, then seq.
  friend std::strong_ordering operator<=>(const event& x, const event& y) noexcept {
    if (auto c = x.key_ <=> y.key_; c != 0)
      return c;
    return x.seq_ <=> y.seq_;
  }

private:
  friend struct detail::event_access;
  device_key key_;
  uint64_t seq_ = 0;
  std::shared_ptr<detail::endpoint> ep_; // cached; null when unresolved
};

/// `(event (device <name>) (node <node>) (device_id <id>) (seq <n>) (state
/// done|failed|pending|unknown))`; `unknown` for an event of another
/// process's device not yet known to be done (printing never makes a round
/// trip).
sexp to_sexp(const event& e);
/// `to_sexp(e)`, printed.
std::ostream& operator<<(std::ostream& os, const event& e);

} // namespace multidev

/// \cond std_hash
// Events, keys and node names hash (`std::unordered_map<event, ...>`). Left
// out of the API reference: Doxygen cannot place specializations of `std::hash`.
template <>
struct std::hash<multidev::node_ref> {
  std::size_t operator()(multidev::node_ref n) const noexcept {
    return std::hash<const void*>{}(n.empty() ? nullptr : &n.str());
  }
};

template <>
struct std::hash<multidev::device_key> {
  std::size_t operator()(const multidev::device_key& k) const noexcept {
    return std::hash<multidev::node_ref>{}(k.node) * 31 + k.device_id;
  }
};

template <>
struct std::hash<multidev::event> {
  std::size_t operator()(const multidev::event& e) const noexcept {
    auto h = std::hash<multidev::device_key>{}(e.key());
    return h ^ (std::hash<uint64_t>{}(e.seq()) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  }
};
/// \endcond
