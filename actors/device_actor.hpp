#pragma once
/// \file
/// Spawning the actor that owns a device core (its runner, events, pools),
/// and the actor's private messages, which stay off the public protocol.

#include <cstdint>
#include <functional>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include <caf/atom.hpp>
#include <caf/node_id.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/core/device_core.hpp"
#include "actors/remote/message_checks.hpp"
#include "multidev/protocol.hpp"

namespace caf {
class actor_system;
}

namespace multidev::detail {

/// Internal messages a device actor sends itself from other threads. They
/// carry the actor's key, a random number only the actor and its core know,
/// so a message forged through `actor_cast` is dropped. (A `wait` needs
/// none: the runner that resolves the awaited seq sends the reply itself.)
namespace internal_atoms {
/// `(key)`: the runner made room in a full queue.
using room_atom = caf::atom_constant<caf::atom("room")>;
} // namespace internal_atoms

/// The device actor's full interface: the public protocol plus the internal
/// messages. Only the backend and the actor itself hold this handle; users
/// get the public `device_actor` it converts to.
using device_actor_full = device_actor::extend<caf::reacts_to<internal_atoms::room_atom, uint64_t>>;

/// What a device actor tells about its device (`identify`), besides what
/// its core knows.
struct device_identity {
  uint32_t device_id = 0;
  std::string driver;
};

/// Who may send a session's device actors messages (issue 38 point 1): its
/// node (`home`), the session's client, and the other nodes the client
/// vouched for (`trust`). A message from anyone else is dropped as it is
/// enqueued (a request gets an error reply): a peer that guessed or was
/// handed a device actor's id reaches nothing. Anonymous messages are let
/// in only when enqueued outside an execution unit (a local `anon_send`,
/// `anon_send_exit`, a runner's `room`); CAF's BASP enqueues the anonymous
/// messages of other nodes with one.
struct peer_guard {
  caf::node_id home;
  caf::node_id client;
  /// Whether `n` may send messages: home and client without a lock.
  bool admits(const caf::node_id& n) const;
  /// Admits `n` too; throws `std::invalid_argument` for the invalid node id
  /// or past `wire_limits::vouched_nodes` nodes (message_checks.hpp).
  void vouch(const caf::node_id& n);
  /// The devices' name prefix for the refusals, e.g. "session 3 of node b".
  std::string who;
  /// The session's memory quota in bytes (issue 38 point 2; 0: none), and
  /// what its devices' pools hold now: an `alloc` that would take the
  /// session past the quota is refused, naming the session, the request and
  /// the limit. Two devices of one session allocating at once may both
  /// pass: the quota is exceeded by at most one allocation per device,
  /// and a recorded round's part (its `alloc_pool` steps, made by the node
  /// actor while the devices' actors may allocate).
  std::size_t memory_limit = 0;
  /// Counts `core` (a device of the session, made by its backend) in
  /// `used_memory`.
  void count(std::shared_ptr<const device_core> core);
  /// What the pools of the session's devices hold, in bytes.
  std::size_t used_memory() const;
  /// Throws `std::invalid_argument` naming the session, the request and the
  /// limit when allocating pool `id` of `size` bytes would take the session
  /// past its quota (the `alloc` message's check, and a recorded round's
  /// `alloc_pool` step's); nothing without a limit.
  void check_alloc_quota(int id, std::size_t size) const;
  /// Takes `n` bytes of the session's transfers in flight (a read's
  /// buffer, a write's bytes, between the request and its end): at most
  /// `memory_limit` bytes at once besides the pools, so a session holds at
  /// most twice its limit of the node's memory. Throws
  /// `std::invalid_argument` naming the session, `what` and the limit past
  /// it; nothing without a limit. `release_transfer` gives them back.
  void take_transfer(std::size_t n, const char* what) const;
  void release_transfer(std::size_t n) const noexcept;
  /// The `wait`s its devices hold for their requesters: at most
  /// `wire_limits::session_waits` at once (message_checks.hpp).
  wait_budget waits;

private:
  mutable std::mutex mu_;
  mutable std::atomic<std::size_t> in_transit_{0};
  std::vector<caf::node_id> vouched_;
  std::vector<std::weak_ptr<const device_core>> cores_; // the backend owns them
};

/// Fails `g`, a gate queued on `c` waiting on a device of another process
/// named `owner_name`, with `err`: the owner's failure, provenance and all
/// (its devices named as that process names them, in ours), or another
/// error's rendering. (A `depend`'s or a copy's gate, and a recorded
/// round's wait on another node's item: actors/remote/node_rounds.cpp.)
void fail_gate(device_core& c, gate& g, const caf::error& err, caf::actor_system& sys,
               const std::string& owner_name);

/// Spawns the device actor of `core`. The actor answers the protocol of
/// `device_actor`; it does not stop the core when it exits (the backend does).
/// With a `guard`, it drops the messages of the nodes `guard` does not admit.
device_actor spawn_device_actor(caf::actor_system& sys, std::shared_ptr<device_core> core,
                                device_identity id,
                                std::shared_ptr<const peer_guard> guard = nullptr);

} // namespace multidev::detail
