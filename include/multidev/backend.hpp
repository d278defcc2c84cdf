#pragma once
/// \file
/// The multi-device scheduler interface (OCANNL's `Schedulers.Multidev`), value
/// for value, as one C++ class: `backend` is one instance of the signature, a set
/// of devices of one driver kind. Each device is a CAF actor that owns its runner
/// (one FIFO work queue and thread), its pool table and its event bookkeeping;
/// this header keeps CAF out (see `multidev/protocol.hpp` for the actor side).
/// The handles it takes and returns live in `device.hpp`, `event.hpp` and
/// `context.hpp`.
///
/// Threads: every `backend` member may be called from any thread, including
/// from tasks running on a runner. A device's tasks run one at a time, in
/// order, on its runner thread, or on the runner thread of a device that
/// waits for them (`backend_options::hand_over`).
///
/// Devices of other processes. A device is reached through an endpoint: its
/// core when it lives in this process, its actor when it lives in another
/// (`attach_device` in `multidev/protocol.hpp` attaches one). Every member
/// that takes a device or an event works on both, by message for the latter,
/// except the ones that need a closure on the device's runner
/// (`schedule_task`, `link`, `run`): those throw `std::invalid_argument`
/// saying the device is remote and what to use instead. Transfers to, from
/// and between devices of other processes move the bytes in messages:
/// `from_host` sends them with the request, `to_host` and a copy out of
/// another process block until the source's bytes (read after the work
/// scheduled there so far) have arrived, and the write is ordered work on
/// the destination; the routine such a copy returns cannot be `run` again. On a remote device, members that wait for a reply the device may
/// defer behind a full queue (`schedule_named`, the pool calls, `all_work`,
/// `await`, `flush`, `sync_device`) throw `deadlock_error` from a task.

#include <chrono>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "multidev/context.hpp"
#include "multidev/device.hpp"
#include "multidev/event.hpp"
#include "multidev/fwd.hpp"
#include "multidev/kernels.hpp"
#include "multidev/round.hpp"
#include "multidev/sexp.hpp"
#include "multidev/task.hpp"
#include "multidev/trace.hpp"
#include "multidev/types.hpp"

namespace caf {
class actor_system;
} // namespace caf

namespace multidev {

/// How a backend is built.
struct backend_options {
  /// Driver kind: `"cpu"` (tasks run on a runner thread, see `hand_over`),
  /// `"cuda"` (backend `multidev_cuda`: the GPUs, through the CUDA runtime;
  /// no device where there is no GPU, and `static_properties` says why),
  /// `"fake"` (for tests: an asynchronous device whose items complete on a
  /// driver thread after a short pseudo-random delay) or `"fake_cuda"` (for
  /// tests: the CUDA driver over a fake runtime). Another name throws
  /// `std::invalid_argument` listing these.
  std::string driver = "cpu";
  /// Number of devices; default: the machine's hardware threads (CPU), the
  /// GPUs found (CUDA; at most this many when set).
  std::optional<int> num_devices;
  /// Tasks a device's queue holds before `schedule_task` waits for room.
  std::size_t queue_capacity = std::size_t{1} << 16;
  /// On an asynchronous driver, items a device keeps submitted and not yet
  /// finished at most (0 counts as 1); its runner waits for a completion
  /// before it submits more. Synchronous drivers (cpu) run one at a time.
  std::size_t max_in_flight = 64;
  /// CAF scheduler threads when the backend owns its actor system; 0: the
  /// machine's hardware threads.
  int scheduler_threads = 0;
  /// What destroying the backend does with work accepted and not started.
  enum class destroy_policy : uint8_t {
    drain,  ///< Finish it (as OCANNL does).
    cancel, ///< Cancel it, so a program can always shut down promptly.
  };
  /// What `~backend` does with work accepted and not started.
  destroy_policy on_destroy = destroy_policy::drain;
  /// Records each device's runner trace keeps (its last items, see
  /// `backend::trace`); 0, the default, turns tracing off, unless the
  /// environment variable `MULTIDEV_TRACE` names a file: then 65,536, and
  /// the backend writes its Chrome trace there when it is destroyed
  /// (`multidev/trace.hpp`, docs/api.md "Traces").
  std::size_t trace_capacity = 0;
  /// Whether a device's items may run on another device's runner thread
  /// (synchronous drivers). When a device's next item waits for a device
  /// that is parked at a wait its last item just opened, its runner runs
  /// that device's items itself, one at a time and in their order, until
  /// its own wait opens or that device parks again, instead of waking the
  /// other runner and sleeping: a dependency hop then stays on one thread.
  /// The runner lends itself only when it would otherwise wait for those
  /// very items, so no device waits longer than it would without. Off: each
  /// device's items run on its own runner thread only.
  bool hand_over = true;
  /// Whether, in a backend of two devices or more, each device's runner
  /// thread pins itself to one CPU of the process's affinity mask, taking
  /// the mask's CPUs in turn across the process (one runner a CPU until
  /// there are more runners than CPUs). Unpinned, the kernel tends to put a
  /// runner woken by another on the waker's CPU, and two runners that wait
  /// for each other then share one CPU while another idles. A backend of
  /// one device does not pin (no runner of it waits for another, and its
  /// runner's waits on other processes are answered by unpinned network
  /// threads), nor does any when the mask has one CPU. Each device's debug
  /// info says where its runner runs (`cpu`).
  bool pin_runners = true;
};

/// One instance of the Multidev signature: devices of one driver kind.
///
/// Constructing a backend enumerates no device and touches no driver; devices
/// come to life on `get_device`. Destroying it finishes the work already
/// accepted (or cancels it: `backend_options::on_destroy`), joins the
/// runners, frees the pools and stops the actors.
class backend {
public:
  /// A backend with its own CAF actor system.
  explicit backend(backend_options opts = {});
  /// A backend on an actor system the caller owns (and must outlive it).
  /// Call `register_types(cfg)` (protocol.hpp) on its config first to use the
  /// actor protocol across processes.
  explicit backend(caf::actor_system& sys, backend_options opts = {});
  /// Finishes (or cancels) the accepted work, joins the runners, frees the
  /// pools, stops the device actors and the node actors made on it, and
  /// destroys its own actor system. Any thread may run it. On a thread the
  /// teardown would wait for (a runner of its devices, where a task drops
  /// the last reference, or a thread of its own actor system, in a
  /// handler), it stops the devices from accepting work and hands the rest
  /// to a thread of its own, which the process joins at exit: it is then
  /// complete soon after, not on return (docs/design.md, "Shutdown").
  ~backend();
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;

