#pragma once
/// \file
/// What a recorded round holds (`multidev/round.hpp`), and the capture that
/// fills it: a thread-local pointer that the backend's work calls test
/// before anything else (one thread-local load, no lock, no atomic, on the
/// hot path), so a call made inside `backend::record` on the recording
/// thread becomes an item instead of work.
///
/// Lifetimes: the round holds its items; an item holds what its per-call
/// replay needs (the device handles, contexts, the task's closure, the
/// routine with its pinned pools, the spec). A device handle keeps the
/// device's record, not its backend: `replay` checks that the round is the
/// backend's own (`round_state::backend_id`).

#include <atomic>
#include <cstddef>
#include <mutex>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "actors/core/bulk_push.hpp"
#include "actors/remote/endpoint_remote.hpp"
#include "multidev/protocol.hpp"
#include "multidev/context.hpp"
#include "multidev/device.hpp"
#include "multidev/event.hpp"
#include "multidev/round.hpp"
#include "multidev/task.hpp"

namespace multidev::detail {

struct backend_impl;
struct device_record;
struct host_rounds; // actors/remote/node_rounds.hpp

/// One recorded call. Only the fields of its kind are set.
struct round_item {
  enum class kind : uint8_t { task, named, wait, run, copy, memset, alloc_pool, free_pool };
  kind k = kind::task;
  /// The device it is scheduled on (a copy's destination; a wait's waiter).
  device dev;
  /// For failure texts: `"<what> <index>"`, or the name given with `name_item`.
  std::string name;
  /// `task`: the task, copied at each replay.
  task work;
  /// `named`: the call; its slot arguments change between replays.
  task_spec spec;
  /// `named`: which arguments are slots (for `round::arg`).
  std::vector<bool> slots;
  /// `wait`: the waiter's context; `copy`: the destination's.
  context ctx;
  /// `copy`: the source's context.
  context src;
  /// `wait`: an event made outside the round (resolved when recorded)...
  event on;
  /// ... or the index of the item, inside the round, it waits for (rebound
  /// to that item's event of each replay).
  std::optional<std::size_t> on_item;
  /// `run`: the routine.
  routine r;
  /// `copy`: the node and where it goes.
  tnode node;
  merge_buffer_use into = merge_buffer_use::no;
  /// `memset`, `alloc_pool`, `free_pool`.
  int pool_id = 0;
  std::size_t offset = 0;
  std::size_t size = 0;
  std::size_t alignment = 0;
  std::optional<memory_mode> mode;
};

/// How a round whose items all run in this process is replayed on the
/// devices (docs/design.md, "Recorded rounds"): each item's entry, made
/// once, pushed with every other of the replay at once (`bulk_push`: a lock
/// per device, every seq known before any entry is visible). Built at the
/// first replay; read-only after.
struct replay_plan {
  /// Whether the round can be replayed so (otherwise it goes call by call).
  bool usable = false;
  /// The devices it pushes to (lanes), held for the round's life.
  std::vector<std::shared_ptr<device_core>> cores;
  std::vector<device_core*> lanes;
  /// Each lane's endpoint (the replay's events name it).
  std::vector<std::shared_ptr<endpoint>> eps;
  /// The entries of one replay, in record order: a task or named task's
  /// run, or a wait on an earlier step of another lane.
  std::vector<bulk_step> steps;
  /// The item each step pushes.
  std::vector<uint32_t> step_item;
  /// Steps per lane, and each step's place on its lane (1 for its first).
  std::vector<uint64_t> lane_steps;
  std::vector<uint64_t> step_ordinal;
  /// Where item `i`'s event is: its lane, and the step whose seq it is
  /// (-1: the lane's last seq before the replay; a wait with no entry of
  /// its own, on its own lane's item or on a done event, is the lane's
  /// last step before it).
  struct item_event {
    uint32_t lane = 0;
    int32_t step = -1;
  };
  std::vector<item_event> item_events;
  /// `round_state::devices[i]`'s lane.
  std::vector<uint32_t> device_lane;
  /// The steps that run a routine (`backend::run`) or a copy between two
  /// devices of this process, in step order, and the routines (null for a
  /// copy: built at each replay, its pools looked up then): pushed under
  /// `routine_push`.
  std::vector<uint32_t> routine_steps;
  std::vector<const routine*> routines;
  /// Per routine: a copy whose source node the round wrote before it
  /// (`routine_push`'s `written_in_round`).
  std::vector<uint8_t> written_in_round;
  /// Whether a copy is among them.
  bool copies = false;
  /// Whether the round calls `alloc_pool` or `free_pool` (then it has no
  /// routine or copy).
  bool pools = false;
};

/// How a round whose items all run on attached nodes' devices is replayed
/// on the nodes (docs/design.md, "Recorded rounds"): each node holds its
/// part (`round_part`, sent once), and a replay is one `round_run` message
/// per node; a cross-node wait is a gate on the waiting node that the
/// awaited node opens with a `round_done`, node to node. Built at the first
/// replay when the device-side plan does not take the round; read-only
/// after, but for `installed`.
struct node_plan {
  bool usable = false;
  struct node {
    /// This process (`host_rounds`): its part is pushed by the replaying
    /// thread, no message sent; `actor` is the host rounds' actor.
    bool here = false;
    /// Here only: per step of the part, the round's item whose closure it
    /// runs (-1: none; a closure cannot travel to a node).
    std::vector<int32_t> closures;
    /// Its node actor (weak: a round may outlive the actor system) and the
    /// session the client holds there.
    caf::actor_addr actor;
    uint64_t session = 0;
    std::string name;
    /// The part's lanes: the devices, and their endpoints (events name them).
    std::vector<device> lanes;
    std::vector<std::shared_ptr<endpoint>> eps;
    /// The endpoint whose link's reply sink sends the node's round messages:
    /// the node's first device's, whatever the round, so that every round's
    /// `round_run`s reach the node in the order sent (one sender).
    std::shared_ptr<endpoint> sender;
    /// The round's id there.
    uint64_t round = 0;
    /// The part to send (`round_put`; emptied once sent), and its steps'
    /// places on their lanes.
    round_part part;
    std::vector<uint64_t> lane_steps;
    std::vector<uint64_t> step_ordinal;
    /// The part's slots, as the round's (item, argument).
    std::vector<round_slot> slots;
  };
  std::vector<node> nodes;
  /// This process's part's keeper, when a node is `here`.
  std::shared_ptr<host_rounds> host;
  /// What a replay's replies need to tell the nodes of a refusal
  /// (`node_replay::routes`): made when the parts are installed, read-only;
  /// a copy of `nodes`' addressing, because the answers may come after the
  /// round (and this plan) is gone.
  struct route {
    bool here = false;
    caf::actor_addr actor;
    uint64_t session = 0;
    uint64_t round = 0;
    std::shared_ptr<endpoint> sender;
    std::string name;
  };
  struct routes_t {
    std::string round_name;
    std::vector<route> nodes;
    std::shared_ptr<host_rounds> host;
  };
  std::shared_ptr<const routes_t> routes;
  /// Where item `i`'s event is: its node, lane, and the part's step whose
  /// seq it is (-1: the lane's last seq before the replay).
  struct item_event {
    uint32_t node = 0;
    uint32_t lane = 0;
    int32_t step = -1;
  };
  std::vector<item_event> item_events;
  /// `round_state::devices[i]`'s node and lane.
  std::vector<std::pair<uint32_t, uint32_t>> device_lane;
  /// The copies into merge buffers: the destination and the node's size. A
  /// replay goes on the nodes while every one is that large (records'
  /// `merge_buffer_capacity`); otherwise call by call, which grows it.
  std::vector<std::pair<device, std::size_t>> merges;
  /// The copies into devices of this process: each replay makes its write
  /// the destination's writer of the node (`updating_for`, or of its merge
  /// buffer), as the call does, once this process's part is pushed.
  std::vector<uint32_t> copies_here;
  /// Whether the parts were sent (under `install_mu`).
  std::mutex install_mu;
  /// Held while a replay takes its number and sends its messages: a node
  /// takes a round's replays only in order, whatever thread replays.
  std::mutex send_mu;
  bool installed = false;
  node_plan() = default;
  node_plan(const node_plan&) = delete;
  node_plan& operator=(const node_plan&) = delete;
  /// Tells the nodes that hold parts to let them go (`round_drop`): the
  /// round's last handle went.
  ~node_plan();
};

/// The nodes' replies to one replay on the nodes, filled as they arrive (on
/// CAF's I/O thread); `replay_events` waits for the one it reads.
struct node_replay {
  struct reply final : replay_fence {
    std::atomic<uint32_t> flag{0}; // 1: ends, 2: err
    std::vector<uint64_t> ends;
    caf::error err;
    /// Its answer was taken in (`arrive`, round.cpp; under `arrive_mu`).
    bool in = false;
    void wait() const override {
      uint32_t v;
      while ((v = flag.load(std::memory_order_acquire)) == 0)
        flag.wait(0, std::memory_order_acquire);
    }
  };
  uint64_t n = 0;
  std::vector<std::shared_ptr<reply>> replies; // per node of the plan
  /// Taking an answer in (`arrive`, round.cpp): each participant that
  /// pushed the replay hears of each one that did not, once, so that no
  /// wait on a refused replay's items is left pending. `replies` is whole
  /// before the first message goes out.
  std::mutex arrive_mu;
  std::shared_ptr<const node_plan::routes_t> routes;
};

struct round_state {
  /// Unique in the process: recorded events carry it (`recorded_node`).
  uint32_t id = 0;
  /// The backend that recorded it (`backend_impl::id`).
  uint64_t backend_id = 0;
  std::string name;
  std::vector<round_item> items;
  /// The devices it touches, in first-touch order (`replay_events::all_work`).
  std::vector<device> devices;
  /// Replays started so far.
  std::atomic<uint64_t> replays{0};
  /// For each local device, the last seq a replay of this round pushed there
  /// with a provenance wrapper (guarded by `backend_impl::rounds_mu`): the
  /// backend keeps the round until they are resolved (`keep_for_replays`).
  std::vector<std::pair<const device_core*, uint64_t>> last_local;
  /// The device-side replay, built once at the first replay (`plan_once`).
  replay_plan plan;
  std::once_flag plan_once;
  /// The node-side replay, built with it when `plan` does not take the round.
  node_plan nodes;
  /// Its images under remaps (`backend::replay(r, remap)`): the round with
  /// each item's device and contexts moved by the remap (the key: the pairs
  /// that move a device it names, a copy's source included), whose own plans replay it as this
  /// round's replay it, under this round's replay numbers. Made at a
  /// remap's first replay when the round holds no closure or routine (an
  /// image would run copies of them); the last `max_images` are kept, and
  /// `name_item` and `slot` let them go (they copy names and slots).
  /// Guarded by `images_mu` (held only to find or make one). An image's
  /// replay holds the image's `image_replay_mu` throughout: it writes the
  /// image's slots, which another thread's replay of it would be binding.
  std::vector<std::pair<std::vector<std::pair<device, device>>, std::shared_ptr<round_state>>>
    images;
  std::mutex images_mu;
  std::mutex image_replay_mu;
  static constexpr std::size_t max_images = 4;
  /// Tests: every replay goes call by call (the plans' reference). Set
  /// before replaying, on the replaying thread.
  bool by_calls = false;

