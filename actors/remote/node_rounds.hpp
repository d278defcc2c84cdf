#pragma once
/// \file
/// A session's recorded rounds on a node (docs/design.md, "Recorded
/// rounds"): the parts of rounds its client sent (`round_put`), each
/// replayed by one `round_run` (every step pushed at once on the session's
/// devices), and the waits between nodes: a step that waits on an item of
/// another node's part is a gate here that that node opens or fails with a
/// `round_done` when its item resolves, sent straight from node to node.
///
/// Threads: the node actor's (every member). The notices this node sends
/// go from its devices' runners, which hold only what they need to send
/// one (the peer's handle, the ids).
///
/// Bounds (message_checks.hpp): `session_rounds` parts, `round_steps` steps
/// a part, `round_early` notices held for replays not pushed yet (past it
/// the round is failed here, not held further).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/actor_addr.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/node_id.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/core/bulk_push.hpp"
#include "multidev/protocol.hpp"

namespace multidev {
class backend;
class device;
}

namespace multidev::detail {

/// The notices for one peer (its node's actor and the client's session
/// there), gathered by this node's runners while its actor is on its way to
/// send them: the items that resolve meanwhile go in one `round_done`.
struct round_outbox {
  caf::actor to;
  uint64_t session = 0;
  /// This node's actor, which sends them (`flush`).
  caf::actor_addr node;
  std::mutex mu;
  std::vector<round_notice> notices;
  /// Adds `n` (any thread); the first since the last flush asks the node's
  /// actor to flush.
  void add(round_notice n, const std::shared_ptr<round_outbox>& me);
  /// Adds all of `ns`, in order, as `add` does.
  void add(std::vector<round_notice> ns, const std::shared_ptr<round_outbox>& me);
  /// Takes the notices gathered (the node actor's thread, which sends them),
  /// cut into the `round_done`s that carry them: in order, each of at most
  /// `wire_limits::round_steps` notices and, past its first, of at most
  /// `wire_limits::round_part_bytes` bytes of copies.
  std::vector<std::vector<round_notice>> take();
};

/// Asks the node's actor to flush an outbox (local only).
using round_flush_atom = caf::atom_constant<caf::atom("round_fl")>;

class device_core;
struct gate;
struct round_bytes;
struct round_state;

class session_rounds {
public:
  /// Where the parts' devices are: the session's backend, null once it
  /// ended (a node keeps it weak: the session's teardown owns it).
  using home_fn = std::function<std::shared_ptr<backend>()>;
  /// `sys`: the node's system (renders errors); `home`: see `home_fn`;
  /// `who`: "session 3 of node b", for errors; `node`: this node's actor,
  /// the sender of its notices.
  session_rounds(caf::actor_system& sys, home_fn home, std::string who, caf::actor_addr node);
  ~session_rounds();
  session_rounds(const session_rounds&) = delete;
  session_rounds& operator=(const session_rounds&) = delete;

