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

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/node_id.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/sec.hpp>
#include <caf/typed_actor.hpp>

#include "multidev/backend.hpp"
#include "multidev/event.hpp"
#include "multidev/kernels.hpp"
#include "multidev/task.hpp"
#include "multidev/trace.hpp"
#include "multidev/types.hpp"

namespace multidev {

/// The atoms of the protocol (CAF 0.17: at most 10 characters each).
namespace atoms {
/// Schedule a named kernel (`task_spec`) or several; replies with the seq(s).
using schedule_atom = caf::atom_constant<caf::atom("schedule")>;
/// Reply once a seq is done (or with its error).
using wait_atom = caf::atom_constant<caf::atom("wait")>;
/// Make this device's later work wait for another device's seq.
using depend_atom = caf::atom_constant<caf::atom("depend")>;
/// Allocate (or replace) a pool.
using alloc_atom = caf::atom_constant<caf::atom("alloc")>;
/// Free a pool once the work before is done.
using free_atom = caf::atom_constant<caf::atom("free")>;
/// Zero a range of a pool, as ordered work.
using memset_atom = caf::atom_constant<caf::atom("memset")>;
/// The seq of everything scheduled so far.
using all_work_atom = caf::atom_constant<caf::atom("all_work")>;
/// Whether the runner is waiting for work.
using idle_atom = caf::atom_constant<caf::atom("idle")>;
/// The bytes the device's pools hold.
using memory_atom = caf::atom_constant<caf::atom("memory")>;
/// The device's debug info, printed.
using debug_atom = caf::atom_constant<caf::atom("debug")>;
/// The device's node, id, name, driver and ordinal.
using identify_atom = caf::atom_constant<caf::atom("identify")>;
/// A seq's state, and the device's last resolved and scheduled seqs.
using status_atom = caf::atom_constant<caf::atom("status")>;
/// The last result a kernel published under a name.
using result_atom = caf::atom_constant<caf::atom("result")>;
/// Cancel the work queued and not started.
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
/// Bring a failed device back.
using recover_atom = caf::atom_constant<caf::atom("recover")>;
/// A copy of the runner trace.
using trace_atom = caf::atom_constant<caf::atom("trace")>;
/// A node actor's name and device actors.
using list_atom = caf::atom_constant<caf::atom("list")>;
/// Write bytes into a pool, as ordered work.
using write_atom = caf::atom_constant<caf::atom("write")>;
/// Read bytes of a pool, after the work scheduled before.
using read_atom = caf::atom_constant<caf::atom("read")>;
/// Another device this one waits for cannot be reached any more.
using lost_atom = caf::atom_constant<caf::atom("lost")>;
/// Copy bytes of this device's pool to another device (node to node).
using copy_to_atom = caf::atom_constant<caf::atom("copy_to")>;
/// Write bytes another device sends into a pool, as ordered work.
using copy_from_atom = caf::atom_constant<caf::atom("copy_from")>;
/// The bytes (or the failure) of a `copy_to`, for its `copy_from`.
using bytes_atom = caf::atom_constant<caf::atom("bytes")>;
/// Why a seq is not done yet (diagnosis across processes).
using why_atom = caf::atom_constant<caf::atom("why")>;
/// Open a session on a node: devices of the client's own.
using open_atom = caf::atom_constant<caf::atom("open")>;
/// Renew a session's lease.
using renew_atom = caf::atom_constant<caf::atom("renew")>;
/// End a session: the client detaches.
using detach_atom = caf::atom_constant<caf::atom("detach")>;
/// A session's client vouches for another node of its own.
using trust_atom = caf::atom_constant<caf::atom("trust")>;
/// A session's client gives the node its part of a recorded round.
using round_put_atom = caf::atom_constant<caf::atom("round_put")>;
/// A session's client replays a round whose part the node holds.
using round_run_atom = caf::atom_constant<caf::atom("round_run")>;
/// A node tells another that an item of a replay, which the other's part
/// waits for, resolved.
using round_done_atom = caf::atom_constant<caf::atom("round_done")>;
/// A session's client lets go of a round (its last handle went).
using round_drop_atom = caf::atom_constant<caf::atom("round_drop")>;
/// A session's client tells a node that a replay it pushed waits on a node
/// that refused that replay.
using round_refused_atom = caf::atom_constant<caf::atom("round_rfsd")>;
} // namespace atoms

/// A `kernel_arg` travels as a tagged record.
struct wire_arg {
  /// The `kernel_arg`'s variant index: which member below holds it.
  uint8_t kind = 0; // the variant index
  /// An `int` argument.
  int64_t integer = 0;
  /// A `float` argument.
  double real = 0;
  /// A `string` argument.
  std::string text;
  /// A buffer argument.
  buffer_arg buffer;
};

/// `x` as a tagged record.
wire_arg to_wire(const kernel_arg& x);
/// The `kernel_arg` `w` holds.
kernel_arg from_wire(const wire_arg& w);

/// One entry of a node's part of a recorded round (`round_part`): a named
/// task, a memset, a pool call, one end of a copy, a wait on an earlier
/// step of the part on another of its devices, or a wait on an item of
/// another node's part (a cross-node edge, resolved by that node's
/// `round_done`, node to node).
struct round_step {
  /// Its item's index in the round (what provenance names, and what a
  /// peer's `round_done` names when `peer_item` is this step's item).
  uint32_t item = 0;
  /// Its device: an index into `round_part::devices`.
  uint32_t lane = 0;
  /// -1: a task (`spec`); >= 0: a wait on that earlier step of the part, on
  /// another lane; -2: a wait on item `peer_item` of peer `peer`.
  int32_t wait_on = -1;
  /// `wait_on` -2: the awaited node, an index into `round_part::peers`.
  uint32_t peer = 0;
  /// `wait_on` -2: the awaited item's index in the round.
  uint32_t peer_item = 0;
  /// The item's name, for provenance ("replay 4 of round 'step', item 'grad 3'").
  std::string name;
  /// `wait_on` -2: the awaited item's device as the client names it
  /// (`a/multidev_cpu:0:1`), for the failure path of the wait.
  std::string peer_device;
  /// A task's kernel and arguments (bound on the node at each replay). A
  /// memset: no kernel, one buffer argument, the span it zeroes. A pool
  /// call: no kernel, one buffer argument, the pool's id at offset 0 and
  /// (`alloc_pool`) its size. A copy's end: no kernel, one buffer
  /// argument, the span it reads (`send`) or writes (`write`).
  task_spec spec;
  /// What a step of `wait_on` -1 runs: `run_spec` (0) its named task,
  /// `zero` (1) a `memset_zero` of the span `spec.args[0]` names,
  /// `alloc` (2) an `alloc_pool`, `free` (3) a `free_pool`, `send` (4) a
  /// copy's read, `write` (5) a copy's write.
  uint8_t op = 0;
  /// `op`: the step runs its named task (`spec`), or is a wait.
  static constexpr uint8_t run_spec = 0;
  /// `op`: the step zeroes the span `spec.args[0]` names (`memset_zero`).
  static constexpr uint8_t zero = 1;
  /// `op`: the step allocates pool `spec.args[0]` names, of its size,
  /// aligned to `alignment`, of memory mode `mode` (`alloc_pool`).
  static constexpr uint8_t alloc = 2;
  /// `op`: the step frees pool `spec.args[0]` names (`free_pool`).
  static constexpr uint8_t free = 3;
  /// `op`: the step reads the span `spec.args[0]` names, a copy's source
  /// (`device_to_device`), in its device's order: the bytes go to the
  /// part's `write` step of the same item (the same node), or to the
  /// peers its notices name (in `round_done`, node to node).
  static constexpr uint8_t send = 4;
  /// `op`: the step writes the bytes of its item's `send` into the span
  /// `spec.args[0]` names, in its device's order; an earlier step of its
  /// lane waits for them (on the part's `send` step of the item, or on
  /// the item from the peer that sends them).
  static constexpr uint8_t write = 5;
  /// An `alloc` step's alignment (a power of two).
  uint64_t alignment = 0;
  /// An `alloc` step's memory mode: -1 for none, else a `memory_mode`'s value.
  int32_t mode = -1;
};

/// Another node of the round, as the client attached it: its node actor,
/// the client's session there, its name, and where it listens (the node
/// connects there, so that `round_done`s go straight between the two).
struct round_peer {
  /// Its node actor.
  caf::actor node;
  /// The client's session there.
  uint64_t session = 0;
  /// The client's name for it (`a`): failures name its devices so.
  std::string name;
  /// Where it listens (empty host: not known; no connection is made).
  std::string host;
  /// Its port.
  uint16_t port = 0;
};

/// One item of a replay resolved, told by the node it ran on to a node
/// whose part waits on it (`round_done`): `error` empty when done, else
/// the failure, whole.
struct round_notice {
  /// The client's id of the round.
  uint64_t round = 0;
  /// The replay's number.
  uint64_t replay = 0;
  /// The item's index in the round.
  uint32_t item = 0;
  /// The item's seq on its device (0: it was never pushed, a refusal).
  uint64_t seq = 0;
  /// Empty: done; else why not (the failure, whole, when it carries one).
  caf::error error;
  /// A copy's bytes (the item is a `send`): where this part of them goes
  /// in the span. The parts may come in any order, each byte once; the
  /// one that completes the span opens the wait.
  uint64_t offset = 0;
  /// A copy's bytes: this part of them (empty for any other item).
  std::string bytes;
};

/// A node's part of a recorded round (docs/design.md, "Recorded rounds"):
/// sent once (`round_put`); then each replay is one `round_run`.
struct round_part {
  /// The client's id of the round (unique in the client's process).
  uint64_t round = 0;
  /// The round's name, for provenance.
  std::string name;
  /// The part's devices (lanes): the session's device ordinals.
  std::vector<uint32_t> devices;
  /// The part's entries, in record order.
  std::vector<round_step> steps;
  /// The slot arguments: slot `k` is argument `slot_args[k]` of step
  /// `slot_steps[k]`; a `round_run` carries their values in this order.
  std::vector<uint32_t> slot_steps;
  /// See `slot_steps`.
  std::vector<uint32_t> slot_args;
  /// The other nodes of the round this part waits on or tells.
  std::vector<round_peer> peers;
  /// Step `notify_steps[k]`'s item, once resolved in a replay, is told to
  /// peer `notify_peers[k]` (`round_done`), which waits on it.
  std::vector<uint32_t> notify_steps;
  /// See `notify_steps`.
  std::vector<uint32_t> notify_peers;
};

/// A device actor: the owner of one device's runner, events and pools.
/// Replies carry a seq of this device's schedule (an event is `(device, seq)`);
/// failures come back as `caf::error`s of category `multidev` (see `errc`).
/// Every request gets a reply, a value or an error: when the actor stops
/// (its backend is destroyed, an exit message, `exit_reason::kill`, an
/// exception), requests still waiting get `device_failed`.
using device_actor = caf::typed_actor<
  /// Schedules a named kernel (resolved through the kernel registry here);
  /// replies with its seq.
  caf::replies_to<atoms::schedule_atom, task_spec>::with<uint64_t>,
  /// Schedules named kernels in order (`backend::schedule_batch`): all are
  /// resolved first, so an unknown kernel or a bad argument schedules none;
  /// replies with their seqs.
  caf::replies_to<atoms::schedule_atom, std::vector<task_spec>>::with<std::vector<uint64_t>>,
  /// Part `part` (0, 1, ...) of batch `batch`, a batch sent in parts
  /// (`backend::schedule_batch` sends more than 4,096 tasks so): the parts
  /// of one sender's batch are resolved as they come and held here; the
  /// `last` one schedules them all, in order, and replies with their seqs
  /// (the others reply with none). A part that does not resolve, or comes
  /// out of order, drops the batch: a bad spec anywhere schedules none. A
  /// sender has at most 8 batches open; its batches go when it goes down.
  caf::replies_to<atoms::schedule_atom, uint64_t, uint32_t, std::vector<task_spec>,
                  bool>::with<std::vector<uint64_t>>,
  /// Replies with `seq` once this device has finished it (at once when it
  /// has); an error if it never will (the device failed or shut down first),
  /// `invalid_argument` at once when `seq` was never scheduled.
  caf::replies_to<atoms::wait_atom, uint64_t>::with<uint64_t>,
  /// The sender gives up its `wait` for `seq` whose request id is `request`
  /// (the 60-bit id of CAF's `message_id::request_id()`): that wait is
  /// dropped unanswered, other waits stay. No reply; no effect when the wait
  /// has been answered already. A sender sends it after its own wait
  /// request, so it arrives after it (a deadline of a remote `sync`).
  caf::reacts_to<atoms::wait_atom, atoms::cancel_atom, uint64_t, uint64_t>,
  /// Work scheduled here after this message waits until `owner` (a device
  /// actor, local or remote) has finished `seq`; replies with the wait's seq.
  caf::replies_to<atoms::depend_atom, caf::actor, uint64_t>::with<uint64_t>,
  /// The same, with the owner's name for the errors of the wait (the
  /// sender's name for it, with its node: `b/multidev_cpu:0:1`). An owner
  /// this device has seen go down is refused at once.
  caf::replies_to<atoms::depend_atom, caf::actor, uint64_t, std::string>::with<uint64_t>,
  /// The same, with where the owner's node listens (`host`, `port`, as the
  /// sender reached it): when the owner lives on a third node, this device
  /// connects to it there first (once per node), so that its `wait` and the
  /// reply go straight between the two nodes instead of through the sender
  /// (CAF routes messages between two nodes that never connected through
  /// the process that introduced them). When the connection fails, the wait
  /// goes through the sender as before; an empty `host` makes none.
  caf::replies_to<atoms::depend_atom, caf::actor, uint64_t, std::string, std::string,
                  uint16_t>::with<uint64_t>,
  /// `owner` (a device actor this one waits on) cannot be reached any more,
  /// because of `why`: the waits on it fail with `why`, and a later `depend`
  /// on it is refused. Sent by the process that made this device wait when
  /// its own connection to the owner's node is lost: CAF routes the messages
  /// between two nodes that never connected through it, and tells neither
  /// when the route breaks.
  caf::reacts_to<atoms::lost_atom, caf::actor, std::string>,
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
  /// Replies with the device's debug info, a printed s-expression, ending
  /// with its part of its process's wait-for graph (`(wait_for ...)`: its
  /// queued waits and its runner's blocked syncs).
  caf::replies_to<atoms::debug_atom>::with<std::string>,
  /// Replies with who the device is: its node (its actor system's node id as
  /// text), its device id there, its name, its driver and its ordinal. The
  /// node and the id make its `device_key` (`attach_device` asks this).
  caf::replies_to<atoms::identify_atom>::with<std::string, uint32_t, std::string,
                                               std::string, int32_t>,
  /// Replies with what is known of `seq` now, without waiting: its state
  /// (an `event_state`: 0 pending, 1 done, 2 failed, 3 cancelled), the seq
  /// of the last resolved item and that of the last scheduled one.
  caf::replies_to<atoms::status_atom, uint64_t>::with<uint8_t, uint64_t, uint64_t>,
  /// Replies whether a kernel wrote a result under `name` on the board of
  /// the device's backend, and the last one it wrote (`backend::result`).
  caf::replies_to<atoms::result_atom, std::string>::with<bool, kernel_result>,
  /// Drops the work queued and not yet started, as `backend::cancel`
  /// (requests deferred behind a full queue are not yet scheduled and stay);
  /// replies with the last seq cancelled (0: nothing was queued).
  caf::replies_to<atoms::cancel_atom>::with<uint64_t>,
  /// Brings a failed device back, as `backend::recover`; replies whether it
  /// had failed and came back.
  caf::replies_to<atoms::recover_atom>::with<bool>,
  /// Copies the bytes into pool `id` at `offset`, ordered with the work (a
  /// transfer from another process); replies with its seq.
  caf::replies_to<atoms::write_atom, int32_t, uint64_t, std::string>::with<uint64_t>,
  /// Reads `size` bytes of pool `id` at `offset`, ordered with the work
  /// (after everything scheduled before it); replies with them once read, an
  /// error if the read fails or is cancelled.
  caf::replies_to<atoms::read_atom, int32_t, uint64_t, uint64_t>::with<std::string>,
  /// A copy from another device, `source`, into pool `id` at `offset`:
  /// queues, as ordered work here, a write of `size` bytes that waits for
  /// them to arrive from `source` (a `bytes` message), connecting first to
  /// `source`'s node at `host:port` when it is a third node (see `depend`;
  /// empty `host`: no connection is made). Replies with the write's seq and
  /// the transfer's id, for the sender's `copy_to` to `source`. The write
  /// fails with the source's failure when the read there fails, or when
  /// `source` goes down first. `source_name` names it in errors.
  caf::replies_to<atoms::copy_from_atom, int32_t, uint64_t, uint64_t, caf::actor, std::string,
                  std::string, uint16_t>::with<uint64_t, uint64_t>,
  /// The other half: reads `size` bytes of pool `id` at `offset` after the
  /// work scheduled before it and sends them straight to `destination`, in
  /// order, as `(bytes, transfer, bytes)` messages of at most 1 MiB each, or
  /// `(bytes, transfer, error)` when the read is refused, fails or is
  /// cancelled. Replies with the read's seq (an error for a bad pool or
  /// range, after telling `destination`).
  caf::replies_to<atoms::copy_to_atom, int32_t, uint64_t, uint64_t, caf::actor,
                  uint64_t>::with<uint64_t>,
  /// The next part of the bytes of transfer `transfer`, from its source (see
  /// `copy_from`); the write waits until all have come.
  caf::reacts_to<atoms::bytes_atom, uint64_t, std::string>,
  /// Transfer `transfer` failed at its source.
  caf::reacts_to<atoms::bytes_atom, uint64_t, caf::error>,
  /// Replies with a copy of the runner trace, as `backend::trace` (times in
  /// the device's process's trace clock: steady-clock nanoseconds, which the
  /// processes of one machine share).
  caf::replies_to<atoms::trace_atom>::with<device_trace>,
  /// Replies why `seq` is not done yet, without waiting: the chain of waits
  /// that holds it in this device's process, without the device's name in
  /// front (`"waits on event 4 of a/multidev_cpu:0:1"`, `"is running its seq
  /// 7"`), and, when the chain goes on at a device of another process, that
  /// device's actor and the seq it waits for there (an invalid handle and 0
  /// otherwise). The asking process follows it (`backend::sync` deadlines).
  caf::replies_to<atoms::why_atom, uint64_t>::with<std::string, caf::actor, uint64_t>>;

/// A node: the devices of one process, served to other processes
/// (`multidev node` publishes one with CAF's middleman; `attach_node`
/// attaches all its devices). One actor per node serves them, so a node
/// needs one port, not one per device. Each client works in a session of
/// its own (docs/design.md, "Sessions"): devices made for it alone (its
/// pools, queues, events, failures), which the node keeps only while the
/// client renews the session's lease.
using node_actor = caf::typed_actor<
  /// Opens a session for the client named `client` (for the node's log)
  /// asking for a lease of `lease_ns` nanoseconds, with the node's `cookie`
  /// (`load_cookie`; a wrong one is refused: "session refused: wrong
  /// cookie"); replies with the node's name, its identity (its actor
  /// system's node id and start epoch: a restarted node has another), the
  /// session's id (0: the node keeps no sessions, the devices are shared),
  /// the lease granted in nanoseconds, and the session's device actors in
  /// ordinal order. Those actors take messages only from the node of the
  /// actor that opened the session (the client), the node itself, and the
  /// nodes the client vouches for (`trust`).
  caf::replies_to<atoms::open_atom, std::string, int64_t, std::string>::with<
    std::string, std::string, uint64_t, int64_t, std::vector<caf::actor>>,
  /// The client of session `id` vouches for another node of its own (one it
  /// attached too): the session's devices take its messages (waits and
  /// copies between nodes). Replies whether the session was open; an error
  /// for a sender of another node than the session's client.
  caf::replies_to<atoms::trust_atom, uint64_t, caf::node_id>::with<bool>,
  /// Renewal `n` (1, 2, ...) of session `id`'s lease, sent by a client whose
  /// last acknowledged renewal is `acked` (0: the `open`). The lease is
  /// extended to the lease from when the node received renewal `acked`
  /// (the `open` for 0), never from this one: the client counts from the
  /// acknowledgement it got, so a renewal whose acknowledgement is lost
  /// extends nothing. Replies with the lease granted. An error once the
  /// session has ended (its lease ran out first, it was detached): a
  /// renewal never brings an ended session back.
  caf::replies_to<atoms::renew_atom, uint64_t, uint64_t, uint64_t>::with<int64_t>,
  /// Ends session `id`: its work not started is cancelled, its pools are
  /// freed once its running item (if any) ends. Replies whether it was open.
  /// `renew` and `detach` are refused to a sender of another node than the
  /// session's client.
  caf::replies_to<atoms::detach_atom, uint64_t>::with<bool>,
  /// The client of session `id` gives the node its part of a recorded round
  /// (`round_part`), checked whole here (devices, steps, waits, peers,
  /// sizes: an `invalid_argument` naming the field otherwise). Replies
  /// true; a part of the same round again replaces it. At most
  /// `wire_limits::session_rounds` rounds per session.
  caf::replies_to<atoms::round_put_atom, uint64_t, round_part>::with<bool>,
  /// Replay `replay` (1, 2, ...; increasing) of round `round` of session
  /// `id`, with the slot arguments' values in the part's order: every step
  /// pushed at once on the session's devices, or none (a device failed or
  /// stopping refuses the whole replay). Replies with each lane's last seq
  /// of the replay, in the part's device order. A full queue defers the
  /// replay (and the session's later ones) until it has room.
  caf::replies_to<atoms::round_run_atom, uint64_t, uint64_t, uint64_t,
                  std::vector<wire_arg>>::with<std::vector<uint64_t>>,
  /// From another node of session `id`'s client: items of replays, which
  /// this session's parts wait on, resolved (`round_notice`; the items that
  /// resolved while the sender's last message was under way go together).
  /// Each is taken only from the node the part names for that item; no
  /// reply.
  caf::reacts_to<atoms::round_done_atom, uint64_t, std::vector<round_notice>>,
  /// The client of session `id` lets go of round `round`: its part goes
  /// (once the waits of its replays in flight have their notices), and its
  /// place among the session's `wire_limits::session_rounds` with it.
  /// Replies whether the session held it.
  caf::replies_to<atoms::round_drop_atom, uint64_t, uint64_t>::with<bool>,
  /// The client of session `id`: replay `replay` of round `round`, which
  /// this node pushed, failed on node actor `peer` because of `why` (it
  /// refused it: its session there ended, a device failed; or its link
  /// closed first): the waits of that replay on `peer`'s items fail with
  /// `why`. A refusing node tells no one itself; its client, which every
  /// refusal reaches, tells each node that pushed the replay as soon as
  /// both answers are in. `why` is bounded as `lost`'s. Replies whether a
  /// wait failed.
  caf::replies_to<atoms::round_refused_atom, uint64_t, uint64_t, uint64_t, caf::actor,
                  std::string>::with<bool>,
  /// The client of session `id` lost node actor `peer` (its connection
  /// there closed, or its session there ended) because of `why`: the waits
  /// of the session's rounds on `peer` fail, now and in later replays. A
  /// route between two nodes through their client breaks without either
  /// hearing it; this is how they hear it.
  caf::reacts_to<atoms::lost_atom, uint64_t, caf::actor, std::string>,
  /// Replies with the node's sessions, printed:
  /// `(node (name ..) (identity ..) (sessions (session (id ..) (client ..)
  /// (lease_left_ms ..) (used_memory ..) (queued ..)) ...) (ended ..)
  /// (cleaned ..))`; `cleaned` counts the ended sessions whose devices are
  /// stopped and pools freed.
  caf::replies_to<atoms::debug_atom>::with<std::string>>;

/// Error codes of the `multidev` error category. The error's context holds
/// two strings, the device name (may be empty) and the message, and for an
/// event that failed or was cancelled a third element: the `failure` with
/// its provenance, so that it survives the trip to another process.
enum class errc : uint8_t {
  /// Bad input: unknown pool or kernel, bad range or alignment.
  invalid_argument = 1,
  /// The device failed or was shut down.
  device_failed = 2,
  /// The awaited event was cancelled (`backend::cancel`).
  cancelled = 3,
};

/// The category atom of multidev errors.
constexpr caf::atom_value error_category = caf::atom("multidev");

/// An error of category `multidev` with `code`, naming `device`, saying `message`.
caf::error make_error(errc code, std::string device, std::string message);

/// The error for an event that did not complete because of `f`: `cancelled`
/// when it is the event's own cancellation, `device_failed` otherwise;
/// carries `f` whole.
caf::error make_error(const failure& f);

/// The failure `err` carries (see `errc`), if any.
std::optional<failure> failure_of(const caf::error& err);

/// Throws the public-edge exception for `err`: `std::invalid_argument`,
/// `cancelled_error` or `device_error` (with the failure's provenance when
/// the error carries one; naming `device` when the error names none).
[[noreturn]] void throw_error(const caf::error& err, const std::string& device);

/// `"<device>: <message>"` for a multidev error, CAF's rendering otherwise.
std::string describe_error(caf::actor_system& sys, const caf::error& err);
/// The same without a system at hand: CAF's plain `to_string` otherwise.
std::string describe_error(const caf::error& err);

/// Registers the protocol's message types on `cfg` (needed before the system
/// starts when devices are driven across processes).
void register_types(caf::actor_system_config& cfg);

/// The settings of the actor systems multidev makes itself (a backend's own
/// system, the `multidev` tool's), for a system of your own that drives
/// devices across processes: `register_types`; CAF's middleman loaded, so
/// `attach_node` works; heartbeats (one a second, and a peer silent for 5 s
/// is dropped: its devices fail instead of hanging their waiters);
/// `middleman.workers` 0 (messages from other nodes are deserialized on the
/// I/O thread: one thread hand-off less per remote hop); and the
/// work-sharing scheduler (idle workers sleep instead of polling, and remote
/// hops are ~3x faster than under work stealing, NOTES.md). Call it once,
/// before a command line or config file is parsed into `cfg`, so that those
/// can override each value.
void configure_system(caf::actor_system_config& cfg);

// -- inspect overloads: the wire form of the messages' value types ----------

/// A `buffer_loc` travels as its pool id and offset.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, buffer_loc& x) {
  return f(caf::meta::type_name("buffer_loc"), x.pool_id, x.offset);
}

