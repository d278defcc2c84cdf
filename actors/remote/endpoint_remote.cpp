// The endpoint of a device of another actor system: requests through one
// link actor per device (see endpoint_remote.hpp).
#include "actors/remote/endpoint_remote.hpp"
#include "actors/wait_graph.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/system_messages.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#include "actors/core/device_core.hpp"
#include "actors/logger_tie.hpp"
#include "actors/remote/reply_sink.hpp"
#include "actors/core/trace.hpp"
#include "messages/tsan.hpp"

namespace multidev::detail {
namespace {
class remote_op;
} // namespace
} // namespace multidev::detail

// Only ever sent to a link actor of this process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<multidev::detail::remote_op>)

namespace multidev::detail {

using namespace atoms;

namespace {

using post_atom = caf::atom_constant<caf::atom("post")>;

/// The timeout of a request that changes the device (schedules, allocates,
/// writes, waits, cancels...): none. Such a request fails only when its link
/// closes (the device's actor is down: its node was lost, by a broken
/// connection or missed heartbeats, or its backend stopped), never while the
/// device may still carry it out, so a caller that retries after an error
/// does not run it twice (docs/design.md, "Requests without a timeout").
const caf::duration until_lost = caf::infinite;

/// The timeout of a query that changes nothing (status, debug info, trace,
/// identify...), which a caller may simply ask again; see `set_query_timeout`.
std::atomic<int64_t> query_timeout_ms{5 * 60 * 1000};

caf::duration query_timeout() {
  return caf::duration{std::chrono::milliseconds{query_timeout_ms.load(std::memory_order_relaxed)}};
}

/// Tasks per message of `schedule_batch`.
constexpr std::size_t batch_limit = 4096;

/// What a link actor and its endpoint share.
struct link_shared {
  caf::actor_addr link;   // written once, before the endpoint is published
  caf::actor_addr target; // likewise
  /// Where the replies to `wait`s land (see reply_sink.hpp); likewise.
  std::shared_ptr<reply_sink> sink;
  /// Held while a batch goes in parts (`schedule_batch`), so that this link
  /// has at most one open on the device at a time.
  std::mutex batch_mu;
  uint64_t last_batch = 0; // the id of the last batch sent in parts; under batch_mu
  /// With tracing on (set once, before the link starts): host threads'
  /// waits on the device, and its loss. Null when tracing is off.
  std::unique_ptr<host_span_log> spans;
  /// A device of a session (set once, before the link starts): its loss is
  /// declared by the session's keeper (actors/remote/node.cpp), not by its actor
  /// going down.
  bool session = false;
  /// When the last reply from the device arrived (`trace_clock`): where a
  /// node loss's span starts at the latest, and how long a silent device
  /// has been silent (`get_global_debug_info`).
  std::atomic<int64_t> last_heard_ns{0};

  /// Requests that add work posted without a caller waiting for their
  /// reply (`depend`, a copy's `copy_to`), not yet answered: a replay on
  /// the device's node waits until none is left (`settle_async`), so that
  /// its entries come after theirs.
  std::atomic<uint32_t> async_work{0};
  /// A replay on the device's node not yet answered: the calls posted after
  /// it wait for its reply first (`post`), so that their work comes after
  /// the replay's (its node pushes the replay, not this link's device actor).
  std::atomic<bool> fenced{false};
  std::mutex fence_mu;
  std::shared_ptr<const replay_fence> fence;
  /// Waits for `fence`'s reply, if there is one, then drops it.
  void pass_fence() {
    if (!fenced.load(std::memory_order_acquire))
      return;
    std::shared_ptr<const replay_fence> f;
    {
      std::lock_guard guard{fence_mu};
      f = fence;
    }
    if (!f)
      return;
    f->wait();
    std::lock_guard guard{fence_mu};
    if (fence == f) {
      fence.reset();
      fenced.store(false, std::memory_order_release);
    }
  }
  void one_async_done() noexcept {
    if (async_work.fetch_sub(1, std::memory_order_acq_rel) == 1)
      async_work.notify_all();
  }

  /// Notes that a reply from the device arrived now (a TSC read and a
  /// relaxed store, against a remote round trip of ~100 us).
  void heard() noexcept {
    last_heard_ns.store(trace_clock::get().now_relaxed(), std::memory_order_relaxed);
  }

  /// Remembers that a reply said `seq` was done: done forever. Seqs resolve
  /// in order but not all to done (a failure, a cancellation, then a
  /// recovery), so what is known is per seq, of the latest few.
  void note_done(uint64_t seq) { note_outcome(seq, event_state::done); }
  /// Remembers how `seq` ended (never `pending`): final, as every outcome.
  void note_outcome(uint64_t seq, event_state s) {
    if (seq == 0 || s == event_state::pending)
      return;
    std::lock_guard guard{mu};
    outcomes_[seq] = s;
    if (outcomes_.size() > max_known)
      outcomes_.erase(outcomes_.begin());
  }
  /// How `seq` ended, if a reply said so.
  std::optional<event_state> known_outcome(uint64_t seq) const {
    if (seq == 0)
      return event_state::done;
    std::lock_guard guard{mu};
    if (auto i = outcomes_.find(seq); i != outcomes_.end())
      return i->second;
    return std::nullopt;
  }
  bool known_done(uint64_t seq) const { return known_outcome(seq) == event_state::done; }
  /// Whether this call should start learning `seq`'s outcome: false while a
  /// request for it is under way (`learned` ends it).
  bool start_learning(uint64_t seq) {
    std::lock_guard guard{mu};
    return learning_.insert(seq).second;
  }
  void learned(uint64_t seq) {
    std::lock_guard guard{mu};
    learning_.erase(seq);
  }

