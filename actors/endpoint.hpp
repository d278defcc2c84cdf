#pragma once
/// \file
/// How a device is reached: through an endpoint. A `local_endpoint` wraps the
/// device's core in this process (calls go straight to it); a remote endpoint
/// (`endpoint_remote.cpp`) wraps the device actor of another actor system and
/// turns each call into a request, sent in order through one link actor of
/// the attaching backend's system. Every `backend` member that takes a device
/// or an event works through its endpoint; the hot paths (`schedule_task`,
/// `all_work`, a local `will_wait_for`, `sync`/`is_done` on a local event)
/// check `core()` first and skip the virtual call.
///
/// Threads: every member may be called from any thread. A remote endpoint's
/// members that wait for a reply to a request that may be deferred behind a
/// full queue (`schedule_named`, the pool calls, `all_work`, `await`,
/// `flush`) throw `deadlock_error` on a runner thread; the others (events,
/// debug info...) never wait for work, only for the reply; `is_done`,
/// `is_failed`, `state` and `is_idle` wait for nothing (they answer from what
/// this process knows).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <caf/actor_addr.hpp>

#include "actors/wait_graph.hpp"
#include "multidev/event.hpp"
#include "multidev/kernels.hpp"
#include "multidev/protocol.hpp"
#include "multidev/sexp.hpp"
#include "multidev/task.hpp"
#include "multidev/trace.hpp"
#include "multidev/types.hpp"

namespace multidev::detail {

class device_core;

/// One device as seen from this process: its key, its name, and the calls
/// the backend makes on it. Registered in the process-wide registry (by key)
/// for as long as it lives, so that a deserialized event finds it.
class endpoint : public std::enable_shared_from_this<endpoint> {
public:
  /// Called once an awaited seq is resolved: `cause == nullptr` when done,
  /// otherwise why it failed or was cancelled (a device of another process
  /// sends its failure whole, provenance included). Must not block.
  using on_resolved = std::function<void(const failure* cause)>;

  virtual ~endpoint();
  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;

  const device_key& key() const noexcept { return key_; }
  /// The device's name (`"<backend>:<ordinal>:<device_id>"` where it lives).
  const std::string& name() const noexcept { return name_; }
  /// The core when the device lives in this process, else null.
  const std::shared_ptr<device_core>& core() const noexcept { return core_; }

  // -- Events ----------------------------------------------------------------

  /// Whether `seq` is known to be done, without a round trip.
  virtual bool known_done(uint64_t seq) const noexcept = 0;
  virtual bool is_done(uint64_t seq) = 0;
  virtual bool is_failed(uint64_t seq) = 0;
  virtual event_state state(uint64_t seq) = 0;
  virtual void sync(uint64_t seq) = 0;
  /// `sync` that gives up at `deadline` with a `timeout_error` saying why.
  virtual void sync_until(uint64_t seq, std::chrono::steady_clock::time_point deadline) = 0;
  /// Calls `cb` once `seq` is resolved; never blocks. An invalid
  /// `seq` (never scheduled) is an error given to `cb` for a remote device,
  /// `std::invalid_argument` thrown here for a local one.
  virtual void when_done(uint64_t seq, on_resolved cb) = 0;

  // -- Work ------------------------------------------------------------------

  virtual uint64_t schedule_named(const task_spec& spec) = 0;
  /// `specs` in order; a spec that does not fit schedules none of them.
  virtual std::vector<uint64_t> schedule_batch(std::span<const task_spec> specs) = 0;
  virtual uint64_t all_work() = 0;
  virtual void await() = 0;
  /// `await` that gives up at `deadline` with a `timeout_error` saying why.
  virtual void await_until(std::chrono::steady_clock::time_point deadline) = 0;
  virtual bool is_idle() = 0;
  virtual std::size_t queue_length() = 0;
  /// Returns once every message sent to the device's actor before it was
  /// handled (see `backend::flush`).
  virtual void flush() = 0;
  /// Work scheduled on this device after this call starts only after
  /// `owner`'s `seq`. `owner` is another device and `seq` not known done (the
  /// caller, `wait_for`, has checked). Returns at once.
  virtual void depend(endpoint& owner, uint64_t seq) = 0;
  /// Copies `size` bytes of `source`'s pool `source_pool` at `source_offset`
  /// into this device's pool `pool` at `offset`, straight from `source`'s
  /// process to this device's: the write is queued here now (after the work
  /// before it; the work after it comes after it) and `source` reads after
  /// its work so far. Returns the write's seq, without waiting for the
  /// bytes. Only between devices of other processes, two different ones
  /// (see `copies_directly`); `std::invalid_argument` otherwise.
  virtual uint64_t copy_from(endpoint& source, int source_pool, std::size_t source_offset,
                             int pool, std::size_t offset, std::size_t size);
  /// Whether `copy_from(source, ...)` works here: both devices live in other
  /// processes and are not the same device.
  virtual bool copies_directly(const endpoint& source) const {
    (void)source;
    return false;
  }
  /// Why the device can no longer be reached (its node is gone), if so.
  virtual std::optional<std::string> gone() const { return std::nullopt; }
  /// Why no new call can reach the device now: it is gone, or its
  /// connection dropped and its session's keeper has not yet declared the
  /// node lost (calls made now are held, then fail with that verdict).
  virtual std::optional<std::string> unreachable() const { return gone(); }
  /// `backend::cancel`: drops the work queued and not yet started.
  virtual void cancel() = 0;
  /// `backend::recover`: brings a failed device back.
  virtual bool recover() = 0;