/// A `buffer_arg` travels as its location and size.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, buffer_arg& x) {
  return f(caf::meta::type_name("buffer_arg"), x.loc, x.size_in_bytes);
}

/// A `wire_arg` travels as its tag and every member.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_arg& x) {
  return f(caf::meta::type_name("wire_arg"), x.kind, x.integer, x.real, x.text,
           x.buffer);
}

/// A `task_spec` travels as the kernel's name and its arguments as `wire_arg`s.
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

/// A round step travels as its fields.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, round_step& x) {
  return f(caf::meta::type_name("round_step"), x.item, x.lane, x.wait_on, x.peer, x.peer_item,
           x.name, x.peer_device, x.spec, x.op, x.alignment, x.mode);
}

/// A round notice travels as its fields.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, round_notice& x) {
  return f(caf::meta::type_name("round_notice"), x.round, x.replay, x.item, x.seq, x.error,
           x.offset, x.bytes);
}

/// A round peer travels as its fields.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, round_peer& x) {
  return f(caf::meta::type_name("round_peer"), x.node, x.session, x.name, x.host, x.port);
}

/// A round part travels as its fields.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, round_part& x) {
  return f(caf::meta::type_name("round_part"), x.round, x.name, x.devices, x.steps,
           x.slot_steps, x.slot_args, x.peers, x.notify_steps, x.notify_peers);
}