  /// The driver's backend name: `"multidev_cpu"`, `"multidev_cuda"`, ...
  const std::string& name() const;

  // -- Slab_alloc ------------------------------------------------------------

  /// Allocates `size_in_bytes` for `pool_id` on `d`, aligned to `alignment` (a
  /// power of two). Returns with the pool allocated. An existing pool is
  /// replaced; its memory is released once the work scheduled so far is done.
  /// Throws `std::invalid_argument` on a bad alignment or size.
  void alloc_pool(const device& d, int pool_id, std::size_t size_in_bytes,
                  std::size_t alignment,
                  std::optional<memory_mode> mode = std::nullopt);
  /// CPU and CUDA both free pools: always true here.
  bool has_free_pool() const noexcept { return true; }
  /// Drops `pool_id` now; frees it once the work scheduled so far is done.
  /// Throws `std::invalid_argument` when the pool does not exist.
  void free_pool(const device& d, int pool_id);
  /// Zeroes `[offset, offset + size)` of a pool, ordered with `d`'s tasks.
  /// Throws `std::invalid_argument` on an unknown pool or an out-of-range span.
  void memset_zero(const device& d, int pool_id, std::size_t offset,
                   std::size_t size_in_bytes);

  // -- Devices and contexts --------------------------------------------------

  /// A new device record for `dv` driven by `r`, with a fresh device id and
  /// empty bookkeeping. `get_device` uses it once per ordinal.
  device make_device(const multidev::dev& dv, const runner& r, int ordinal);
  /// A root context of `d` holding `buffers`, compiled with `opt`.
  context make_context(const device& d, ctx_buffers buffers = {},
                       optimize_ctx opt = {});
  /// A context with `parent` = `ctx`; omitted fields are inherited.
  context make_child(const context& ctx,
                     std::optional<ctx_buffers> buffers = std::nullopt,
                     std::optional<optimize_ctx> opt = std::nullopt,
                     std::optional<std::optional<tnode>> merge_buffer_node = std::nullopt);
  /// `d`'s name: `"<backend name>:<ordinal>:<device_id>"`.
  std::string get_name(const device& d) const;

  // -- Events ----------------------------------------------------------------