  /// What this process knows of the device's runner being idle: the last
  /// answer, good only while no request that adds work was sent after the
  /// question (`work_sent` counts those).
  void work_sent() noexcept { work_sent_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t work_sent_count() const noexcept { return work_sent_.load(std::memory_order_relaxed); }
  /// The answer known now, and whether the caller should ask again (none
  /// under way).
  std::pair<bool, bool> known_idle() {
    auto sent = work_sent_count();
    std::lock_guard guard{mu};
    bool ask = !idle_asking_;
    idle_asking_ = true;
    return {idle_known_ && idle_sent_ == sent, ask};
  }
  /// The answer to an `idle` question asked when `sent` requests that add
  /// work had been sent (none: it failed).
  void idle_answer(std::optional<bool> idle, uint64_t sent) {
    std::lock_guard guard{mu};
    idle_asking_ = false;
    if (!idle)
      return;
    idle_known_ = *idle;
    idle_sent_ = sent;
  }
  std::string name() const {
    std::lock_guard guard{mu};
    return name_;
  }
  void set_name(std::string name) {
    std::lock_guard guard{mu};
    name_ = std::move(name);
  }
  /// Closes the link for good; the first reason stays.
  void close(const std::string& why) {
    std::lock_guard guard{mu};
    if (closed_.empty())
      closed_ = why;
  }
  /// A session's device (`session`): runs `f` when the link closes, rather
  /// than now; false when it is closed already. For a `wait` that failed
  /// because the device's actor is unreachable, not by the device's answer:
  /// the node may still run that seq until the session's keeper gives its
  /// verdict (endpoint_remote.hpp).
  bool defer(std::function<void()> f) {
    std::lock_guard guard{mu};
    if (!closed_.empty())
      return false;
    deferred_.push_back(std::move(f));
    return true;
  }
  std::vector<std::function<void()>> take_deferred() {
    std::lock_guard guard{mu};
    return std::move(deferred_);
  }
  /// Has `waiting` (a device actor of another node, waiting on this link's
  /// device) told `lost` when this link closes; false when it is closed.
  bool watch(const caf::actor& waiting) {
    std::lock_guard guard{mu};
    if (!closed_.empty())
      return false;
    watchers_.emplace(waiting.address(), waiting);
    return true;
  }
  /// Where the device's node listens, as this process reached it (empty
  /// host: not known, e.g. a device attached alone).
  void set_address(std::string host, uint16_t port) {
    std::lock_guard guard{mu};
    host_ = std::move(host);
    port_ = port;
  }
  std::pair<std::string, uint16_t> address() const {
    std::lock_guard guard{mu};
    return {host_, port_};
  }
  std::map<caf::actor_addr, caf::actor> take_watchers() {
    std::lock_guard guard{mu};
    return std::move(watchers_);
  }
  /// Has node actor `waiting` (session `session` there) told, when this
  /// link closes, that node actor `lost` is (its recorded rounds wait on
  /// it); false when closed already.
  bool watch_for_rounds(const caf::actor& waiting, uint64_t session, const caf::actor& lost) {
    std::lock_guard guard{mu};
    if (!closed_.empty())
      return false;
    for (const auto& w : round_watchers_)
      if (w.waiting == waiting && w.session == session && w.lost == lost)
        return true;
    round_watchers_.push_back({waiting, session, lost});
    return true;
  }
  /// Has this process's part of the rounds (`key`: its `host_rounds`)
  /// called `here` with the reason when this link closes (its rounds wait
  /// on node actor `lost`; a call, not a message, so that no other process
  /// can send it); false when closed already.
  bool watch_for_rounds_here(const void* key, const caf::actor& lost,
                             std::function<void(const std::string&)> here) {
    std::lock_guard guard{mu};
    if (!closed_.empty())
      return false;
    for (const auto& w : round_watchers_)
      if (w.key == key && w.lost == lost)
        return true;
    round_watchers_.push_back({{}, 0, lost, key, std::move(here)});
    return true;
  }
  struct round_watcher {
    caf::actor waiting;
    uint64_t session = 0;
    caf::actor lost;
    const void* key = nullptr;
    std::function<void(const std::string&)> here;
  };
  std::vector<round_watcher> take_round_watchers() {
    std::lock_guard guard{mu};
    return std::move(round_watchers_);
  }
  /// A session's device whose actor went down (`link_state::held`): why.
  void hold(std::string why) {
    std::lock_guard guard{mu};
    held_ = std::move(why);
  }
  /// Why it was closed, or why its calls are held; none while open.
  std::optional<std::string> held_reason() const {
    std::lock_guard guard{mu};
    if (!closed_.empty())
      return closed_;
    if (!held_.empty())
      return held_;
    return std::nullopt;
  }
  /// Why it was closed, if it was.
  std::optional<std::string> closed_reason() const {
    std::lock_guard guard{mu};
    if (closed_.empty())
      return std::nullopt;
    return closed_;
  }
  /// The error every call gets once closed; none while open.
  caf::error closed_error() const {
    std::lock_guard guard{mu};
    if (closed_.empty())
      return caf::none;
    return make_error(errc::device_failed, name_, closed_);
  }

private:
  static constexpr std::size_t max_known = 4096;
  mutable std::mutex mu;
  std::string name_;
  std::string closed_;
  std::string held_; // see hold
  std::map<uint64_t, event_state> outcomes_;
  std::set<uint64_t> learning_;
  std::atomic<uint64_t> work_sent_{0};
  bool idle_known_ = false;
  bool idle_asking_ = false;
  uint64_t idle_sent_ = 0;
  std::map<caf::actor_addr, caf::actor> watchers_;
  std::vector<round_watcher> round_watchers_;
  std::string host_;
  uint16_t port_ = 0;
  std::vector<std::function<void()>> deferred_;
};

/// Remembers the outcome a `wait`'s error reply gives `seq`: one that
/// carries a failure (the seq's own, or the device's that poisoned it) is
/// final; another (the link closed, the seq unknown there) says nothing.
void note_failure(link_shared& shared, uint64_t seq, const caf::error& err) {
  if (!failure_of(err))
    return;
  shared.heard();
  shared.note_outcome(seq, err.code() == static_cast<uint8_t>(errc::cancelled)
                             ? event_state::cancelled
                             : event_state::failed);
}

/// One request to the device's actor, from the caller's side: how to send it
/// (run by the link actor, which holds the handle) and what to do with its
/// outcome. Settled exactly once: by the reply, by the link closing, or,
/// when the message never reached the link, by its destructor.
class remote_op {
public:
  using issue_fn = std::function<void(caf::event_based_actor*, const device_actor&,
                                      const std::shared_ptr<remote_op>&)>;
  using fail_fn = std::function<void(const caf::error&)>;

  remote_op(issue_fn issue, fail_fn fail, std::shared_ptr<link_shared> shared)
    : issue_(std::move(issue)), fail_(std::move(fail)), shared_(std::move(shared)) {}
  remote_op(const remote_op&) = delete;
  remote_op& operator=(const remote_op&) = delete;
  ~remote_op() {
    tsan_acquire(this); // see post(): the last owner may be a dropped message
    if (settled_.load())
      return;
    auto err = shared_->closed_error();
    if (!err)
      err = make_error(errc::device_failed, shared_->name(),
                       "the request never reached the device's link actor");
    fail(err);
  }

