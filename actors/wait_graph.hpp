#pragma once
/// \file
/// The live wait-for graph: who waits on which event, and why a wait cannot
/// proceed. Its edges are of two kinds, read where they live:
///
/// - a *gate*: a device's queue holds a wait for another device's event
///   (`will_wait_for`); the waiting device's core keeps its pending gates;
/// - a *blocking sync*: a thread blocks in `sync` or `await` on an event,
///   either a host thread or a task on a device's runner (or stream). These
///   register here, in a process-wide table, for as long as they block.
///
/// From the two, `check_sync_cycle` refuses a sync from a task that would
/// close a cycle of runners (the only cycle this runtime can form: a gate is
/// always the newest item of its device and waits on an event already
/// scheduled, so gates alone never close one), `wait_chain` says why an
/// event is not done yet (for the deadline errors), and `wait_graph_info`
/// lists the whole graph for `get_global_debug_info`.
///
/// Cost: nothing on the hot path. A sync registers only once it is about to
/// block; the checks run then, under one process-wide lock.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "multidev/sexp.hpp"

namespace multidev::detail {

class device_core;
class endpoint;

/// One thread blocked on an event, registered while it blocks.
struct blocked_wait {
  /// The device whose task blocks (its runner or stream thread); null for a
  /// host thread.
  const device_core* runner = nullptr;
  /// The seq of the runner's item that blocks (0 for a host thread).
  uint64_t item = 0;
  /// The awaited event: a local device's core, or (`owner == nullptr`) a
  /// device of another process, named by `owner_name`.
  const device_core* owner = nullptr;
  std::string owner_name;
  uint64_t seq = 0;
  /// What the thread called: `sync` or `await`.
  const char* what = "sync";
  std::thread::id thread = std::this_thread::get_id();
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

/// Registers a blocked thread for its lifetime. When the thread is a runner,
/// registering first checks that the wait would not close a cycle of
/// runners, and throws `deadlock_error` naming the cycle instead of
/// blocking (the check and the registration are one step, under the
/// table's lock, so of two syncs that close a cycle together, the second
/// sees the first).
class blocked_scope {
public:
  explicit blocked_scope(blocked_wait w);
  ~blocked_scope();
  blocked_scope(const blocked_scope&) = delete;
  blocked_scope& operator=(const blocked_scope&) = delete;

private:
  blocked_wait w_;
};

struct gate;

/// Where a chain of waits leaves this process: the wait (a gate) on a device
/// of another process that holds it, and the seq it waits for there.
struct remote_hop {
  std::shared_ptr<gate> at;
  uint64_t seq = 0;
};

/// Why `owner`'s `seq` is not done yet, as a chain of waits that ends in
/// what holds it: `"cpu:0 waits on event 4 of cpu:1, which is running its
/// seq 3"`. Follows gates and blocking syncs through devices of this process;
/// ends at a device of another process (saying whether its node is lost),
/// a running task, a failure or a cycle.
std::string wait_chain(const device_core& owner, uint64_t seq);

/// `wait_chain` without `owner`'s name in front (`"waits on event 4 of
/// cpu:1, which ..."`). With `hop`, a chain that ends at a wait on a device
/// of another process whose node is not known lost ends with `"waits on
/// event S of NAME"`, and `*hop` says where it goes on (`follow_chain`).
std::string wait_chain_rest(const device_core& owner, uint64_t seq, remote_hop* hop);

/// One step of a chain of waits through a device of another process: why
/// its seq is not done, as its process says, in this process's names and
/// without the device's name in front; where it goes on (`next`, null where
/// it ends) and the seq it waits for there (`endpoint::why`).
struct chain_step {
  std::string rest;
  std::shared_ptr<endpoint> next;
  uint64_t next_seq = 0;
};

/// `wait_chain`, followed into other processes: a device of another process
/// is asked why its seq is not done (`endpoint::why`), waiting at most until
/// `deadline` for the answers; a silent one is named so. At most 16 hops
/// past the process edge.
std::string follow_chain(const device_core& owner, uint64_t seq,
                         std::chrono::steady_clock::time_point deadline);

/// The same from a device of another process named `name` here, whose
/// answer to `why` was `first`.
std::string follow_remote_chain(const std::string& name, chain_step first,
                                std::chrono::steady_clock::time_point deadline);

/// How long a deadline's explanation may ask other processes, past the
/// deadline: a silent node costs at most this.
inline constexpr std::chrono::milliseconds explain_budget{250};

/// The end of a chain at a device of another process that cannot say more.
inline constexpr const char* remote_silent_end =
  "lives on another node and has not reported it done";

/// `(wait_for (wait ...) ...)`: every pending gate of `devices` and every
/// blocked thread of the process, each with the event it waits on, that
/// event's state, and who holds it (the running item, or the task that
/// poisoned it).
sexp wait_graph_info(std::span<const std::shared_ptr<device_core>> devices);

/// `wait_graph_info` of the one device `d`, with only the threads of its
/// runner: what a device actor tells another process of its waits.
sexp wait_graph_info_of(const std::shared_ptr<device_core>& d);

} // namespace multidev::detail
