#pragma once
/// \file
/// The device actors' protocol: every message that crosses an actor
/// boundary, the typed interface of a device actor, the error values it
/// replies with, the type registration a CAF config needs, and
/// `device_actor_of` to get a device's actor. This is the one header that
/// owns the public protocol; user actors include it to drive devices by
/// message. It includes CAF headers; `<multidev/multidev.hpp>` does not.
///
/// Order between the two paths. A device has two producers of work: host
/// calls on `backend` (which go straight to the device's queue) and messages
/// to its actor (handled in mailbox order). Each path is FIFO on its own;
/// between them, a message's effect is in the queue once its reply has
/// arrived, or once `backend::flush(d)` returns on the thread that sent it.
/// So `anon_send(a, depend_atom, ...)` followed by `schedule_task(d, ...)`
/// needs a `flush(d)` in between for the task to wait behind the dependency.
///
/// Flow control. Messages that add to the device's schedule (`schedule`,
/// `depend`, `alloc`, `free`, `memset`, `all_work`) are handled in order; when
/// the device's queue is full (`backend_options::queue_capacity`) the actor
/// defers them, in order, and replies once the runner has made room. A remote
/// producer therefore cannot grow a queue without bound: it is held back by
/// its replies (use `request`, not `send`, for a bounded number in flight).

#include <cstdint>
#include <string>
#include <variant>

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "multidev/backend.hpp"
#include "multidev/task.hpp"
#include "multidev/types.hpp"

namespace multidev {

/// The atoms of the protocol (CAF 0.17: at most 10 characters each).
namespace atoms {
using schedule_atom = caf::atom_constant<caf::atom("schedule")>;
using wait_atom = caf::atom_constant<caf::atom("wait")>;
using depend_atom = caf::atom_constant<caf::atom("depend")>;
using alloc_atom = caf::atom_constant<caf::atom("alloc")>;
using free_atom = caf::atom_constant<caf::atom("free")>;
using memset_atom = caf::atom_constant<caf::atom("memset")>;
using all_work_atom = caf::atom_constant<caf::atom("all_work")>;
using idle_atom = caf::atom_constant<caf::atom("idle")>;
using memory_atom = caf::atom_constant<caf::atom("memory")>;
using debug_atom = caf::atom_constant<caf::atom("debug")>;
} // namespace atoms

/// A device actor: the owner of one device's runner, events and pools.
/// Replies carry a seq of this device's schedule (an event is `(device, seq)`);
/// failures come back as `caf::error`s of category `multidev` (see `errc`).
/// Every request gets a reply, a value or an error: when the actor stops
/// (its backend is destroyed), requests still waiting get `device_failed`.
using device_actor = caf::typed_actor<
  /// Schedules a named kernel (resolved through the kernel registry here);
  /// replies with its seq.
  caf::replies_to<atoms::schedule_atom, task_spec>::with<uint64_t>,
  /// Replies with `seq` once this device has finished it (at once when it
  /// has); an error if it never will (the device failed or shut down first),
  /// `invalid_argument` at once when `seq` was never scheduled.
  caf::replies_to<atoms::wait_atom, uint64_t>::with<uint64_t>,
  /// Work scheduled here after this message waits until `owner` (a device
  /// actor, local or remote) has finished `seq`; replies with the wait's seq.
  caf::replies_to<atoms::depend_atom, caf::actor, uint64_t>::with<uint64_t>,
  /// Allocates (or replaces) pool `id` with `size` bytes aligned to
  /// `alignment`; `mode` is a `memory_mode` or -1. Replies with used memory.
  caf::replies_to<atoms::alloc_atom, int32_t, uint64_t, uint64_t, int32_t>::with<uint64_t>,
  /// Frees pool `id`, ordered with the work; replies with used memory.
  caf::replies_to<atoms::free_atom, int32_t>::with<uint64_t>,
  /// Zeroes `[offset, offset + size)` of pool `id`; replies with its seq.
  caf::replies_to<atoms::memset_atom, int32_t, uint64_t, uint64_t>::with<uint64_t>,
  /// Replies with the seq of everything scheduled so far (after every
  /// message sent before it: `backend::flush` uses it).
  caf::replies_to<atoms::all_work_atom>::with<uint64_t>,
  /// Replies whether the runner is waiting for work.
  caf::replies_to<atoms::idle_atom>::with<bool>,
  /// Replies with the bytes held by the device's pools.
  caf::replies_to<atoms::memory_atom>::with<uint64_t>,
  /// Replies with the device's debug info, a printed s-expression.
  caf::replies_to<atoms::debug_atom>::with<std::string>>;

/// Error codes of the `multidev` error category. The error's context holds
/// two strings: the device name (may be empty) and the message.
enum class errc : uint8_t {
  /// Bad input: unknown pool or kernel, bad range or alignment.
  invalid_argument = 1,
  /// The device failed or was shut down.
  device_failed = 2,
};

/// The category atom of multidev errors.
constexpr caf::atom_value error_category = caf::atom("multidev");

caf::error make_error(errc code, std::string device, std::string message);

/// Throws the public-edge exception for `err`: `std::invalid_argument` or
/// `device_error` (naming `device` when the error does not).
[[noreturn]] void throw_error(const caf::error& err, const std::string& device);

/// `"<device>: <message>"` for a multidev error, CAF's rendering otherwise.
std::string describe_error(caf::actor_system& sys, const caf::error& err);

/// Registers the protocol's message types on `cfg` (needed before the system
/// starts when devices are driven across processes).
void register_types(caf::actor_system_config& cfg);

// -- inspect overloads: the wire form of the messages' value types ----------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, buffer_loc& x) {
  return f(caf::meta::type_name("buffer_loc"), x.pool_id, x.offset);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, buffer_arg& x) {
  return f(caf::meta::type_name("buffer_arg"), x.loc, x.size_in_bytes);
}

/// A `kernel_arg` travels as a tagged record.
struct wire_arg {
  uint8_t kind = 0; // the variant index
  int64_t integer = 0;
  double real = 0;
  std::string text;
  buffer_arg buffer;
};

wire_arg to_wire(const kernel_arg& x);
kernel_arg from_wire(const wire_arg& w);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_arg& x) {
  return f(caf::meta::type_name("wire_arg"), x.kind, x.integer, x.real, x.text,
           x.buffer);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, task_spec& x) {
  std::vector<wire_arg> args;
  for (const auto& a : x.args)
    args.push_back(to_wire(a));
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x.args.clear();
    for (const auto& w : args)
      x.args.push_back(from_wire(w));
    return caf::none;
  });
  return f(caf::meta::type_name("task_spec"), x.kernel, args, load);
}

/// The actor that owns `d` (a device of `b`); throws `std::invalid_argument`
/// when `d` belongs to another backend.
device_actor device_actor_of(const backend& b, const device& d);

} // namespace multidev