/// A `failure_hop` travels as its waiter, device and seq.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, failure_hop& x) {
  return f(caf::meta::type_name("failure_hop"), x.waiter, x.device, x.seq);
}

/// A failure travels whole: origin, task, seq, message and path.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, failure& x) {
  auto kind = static_cast<uint8_t>(x.origin_kind);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x.origin_kind = kind == static_cast<uint8_t>(failure::kind::cancelled)
                      ? failure::kind::cancelled
                      : failure::kind::failed;
    return caf::none;
  });
  return f(caf::meta::type_name("failure"), kind, x.device, x.task, x.seq, x.message,
           x.path, load);
}

/// A `trace_record` travels whole; a kind this process does not know is an error.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trace_record& x) {
  auto kind = static_cast<uint8_t>(x.kind);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    if (kind > static_cast<uint8_t>(trace_kind::cancel))
      return caf::make_error(caf::sec::invalid_argument);
    x.kind = static_cast<trace_kind>(kind);
    return caf::none;
  });
  return f(caf::meta::type_name("trace_record"), x.seq, kind, x.description, x.start_ns,
           x.end_ns, x.failed, x.awaited_device, x.awaited_seq, load);
}

/// A `device_trace` travels whole: device, capacity, records, dropped.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_trace& x) {
  return f(caf::meta::type_name("device_trace"), x.device, x.capacity, x.records, x.dropped);
}

