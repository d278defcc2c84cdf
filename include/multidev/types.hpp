#pragma once
/// \file
/// Plain value types of the interface: tensor nodes, buffer locations,
/// context buffers, hardware limits, and the public error types. No CAF.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "multidev/sexp.hpp"

namespace multidev {

/// How a tensor node's memory is used (OCANNL's `Tnode.memory_mode`).
enum class memory_mode : uint8_t {
  effectively_constant, ///< Read-only after initialization; cacheable per device.
  virtual_,             ///< Computed inline, never stored.
  never_virtual,        ///< Must be stored, placement undecided.
  local,                ///< Lives inside one routine.
  device_only,          ///< Stored on devices, never on the host.
  on_device,            ///< Stored on devices, host copy on demand.
  materialized,         ///< Stored on devices and on the host.
};

/// The name as printed in sexps and scenarios (e.g. `"on_device"`).
std::string to_string(memory_mode m);

/// Parses a name printed by `to_string`; `std::nullopt` when unknown.
std::optional<memory_mode> memory_mode_from_string(const std::string& s);

/// The name as an atom (`on_device`).
sexp to_sexp(memory_mode m);

/// A tensor node's identity: the unit that contexts map to buffers and that
/// transfers move. Nodes compare by `id` alone.
struct tnode {
  /// The node's identity: nodes compare by it alone.
  int id = 0;
  /// A name for messages and printing.
  std::string label;
  /// The bytes of the node's buffer.
  std::size_t size_in_bytes = 0;
  /// How the node's memory is used.
  memory_mode mode = memory_mode::on_device;

  /// Equal when the ids are.
  friend bool operator==(const tnode& x, const tnode& y) { return x.id == y.id; }
  /// Ordered by id.
  friend auto operator<=>(const tnode& x, const tnode& y) { return x.id <=> y.id; }
};

/// `(tnode (id ..) (label ..) (size ..) (mode ..))`.
sexp to_sexp(const tnode& t);

/// A position inside one device's pool table: `base(pool_id) + offset`.
struct buffer_loc {
  /// The pool, in the device's pool table (0 is the merge buffer).
  int pool_id = 0;
  /// Bytes from the pool's start.
  std::size_t offset = 0;
  /// Member-wise equality.
  friend bool operator==(const buffer_loc&, const buffer_loc&) = default;
};

/// `(buffer_loc (pool_id ..) (offset ..))`.
sexp to_sexp(const buffer_loc& b);

/// Which tensor nodes a context holds, and where.
using ctx_buffers = std::map<tnode, buffer_loc>;

/// `(ctx_buffers ((tnode ..) (buffer_loc ..)) ...)`.
sexp to_sexp(const ctx_buffers& b);

/// Optimization settings a context was compiled with (OCANNL's
/// `Low_level.optimize_ctx`); carried along, opaque to the scheduler.
struct optimize_ctx {
  /// The settings, as OCANNL gave them.
  sexp computations = sexp::list();
  /// Member-wise equality.
  friend bool operator==(const optimize_ctx&, const optimize_ctx&) = default;
};

/// `(optimize_ctx <computations>)`.
sexp to_sexp(const optimize_ctx& o);

/// Conservative per-workgroup limits: the minimum across a backend's devices;
/// all empty for backends that do not bind hardware axes (CPU).
struct hardware_limits {
  /// Threads in one block (CUDA `maxThreadsPerBlock`).
  std::optional<int> max_threads_per_block;
  /// A block's x dimension (CUDA `maxThreadsDim[0]`).
  std::optional<int> max_block_dim_x;
  /// A grid's x dimension (CUDA `maxGridSize[0]`).
  std::optional<int> max_grid_dim_x;
  /// Bytes of shared memory in one block (CUDA `sharedMemPerBlock`).
  std::optional<int> shared_memory_per_block;
  /// Member-wise equality.
  friend bool operator==(const hardware_limits&, const hardware_limits&) = default;
};

/// `(hardware_limits (max_threads_per_block ..) ...)`; `none` for an empty limit.
sexp to_sexp(const hardware_limits& h);

/// One step of a failure's way to an observer: `waiter` waited for `device`'s
/// `seq`, which did not complete.
struct failure_hop {
  /// The device that waited (`"<name>:<ordinal>:<id>"`).
  std::string waiter;
  /// The device it waited for.
  std::string device;
  /// The seq of that device's schedule it waited for.
  uint64_t seq = 0;
  /// Member-wise equality.
  friend bool operator==(const failure_hop&, const failure_hop&) = default;
};

/// Why an event did not complete, and where that started (its provenance).
/// Shared and immutable once made: every event it resolves points to it.
struct failure {
  /// What happened at the origin.
  enum class kind : uint8_t {
    failed,    ///< A task threw, or the device failed or was killed.
    cancelled, ///< The work was cancelled before it started.
  };
  /// Whether the origin failed or was cancelled.
  kind origin_kind = kind::failed;
  /// The device where it started (`"<name>:<ordinal>:<id>"`).
  std::string device;
  /// The task there, as described (`step 3`; `task#7` when nameless); empty when the
  /// device itself failed (killed, shut down) rather than one of its tasks.
  std::string task;
  /// The origin's seq (0 when none).
  uint64_t seq = 0;
  /// The original message (`what()` of the exception a task threw).
  std::string message;
  /// The devices it travelled through, the observer's side first: `path[0]`
  /// waited for `path[1].waiter`'s event, and so on down to the origin.
  std::vector<failure_hop> path;