  /// Whether this call wins the one settlement.
  bool settle() noexcept { return !settled_.exchange(true); }
  bool settled() const noexcept { return settled_.load(); }
  link_shared& shared() const noexcept { return *shared_; }
  void issue(caf::event_based_actor* self, const device_actor& target,
             const std::shared_ptr<remote_op>& me) {
    issue_(self, target, me);
  }
  void fail(const caf::error& err) noexcept {
    if (!settle())
      return;
    try {
      fail_(err);
    } catch (...) {
      // The caller's business; the link goes on.
    }
  }

private:
  issue_fn issue_;
  fail_fn fail_;
  std::shared_ptr<link_shared> shared_;
  std::atomic<bool> settled_{false};
};

/// What the device is told when request `xs...` (sent as `id`) timed out:
/// nothing, except for a `wait`, which the device would keep registered until
/// its seq resolves.
template <class... Ts>
void give_up(caf::event_based_actor*, const device_actor&, caf::message_id, const Ts&...) {}

void give_up(caf::event_based_actor* self, const device_actor& target, caf::message_id id,
             wait_atom, uint64_t seq) {
  self->send(target, wait_atom::value, cancel_atom::value, seq,
             id.request_id().integer_value());
}

/// A request `xs...` expecting `Rs...`: `on_value` gets the reply, `on_error`
/// any error (including the link closing).
template <class... Rs, class OnValue, class... Ts>
std::shared_ptr<remote_op> make_op(std::shared_ptr<link_shared> shared, caf::duration timeout,
                                   OnValue on_value, remote_op::fail_fn on_error,
                                   Ts... xs) {
  auto issue = [timeout, on_value, xs...](caf::event_based_actor* self,
                                          const device_actor& target,
                                          const std::shared_ptr<remote_op>& me) {
    // The link actor may handle the reply on another worker (tsan.hpp).
    auto handle = self->request(target, timeout, xs...);
    auto id = handle.id();
    handle.then(handed_off<void(Rs...)>([me, on_value](Rs... rs) {
                  me->shared().heard();
                  if (me->settle())
                    on_value(std::move(rs)...);
                }),
                handed_off<void(caf::error&)>([self, target, id, me, xs...](caf::error& e) {
                  if (e == caf::sec::request_timeout)
                    give_up(self, target, id, xs...);
                  // Not the device's answer (its actor unreachable, the
                  // request bounced before the link heard the actor go): a
                  // session's device fails it only at the keeper's verdict,
                  // as a `wait` (when_done) and the held calls do.
                  auto& sh = me->shared();
                  if (sh.session && e == caf::sec::request_receiver_down
                      && sh.defer([me] { me->fail(me->shared().closed_error()); }))
                    return;
                  me->fail(e);
                }));
  };
  return std::make_shared<remote_op>(std::move(issue), std::move(on_error), std::move(shared));
}

/// Replaces every `theirs` in `text` that stands as a whole device name
/// (not part of a longer name, nor after a node's `/`) with `ours`.
void rename_in_text(std::string& text, const std::string& theirs, const std::string& ours) {
  if (theirs.empty() || theirs == ours)
    return;
  auto in_name = [](char c, bool before) {
    auto u = static_cast<unsigned char>(c);
    return std::isalnum(u) || c == '_'
           || (before && (c == ':' || c == '/' || c == '.' || c == '-'));
  };
  for (auto at = text.find(theirs); at != std::string::npos; at = text.find(theirs, at)) {
    auto end = at + theirs.size();
    if ((at > 0 && in_name(text[at - 1], true)) || (end < text.size() && in_name(text[end], false))) {
      at = end;
      continue;
    }
    text.replace(at, theirs.size(), ours);
    at += ours.size();
  }
}

/// `err`, from the device named `remote` here (`"b/multidev_cpu:0:1"`), as
/// this process should read it (see `to_our_names`): the device it names,
/// and that device and `remote` where the message names them, get their
/// node in front (the node's `multidev_cpu:0:1` may be this process's too).
caf::error in_our_names(const caf::error& err, const std::string& remote) {
  if (auto f = failure_of(err)) {
    to_our_names(*f, remote);
    return make_error(*f);
  }
  const auto& ctx = err.context();
  if (err.category() != error_category || ctx.size() != 2
      || !ctx.match_element<std::string>(0) || !ctx.match_element<std::string>(1))
    return err;
  auto device = ctx.get_as<std::string>(0);
  auto message = ctx.get_as<std::string>(1);
  auto theirs = device;
  to_our_name(device, remote);
  rename_in_text(message, theirs, device);
  if (auto cut = remote.rfind('/'); cut != std::string::npos)
    rename_in_text(message, remote.substr(cut + 1), remote);
  return make_error(static_cast<errc>(err.code()), std::move(device), std::move(message));
}

/// Hands `op` to the link actor, or fails it at once when the link is closed.
void post(link_shared& shared, std::shared_ptr<remote_op> op) {
  shared.pass_fence();
  if (auto err = shared.closed_error()) {
    op->fail(err);
    return;
  }
  auto link = caf::actor_cast<caf::actor>(shared.link);
  if (!link) {
    op->fail(make_error(errc::device_failed, shared.name(),
                        "its link actor is gone (the backend that attached it was shut down)"));
    return;
  }
  // A message dropped by a link that stopped meanwhile destroys `op`, whose
  // destructor fails it: nobody waits forever. `op` reaches the link actor
  // (or that destructor) through CAF's mailbox (tsan.hpp).
  tsan_release(op.get());
  caf::anon_send(link, post_atom::value, std::move(op));
}

/// Sends `xs...` through the link and waits for the reply. `ordered`: the
/// request adds to the device's schedule, so the device's actor may defer
/// it behind a full queue; a runner must not wait for that.
/// Thrown by `call` instead of an error when `timeout` was a caller's
/// deadline and the reply did not come before it.
struct deadline_passed {};

template <class... Rs, class... Ts>
std::tuple<Rs...> call_until(const std::shared_ptr<link_shared>& shared, const char* what,
                             bool ordered, caf::duration timeout, bool is_deadline, Ts... xs);

/// Where the reply to a request lands: `flag` turns 1 (the reply is in
/// `value`) or 2 (the error is in `err`), and is notified.
template <class... Rs>
struct reply_slot {
  std::atomic<uint32_t> flag{0}; // 1: value, 2: error
  std::tuple<Rs...> value;
  caf::error err;