/// A `kernel_result` travels as its sum, hash and count.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kernel_result& x) {
  return f(caf::meta::type_name("kernel_result"), x.sum, x.hash, x.count);
}

/// A key travels as the node's text and the device id; the receiver interns
/// the text again.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_key& x) {
  std::string node = x.node.str();
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x.node = node_ref{node};
    return caf::none;
  });
  return f(caf::meta::type_name("device_key"), node, x.device_id, load);
}

/// An event travels as its key and seq only. The receiver resolves the key
/// through its registry of devices (its own devices, and the devices its
/// backends attached), so an event of a device it can reach works at once.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, event& x) {
  device_key key = x.key();
  uint64_t seq = x.seq();
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x = event{key, seq};
    return caf::none;
  });
  return f(caf::meta::type_name("event"), key, seq, load);
}

/// The actor that owns `d` (a device of `b`, or a device `b` attached: then
/// the handle of the remote actor); throws `std::invalid_argument` when `d`
/// belongs to another backend.
device_actor device_actor_of(const backend& b, const device& d);

/// Attaches the device actor `a` of another actor system to `b` and returns
/// a `device` for it: typically an actor of another process, obtained with
/// `sys.middleman().remote_actor<device_actor>(host, port)` on `b`'s system.
/// Blocks for one round trip (the device tells its key and name). Attaching
/// the same device again returns the same `device`; one of `b`'s own devices
/// is returned as it is.
///
/// The device is driven by messages to `a`, in the order of the calls (one
/// link actor on `b`'s system sends them all): `schedule_named`, the pool
/// calls, `all_work`, `await`, `is_idle`, `get_used_memory`, the debug info,
/// `trace`, `make_context`, `alloc_node`, `sync`/`is_done`/`state` on its
/// events, `cancel`, `recover`, `result`, `flush`, `sync_device`, and
/// `will_wait_for` in all four directions (its events and its
/// contexts with local ones and with other remote ones). Transfers move
/// the bytes in `write`/`read` messages (see `backend`). What needs a
/// closure on the device's runner (`schedule_task`, `link`/`run`) throws
/// `std::invalid_argument` saying the device is remote. Calls that wait for
/// a reply the device may defer behind a full queue (`schedule_named`, the
/// pool calls, `all_work`, `await`, `flush`) throw `deadlock_error` from a
/// task. If `a` goes down, every pending and later call on it fails with
/// `device_error`, and so does every local device waiting for it. Throws
/// `device_error` when `a` does not answer.
device attach_device(backend& b, const device_actor& a);