  /// Blocks until `e` is done. Throws `device_error` when it failed,
  /// `cancelled_error` when it was cancelled.
  void sync(const event& e) const;
  /// `sync` that gives up at `deadline` (or after `timeout`) with a
  /// `timeout_error` naming the chain of waits that holds `e`. From a task,
  /// `sync` (with or without a deadline) throws `deadlock_error` naming the
  /// cycle when waiting would close a cycle of runners.
  void sync(const event& e, std::chrono::steady_clock::time_point deadline) const;
  /// `sync` that gives up after `timeout` (see above).
  void sync(const event& e, std::chrono::steady_clock::duration timeout) const;
  /// Whether `e` is done; never blocks. A failed event is not done. For an
  /// event of another process: whether this process has heard it is done
  /// (see `state`).
  bool is_done(const event& e) const;
  /// Everything scheduled on `ctx.device` after this call starts only after
  /// `e` is done. Returns at once; a no-op for events of the same device or
  /// events already done. If `e` fails, `ctx.device` fails too. Works in all
  /// four directions between devices of this process and of others: a local
  /// device waits on a remote event behind a gate that the reply to a `wait`
  /// request opens; a remote device gets a `depend` message naming the
  /// owner's actor. Nothing blocks meanwhile.
  void will_wait_for(const context& ctx, const event& e);

  /// How `e` ended: done, failed, cancelled, or still pending. Never blocks.
  /// For an event of another process, what this process has heard: a seq not
  /// heard of is `pending`, and asked about without waiting, so a later call
  /// sees its outcome; once its node is lost, `failed` unless heard done.
  event_state state(const event& e) const;

  // -- Cancellation and recovery ---------------------------------------------

  /// Drops the work queued on `d` and not yet started: its events resolve
  /// `cancelled` (`sync` throws `cancelled_error`), in seq order; devices
  /// that wait on them fail with a cause that says so. A running task is not
  /// interrupted; a wait the runner is parked on is dropped too. `d` stays
  /// usable: work scheduled after the call runs. Returns at once.
  void cancel(const device& d);
  /// Brings a failed device back: the events that failed stay failed, its
  /// pools survive, new work runs. False when `d` had not failed, or was
  /// killed or shut down (those do not come back).
  bool recover(const device& d);

  // -- Properties and debug info ---------------------------------------------

  /// Computed on first call.
  sexp static_properties() const;
  /// Computed on first call; all empty for CPU.
  multidev::hardware_limits hardware_limits() const;
  /// Bytes held by `d`'s pools, including pools freed or replaced whose
  /// release still waits for earlier work.
  std::size_t get_used_memory(const device& d) const;
  /// `(<backend name> (num_devices ..) (devices_in_use ..) (devices ...) ...)`:
  /// the debug info of every device made so far (and of the attached ones),
  /// ending with the live wait-for graph, `(wait_for (wait ...) ...)`: every
  /// queued wait and every thread blocked in `sync` or `await`, and who holds
  /// or poisoned each event. The devices of nodes (`(attached ...)`) are asked
  /// at once and waited for at most 1 s: each lists its part of its node's
  /// wait-for graph; a silent one is `(silent "silent for N s")`.
  sexp get_global_debug_info() const;
  /// `(device (name ..) (queue_length ..) (scheduled ..) (finished ..)
  /// (pending_waits ..) (waiters ..) (parked_on ..) (error ..) (used_memory ..)
  /// (spare_extras ..) (run_by ..) (run_by_others ..) (cpu ..) (pools ..) ...)`:
  /// `spare_extras` counts the queue entries of copies, zeroings and pool
  /// releases kept for reuse (at most 1,024 once the device is idle; all of
  /// a burst's while it runs); `run_by` says who runs the device's items now
  /// (`runner`, `lendable`: parked at a wait whose opener may run them,
  /// `lent`: another device's runner does, `returned`) and `run_by_others`
  /// how many items another runner ran (`backend_options::hand_over`);
  /// `cpu` is the CPU its runner is pinned to, or `any`
  /// (`backend_options::pin_runners`). With tracing on, ends with `(trace
  /// (capacity ..) (recorded ..) (dropped ..) (last (item ..) ...))`: the
  /// last 8 items of the runner.
  sexp get_debug_info(const device& d) const;
  /// A copy of `d`'s runner trace (`multidev/trace.hpp`): the last
  /// `trace_capacity` items it handled, oldest first, and how many older
  /// ones were dropped; taken without stopping the runner; with the host
  /// threads' blocking waits on `d` and its node's loss (`host`). Empty,
  /// with capacity 0, when tracing is off. A device of another process is
  /// asked by message and named as this process names it; once its node is
  /// lost, only `host` is left, and `unreachable` says why.
  device_trace trace(const device& d) const;