  /// Blocks until the reply or error is in; returns `flag` (1 or 2).
  uint32_t wait() {
    uint32_t v;
    while ((v = flag.load()) == 0)
      flag.wait(0);
    return v;
  }
};

/// Posts the request `xs...` (replied with `Rs...`) to the link, failing
/// after `timeout`; returns the slot its reply or error lands in.
template <class... Rs, class... Ts>
std::shared_ptr<reply_slot<Rs...>> post_for_reply(const std::shared_ptr<link_shared>& shared,
                                                  caf::duration timeout, Ts... xs) {
  auto s = std::make_shared<reply_slot<Rs...>>();
  post(*shared, make_op<Rs...>(
                  shared, timeout,
                  [s](Rs... rs) {
                    s->value = std::tuple<Rs...>{std::move(rs)...};
                    s->flag.store(1);
                    s->flag.notify_all();
                  },
                  [s](const caf::error& e) {
                    s->err = e;
                    s->flag.store(2);
                    s->flag.notify_all();
                  },
                  xs...));
  return s;
}

template <class... Rs, class... Ts>
std::tuple<Rs...> call(const std::shared_ptr<link_shared>& shared, const char* what,
                       bool ordered, caf::duration timeout, Ts... xs) {
  return call_until<Rs...>(shared, what, ordered, timeout, false, xs...);
}

/// `call`; with `is_deadline`, a reply that does not come within `timeout`
/// throws `deadline_passed`.
template <class... Rs, class... Ts>
std::tuple<Rs...> call_until(const std::shared_ptr<link_shared>& shared, const char* what,
                             bool ordered, caf::duration timeout, bool is_deadline, Ts... xs) {
  if (ordered && current_runner != nullptr)
    throw deadlock_error(fmt::format(
      "{} on {} from a task: it is a device of another process, whose reply may wait "
      "behind its full queue, which may wait for this runner; call it from a host "
      "thread",
      what, shared->name()));
  if (ordered && !(std::is_same_v<Ts, all_work_atom> || ...))
    shared->work_sent(); // adds work: an `idle` answer from before is stale
  auto s = post_for_reply<Rs...>(shared, timeout, xs...);
  if (s->wait() == 2) {
    if (is_deadline && s->err == caf::sec::request_timeout)
      throw deadline_passed{};
    throw_error(in_our_names(s->err, shared->name()), shared->name());
  }
  return std::move(s->value);
}

// -- the link actor -------------------------------------------------------------

struct link_state {
  device_actor target;
  std::shared_ptr<link_shared> shared;
  /// Requests sent and not yet answered (settled ones are pruned lazily).
  std::vector<std::weak_ptr<remote_op>> pending;
  std::size_t prune_at = 64;
  /// A session's device whose actor went down: its node may still run what
  /// it holds until the session's lease ends, so nothing fails before the
  /// session's keeper says it is lost (`lost_atom`); requests wait here.
  bool held = false;
  std::vector<std::shared_ptr<remote_op>> held_ops; // posted while held
  static inline const char* name = "multidev_link";
};

using link_ptr = caf::stateful_actor<link_state>*;

/// With tracing on, records the loss of the link's device, declared now
/// because its actor went down for `reason` (see `host_span`).
void trace_loss(link_ptr self, const caf::error& reason, const std::string& why) {
  auto& shared = *self->state.shared;
  if (!shared.spans || shared.closed_reason())
    return;
  host_span s;
  s.kind = host_span_kind::node_lost;
  s.failed = true;
  s.end_ns = trace_clock::get().now();
  auto heard = shared.last_heard_ns.load(std::memory_order_relaxed);
  if (reason == caf::exit_reason::remote_link_unreachable) {
    // Its node is gone: a broken connection, found at once, or a silent
    // one, dropped at a heartbeat tick once nothing was heard from it for
    // the connection timeout, so not heard from since at least the timeout
    // and at most one heartbeat interval more before now. The span starts
    // at the device's last reply, or that earliest moment if later.
    const auto& cfg = self->system().config();
    auto beat = caf::get_or(cfg, "middleman.heartbeat-interval", caf::timespan{0});
    auto timeout = caf::get_or(cfg, "middleman.connection-timeout", caf::timespan{0});
    s.start_ns = heard != 0 ? heard : s.end_ns;
    if (beat.count() > 0 && timeout.count() > 0)
      s.start_ns = std::max(s.start_ns,
                            s.end_ns - static_cast<int64_t>((timeout + beat).count()));
  } else {
    s.start_ns = s.end_ns; // its actor stopped: nothing to find out
  }
  s.start_ns = std::min(s.start_ns, s.end_ns);
  try {
    s.description = fmt::format("node lost: {}: {}", shared.name(), why);
  } catch (...) {
    // Out of memory: the span goes without its text.
  }
  shared.spans->add(std::move(s));
}

/// Fails every pending request with `why`, and every later one.
void close_link(link_ptr self, const std::string& why) {
  auto& st = self->state;
  st.shared->close(why);
  if (st.shared->sink)
    st.shared->sink->close(st.shared->closed_error());
  // Devices of other nodes that wait here through this process learn it
  // from us: their own route to the device may run through this process.
  auto lost = fmt::format("{}: {}", st.shared->name(), why);
  for (auto& [addr, waiting] : st.shared->take_watchers())
    self->send(waiting, lost_atom::value, caf::actor_cast<caf::actor>(st.target), lost);
  // And the nodes whose recorded rounds wait on this device's node.
  for (auto& w : st.shared->take_round_watchers()) {
    if (w.here)
      w.here(lost);
    else
      self->send(w.waiting, lost_atom::value, w.session, w.lost, lost);
  }
  auto err = st.shared->closed_error();
  auto pending = std::move(st.pending);
  st.pending.clear();
  for (auto& w : pending)
    if (auto op = w.lock())
      op->fail(err);
  auto held = std::move(st.held_ops);
  st.held_ops.clear();
  for (auto& op : held)
    op->fail(err);
  for (auto& f : st.shared->take_deferred())
    f();
}

caf::behavior link_impl(link_ptr self, device_actor target,
                        std::shared_ptr<link_shared> shared) {
  // `shared` was made by the spawning thread; the handlers below share the
  // state, each on whichever worker runs it (tsan.hpp).
  tsan_acquire(shared.get());
  tsan_turn turn{self};
  self->state.target = std::move(target);
  self->state.shared = std::move(shared);
  // A request to an actor whose node vanished may never be answered: the
  // monitor's down message fails them all instead.
  self->monitor(self->state.target);
  self->set_down_handler([self](caf::down_msg& dm) {
    tsan_turn turn{self};
    if (dm.source != self->state.target.address())
      return;
    if (self->state.shared->session) {
      self->state.held = true; // the keeper declares the loss (see link_state)
      self->state.shared->hold(fmt::format(
        "its connection is down ({}); its calls wait for the session's lease to decide",
        self->system().render(dm.reason)));
      return;
    }
    auto why = fmt::format("its actor is down ({})", self->system().render(dm.reason));
    trace_loss(self, dm.reason, why);
    close_link(self, why);
  });
  self->set_exit_handler([self](caf::exit_msg& msg) {
    tsan_turn turn{self};
    close_link(self, link_closed_at_shutdown);
    self->quit(msg.reason);
  });
  return {
    [self](lost_atom, const std::string& why) {
      // The session's keeper: its node is lost, or the session ended.
      tsan_turn turn{self};
      trace_loss(self, caf::exit_reason::remote_link_unreachable, why);
      close_link(self, why);
    },
    [self](post_atom, const std::shared_ptr<remote_op>& op) {
      tsan_turn turn{self};
      tsan_acquire(op.get()); // see post()
      auto& st = self->state;
      if (auto err = st.shared->closed_error()) {
        op->fail(err);
        return;
      }
      if (st.held) {
        st.held_ops.push_back(op); // failed when the keeper declares the loss
        return;
      }
      if (st.pending.size() >= st.prune_at) {
        std::erase_if(st.pending, [](const auto& w) {
          auto p = w.lock();
          return !p || p->settled();
        });
        st.prune_at = std::max<std::size_t>(64, 2 * st.pending.size());
      }
      st.pending.push_back(op);
      op->issue(self, st.target, op);
    },
  };
}

// -- the endpoint ---------------------------------------------------------------

/// `owner`'s name as another process should print it: a device of this
/// process gets this host and process id in front (`host:pid/name`), since
/// the devices of every process are named alike; an attached one is named
/// after its node already.
std::string qualified_name(const endpoint& owner) {
  if (!owner.core())
    return owner.name();
  return this_process() + "/" + owner.name();
}

class remote_endpoint final : public endpoint {
public:
  remote_endpoint(device_key key, std::string name, std::shared_ptr<link_shared> shared)
    : endpoint(key, std::move(name), nullptr), shared_(std::move(shared)) {}