  /// Item `i`'s recorded event.
  event recorded_event(std::size_t i) const;
  /// The index of the item `e` names; throws `std::invalid_argument` (in
  /// `what`'s name) when `e` is not one of this round's recorded events.
  std::size_t index_of(const event& e, const char* what) const;
  /// The last item recorded on `d`, if any.
  std::optional<std::size_t> last_on(const device& d) const;
  /// Appends `it` (naming it `"<label> <index>"`); returns its recorded event.
  event add(round_item it, std::string_view label);
};

/// A new round id (`round_state::id`), unique in the process.
uint32_t next_round_id() noexcept;

/// The node of recorded events: no device lives there, so they resolve to
/// no endpoint (waiting on one outside its round throws).
node_ref recorded_node();
/// Whether `e` is a recorded event (of any round).
inline bool is_recorded(const event& e) { return e.key().node == recorded_node(); }

/// The capture in progress on this thread, if any: which backend and round.
struct capture {
  const backend_impl* owner = nullptr;
  round_state* round = nullptr;
};
/// Set by `backend::record` on the recording thread for the body's run.
/// `constinit`: no dynamic initialization, so reading it costs no TLS
/// wrapper call, only the thread-local load.
extern constinit thread_local capture* current_capture;

/// The capture of `owner` on this thread; throws `std::invalid_argument`
/// naming `call` when this thread records a round of another backend.
round_state& capture_of(const backend_impl& owner, const char* call);
/// Throws `std::invalid_argument`: `call` cannot be recorded in a round (it
/// reads or waits now, or changes what a replay could not redo); `why` says
/// what to do instead.
[[noreturn]] void refuse_in_round(const char* call, const char* why);

// The capture of each recordable call (actors/round.cpp); the backend's
// members call them when `current_capture` is set.
void record_task(const backend_impl& impl, const device& d, task&& t);
event record_named(const backend_impl& impl, const device& d, const task_spec& spec);
std::vector<event> record_batch(const backend_impl& impl, const device& d,
                                std::span<const task_spec> specs);
void record_wait(const backend_impl& impl, const context& ctx, const event& e);
event record_run(const backend_impl& impl, const routine& r);
std::optional<routine> record_copy(const backend_impl& impl, const tnode& t,
                                   merge_buffer_use into, const context& dst,
                                   const context& src);
void record_pool_call(const backend_impl& impl, round_item::kind k, const device& d,
                      int pool_id, std::size_t offset, std::size_t size,
                      std::size_t alignment, std::optional<memory_mode> mode);
/// `all_work(d)` inside a record: the recorded event of the last item on `d`.
event recorded_all_work(const backend_impl& impl, const device& d);

/// Keeps `st` alive in `impl` while a replay's wrappers may read it (called
/// as a replay returns): a replayed task's closure holds a plain pointer to
/// its round (a shared one would make the host and the runner bounce its
/// count between their caches on every task), so the backend holds the
/// round from its first replay until nobody else does and every seq in
/// `last_local` is resolved. `pushed`: (local device, seq) of items the
/// replay pushed whose work reads the round, any number per device
/// (`last_local` is raised to the largest); drops the rounds past that. One
/// lock per replay.
void keep_for_replays(backend_impl& impl, const std::shared_ptr<round_state>& st,
                      std::span<const std::pair<const device_core*, uint64_t>> pushed);

/// The bytes of one copy of a replay on the nodes (`round_step::send` and
/// `write`): the read fills them on the source's runner (same node) or
/// the notices from the source's node do (`session_rounds::done`); the
/// write reads them once the gate before it opened, which that filling
/// happens before.
struct round_bytes {
  /// The span's size.
  uint64_t size = 0;
  std::string data;
  /// The parts come so far (offset -> size) and their bytes in all (the
  /// destination's node; a part may come before an earlier one).
  std::map<uint64_t, uint64_t> parts;
  uint64_t received = 0;
};

/// A node's replay of its part of a round (actors/remote/node_rounds.cpp):
/// each task step's spec bound on its lane (`specs[k]`, null for a wait;
/// a memset's order made, its pool looked up) and
/// wrapped with the provenance of item `k` of `st` (whose items are the
/// part's steps, named as the client named them) and replay `n`, then all
/// pushed at once (`bulk_push`, never waiting for room: an actor's thread),
/// `external` the gates of the waits on other nodes. `ends` gets each
/// lane's last seq. Throws as `bulk_push` does, or `std::invalid_argument`
/// for a spec that does not bind, with nothing queued. This process's part
/// (`host_rounds`) may hold closures too: a task step whose spec is null
/// runs item `closures[k]` of `source` (the recorded round, kept while the
/// replay's items may run, as a local replay keeps it). A copy's `send`
/// and `write` steps read and write `bytes[k]` (per step; null for the
/// others).
void push_part(backend_impl& impl, const std::shared_ptr<round_state>& st,
               std::span<device_core* const> lanes,
               std::span<const std::shared_ptr<device_core>> cores,
               std::span<const bulk_step> steps, std::span<const round_step* const> specs,
               uint64_t n, std::span<const std::shared_ptr<gate>> external,
               std::span<uint64_t> ends, const std::shared_ptr<round_state>& source = {},
               std::span<const int32_t> closures = {},
               std::span<const std::shared_ptr<round_bytes>> bytes = {});

/// The routines of a replay pushed at once (`replay_plan`, a `host_rounds`
/// part): what `backend::run` does around its push, for all of them under
/// one hold of their devices' records (actors/transfers.cpp). Made before
/// the push (once `check_pins` passed for each): waits for room on `lanes` (no waiting
/// for room under the records' locks: the push must not wait then), locks
/// the records, and queues on each routine's device the copies still
/// reading its outputs that it must come after (write after read; ahead of
/// the replay's entries there, which only orders more). After the push,
/// `wrote(k, seq)` makes routine `k` its outputs' writer. Unlocks when it
/// goes. A copy (`local_copy`'s routine) also waits for its source's
/// writer of the node (unless `written_in_round[k]`: the round wrote that
/// node before the copy, and the plan's wait step orders the copy after
/// that writer; the writer from before the replay is not the copy's to
/// wait for, as the calls would not, and its failure must not fail the
/// copy), and is entered as a reader there. A routine the user runs that
/// copies, or reads the merge buffer, is not taken.
class routine_push {
public:
  /// `may_wait` false: the caller waited for room itself (it holds a lock
  /// that what frees room may need). `written_in_round`: empty, or one
  /// flag per routine.
  routine_push(std::span<const routine* const> routines, std::span<device_core* const> lanes,
               bool may_wait = true, std::span<const uint8_t> written_in_round = {});
  ~routine_push();
  routine_push(const routine_push&) = delete;
  routine_push& operator=(const routine_push&) = delete;
  /// Routine `k` (of the constructor's span) was pushed at `seq`.
  void wrote(std::size_t k, uint64_t seq);
  /// Throws `std::invalid_argument` when a pool `r` holds was freed or
  /// replaced after linking (as `backend::run` does).
  static void check_pins(const routine& r);
  /// Whether a replay pushed at once may hold `r` (else call by call).
  static bool takes(const routine& r) { return !r.copy_source && !r.merge_buffer_input; }

private:
  std::span<const routine* const> routines_;
  std::vector<device_record*> locked_;
};

/// The routine of a copy between two devices of this process (what
/// `device_to_device` runs there), not run; none when a context lacks `t`.
/// Without `may_grow`, a merge buffer too small for `t` throws
/// `std::invalid_argument` instead of growing (actors/transfers.cpp).
std::optional<routine> local_copy(backend& b, const tnode& t, merge_buffer_use into,
                                  const context& dst, const context& src, bool may_grow);
/// Whether `dst`'s merge buffer holds `t` without growing.
bool merge_buffer_fits(const context& dst, const tnode& t);

/// `device_to_device` returning the copy's event on `dst` (actors/transfers.cpp);
/// throws `std::invalid_argument` when a context lacks `t`.
event copy_step(backend& b, const tnode& t, merge_buffer_use into, const context& dst,
                const context& src);

} // namespace multidev::detail