  /// Keeps `part` (checked by `check_round_part`); throws
  /// `std::invalid_argument` for a round held already or past
  /// `wire_limits::session_rounds`. This process's part of a round
  /// (`host_rounds`) gives its devices as `lanes`, instead of the ordinals
  /// `part.devices`, and may hold closures: step `k` with `closures[k]` >= 0
  /// runs that item of `source` (the recorded round; held weak, a round's
  /// own plan holds this).
  void put(round_part part, const std::vector<device>& lanes = {},
           const std::shared_ptr<round_state>& source = {},
           const std::vector<int32_t>& closures = {});
  /// Lets go of round `round`'s part: at once when no wait of its replays
  /// is pending, else once the last is told (its replays are refused
  /// meanwhile). False when no part of it is held.
  bool drop(uint64_t round);
  /// Whether every device of round `round` has room for an entry now (an
  /// unknown round: true, `run` refuses it).
  bool has_room(uint64_t round) const;
  /// Replay `n` of round `round` with the slots' values: pushes it whole
  /// and returns its lanes' last seqs. Throws `std::invalid_argument` (no
  /// such round, a replay number not above the last one, bad slots, a spec
  /// that does not bind) or `device_error` (a device refused), with nothing
  /// queued. The peers that wait on the replay's items hear of a refusal
  /// from the client, which the refusal reaches in every case (`refused`).
  std::vector<uint64_t> run(uint64_t round, uint64_t n, const std::vector<wire_arg>& slots);
  /// A `round_done` from node `from`; why it was dropped, if it was (not
  /// from the node the part names for the item, a replay refused here, a
  /// round held nowhere).
  std::optional<std::string> done(const caf::node_id& from, const round_notice& x);
  /// Node actor `peer` went down (`why`): the waits on it fail, now and in
  /// later replays.
  void peer_down(const caf::actor_addr& peer, const std::string& why);
  /// Replay `n` of round `round` failed on node actor `peer` (`why`): it
  /// refused it (its session there ended, a device failed, ...) or its link
  /// closed before it answered. The client tells the nodes that pushed the
  /// replay (`round_refused`) and this process's part, each once both
  /// answers are in: the waits of that replay here on `peer`'s items fail.
  /// Whether a wait failed (none: told already, or no such replay here).
  bool refused(uint64_t round, uint64_t n, const caf::actor_addr& peer, const std::string& why);
  /// The peers of every part (to monitor and connect to), once each.
  std::vector<round_peer> peers() const;
  /// Notices held for replays not pushed yet, and those dropped.
  std::size_t early() const noexcept { return early_; }
  std::size_t dropped() const noexcept { return dropped_; }
  /// Parts held, and replays pushed.
  std::size_t parts() const noexcept { return rounds_.size(); }
  uint64_t replays() const noexcept { return replays_; }

  /// Replays that wait for room, in order (`round_run` while one waits
  /// joins them).
  struct deferred_run {
    caf::typed_response_promise<std::vector<uint64_t>> rp;
    uint64_t round = 0;
    uint64_t n = 0;
    std::vector<wire_arg> slots;
  };
  std::deque<deferred_run> deferred;

private:
  struct held_gate {
    std::shared_ptr<device_core> core;
    std::shared_ptr<gate> g;
    /// A wait for a copy's bytes (the part writes the item): where they go.
    std::shared_ptr<round_bytes> bytes;
  };
  struct part_state {
    round_part part;
    /// The steps' names (as items), for provenance.
    std::shared_ptr<round_state> st;
    /// This process's part: the recorded round and, per step, the item
    /// whose closure it runs (-1: none).
    std::weak_ptr<round_state> source;
    std::vector<int32_t> closures;
    std::vector<std::shared_ptr<device_core>> cores;
    std::vector<device_core*> lanes;
    std::vector<bulk_step> steps;
    /// Per step: its named task or memset (null: a wait, or a closure).
    std::vector<const round_step*> specs;
    std::vector<uint64_t> lane_steps;
    std::vector<uint64_t> step_ordinal;
    /// The steps that wait on other nodes, in order.
    std::vector<uint32_t> externals;
    /// The awaited item -> its peer.
    std::unordered_map<uint32_t, uint32_t> expects;
    /// The copies' ends here: item -> its `write` step, its `send` step.
    std::unordered_map<uint32_t, uint32_t> write_of, send_of;
    /// Per step, the replay being pushed's copy bytes (scratch: null but
    /// for the copies' steps while `run` pushes).
    std::vector<std::shared_ptr<round_bytes>> bytes;
    /// The last replay pushed or refused here.
    uint64_t last = 0;
    /// (replay, item) -> the gates waiting for it.
    std::map<std::pair<uint64_t, uint32_t>, std::vector<held_gate>> pending;
    /// (replay, item) -> its notices, come before the replay (a copy's
    /// bytes are several).
    std::map<std::pair<uint64_t, uint32_t>, std::vector<round_notice>> early;
    /// Per peer: why it is down (empty: up).
    std::vector<std::string> dead;
    /// Why the round cannot be replayed here any more (empty: it can).
    std::string broken;
    /// Let go by the client: erased once `pending` is empty.
    bool dropped = false;
    /// Per notice (`round_part::notify_steps`): its peer's outbox.
    std::vector<std::shared_ptr<round_outbox>> boxes;
  };
  void settle(part_state& r, const held_gate& h, uint32_t peer, const caf::error& err);
  /// Notice `x` from peer `peer` for the wait `h`: settles it (true), or
  /// takes a part of a copy's bytes and leaves it waiting for the rest.
  bool apply(part_state& r, const held_gate& h, uint32_t peer, const round_notice& x);
  /// Fails the round here (`broken`): its waits, and the notices held.
  void break_round(part_state& r, std::string why);
  /// Takes `held` (notices come early) off the counts.
  void forget_early(std::vector<round_notice>& held);
  void drop_early_up_to(part_state& r, uint64_t n);
  /// Fails the pending waits of replays `first`..`last` on peer `peer`'s
  /// items with `why` (`peer_down`, `refused`); whether one failed.
  bool fail_waits_on(part_state& r, uint32_t peer, const std::string& why, uint64_t first,
                     uint64_t last);
  /// Erases `it` when dropped and nothing waits on it any more.
  void erase_if_done(std::map<uint64_t, part_state>::iterator it);