/// The default cookie file: `$XDG_CONFIG_HOME/multidev/cookie`, or
/// `~/.config/multidev/cookie` (XDG_CONFIG_HOME unset). Throws
/// `std::invalid_argument` when neither that nor HOME is set.
std::string default_cookie_file();

/// The cookie in `file` (empty: `default_cookie_file()`), which a node and
/// its clients share: created on first use (mode 0600, its folder 0700) with
/// 32 random bytes of /dev/urandom as hex text. Throws
/// `std::invalid_argument` naming the file when it cannot be made or read,
/// holds under 16 characters, or is readable by its group or others (naming
/// its mode).
std::string load_cookie(const std::string& file = {});

/// Whether two cookies are equal, in time that does not depend on where
/// they differ.
bool same_cookie(const std::string& a, const std::string& b) noexcept;

/// Spawns, on `b`'s actor system, the node actor that serves sessions of
/// `b`'s devices (each client gets devices of its own, made like `b`'s)
/// under `name`, to clients that present the cookie of `cookie_file`
/// (empty: the default file; `load_cookie`, which throws). Publish it with
/// `publish_node` to serve them. It serves them for as long as `b` lives:
/// `~backend` stops it (published or not). Each session's pools may hold
/// `session_memory_limit` bytes in all (0: half the machine's physical
/// memory, `default_session_memory_limit()`); an allocation past it is
/// refused with an error naming the session, the request and the limit.
node_actor spawn_node_actor(backend& b, std::string name, const std::string& cookie_file = {},
                            std::size_t session_memory_limit = 0);