  // -- Work ------------------------------------------------------------------

  /// Blocks until `d` has finished everything scheduled on it. Throws
  /// `device_error` when `d` is failed (a device recovered since its last
  /// item failed is not: that failure stays on the item's event).
  void await(const device& d) const;
  /// `await` that gives up at `deadline` (or after `timeout`) with a
  /// `timeout_error` naming the chain of waits that holds the device.
  void await(const device& d, std::chrono::steady_clock::time_point deadline) const;
  /// `await` that gives up after `timeout` (see above).
  void await(const device& d, std::chrono::steady_clock::duration timeout) const;
  /// Done exactly when everything scheduled on `d` before the call finished.
  event all_work(const device& d) const;
  /// Whether `d`'s runner is waiting for work. Never blocks: for a device of
  /// another process, its last answer (asked again without waiting), false
  /// while this process has sent it work since, or once its node is lost.
  bool is_idle(const device& d) const;
  /// Memoized; throws `std::invalid_argument` naming the ordinal and the count.
  device get_device(int ordinal);
  /// The number of devices: the driver's, plus those of the nodes attached
  /// with `attach_node`.
  int num_devices() const;
  /// Appends `t` to `d`'s queue and returns; waits for room when the queue is
  /// full. Throws `device_error` when `d` failed or was shut down.
  void schedule_task(const device& d, task t);
  /// Schedules a named kernel call, resolved through the kernel registry now
  /// (errors: `std::invalid_argument`); returns its event.
  event schedule_named(const device& d, const task_spec& spec);
  /// Schedules named kernel calls in order, as `schedule_named` each, and
  /// returns their events. Every spec is resolved first: one that does not
  /// fit (`std::invalid_argument`) schedules none. On a device of another
  /// process it is one message per 4,096 tasks instead of a round trip per
  /// task: the way to feed a remote device at full rate.
  std::vector<event> schedule_batch(const device& d, std::span<const task_spec> specs);
  /// Returns once every message sent to `d`'s actor before this call (from
  /// this thread, or already in its mailbox) has been handled, so that host
  /// calls made after it are ordered after those messages (see
  /// `multidev/protocol.hpp`, "Order between the two paths"). A blocking CAF
  /// round trip (~70 us): for mixing the two paths, not for the hot path.
  void flush(const device& d) const;

  // -- Nodes, linking and transfers (SPEC §5.7) -------------------------------

  /// Allocates `t`'s own pool on `ctx.device` (pool id from `next_pool_id`)
  /// and returns the child context that holds it. An effectively-constant node
  /// already cached on the device reuses that buffer.
  context alloc_node(const context& ctx, const tnode& t);
  /// Links a registered kernel against `ctx`: nodes become their buffers.
  /// Throws `std::invalid_argument` for an unknown kernel, a wrong argument
  /// count or type, a node absent from `ctx`, or a merge-buffer kernel whose
  /// merge node is not `ctx.merge_buffer_node`.
  routine link(const context& ctx, const std::string& kernel,
               const std::vector<link_arg>& args);
  /// Schedules `r` on its device after the writers of its inputs; records it
  /// as the writer of its outputs. Returns the event of its completion.
  /// Throws `std::invalid_argument` when a pool it uses was freed or replaced,
  /// or the merge buffer holds another node than `r.merge_buffer_input`.
  event run(const routine& r);
  /// Copies host bytes into `t`'s buffer as ordered work on `ctx.device`. The
  /// bytes must stay valid until that work is done (like cudaMemcpyAsync).
  /// False when `ctx` does not hold `t`; `std::invalid_argument` when the
  /// size differs from `t.size_in_bytes`.
  bool from_host(const context& ctx, const tnode& t, std::span<const std::byte> host);
  /// `alloc_node` (when needed) then `from_host`; returns the context holding `t`.
  context init_from_host(const context& ctx, const tnode& t, std::span<const std::byte> host);
  /// Copies `t`'s buffer into host bytes, ordered after `t`'s last writer;
  /// the bytes are filled once `all_work(ctx.device)` is done.
  bool to_host(const context& ctx, const tnode& t, std::span<std::byte> host);
  /// Copies `t` from `src` to `dst` (into `dst`'s buffer of `t`, or into its
  /// merge buffer), on `dst`'s runner after `t`'s last writer on `src`; the
  /// copy becomes `t`'s writer on `dst`. Returns the copy as a routine (run it
  /// again with `run`); for `merge_buffer_use::copy` its context has
  /// `merge_buffer_node = t`. `std::nullopt` when a context lacks `t`.
  std::optional<routine> device_to_device(const tnode& t, merge_buffer_use into,
                                          const context& dst, const context& src);
  /// Allocates `t` on `dst` when absent and copies it from `src`; returns the
  /// context that holds it on `dst`.
  context init_from_device(const tnode& t, const context& dst, const context& src);
  /// Waits until `d` is idle and forgets the writer events that are done.
  void sync_device(const device& d);