  link_shared& shared() const noexcept { return *shared_; }

  bool known_done(uint64_t seq) const noexcept override {
    try {
      return shared_->known_done(seq);
    } catch (...) {
      return false; // the lock failed: not known
    }
  }

  // `is_done`, `is_failed` and `state` never wait for the device: they say
  // what this process knows (the replies to its syncs, waits and earlier
  // questions; a lost device's unknown seqs are failed: they can never
  // complete here), and a seq not known yet is asked about without waiting,
  // once, so that asking again learns the outcome as soon as it is there.
  bool is_done(uint64_t seq) override { return state(seq) == event_state::done; }

  bool is_failed(uint64_t seq) override {
    auto s = state(seq);
    return s == event_state::failed || s == event_state::cancelled;
  }

  event_state state(uint64_t seq) override {
    if (auto known = shared_->known_outcome(seq))
      return *known;
    if (shared_->closed_reason())
      return event_state::failed;
    learn(seq);
    return event_state::pending;
  }

  void sync(uint64_t seq) override {
    sync_until(seq, std::chrono::steady_clock::time_point::max());
  }

  void sync_until(uint64_t seq, std::chrono::steady_clock::time_point deadline) override {
    sync_until(seq, deadline, "sync");
  }

  /// Waits for the reply to a `wait`, registered in the wait graph meanwhile.
  void sync_until(uint64_t seq, std::chrono::steady_clock::time_point deadline,
                  const char* what) {
    if (known_done(seq))
      return;
    blocked_wait w;
    if (const auto* r = current_runner) {
      w.runner = r;
      w.item = r->runner().running_item();
    }
    w.owner_name = name();
    w.seq = seq;
    w.what = what;
    blocked_scope blocked{std::move(w)};
    // With tracing on, a host thread's wait goes in the trace.
    host_wait_scope traced{current_runner == nullptr ? shared_->spans.get() : nullptr, what, name(),
                           seq};
    auto start = std::chrono::steady_clock::now();
    caf::duration timeout = caf::infinite;
    bool timed = deadline != std::chrono::steady_clock::time_point::max();
    if (timed)
      timeout = caf::duration{std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::max(deadline - start, std::chrono::steady_clock::duration{1}))};
    try {
      call_until<uint64_t>(shared_, "sync", false, timeout, timed, wait_atom::value, seq);
    } catch (const cancelled_error&) {
      shared_->note_outcome(seq, event_state::cancelled);
      throw;
    } catch (const device_error&) {
      if (!shared_->closed_reason()) // a lost link says nothing of the seq
        shared_->note_outcome(seq, event_state::failed);
      throw;
    } catch (const deadline_passed&) {
      auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
      // Asked of the device's process, followed where it goes on.
      auto until = std::chrono::steady_clock::now() + explain_budget;
      auto chain = follow_remote_chain(name(), why(seq, until), until);
      throw timeout_error(fmt::format("{} on {} seq {} passed its deadline after {:.3f} s: {}",
                                      what, name(), seq, waited.count(), chain),
                          chain);
    }
    shared_->note_done(seq);
  }

  void when_done(uint64_t seq, on_resolved cb) override {
    if (known_done(seq)) {
      cb(nullptr);
      return;
    }
    auto failed = [cb, name = name()](const caf::error& e) {
      // A failure of the device travels whole; anything else (its actor
      // down, the link closed) starts here.
      auto f = failure_of(in_our_names(e, name));
      if (!f) {
        f.emplace();
        f->device = name;
        f->message = describe_error(e);
        if (f->message.starts_with(name + ": "))
          f->message.erase(0, name.size() + 2);
      }
      cb(&*f);
    };
    // Straight to the device's actor, the reply handled where it arrives
    // (reply_sink.hpp): a wait needs no order with the other calls, as its
    // seq is scheduled there already (this process learned it from a reply).
    auto shared = shared_;
    bool sent = shared_->sink->wait(
      caf::actor_cast<caf::actor>(shared_->target), seq,
      [shared, cb, seq, failed](const caf::message& m) {
        if (m.match_elements<uint64_t>()) {
          shared->heard();
          shared->note_done(seq);
          cb(nullptr);
        } else if (m.match_elements<caf::error>()) {
          const auto& e = m.get_as<caf::error>(0);
          // Not the device's answer (its actor unreachable): a session's
          // device fails it only at the keeper's verdict.
          if (shared->session && e.category() != error_category
              && shared->defer([failed, shared] { failed(shared->closed_error()); }))
            return;
          note_failure(*shared, seq, e);
          failed(e);
        } else {
          failed(make_error(errc::device_failed, shared->name(), "an unexpected reply to wait"));
        }
      });
    if (!sent) {
      auto err = shared_->closed_error();
      failed(err ? err : make_error(errc::device_failed, name(), "its actor is gone"));
    }
  }

  uint64_t schedule_named(const task_spec& spec) override {
    return std::get<0>(call<uint64_t>(shared_, "schedule_named", true, until_lost,
                                      schedule_atom::value, spec));
  }

