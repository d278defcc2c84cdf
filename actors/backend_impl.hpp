#pragma once
/// \file
/// The state behind `multidev::backend`: the actor system, the driver, the
/// memoized devices with their actors, and the device records' bookkeeping.

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string_view>
#include <memory>
#include <mutex>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/core/device_core.hpp"
#include "actors/endpoint.hpp"
#include "multidev/protocol.hpp"
#include "multidev/backend.hpp"

namespace multidev::detail {

struct peer_guard; // actors/device_actor.hpp
struct host_rounds; // actors/remote/node_rounds.hpp
struct round_state; // actors/round_state.hpp

/// OCANNL's device record: identity plus the transfer bookkeeping, guarded by
/// `mu`. Holds no strong actor handle, so a user keeping a `device` past the
/// backend's life cannot keep the actor system from stopping. The runner
/// holds the device's endpoint: its core for a device of this process, its
/// actor for one of another process (`attach_device`).
struct device_record {
  multidev::dev dv;
  int ordinal = 0;
  int device_id = 0;
  multidev::runner r;
  std::string name;

  /// A transfer (`backend::run`) holds it, and the source record's for a
  /// copy (both taken with `std::lock`), from computing its waits to
  /// recording itself, so transfers of a node are serial; it never waits
  /// for room in a queue while holding it. The public getters lock it.
  /// A spin lock (it yields after a short spin): every host copy and `run`
  /// takes it for a few map updates and a push.
  mutable spin_mutex mu;
  /// Last scheduled writer of each node on this device.
  std::map<tnode, event> updating_for;
  /// Copies running on other devices that read this device's buffer of a
  /// node: a later writer of the node here waits for them.
  std::map<tnode, std::vector<event>> readers;
  std::optional<std::pair<tnode, event>> updating_for_merge_buffer;
  std::map<tnode, buffer_loc> constant_buffer_cache;
  std::size_t merge_buffer_capacity = 0;
  int next_pool_id = 1;

  /// The core of a device of this process; `std::invalid_argument` for a
  /// device of another process (see `local_core`).
  device_core& core() const;
  endpoint& ep() const { return *r.endpoint(); }
};

/// Throws `std::invalid_argument`: `what` cannot work on `rec`, a device of
/// another process; `instead` says what to use.
[[noreturn]] void refuse_remote(const device_record& rec, std::string_view what,
                                std::string_view instead);

/// `rec`'s core, or `refuse_remote(rec, what, instead)`. C strings, measured
/// only on refusal: this is on every host copy's path, where two `strlen`s
/// were ~100 of its instructions.
inline device_core& local_core(const device_record& rec, const char* what,
                               const char* instead) {
  if (auto* c = rec.r.local_core())
    return *c;
  refuse_remote(rec, what, instead);
}

/// A number no other backend of the process has (`backend_impl::id`).
uint64_t next_backend_id() noexcept;

struct backend_impl {
  /// Unique in the process, unlike the address: a round is replayed only
  /// by the backend that recorded it (`round_state::backend_id`).
  uint64_t id = next_backend_id();
  backend_options opts;
  std::unique_ptr<caf::actor_system_config> own_cfg;
  std::unique_ptr<caf::actor_system> own_sys;
  caf::actor_system* sys = nullptr;
  std::shared_ptr<driver> drv;
  std::shared_ptr<result_board> results = std::make_shared<result_board>();

  /// This backend's node: its actor system's node id, interned.
  node_ref node;

  /// A session's backend (actors/remote/node.cpp): the lease its devices' runners
  /// check before each item (`device_core::set_lease`), and what their
  /// items cancelled past it say. Null for every other backend; set before
  /// the first `get_device`.
  std::shared_ptr<std::atomic<int64_t>> lease;
  std::string lease_why;
  /// A session's backend: who may send its device actors messages (its
  /// client and the nodes it vouches for); null for every other backend.
  /// Set before the first `get_device`.
  std::shared_ptr<peer_guard> guard;

  mutable std::mutex mu;
  std::vector<device> devices;            // by ordinal; empty until first use
  std::map<const device_core*, device_actor> actor_of; // every device made here
  std::vector<device> made;               // make_device results, for shutdown
  std::map<device_key, device> attached;  // attach_device results, by key
  std::map<device_key, caf::actor> links; // their link actors, stopped at shutdown
  /// The node actors that serve this backend's devices (`spawn_node_actor`),
  /// stopped at shutdown: one left running would hold its actor system
  /// (a backend's own: ~backend) forever. Weak: the backend keeps none alive.
  std::vector<caf::actor_addr> node_actors;
  /// This process's parts of rounds that run on nodes too, once one was
  /// replayed (`host_rounds_of`); closed at shutdown, after the devices.
  std::shared_ptr<host_rounds> here_rounds;

