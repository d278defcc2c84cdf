#pragma once
/// \file
/// The endpoint of a device of another actor system (another process,
/// usually): every call becomes a request to the device's actor.
///
/// All requests to one remote device but `wait` go through one *link* actor
/// spawned on the attaching backend's system, so the device's actor handles
/// them in the order of the calls, whichever host thread made them (CAF orders messages
/// per sender and receiver): a `will_wait_for` on a remote context, which
/// sends `depend` and returns at once, is handled before the
/// `schedule_named` that follows it. A host thread that needs the reply
/// waits on an atomic until the link delivers it. The link monitors the
/// device's actor: when it goes down (its node vanished, its backend was
/// destroyed), every pending and later call fails with `device_error`
/// instead of waiting forever. The backend stops the link when it is
/// destroyed, with the same effect. A `wait` (`when_done`) goes from the
/// link's reply sink instead (reply_sink.hpp), its reply handled on the
/// thread that delivers it; the link closes the sink when it closes.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>

#include "actors/endpoint.hpp"
#include "actors/remote/reply_sink.hpp"
#include "multidev/protocol.hpp"

namespace caf {
class actor_system;
}

namespace multidev::detail {

/// A device of another actor system attached to a backend.
struct remote_device {
  std::shared_ptr<endpoint> ep;
  /// The link actor (see above); the backend stops it at shutdown.
  caf::actor link;
  std::string driver;
  int ordinal = 0;
};

/// Spawns a link actor on `sys` for `target`, asks the device who it is (a
/// blocking round trip from this thread) and registers its endpoint. Throws
/// `device_error` when `target` does not answer; the link is stopped then.
/// `trace_capacity` > 0 (the attaching backend traces): the endpoint keeps
/// that many host spans (host threads' waits on the device, its loss) for
/// its `trace`.
/// `session`: the device is a node session's (actors/remote/node.cpp): when its
/// actor goes down, its calls wait until the session's keeper sends the link
/// `(lost, why)`, which fails them all (a node keeps running a session's work
/// until its lease ends). `timeout`: for the round trip (default: the query
/// timeout).
remote_device attach_remote(caf::actor_system& sys, const device_actor& target,
                            const std::string& prefix = {}, std::size_t trace_capacity = 0,
                            bool session = false,
                            std::optional<std::chrono::nanoseconds> timeout = std::nullopt);

/// Tells `ep`, a device of a node attached at `host:port`, where its node
/// listens: a device of another node made to wait on it, or to copy from it,
/// connects there so that their messages and bytes go straight between the
/// two nodes. No effect on a device of this process.
void set_node_address(endpoint& ep, const std::string& host, uint16_t port);

/// What the calls to a node's device wait for after a replay of a recorded
/// round there (actors/round.cpp): the node's reply to it. The node, not the
/// device's actor, pushes the replay, so a call sent before that reply
/// could be queued ahead of the replay's entries.
struct replay_fence {
  virtual ~replay_fence() = default;
  /// Blocks until the reply (or its error) is in.
  virtual void wait() const = 0;
};

/// Waits until the requests that add work posted to `ep` without waiting
/// for their reply (`depend`, a copy's `copy_to`) are answered, so that a
/// replay on `ep`'s node comes after them. No-op for a device of this
/// process.
void settle_async(endpoint& ep);
/// The calls to `ep` wait for `f` before they are sent (null: none). No-op
/// for a device of this process.
void set_fence(endpoint& ep, std::shared_ptr<const replay_fence> f);
/// Sends `msg` as a request to `node` (its node's actor) from `ep`'s link's
/// reply sink, `h` getting the reply or the link's error when it closes;
/// false when `ep` is not a device of another process or its link closed.
bool request_node(endpoint& ep, const caf::actor& node, caf::message msg,
                  reply_sink::handler h);
/// When `ep`'s link closes (its node lost), node actor `waiting` hears
/// `(lost, session, lost, why)`: the recorded rounds of the client's session
/// `session` there wait on node actor `lost` (`ep`'s node), and a route
/// through this process breaks without either node hearing it. False when
/// `ep` is not a device of another process or its link closed already.
bool watch_for_rounds(endpoint& ep, const caf::actor& waiting, uint64_t session,
                      const caf::actor& lost);
/// The same for this process's part of the rounds (`host_rounds`, `key`):
/// `here` is called (on the link's actor) with the reason, once; a call,
/// not a message, so that no other process can fake it.
bool watch_for_rounds_here(endpoint& ep, const void* key, const caf::actor& lost,
                           std::function<void(const std::string&)> here);
/// Where `ep`'s node listens, as this process attached it (empty host: not
/// known, or a device of this process).
std::pair<std::string, uint16_t> node_address(const endpoint& ep);

/// How long a request to a device of another actor system that changes
/// nothing there (`is_idle`, `queue_length`, a status, debug info, a trace,
/// a result, used memory, `identify`) waits for its reply before it fails;
/// 5 minutes unless set, for the whole process. A request that changes the
/// device (schedules, allocates, writes, reads, waits, cancels, recovers)
/// has no timeout: it fails only when its link closes. Tests shorten it.
void set_query_timeout(std::chrono::milliseconds timeout);

/// This process as another one names it in a `depend`: `"<host>:<pid>"`
/// (a device of this process goes as `"<host>:<pid>/<name>"`).
const std::string& this_process();

/// `name`, a device as the process of the device named `from` here names it
/// (`from`: `"b/multidev_cpu:0:1"` for a node's device, `"<host>:<pid>/..."`
/// for one a `depend` named, a bare name for a device attached alone), as
/// this process names it: a name without a node (no '/') is of that process
/// and gets `from`'s node in front; a name with this process's own
/// `"<host>:<pid>/"` in front (a device of ours, named so by another process)
/// loses it.
void to_our_name(std::string& name, const std::string& from);

/// `to_our_name` on every device a failure names (origin and path), so that
/// its provenance reads right in the process it reached: received from a
/// node `b` that got it from node `a`, the origin is `a/...`, not `b/...`.
void to_our_names(failure& f, const std::string& from);

/// Why the calls of a link stopped by its backend fail.
inline constexpr const char* link_closed_at_shutdown =
  "the backend that attached it was shut down";

} // namespace multidev::detail