  /// `"cpu:2 waited for cpu:1 seq 7, which waited for cpu:0 seq 3: task
  /// 'step 3' failed: boom"`; without a path, `"cpu:0: task 'step 3' failed:
  /// boom"`.
  std::string describe() const;
  /// The same, without the leading name of the device it is about.
  std::string describe_reason() const;
  /// The device it is about: the first waiter, or the origin.
  const std::string& about() const noexcept {
    return path.empty() ? device : path.front().waiter;
  }
  /// Whether the observed event itself was cancelled (not one it waited for).
  bool is_cancellation() const noexcept {
    return origin_kind == kind::cancelled && path.empty();
  }
};

/// How an event ended, or that it has not yet.
enum class event_state : uint8_t { pending, done, failed, cancelled };

/// The name: `"pending"`, `"done"`, `"failed"` or `"cancelled"`.
std::string to_string(event_state s);

/// A device failed (a task threw, a device it waited on failed, it was shut
/// down or killed). `what()` names the device and gives the original message;
/// `cause()` says where it started and which devices it travelled through.
class device_error : public std::runtime_error {
public:
  /// A failure that started at `device_name` (`"<name>:<ordinal>:<device_id>"`),
  /// with `message`.
  device_error(std::string device_name, std::string message);
  /// The failure `cause`, with its provenance.
  explicit device_error(std::shared_ptr<const failure> cause);
  /// `"<name>:<ordinal>:<device_id>"` of the failed device.
  const std::string& device_name() const noexcept { return cause_->about(); }
  /// The message without that device's name in front.
  const std::string& message() const noexcept { return message_; }
  /// The provenance: origin device, task, original message and path.
  const failure& cause() const noexcept { return *cause_; }
  /// `cause()`, shared: to pass on without a copy.
  const std::shared_ptr<const failure>& cause_ptr() const noexcept { return cause_; }
  /// The device where the failure started (`failure::device`).
  const std::string& origin_device() const noexcept { return cause_->device; }
  /// The task there (`failure::task`).
  const std::string& origin_task() const noexcept { return cause_->task; }
  /// The original message (`failure::message`).
  const std::string& original_message() const noexcept { return cause_->message; }
  /// The waits it travelled through (`failure::path`).
  const std::vector<failure_hop>& path() const noexcept { return cause_->path; }

private:
  std::shared_ptr<const failure> cause_;
  std::string message_;
};

/// The awaited event was cancelled (`backend::cancel`) before it started.
/// Distinct from a failure; a device that waited on a cancelled event fails
/// with a plain `device_error` whose cause says so.
class cancelled_error : public device_error {
public:
  /// `device_error`'s constructors.
  using device_error::device_error;
};

/// Throws `cancelled_error` when `f` is the event's own cancellation,
/// `device_error` otherwise.
[[noreturn]] void throw_failure(std::shared_ptr<const failure> f);

/// Waiting would deadlock, so the caller gets this error instead of
/// blocking: a task called `sync` (or `await`) on an event of its own device
/// that is still ahead of it, or on an event that needs, through a chain of
/// waits and of other tasks blocked in `sync`, its own device's later work
/// (a cycle of runners; `what()` names the cycle).
class deadlock_error : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

/// A `sync` or `await` given a deadline did not finish by it. `what()` says
/// what was awaited, how long, and why it is not done: `chain()`, the chain
/// of waits from the awaited event to what holds it (`"cpu:2 waits on event
/// 17 of cpu:0, which is running its seq 4"`). The wait itself is abandoned;
/// the event is not affected and may still complete.
class timeout_error : public std::runtime_error {
public:
  /// `what()` is `what`; `chain()` is `chain`.
  timeout_error(const std::string& what, std::string chain)
    : std::runtime_error(what), chain_(std::move(chain)) {}
  /// The chain of waits from the awaited event to what holds it.
  const std::string& chain() const noexcept { return chain_; }

private:
  std::string chain_;
};

} // namespace multidev