  std::vector<uint64_t> schedule_batch(std::span<const task_spec> specs) override {
    if (specs.size() <= batch_limit)
      return checked(specs.size(), std::get<0>(call<std::vector<uint64_t>>(
                                     shared_, "schedule_batch", true, until_lost,
                                     schedule_atom::value,
                                     std::vector<task_spec>(specs.begin(), specs.end()))));
    // In parts of at most `batch_limit` specs, each a round trip: one message
    // of a million tasks would be hundreds of MB to serialize at once, and
    // would hold the device actor that long. The device binds each part as
    // it comes and holds it; the last part schedules them all. A part that
    // does not bind drops the batch there: a bad spec anywhere schedules
    // none (the device forgets a batch whose sender goes away, too).
    std::lock_guard serial{shared_->batch_mu};
    auto id = ++shared_->last_batch;
    std::vector<uint64_t> seqs;
    uint32_t part = 0;
    for (std::size_t i = 0; i < specs.size(); i += batch_limit, ++part) {
      auto chunk = specs.subspan(i, std::min(batch_limit, specs.size() - i));
      bool last = i + chunk.size() == specs.size();
      seqs = std::get<0>(call<std::vector<uint64_t>>(
        shared_, "schedule_batch", true, until_lost, schedule_atom::value, id, part,
        std::vector<task_spec>(chunk.begin(), chunk.end()), last));
    }
    return checked(specs.size(), std::move(seqs));
  }

  uint64_t all_work() override {
    return std::get<0>(
      call<uint64_t>(shared_, "all_work", true, until_lost, all_work_atom::value));
  }

  void await() override { await_until(std::chrono::steady_clock::time_point::max()); }

  void await_until(std::chrono::steady_clock::time_point deadline) override {
    auto seq = std::get<0>(
      call<uint64_t>(shared_, "await", true, until_lost, all_work_atom::value));
    sync_until(seq, deadline, "await");
  }

  /// What this process knows, never waiting: the device's last answer,
  /// unless this process sent it work since it was asked (then not idle), or
  /// it is lost (not idle: its work can never finish). Asks again, without
  /// waiting, when no question is under way.
  bool is_idle() override {
    if (shared_->closed_reason())
      return false;
    auto [idle, ask] = shared_->known_idle();
    if (ask) {
      auto shared = shared_;
      auto sent = shared_->work_sent_count();
      post(*shared_, make_op<bool>(
                       shared_, query_timeout(),
                       [shared, sent](bool v) { shared->idle_answer(v, sent); },
                       [shared, sent](const caf::error&) { shared->idle_answer(std::nullopt, sent); },
                       idle_atom::value));
    }
    return idle;
  }

  std::size_t queue_length() override {
    auto [state, resolved, scheduled] = call<uint8_t, uint64_t, uint64_t>(
      shared_, "queue_length", false, query_timeout(), status_atom::value, uint64_t{0});
    return scheduled - resolved;
  }

  void flush() override {
    call<uint64_t>(shared_, "flush", true, until_lost, all_work_atom::value);
  }

  void depend(endpoint& owner, uint64_t seq) override {
    auto a = owner.actor();
    if (!a)
      throw device_error(owner.name(),
                         fmt::format("its actor is gone, so {} cannot wait for its seq {}",
                                     name(), seq));
    // Answered once the gate is queued there; the calls after this one go
    // through the same link, so they are handled after it. A refusal (the
    // device failed) needs no answer here: the calls after it fail too.
    // An owner of a third node: when this process loses it, it tells the
    // device waiting here (see `lost`).
    auto* remote_owner = dynamic_cast<remote_endpoint*>(&owner);
    if (remote_owner && !remote_owner->shared_->watch(caf::actor_cast<caf::actor>(shared_->target)))
      throw device_error(owner.name(),
                         fmt::format("{} cannot wait for its seq {}: {}", name(), seq,
                                     remote_owner->gone().value_or("its link is closed")));
    // With where the owner's node listens, when it is a node this process
    // attached: this device's node connects there, and the wait goes
    // straight between the two nodes (none for an owner of this process).
    std::pair<std::string, uint16_t> address;
    if (remote_owner)
      address = remote_owner->shared_->address();
    shared_->pass_fence();
    shared_->async_work.fetch_add(1, std::memory_order_acq_rel);
    auto shared = shared_;
    post(*shared_, make_op<uint64_t>(
                     shared_, until_lost, [shared](uint64_t) { shared->one_async_done(); },
                     [shared](const caf::error&) { shared->one_async_done(); },
                     depend_atom::value, caf::actor_cast<caf::actor>(a), seq,
                     qualified_name(owner), std::move(address.first), address.second));
  }

  bool copies_directly(const endpoint& source) const override {
    return &source != this && dynamic_cast<const remote_endpoint*>(&source) != nullptr;
  }

  uint64_t copy_from(endpoint& source, int source_pool, std::size_t source_offset, int pool,
                     std::size_t offset, std::size_t size) override {
    if (!copies_directly(source))
      return endpoint::copy_from(source, source_pool, source_offset, pool, offset, size);
    auto& from = static_cast<remote_endpoint&>(source);
    auto a = from.actor();
    if (!a)
      throw device_error(from.name(), fmt::format("its actor is gone, so {} cannot copy from it",
                                                  name()));
    // When this process loses the source, the device waiting here for its
    // bytes hears it (`lost`), as for a `depend`.
    if (!from.shared_->watch(caf::actor_cast<caf::actor>(shared_->target)))
      throw device_error(from.name(), fmt::format("{} cannot copy from it: {}", name(),
                                                  from.gone().value_or("its link is closed")));
    // First the write here, queued in this device's order (it waits for the
    // bytes); then the read there, in the source's order, which sends them.
    // Neither waits for the bytes, and they never pass through this process.
    auto [host, port] = from.shared_->address();
    auto [seq, transfer] = call<uint64_t, uint64_t>(
      shared_, "device_to_device", true, until_lost, copy_from_atom::value,
      static_cast<int32_t>(pool), static_cast<uint64_t>(offset), static_cast<uint64_t>(size),
      caf::actor_cast<caf::actor>(a), qualified_name(from), std::move(host), port);
    // A refusal there (a bad pool or range, a failed source) reaches the
    // destination as the failure of its write.
    from.shared_->pass_fence();
    from.shared_->async_work.fetch_add(1, std::memory_order_acq_rel);
    auto src = from.shared_;
    post(*from.shared_, make_op<uint64_t>(
                          from.shared_, until_lost, [src](uint64_t) { src->one_async_done(); },
                          [src](const caf::error&) { src->one_async_done(); },
                          copy_to_atom::value, static_cast<int32_t>(source_pool),
                          static_cast<uint64_t>(source_offset), static_cast<uint64_t>(size),
                          caf::actor_cast<caf::actor>(actor()), transfer));
    return seq;
  }