/// Half the machine's physical memory (sysconf): what a node's session may
/// hold in its pools unless told otherwise (`multidev node --memory-limit`).
std::size_t default_session_memory_limit();

/// What a node's port grants a connection whose peer has not opened a
/// session with the cookie (nor been vouched for by a client that did):
/// issue 38 point 3, docs/design.md "Unauthenticated connections".
struct node_transport_limits {
  /// How long such a connection may stay open (TLS and BASP handshakes,
  /// the session's `open`, and idling all count); then it is closed.
  std::chrono::milliseconds handshake_timeout{10'000};
  /// How many such connections the node holds at once; a new one past it
  /// closes the oldest. At most half the process's descriptor limit
  /// (RLIMIT_NOFILE), so the sessions' connections always find room.
  std::size_t max_unauthenticated = 64;
  /// The largest BASP payload read from such a connection, in bytes: a
  /// header that announces more closes the connection before anything is
  /// allocated for it. A session's `open` takes well under 1 KiB.
  std::uint32_t max_unauthenticated_payload = 64 * 1024;
  /// How many BASP messages a second such a connection may send (a burst
  /// of as many); more close it.
  std::uint32_t max_unauthenticated_messages = 64;
};

/// Publishes `node` on `address:port` (port 0: one the system picks) and
/// returns the port: over TLS when its actor system has libcaf_openssl
/// loaded (`configure_tls`), over plain TCP otherwise. `SO_REUSEADDR` is set.
/// Its connections are held to `limits` until their peer opened a session.
caf::expected<uint16_t> publish_node(const node_actor& node, uint16_t port,
                                     const std::string& address,
                                     const node_transport_limits& limits = {});

/// The files of a TLS identity (PEM): this side's certificate and private
/// key, and the CA certificate that signs the peers' certificates.
struct tls_files {
  /// This side's certificate (PEM file).
  std::string certificate;
  /// This side's private key (PEM file).
  std::string key;
  /// The CA certificate that signs the peers' certificates (PEM file).
  std::string ca_file;
  /// For an encrypted key; empty otherwise.
  std::string passphrase;
};

/// Loads libcaf_openssl on `cfg` (after `configure_system`) with `files`:
/// nodes are then published and attached over TLS, each side presenting
/// its certificate and refusing a peer whose certificate `ca_file` did not
/// sign. Throws `std::invalid_argument` naming a file that cannot be read.
void configure_tls(caf::actor_system_config& cfg, const tls_files& files);

/// Attaches every device of the node published on `host:port` to `b` and
/// returns them. They take the ordinals after `b`'s local devices
/// (`get_device`, `num_devices`), in the node's order, and are named
/// `"<node name>/<their name there>"`, so errors name the node;
/// `static_properties` lists them under `(nodes (node (name ..) (address ..)
/// (device (ordinal ..) (name ..)) ...))`. Attaching a node of a name
/// attached before (a restarted node) gives its devices the ordinals the old
/// ones had; the old devices stay failed. Over TLS when `b`'s system has
/// libcaf_openssl loaded (`configure_tls`). `b`'s actor system needs CAF's
/// middleman and heartbeats (a backend's own system has both; for yours,
/// `configure_system(cfg)`). Throws `std::invalid_argument` without a
/// middleman or with heartbeats off (a node cut off by a silent link would
/// hang every wait on it), `device_error` naming
/// `host:port` when the node cannot be reached or does not answer within
/// `timeout`.
std::vector<device> attach_node(backend& b, const std::string& host, uint16_t port,
                                std::chrono::milliseconds timeout = std::chrono::seconds{10});

/// How `attach_node` attaches a node, and the session it opens there
/// (docs/design.md, "Sessions and leases").
struct node_attach_options {
  /// Bounds the whole attach: connecting, opening the session, and asking
  /// each device who it is.
  std::chrono::milliseconds timeout = std::chrono::seconds{10};
  /// The lease asked of the node: it starts the session's items only while
  /// the lease is valid, and ends the session (cancels its queue, frees its
  /// pools) once it ran out unrenewed.
  std::chrono::milliseconds lease = std::chrono::seconds{3};
  /// How often the client renews it (below the lease).
  std::chrono::milliseconds renew_every = std::chrono::seconds{1};
  /// The client declares the node lost once no renewal was acknowledged for
  /// the lease plus this margin (never earlier: the node may run the
  /// session's work until its lease ends), and then every call on its
  /// devices fails with "session ended".
  std::chrono::milliseconds margin = std::chrono::seconds{1};
  /// When set, the name the node must call itself (`--node NAME=HOST:PORT`):
  /// another one is refused with both names.
  std::string expected_name;
  /// When set, the name this backend gives the node (its devices are named
  /// `<name>/...`, `detach_node` takes it) instead of the node's own. A node
  /// attached under a second name is a second client of it: a session of
  /// its own, as another process's would be.
  std::string name;
  /// The file of the cookie the session is opened with (`load_cookie`);
  /// empty: the default file, which `multidev node` uses too.
  std::string cookie_file;
  /// When set, a node that cannot be reached (the connection refused, the
  /// network unreachable) is tried again, 50 ms apart and up to 1 s apart,
  /// until `timeout`: a node that restarts, or a link that heals, in the
  /// meantime is attached. Unset (the default), such a node fails the
  /// attach at once.
  bool retry_unreachable = false;
};

/// `attach_node` with `opts`. A node attached already under the same name
/// whose session is open: the same devices (a node of another identity
/// under that name is refused: names are unique in a backend). One whose
/// session ended (lost, detached): a new session, its devices under the old
/// ordinals (named `"<name>@<n>/..."` when the node restarted since: another
/// identity), the old devices failing with "session ended".
std::vector<device> attach_node(backend& b, const std::string& host, uint16_t port,
                                const node_attach_options& opts);

/// Ends the session of node `name` attached to `b`: the node cancels its
/// work not started and frees its pools; the calls on its devices fail with
/// "session ended" from the return on. The node may be attached again.
/// Waits at most `timeout` for the devices' links. Throws
/// `std::invalid_argument` when no node of that name is attached.
void detach_node(backend& b, const std::string& name,
                 std::chrono::milliseconds timeout = std::chrono::seconds{10});

} // namespace multidev