  caf::actor_system* sys_;
  home_fn home_;
  std::string who_;
  caf::actor_addr node_;
  std::map<uint64_t, part_state> rounds_;
  /// One per peer node and session there, shared by the parts.
  std::map<std::pair<caf::actor_addr, uint64_t>, std::shared_ptr<round_outbox>> outboxes_;
  std::size_t early_ = 0;
  std::size_t early_bytes_ = 0;
  std::size_t dropped_ = 0;
  uint64_t replays_ = 0;
};

/// This process's part of a round that runs on nodes too (docs/design.md,
/// "Recorded rounds"): a `session_rounds` of the backend's own devices,
/// replayed by the thread that replays the round, and the actor that takes
/// the nodes' `round_done` for it, sends its own notices to them (as a
/// node's actor does) and watches the nodes its waits are on.
///
/// Threads: `rounds` under `mu` (the replaying thread, the actor).
struct host_rounds {
  std::mutex mu;
  /// Null once the backend shut down.
  std::unique_ptr<session_rounds> rounds;
  /// The actor, and a strong handle to it until `close` (an actor no
  /// strong handle names is gone; a round may outlive the actor system).
  caf::actor_addr actor;
  caf::actor alive;
  /// Monitors the nodes of a part put here (their losses fail its waits);
  /// each once.
  void watch(const std::vector<round_peer>& peers) const;
  /// Lets go of round `round`'s part, through the actor (which takes `mu`):
  /// any thread, holding `mu` or not (a round's plan as it goes).
  void drop(uint64_t round);
  /// The rounds `drop` asked for (under `drop_mu`), and the nodes watched
  /// (under `mu`).
  std::mutex drop_mu;
  std::vector<uint64_t> dropping;
  std::vector<caf::actor_addr> watched;
  /// Lets go of the rounds and the actor (the backend's teardown, after
  /// its devices).
  void close();
};

/// The backend's `host_rounds`, made and its actor spawned on first use.
std::shared_ptr<host_rounds> host_rounds_of(backend& b);

/// Asks a `host_rounds` actor to monitor nodes (local only).
using round_watch_atom = caf::atom_constant<caf::atom("round_wt")>;
/// Asks a `host_rounds` actor to drop the parts in `host_rounds::dropping`.
using round_let_go_atom = caf::atom_constant<caf::atom("round_lgo")>;

} // namespace multidev::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<multidev::detail::round_outbox>)