  std::optional<std::string> gone() const override { return shared_->closed_reason(); }
  std::optional<std::string> unreachable() const override { return shared_->held_reason(); }

  void cancel() override {
    call<uint64_t>(shared_, "cancel", false, until_lost, cancel_atom::value);
  }

  bool recover() override {
    return std::get<0>(call<bool>(shared_, "recover", false, until_lost,
                                  recover_atom::value));
  }

  void alloc_pool(int id, std::size_t size, std::size_t alignment,
                  std::optional<memory_mode> mode) override {
    call<uint64_t>(shared_, "alloc_pool", true, until_lost, alloc_atom::value,
                   static_cast<int32_t>(id), static_cast<uint64_t>(size),
                   static_cast<uint64_t>(alignment),
                   mode ? static_cast<int32_t>(*mode) : int32_t{-1});
  }

  void free_pool(int id) override {
    call<uint64_t>(shared_, "free_pool", true, until_lost, free_atom::value,
                   static_cast<int32_t>(id));
  }

  uint64_t write_bytes(int id, std::size_t offset, std::string bytes) override {
    return std::get<0>(call<uint64_t>(shared_, "write", true, until_lost, write_atom::value,
                                      static_cast<int32_t>(id), static_cast<uint64_t>(offset),
                                      std::move(bytes)));
  }
  std::string read_bytes(int id, std::size_t offset, std::size_t size) override {
    return std::get<0>(call<std::string>(shared_, "read", true, until_lost, read_atom::value,
                                         static_cast<int32_t>(id), static_cast<uint64_t>(offset),
                                         static_cast<uint64_t>(size)));
  }
  uint64_t memset_zero(int id, std::size_t offset, std::size_t size) override {
    return std::get<0>(call<uint64_t>(shared_, "memset_zero", true, until_lost,
                                      memset_atom::value, static_cast<int32_t>(id),
                                      static_cast<uint64_t>(offset),
                                      static_cast<uint64_t>(size)));
  }

  std::size_t used_memory() override {
    return std::get<0>(
      call<uint64_t>(shared_, "get_used_memory", false, query_timeout(), memory_atom::value));
  }

  sexp debug_info() override {
    auto text = std::get<0>(
      call<std::string>(shared_, "get_debug_info", false, query_timeout(), debug_atom::value));
    return parsed_info(text);
  }

  std::function<sexp()> debug_info_until(std::chrono::steady_clock::time_point deadline) override {
    auto me = std::static_pointer_cast<remote_endpoint>(shared_from_this());
    if (auto why = shared_->closed_reason())
      return [me, why = *why] {
        return sexp::list({sexp::atom("device"), sexp::field("name", me->name()),
                           sexp::field("lost", why)});
      };
    auto timeout = std::max<std::chrono::steady_clock::duration>(
      deadline - std::chrono::steady_clock::now(), std::chrono::milliseconds{1});
    auto s = post_for_reply<std::string>(shared_, caf::duration{timeout}, debug_atom::value);
    // The request's timeout (CAF's clock) ends the wait at `deadline`.
    return [me, s] {
      if (s->wait() == 1)
        return me->parsed_info(std::get<0>(s->value));
      auto head = sexp::list({sexp::atom("device"), sexp::field("name", me->name())});
      if (s->err == caf::sec::request_timeout)
        head.push_back(sexp::field("silent", me->silence()));
      else if (auto why = me->shared_->closed_reason())
        head.push_back(sexp::field("lost", *why));
      else
        head.push_back(sexp::field("error", describe_error(s->err)));
      return head;
    };
  }

  /// `"silent for N s"`: since the last reply from the device.
  std::string silence() const {
    auto heard = shared_->last_heard_ns.load(std::memory_order_relaxed);
    if (heard == 0)
      return "silent since it was attached";
    auto s = static_cast<double>(trace_clock::get().now() - heard) / 1e9;
    return fmt::format("silent for {:.1f} s", std::max(0.0, s));
  }

  chain_step why(uint64_t seq, std::chrono::steady_clock::time_point deadline) override {
    if (auto lost = shared_->closed_reason())
      return {fmt::format("is not running: its node is lost ({})", *lost), nullptr, 0};
    auto start = std::chrono::steady_clock::now();
    auto timeout = std::max<std::chrono::steady_clock::duration>(deadline - start,
                                                                 std::chrono::milliseconds{1});
    try {
      auto [rest, next, next_seq] = call_until<std::string, caf::actor, uint64_t>(
        shared_, "why", false, caf::duration{timeout}, true, why_atom::value, seq);
      in_our_text(rest);
      chain_step step{std::move(rest), nullptr, next_seq};
      if (next) {
        step.next = find_endpoint_of(next.address());
        if (!step.next)
          step.rest += ", which lives on a node not attached here";
      }
      return step;
    } catch (const deadline_passed&) {
      auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
      return {fmt::format("has not said why within {:.3f} s ({}): its node is silent",
                          waited.count(), silence()),
              nullptr, 0};
    } catch (const std::exception& e) {
      return {fmt::format("{} (asked why: {})", remote_silent_end, e.what()), nullptr, 0};
    }
  }

  /// The device's trace, by message, in this process's names (the device's,
  /// and those of the devices its gates awaited), with what this process
  /// saw of it; a device whose link is closed (its node lost) has only the
  /// latter.
  device_trace trace() override {
    device_trace t;
    try {
      t = std::get<0>(
        call<device_trace>(shared_, "trace", false, query_timeout(), trace_atom::value));
      t.device = name();
      for (auto& r : t.records)
        to_our_name(r.awaited_device, name());
    } catch (const device_error&) {
      auto why = shared_->closed_reason();
      if (!why)
        throw;
      t = device_trace{};
      t.device = name();
      t.unreachable = std::move(*why);
    }
    if (shared_->spans)
      t.host = shared_->spans->read();
    return t;
  }

  std::optional<kernel_result> result(const std::string& name) override {
    auto [found, r] = call<bool, kernel_result>(shared_, "result", false, query_timeout(),
                                                result_atom::value, name);
    if (!found)
      return std::nullopt;
    return r;
  }

  device_actor actor() const override { return caf::actor_cast<device_actor>(shared_->target); }