  /// The last result a kernel wrote under `name` (e.g. `checksum`).
  std::optional<kernel_result> result(const std::string& name) const;
  /// The last result a kernel wrote under `name` on the board of `d`'s
  /// backend: this one's for its own devices, the remote backend's (one
  /// round trip) for a device of another process.
  std::optional<kernel_result> result(const device& d, const std::string& name) const;

  // -- Recorded rounds (multidev/round.hpp, docs/api.md) ----------------------

  /// Runs `body` on this thread, capturing instead of running every work
  /// call it makes on this backend (`schedule_task`, `schedule_named`,
  /// `schedule_batch`, `will_wait_for`, `run`, `device_to_device`,
  /// `memset_zero`, `alloc_pool`, `free_pool`), on local or attached
  /// devices, into a round named `name`; nothing is scheduled. Inside, the
  /// events those calls return are recorded events (see round.hpp) and
  /// `all_work(d)` is the recorded event of the last item recorded on `d`.
  /// Refused with `std::invalid_argument` naming the call (and the capture
  /// is dropped): what reads, waits or decides now (`sync`, `await`,
  /// `to_host`, `from_host`, `init_from_host`, `init_from_device`,
  /// `alloc_node`, `flush`, `sync_device`, `cancel`, `recover`), a
  /// `will_wait_for` on an event made outside the round that is still
  /// pending, `all_work` of a device the round has not touched yet, another
  /// backend's calls, and a nested `record` or a `replay`. Other threads'
  /// calls are not captured. An exception from `body` drops the capture and
  /// propagates.
  round record(std::string name, const std::function<void()>& body);
  /// `record` with the name `"round <id>"`.
  round record(const std::function<void()>& body);
  /// Schedules the round's items once more, in record order, each through
  /// the call it was recorded from (its checks included), with its slots'
  /// current values and each in-round `will_wait_for` waiting for this
  /// replay's item. Replays queue behind each other and behind other work
  /// like any calls. A task or named task of a device of this process that
  /// fails says `replay N of round 'R', item 'I': ` in front of its error.
  /// Throws `std::invalid_argument` for an empty round or one recorded by
  /// another backend, and, prefixed the same way, when an item is refused
  /// (a pool it uses was freed): a round replayed at once (docs/api.md,
  /// "Recorded rounds") then schedules nothing (its pool calls undone),
  /// one replayed call by call keeps the items before it scheduled.
  /// Before anything is scheduled, throws `device_error` naming the device,
  /// its node's loss and the round when a device the round touches is lost
  /// (its node was killed or its session ended): replay it with a remap.
  replay_events replay(const round& r);
  /// `replay(r)` with each item's device replaced by its image under
  /// `remap` (devices not in it stay; entries for devices the round does
  /// not touch are ignored): a round whose node was lost runs on another
  /// node's devices. Checked before anything is scheduled, each refusal a
  /// `std::invalid_argument` naming the round and the device: a source is
  /// mapped once; no two devices of the round end up on one device; each
  /// target is a device of this backend, not lost, of the source's driver;
  /// a target of another process gets no closure (`schedule_task`); a
  /// linked routine (`run`) is not moved; and every pool (but the merge
  /// buffer, 0) that the moved items use on a target exists there now or
  /// is made before by the round's own `alloc_pool` there (and not freed
  /// before by its `free_pool`). The round's unmapped devices are checked
  /// as `replay(r)` checks them. `replay_events::all_work` names the targets.
  replay_events replay(const round& r, const device_remap& remap);

  /// The actor system the devices live in.
  caf::actor_system& system() const;
  /// Internal state, for `protocol.hpp` and the tools.
  detail::backend_impl& impl() const noexcept { return *impl_; }

private:
  /// Both `replay`s: `remap` null for none.
  replay_events replay_mapped(const round& r, const device_remap* remap);
  std::unique_ptr<detail::backend_impl> impl_;
};

} // namespace multidev
