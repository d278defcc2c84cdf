#pragma once
// What a peer's message may carry (issue 38 point 4): one check per message
// kind that a peer can send to a device actor or a node actor, called in the
// handler before anything is allocated, queued or deferred. Each throws
// `std::invalid_argument` naming the message, the field and its value
// ("alloc: alignment 2147483648 exceeds the limit of 1073741824"); the
// handler replies with it as an `invalid_argument` error and goes on
// serving. What needs the device's state in order (a pool's bounds at the
// time the request runs, a seq scheduled) stays where it was: the pool
// table (`span`, `check_request`) and `device_core::check_scheduled`.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/node_id.hpp>

#include "multidev/task.hpp"

namespace multidev {
struct round_part; // multidev/protocol.hpp
struct wire_arg;
} // namespace multidev

namespace multidev::detail {

/// The bounds of the fields of a peer's message.
namespace wire_limits {
/// A name: a kernel's, an owner's or source's (`depend`, `copy_from`), a
/// result's, a session's client's.
inline constexpr std::size_t name_bytes = 1024;
/// A host name or address (`depend`, `copy_from`): a DNS name has at most 253.
inline constexpr std::size_t host_bytes = 255;
/// A reason (`lost`) or a kernel's text argument.
inline constexpr std::size_t text_bytes = 4096;
/// The arguments of one task (the kernels take a handful).
inline constexpr std::size_t kernel_args = 64;
/// A pool's alignment: a power of two up to 1 GiB (the largest huge page).
/// Larger ones reserve address space far beyond the size the quota counts
/// (the CPU driver rounds the block up to the alignment).
inline constexpr uint64_t alignment = uint64_t{1} << 30;
/// The tasks of one batch: in one message, or in all the parts of one
/// batch sent in parts; also the tasks all open batches of one device hold.
inline constexpr std::size_t batch_tasks = std::size_t{1} << 20;
/// Requests a device actor holds back behind its full queue (flow control):
/// more are refused, as a full queue with nothing to hold them would.
inline constexpr std::size_t deferred_requests = std::size_t{1} << 16;
/// Sessions one client node may hold open on a node at once.
inline constexpr std::size_t sessions_per_client = 16;
/// Nodes one session's client may vouch for (`trust`).
inline constexpr std::size_t vouched_nodes = 64;
/// `wait`s the devices of one session hold for their requesters at once
/// (each is a reply owed, kept until the awaited seq resolves: maybe never).
inline constexpr std::size_t session_waits = std::size_t{1} << 16;
/// Recorded rounds one session holds parts of (`round_put`).
inline constexpr std::size_t session_rounds = 1024;
/// The steps of one round's part on a node (each a queue entry a replay
/// makes), and its peers (the other nodes of the round).
inline constexpr std::size_t round_steps = std::size_t{1} << 16;
inline constexpr std::size_t round_peers = vouched_nodes;
/// `round_done`s one session holds for replays it has not pushed yet (a
/// peer's replay ran ahead of this node's): past that, the round is failed
/// on this node instead of holding more.
inline constexpr std::size_t round_early = std::size_t{1} << 16;
/// The bytes of copies (`round_step::send`) those notices may carry, held
/// by one session at once; past that, the same.
inline constexpr std::size_t round_early_bytes = std::size_t{512} << 20;
/// The bytes of a copy one `round_notice` carries (a copy's bytes go as
/// parts), and that one `round_done` carries: every buffer stays small
/// enough for the allocator to reuse, as a copy's `bytes` messages.
inline constexpr std::size_t round_part_bytes = std::size_t{1} << 20;
} // namespace wire_limits

/// What the waits registered on one session's devices hold (issue 38
/// point 2): a `wait` takes a ticket, given back when its reply leaves or
/// the wait is dropped (its requester gone, its deadline passed). Past
/// `wire_limits::session_waits` at once, `take` refuses. Thread safe.
class wait_budget {
public:
  /// A ticket for a wait on `seq` (its last copy gives it back); throws
  /// `std::invalid_argument` naming `who` (the session), the seq and the
  /// limit when the session holds the limit already.
  std::shared_ptr<void> take(const std::string& who, uint64_t seq) const;
  /// The tickets out now.
  std::size_t held() const noexcept { return held_->load(std::memory_order_relaxed); }

private:
  /// Shared with the tickets, which may outlive the budget's owner.
  std::shared_ptr<std::atomic<std::size_t>> held_ = std::make_shared<std::atomic<std::size_t>>(0);
};

/// `schedule` of one task: its kernel's name, argument count and text.
void check_schedule(const task_spec& spec);
/// `schedule` of a batch, whole or one part of it: its size, and each task.
void check_schedule(const std::vector<task_spec>& specs);
/// `depend`: the owner's name and the host its node listens on.
void check_depend(const std::string& owner_name, const std::string& host);
/// `lost`: the reason.
void check_lost(const std::string& why);
/// `copy_from`: the source's name and the host its node listens on.
void check_copy_from(const std::string& source_name, const std::string& host);
/// `alloc`: the memory mode (-1 or a `memory_mode`) and the alignment's
/// bound (its being a power of two, the pool id and the size are checked by
/// the pool table, in order).
void check_alloc(int32_t id, uint64_t alignment, int32_t mode);
/// `result`: the name.
void check_result(const std::string& name);
/// `open`: the client's name.
void check_open(const std::string& client);
/// `trust`: the node vouched for.
void check_trust(const caf::node_id& peer);
/// `round_put`: the part whole, on a session of `devices` devices: its
/// sizes, names and specs, each step's lane, each wait's target (an earlier
/// step on another lane, or a peer), the slots, the peers (at most
/// `round_peers`, with a valid node actor on another node than this one,
/// `home`) and the notices.
void check_round_part(const round_part& part, std::size_t devices, const caf::node_id& home);
/// `round_run`: the slot values, against the part's slots.
void check_round_run(const round_part& part, const std::vector<wire_arg>& slots);

} // namespace multidev::detail