  /// The rounds replayed here whose tasks may still read them (see
  /// `keep_for_replays` in actors/round_state.hpp), under `rounds_mu`.
  std::mutex rounds_mu;
  std::vector<std::shared_ptr<const round_state>> replayed_rounds;

  /// A node attached with `attach_node`: its devices take the ordinals after
  /// the local ones, in attachment order; attaching a node of the same name
  /// again (restarted) gives its new devices the same ordinals.
  struct attached_node {
    std::string name;
    std::string address;
    std::vector<device> devices;
    /// The node's identity (its node id and start epoch) and its session
    /// (docs/design.md, "Sessions"); session 0: a node without sessions.
    std::string identity;
    uint64_t session = 0;
    /// The session's keeper (actors/remote/node.cpp): renews its lease, declares
    /// the node lost; null once it stopped.
    caf::actor keeper;
    /// The node's actor, which the client vouches for its other nodes to
    /// (`trust`), so their devices may wait and copy between them.
    caf::actor node;
    /// Set by the keeper once the session ended (lost, detached): the node
    /// may be attached again.
    std::shared_ptr<std::atomic<bool>> ended = std::make_shared<std::atomic<bool>>(false);
    /// How many times a node of this name attached with another identity
    /// (restarted): its devices are named `<name>@<n>/` from the second.
    int incarnation = 1;
  };
  std::vector<attached_node> nodes;
  /// The devices of `nodes`, by ordinal minus the local device count.
  std::vector<device> node_devices;

  /// Where the backend's trace goes when it is destroyed (`MULTIDEV_TRACE`,
  /// see `trace_file_from_environment`); empty: nowhere.
  std::string trace_file;
  /// For that file: the attached devices' traces, read as the teardown
  /// begins (before their links close), by key.
  std::map<device_key, device_trace> last_remote_traces;
  bool remote_traces_read = false;
  /// Reads `last_remote_traces` once, when there is a trace file and this
  /// thread may wait for replies (not one the teardown waits for).
  void read_remote_traces() noexcept;
  /// Writes the trace file, if any, from the local devices' traces and
  /// `last_remote_traces`; what goes wrong is said on stderr.
  void write_trace_file() noexcept;

  /// `d`'s endpoint; throws `std::invalid_argument` when the device does not
  /// belong to this backend (made or attached here).
  endpoint& endpoint_of(const device& d) const;

  /// The actor that owns `d` (for an attached device, the remote actor);
  /// throws `std::invalid_argument` when the device does not belong to this
  /// backend.
  device_actor actor_for(const device& d) const;

  /// `a` as a device of this backend (see `attach_device`); `prefix`
  /// ("<node>/") goes in front of its name, so errors name its node.
  /// `fresh`, when given, tells whether this call attached it (false: it
  /// was made or attached here before).
  /// `session` and `timeout`: see `attach_remote`.
  device attach(const device_actor& a, const std::string& prefix = {}, bool* fresh = nullptr,
                bool session = false,
                std::optional<std::chrono::nanoseconds> timeout = std::nullopt);

  /// Undoes the `attach` that attached `d` fresh: forgets it and stops its
  /// link, so its calls fail (an `attach_node` that fails part way).
  void detach(const device& d);

  /// Stops accepting work and cuts what leaves the backend (the first
  /// phases of `shutdown`); waits for nothing, so any thread may call it.
  void stop_accepting();
  /// The whole teardown of the backend's devices and actors (docs/design.md,
  /// "Shutdown"): joins the runners, so it must not run on one of them.
  void shutdown();
  /// Whether tearing the backend down would wait for the calling thread: a
  /// runner (or a driver's stream thread) of one of its devices, or a thread
  /// of its own actor system (a CAF worker running a user's handler).
  bool teardown_waits_for_this_thread() const;
};

/// `MULTIDEV_TRACE`, for a backend made with `opts`: when it names a file
/// and `opts.trace_capacity` is 0 (no explicit trace settings), turns
/// tracing on (65,536 records a device) and returns the file's path for
/// this backend (`%p`: the process id; the second backend of the process
/// given the same value gets `.1` before the extension, the third `.2`...),
/// made empty now so that an
/// unwritable path is found at once: then a message on stderr, no tracing,
/// and an empty return. Never throws.
std::string trace_file_from_environment(backend_options& opts) noexcept;

/// Tears `impl` down (shutdown, then the actor system it owns) on this
/// thread, or, when that would wait for this thread, on the reaper's
/// (actors/reaper.hpp) after stopping its devices from accepting work.
void destroy(std::unique_ptr<backend_impl> impl) noexcept;

/// Marks the threads of an actor system made with it, so that
/// `teardown_waits_for_this_thread` knows them (CAF 0.17 says nothing of
/// which system a thread belongs to).
void mark_system_threads(caf::actor_system_config& cfg);

/// `d`'s record; throws `std::invalid_argument` for a default-constructed device.
device_record& record_of(const device& d);

} // namespace multidev::detail