  // -- Pools, properties -----------------------------------------------------

  virtual void alloc_pool(int id, std::size_t size, std::size_t alignment,
                          std::optional<memory_mode> mode) = 0;
  virtual void free_pool(int id) = 0;
  virtual uint64_t memset_zero(int id, std::size_t offset, std::size_t size) = 0;
  /// Writes `bytes` into pool `id` at `offset`, ordered with the work;
  /// returns its seq (a transfer between processes).
  virtual uint64_t write_bytes(int id, std::size_t offset, std::string bytes) = 0;
  /// Reads `size` bytes of pool `id` at `offset` after the work scheduled
  /// before it; blocks until they are read (throws `device_error` when the
  /// read fails).
  virtual std::string read_bytes(int id, std::size_t offset, std::size_t size) = 0;
  virtual std::size_t used_memory() = 0;
  virtual sexp debug_info() = 0;
  /// `backend::trace`: a copy of the runner trace.
  virtual device_trace trace() = 0;
  /// The last result a kernel wrote under `name` on the board of the device's
  /// backend.
  virtual std::optional<kernel_result> result(const std::string& name) = 0;
  /// The device's actor; an invalid handle once it is gone.
  virtual device_actor actor() const = 0;

  // -- Diagnosis -------------------------------------------------------------

  /// Why `seq` is not done, asked of the device's process and waited for at
  /// most until `deadline` (a silent device says so). Only for a device of
  /// another process; this one says it cannot tell.
  virtual chain_step why(uint64_t seq, std::chrono::steady_clock::time_point deadline);
  /// Asks for `debug_info` now; the function returned waits for it at most
  /// until `deadline` (a device of another process that does not answer by
  /// then is listed as silent, for how long). This one asks when called.
  virtual std::function<sexp()> debug_info_until(std::chrono::steady_clock::time_point deadline);

protected:
  endpoint(device_key key, std::string name, std::shared_ptr<device_core> core);

private:
  device_key key_;
  std::string name_;
  std::shared_ptr<device_core> core_;
};

/// The endpoint of a device of this process: `core`, whose actor is `actor`
/// (held weakly: an event kept past its backend must not keep an actor).
/// Registered under `key`.
std::shared_ptr<endpoint> make_local_endpoint(device_key key,
                                              std::shared_ptr<device_core> core,
                                              caf::actor_addr actor);

/// `will_wait_for` in all four directions: work scheduled on `waiting` after
/// this call starts after `owner`'s `seq`. A no-op when `owner` is `waiting`
/// or the seq is known done. Local on local: a gate the owner's core opens;
/// local on remote: a gate the reply to a `wait` request opens; remote on
/// anything: a `depend` message to the waiting device's actor naming the
/// owner's actor. Never blocks.
void wait_for(endpoint& waiting, endpoint& owner, uint64_t seq);

/// The live endpoint registered under `key`, preferring a local one; null
/// when none.
std::shared_ptr<endpoint> find_endpoint(const device_key& key);

/// The live endpoint whose device's actor is `actor`, preferring a local
/// one; null when none (a scan of the registry: for diagnosis only).
std::shared_ptr<endpoint> find_endpoint_of(const caf::actor_addr& actor);

/// Adds `ep` to the registry (endpoints leave it when destroyed).
void register_endpoint(const std::shared_ptr<endpoint>& ep);

} // namespace multidev::detail
