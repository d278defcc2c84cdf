#pragma once
/// \file
/// A wait in a device's queue for another device's event.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "multidev/types.hpp"

namespace multidev::detail {

class device_core;
class endpoint;

/// What a wait on another device's event carries besides its order.
enum class wait_kind : unsigned char {
  /// A data dependency (a read-after-write, a user's `will_wait_for`): the
  /// awaited event's failure fails the waiting device.
  data,
  /// Ordering only (a write-after-read: a writer waits for the copies still
  /// reading the bytes it overwrites): the wait ends however the awaited
  /// event resolves. A reader that failed, was cancelled or was killed
  /// reads no more, so its failure does not reach the writer.
  order,
};

/// A point in a device's queue that opens when another device's event is done
/// (or fails, which poisons the device when the runner reaches it, unless
/// the wait is ordering only).
struct gate {
  /// Opening is one compare-and-swap `pending -> open`. A failure holds
  /// `resolving` between the compare-and-swap that makes it win and the
  /// store of `failed`, after its cause (no throwing in between).
  enum state_t : int { pending = 0, open = 1, failed = 2, resolving = 3 };
  std::atomic<int> state{pending};
  /// Its place in the device's schedule; 0 until it is queued (the wait
  /// graph reads it from other threads).
  std::atomic<uint64_t> seq{0};
  /// The awaited event: `owner` and `owner_seq` for a local wait (formatted
  /// only when needed), `label` otherwise.
  std::weak_ptr<device_core> owner;
  uint64_t owner_seq = 0;
  std::string label;
  /// Whether a CAF reply opens it (the owner lives behind an actor).
  bool remote = false;
  /// An ordering-only wait (`wait_kind::order`): it opens however the
  /// awaited event resolves, done, failed or cancelled.
  bool order_only = false;
  /// The awaited device's name when it lives behind an actor (empty: ask
  /// `owner`, or use the label).
  std::string owner_name;
  /// For a remote wait: how the awaited device is reached, so the wait graph
  /// can say whether its node is lost (may be empty).
  std::weak_ptr<endpoint> remote_owner;
  /// `"<owner> seq <n>"`, or the label. Never throws: falls back to a fixed
  /// text when formatting fails.
  std::string what() const noexcept;
  /// The awaited device's name, as a failure's path records it.
  std::string owner_label() const;
  /// Opens (`cause == nullptr`) or fails the gate; the first resolution
  /// wins. Whether this call resolved it: the caller then rings the runner
  /// of the device it is queued on. Never throws.
  bool settle(const std::shared_ptr<const failure>& cause) noexcept;
  /// A failure of the awaited device with `message` only (a CAF error's
  /// rendering, a cancellation), its leading `"<owner>: "` taken off.
  /// Never throws (a fixed cause when out of memory).
  std::shared_ptr<const failure> owner_failure(const std::string& message) const noexcept;
  /// Why the awaited event did not complete; written before `state`
  /// becomes `failed` (null when even that could not be made).
  std::shared_ptr<const failure> cause;
};

/// A new gate. Its memory (the gate with its reference counts) comes from a
/// process-wide cache of gates freed before (see device_gates.cpp).
std::shared_ptr<gate> make_gate();

/// The cause of a failed gate whose real cause could not be copied (out of
/// memory); made at load time (see device_gates.cpp).
const std::shared_ptr<const failure>& unknown_gate_cause() noexcept;

} // namespace multidev::detail