  void set_address(std::string host, uint16_t port) { shared_->set_address(std::move(host), port); }

private:
  /// `text`, the device's debug info, parsed, with the devices it names
  /// (`name`, `waiter`, `device` fields) named as this process names them.
  sexp parsed_info(const std::string& text) const {
    try {
      return renamed(parse_sexp(text));
    } catch (const sexp_parse_error&) {
      return sexp::atom(text);
    }
  }
  sexp renamed(const sexp& x) const {
    if (x.is_atom())
      return x;
    const auto& items = x.items();
    if (items.size() == 2 && items[0].is_atom() && items[1].is_atom()) {
      const auto& key = items[0].as_atom();
      if (key == "name" || key == "waiter" || key == "device") {
        auto v = items[1].as_atom();
        if (v != "host")
          to_our_name(v, name());
        return sexp::field(key, std::move(v));
      }
    }
    auto out = sexp::list();
    for (const auto& i : items)
      out.push_back(renamed(i));
    return out;
  }

  /// A text of the device's process, naming this device and this
  /// process's devices as this process does.
  void in_our_text(std::string& text) const {
    const auto& ours = name();
    if (auto cut = ours.rfind('/'); cut != std::string::npos)
      rename_in_text(text, ours.substr(cut + 1), ours);
    auto here = this_process() + "/";
    for (auto at = text.find(here); at != std::string::npos; at = text.find(here, at))
      text.erase(at, here.size());
  }

  /// Asks the device, without waiting, for `seq`'s outcome (a `wait`, whose
  /// reply comes once it is resolved), unless a question is under way.
  void learn(uint64_t seq) {
    if (!shared_->start_learning(seq))
      return;
    auto shared = shared_;
    bool sent = shared_->sink->wait(caf::actor_cast<caf::actor>(shared_->target), seq,
                                    [shared, seq](const caf::message& m) {
                                      if (m.match_elements<uint64_t>()) {
                                        shared->heard();
                                        shared->note_done(seq);
                                      } else if (m.match_elements<caf::error>()) {
                                        note_failure(*shared, seq, m.get_as<caf::error>(0));
                                      }
                                      shared->learned(seq);
                                    });
    if (!sent)
      shared_->learned(seq);
  }

  /// `seqs`, the reply to a batch of `n` tasks, if it has one seq for each.
  std::vector<uint64_t> checked(std::size_t n, std::vector<uint64_t> seqs) const {
    if (seqs.size() != n)
      throw device_error(name(), fmt::format("schedule_batch: {} seqs for {} tasks",
                                             seqs.size(), n));
    return seqs;
  }



  std::shared_ptr<link_shared> shared_;
};

} // namespace

remote_device attach_remote(caf::actor_system& sys, const device_actor& target,
                            const std::string& prefix, std::size_t trace_capacity,
                            bool session, std::optional<std::chrono::nanoseconds> timeout) {
  if (!target)
    throw std::invalid_argument("attach_device: invalid device actor handle");
  auto shared = std::make_shared<link_shared>();
  shared->session = session;
  if (trace_capacity > 0)
    shared->spans = std::make_unique<host_span_log>(trace_capacity);
  shared->set_name(fmt::format("device actor {}", target->id()));
  shared->sink = reply_sink::make(sys);
  caf::actor link;
  {
    logger_tie_guard untie; // spawning ties this thread to the system
    tsan_release(shared.get()); // see link_impl
    link = sys.spawn(link_impl, target, shared);
  }
  shared->link = link.address();
  shared->target = target.address();
  try {
    auto [node, id, name, driver, ordinal] =
      call<std::string, uint32_t, std::string, std::string, int32_t>(
        shared, "attach_device", false,
        timeout ? caf::duration{std::max(*timeout, std::chrono::nanoseconds{1})} : query_timeout(),
        identify_atom::value);
    name = prefix + name;
    shared->set_name(name);
    auto ep = std::make_shared<remote_endpoint>(device_key{node_ref{node}, id}, name, shared);
    register_endpoint(ep);
    return remote_device{std::move(ep), std::move(link), std::move(driver), ordinal};
  } catch (...) {
    caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
    throw;
  }
}

void set_node_address(endpoint& ep, const std::string& host, uint16_t port) {
  if (auto* r = dynamic_cast<remote_endpoint*>(&ep))
    r->set_address(host, port);
}

void settle_async(endpoint& ep) {
  auto* r = dynamic_cast<remote_endpoint*>(&ep);
  if (!r)
    return;
  auto& n = r->shared().async_work;
  for (auto v = n.load(std::memory_order_acquire); v != 0; v = n.load(std::memory_order_acquire))
    n.wait(v);
}

void set_fence(endpoint& ep, std::shared_ptr<const replay_fence> f) {
  auto* r = dynamic_cast<remote_endpoint*>(&ep);
  if (!r)
    return;
  auto& sh = r->shared();
  std::lock_guard guard{sh.fence_mu};
  sh.fence = std::move(f);
  sh.fenced.store(sh.fence != nullptr, std::memory_order_release);
}

bool request_node(endpoint& ep, const caf::actor& node, caf::message msg,
                  reply_sink::handler h) {
  auto* r = dynamic_cast<remote_endpoint*>(&ep);
  if (!r || !r->shared().sink)
    return false;
  return r->shared().sink->request(node, std::move(msg), std::move(h));
}

bool watch_for_rounds(endpoint& ep, const caf::actor& waiting, uint64_t session,
                      const caf::actor& lost) {
  auto* r = dynamic_cast<remote_endpoint*>(&ep);
  return r && r->shared().watch_for_rounds(waiting, session, lost);
}

bool watch_for_rounds_here(endpoint& ep, const void* key, const caf::actor& lost,
                           std::function<void(const std::string&)> here) {
  auto* r = dynamic_cast<remote_endpoint*>(&ep);
  return r && r->shared().watch_for_rounds_here(key, lost, std::move(here));
}

std::pair<std::string, uint16_t> node_address(const endpoint& ep) {
  if (const auto* r = dynamic_cast<const remote_endpoint*>(&ep))
    return r->shared().address();
  return {};
}

void set_query_timeout(std::chrono::milliseconds timeout) {
  query_timeout_ms.store(std::max<int64_t>(1, timeout.count()));
}

const std::string& this_process() {
  static const std::string here = [] {
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) != 0)
      host[0] = '\0';
    return fmt::format("{}:{}", host.data(), ::getpid());
  }();
  return here;
}

void to_our_name(std::string& name, const std::string& from) {
  if (name.empty())
    return;
  if (name.find('/') == std::string::npos) {
    auto cut = from.rfind('/');
    if (cut != std::string::npos)
      name.insert(0, from, 0, cut + 1);
  }
  const auto& here = this_process();
  if (name.size() > here.size() + 1 && name.starts_with(here) && name[here.size()] == '/')
    name.erase(0, here.size() + 1);
}

void to_our_names(failure& f, const std::string& from) {
  to_our_name(f.device, from);
  for (auto& hop : f.path) {
    to_our_name(hop.waiter, from);
    to_our_name(hop.device, from);
  }
}

} // namespace multidev::detail
