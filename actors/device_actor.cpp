#include "actors/device_actor.hpp"
#include "actors/wait_graph.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message_id.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/openssl/manager.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/binding.hpp"
#include "actors/remote/endpoint_remote.hpp"
#include "actors/remote/message_checks.hpp"
#include "actors/remote/reply_sink.hpp"
#include "messages/tsan.hpp"

namespace multidev::detail {

namespace {

using namespace atoms;
using namespace internal_atoms;

struct device_state {
  std::shared_ptr<device_core> core;
  device_identity id;
  /// The key the internal `room` message must carry (see `internal_atoms`).
  uint64_t key = 0;
  /// Gates waiting on remote owners, so a vanished owner fails them.
  std::multimap<caf::actor_addr, std::weak_ptr<gate>> remote_gates;
  /// Requesters of other nodes with `wait`s registered here, monitored: when
  /// one goes (its node died or was cut off), its waits are dropped instead
  /// of holding its handle until the awaited seqs resolve, maybe never.
  std::set<caf::actor_addr> remote_waiters;
  /// The actors this one monitors (owners of remote gates, remote
  /// requesters): one monitor each, however many waits (`watch`); an actor
  /// leaves the set with its down message.
  std::set<caf::actor_addr> monitored;
  /// Owners of remote gates seen going down, the latest few: a `depend` on
  /// one of them is refused.
  std::deque<caf::actor_addr> dead_owners;
  /// Where the owners' replies to this device's `wait`s land, opening the
  /// gates on the thread that delivers them (reply_sink.hpp); made on the
  /// first remote gate, closed when the state goes.
  std::shared_ptr<reply_sink> sink;
  /// Ordered requests held back while the device's queue is full, oldest
  /// first; each one replies when it runs (`refuse`: with an error instead).
  std::deque<std::function<void(bool refuse)>> deferred;
  /// A batch sent in parts (`schedule` with a batch id): the tasks of the
  /// parts bound so far, and the number of the part expected next.
  struct staged_batch {
    uint32_t next_part = 0;
    std::vector<task> work;
  };
  /// Connections of this process to the nodes of the owners it waits on
  /// (`with_route`), by node: settled once made or given up; until then,
  /// what waits for it.
  struct route {
    bool settled = false;
    std::vector<std::function<void()>> waiting;
  };
  std::map<caf::node_id, route> routes;
  /// Copies from devices of other processes whose bytes have not arrived
  /// (`copy_from`), by transfer id: who sends them, the gate they open, where
  /// the write after the gate finds them, and how many are due.
  struct incoming_copy {
    caf::actor_addr source;
    std::shared_ptr<gate> g;
    /// The parts come in order; the write after the gate copies them.
    std::shared_ptr<std::vector<std::string>> parts;
    uint64_t size = 0;
    uint64_t received = 0;
    std::string source_name;
  };
  std::map<uint64_t, incoming_copy> incoming;
  uint64_t last_transfer = 0;
  /// The batches sent in parts and not yet scheduled, by sender and id.
  /// Their senders are monitored (`watch`): the batches of one that goes
  /// down (its node lost, its link stopped) are dropped.
  std::map<std::pair<caf::actor_addr, uint64_t>, staged_batch> batches;
  /// The actor, as the key of its handlers' turns (tsan.hpp).
  const void* turn_key = nullptr;
  static inline const char* name = "multidev_device";

  device_state() = default;
  device_state(const device_state&) = delete;
  device_state& operator=(const device_state&) = delete;
  /// However the actor ends, its state goes (CAF destroys it as the actor
  /// finishes, before its monitors hear of it): an exit message, an
  /// exception, or `exit_reason::kill`, which skips the exit handler. Every
  /// deferred request is refused here, so each one gets a reply.
  ~device_state() {
    tsan_turn turn{turn_key}; // `deferred`: see ordered
    refuse_deferred();
  }
  /// Refuses the deferred requests, oldest first.
  void refuse_deferred() {
    while (!deferred.empty()) {
      auto next = std::move(deferred.front());
      deferred.pop_front();
      next(true);
    }
  }
};

using self_ptr = device_actor_full::stateful_pointer<device_state>;

uint64_t random_key() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

/// Runs `f`, turning the exceptions of the public edge into error values.
template <class F>
auto attempt(const device_core& core, F& f) -> caf::expected<decltype(f())> {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    return make_error(errc::invalid_argument, core.name(), e.what());
  } catch (const device_error& e) {
    return make_error(errc::device_failed, e.device_name(), e.message());
  } catch (const std::exception& e) {
    return make_error(errc::device_failed, core.name(), e.what());
  }
}

/// The refusal of the message being handled when `check` (message_checks.hpp)
/// throws: an `invalid_argument` error naming the device, the field and its
/// value; none when the message passes.
template <class F>
std::optional<caf::error> refused(const device_core& core, F check) {
  try {
    check();
    return std::nullopt;
  } catch (const std::invalid_argument& e) {
    return make_error(errc::invalid_argument, core.name(), e.what());
  }
}

/// The refusal of a request that would be deferred behind the full queue
/// while `wire_limits::deferred_requests` are deferred already; none when
/// it may go in or wait.
std::optional<caf::error> deferral_refused(const device_state& st) {
  if (st.deferred.size() < wire_limits::deferred_requests)
    return std::nullopt;
  return make_error(errc::invalid_argument, st.core->name(),
                    fmt::format("the device's queue is full and {} requests wait for room "
                                "already (at most {}): request refused",
                                st.deferred.size(), wire_limits::deferred_requests));
}

/// Where the reply to the message being handled goes: what a response
/// promise holds, without the actor.
struct reply_to {
  caf::strong_actor_ptr sender;
  caf::message_id mid;
  caf::mailbox_element::forwarding_stack stages;
  /// The actor that answers (this device's): the reply names it as its
  /// sender, as the actor's own reply would, so that a requester can tell
  /// it from a forgery (reply_sink). Weak: waits must not keep it alive.
  caf::actor_addr from;
};

/// Answers `to` from any thread, as a response promise would from the actor
/// (`response_promise::deliver`): a response needs no actor to send it, so the
/// runner that resolves an awaited seq replies at once instead of handing the
/// reply to the device actor first -- one thread hand-off less per remote
/// hop (~30 µs of ~115 on this project's guest). Nothing to do for a message
/// that is not a request.
void reply_from_runner(reply_to& to, caf::message msg) noexcept {
  try {
    if (!to.stages.empty()) {
      auto next = std::move(to.stages.back());
      to.stages.pop_back();
      next->enqueue(caf::make_mailbox_element(std::move(to.sender), to.mid,
                                              std::move(to.stages), std::move(msg)),
                    nullptr);
      return;
    }
    if (to.sender && to.mid.is_request())
      to.sender->enqueue(caf::actor_cast<caf::strong_actor_ptr>(to.from), to.mid.response_id(),
                         std::move(msg), nullptr);
  } catch (...) {
    // Out of memory: the requester's monitor or timeout ends its wait.
  }
}

/// The reply a `wait` owes, registered with the core: `requester` is set for
/// a requester of another node, whose waits its down message drops.
struct wait_reply {
  caf::actor_addr requester;
  reply_to to;
  uint64_t seq;
  std::shared_ptr<void> ticket; // a session's (peer_guard::waits), back as this goes
  void operator()(const failure* cause) {
    reply_from_runner(to, cause ? caf::make_message(make_error(*cause))
                                : caf::make_message(seq));
  }
};

/// Runs the oldest deferred request.
void run_next(self_ptr self) {
  tsan_turn turn{self}; // `deferred`: see ordered
  auto next = std::move(self->state.deferred.front());
  self->state.deferred.pop_front();
  next(false);
}

/// Runs the deferred requests while the queue has room; otherwise asks the
/// runner for a `room` message when it has made some.
void drain(self_ptr self) {
  tsan_turn turn{self}; // `deferred`: see ordered
  auto& st = self->state;
  while (!st.deferred.empty()) {
    caf::actor_addr addr = self->address();
    auto key = st.key;
    bool full = st.core->notify_when_room([addr, key] {
      if (auto me = caf::actor_cast<device_actor_full>(addr))
        caf::anon_send(me, room_atom::value, key);
    });
    if (full)
      return;
    run_next(self);
  }
}

/// Runs `go` now (`go(false)`) when nothing is deferred and the queue has
/// room; otherwise defers it behind the requests deferred before it (`room`
/// runs it, or refuses it with `go(true)` when the actor stops first).
template <class G>
void now_or_deferred(self_ptr self, G go) {
  auto& st = self->state;
  if (st.deferred.empty() && st.core->has_room()) {
    go(false);
  } else {
    st.deferred.emplace_back(std::move(go));
    drain(self);
  }
}

/// Handles a request that adds to the device's schedule: now, when nothing is
/// deferred and the queue has room; otherwise after the requests deferred
/// before it, once the runner has made room. `f` must capture by value.
template <class F>
auto ordered(self_ptr self, F f) -> caf::result<decltype(f())> {
  using value = decltype(f());
  // `deferred` and what its entries captured are the actor's own, but the
  // handler that runs an entry (`room`) may run on another worker than the
  // one that added it (tsan.hpp).
  tsan_turn turn{self};
  auto& st = self->state;
  if (st.deferred.empty() && st.core->has_room())
    return attempt(*st.core, f);
  if (auto err = deferral_refused(st))
    return std::move(*err);
  auto rp = self->make_response_promise<value>();
  // The core, not the state: a refusal may come from the state's destructor.
  st.deferred.emplace_back([core = st.core, rp, f](bool refuse) mutable {
    if (refuse) {
      rp.deliver(make_error(errc::device_failed, core->name(),
                            "the device actor stopped before this request was handled"));
      return;
    }
    auto x = attempt(*core, f);
    if (x)
      rp.deliver(std::move(*x));
    else
      rp.deliver(std::move(x.error()));
  });
  drain(self);
  return rp;
}

/// Monitors `who` unless this actor does already: one monitor per actor it
/// waits on or answers, however many waits (a monitor per `depend` piled up
/// on the owner, one per wait, for as long as both lived).
void watch(self_ptr self, const caf::actor_addr& who) {
  if (who && self->state.monitored.insert(who).second)
    self->monitor(who);
}

// -- direct routes between nodes -----------------------------------------------

/// How long a connection to another node may take before the messages to it
/// go the way CAF knows (through the process that introduced it).
constexpr auto connect_timeout = std::chrono::seconds{2};

/// Runs `then` (in this actor's turn) once this process has its own
/// connection to `peer`'s node, made here on first use to `host:port`, or
/// once making it failed or took longer than `connect_timeout`. At once when
/// there is nothing to make: no address, `peer` on this node or on the node
/// of the sender (`via`, a node the messages take no detour through).
///
/// Why: CAF 0.17 routes a message to a node this process never connected to
/// through the node that introduced it, so without this a wait of a device of
/// node b on one of node a, both attached by a client, goes a -> client -> b
/// (two hops through the client). With the connection, the `wait` and its
/// reply go straight between a and b, and b's BASP watches a itself. (CAF's
/// own `middleman.enable-automatic-connections` does this too, but through a
/// plain-TCP port it opens on every interface, beside the node's TLS and its
/// loopback-only default.) The connection is made with the process's own
/// middleman: over TLS when the node runs TLS.
void with_route(self_ptr self, const caf::node_id& peer, const caf::node_id& via,
                const std::string& host, uint16_t port, std::function<void()> then) {
  auto& sys = self->system();
  if (host.empty() || port == 0 || !peer || peer == self->node() || peer == via
      || !sys.has_middleman()) {
    then();
    return;
  }
  auto [it, fresh] = self->state.routes.try_emplace(peer);
  if (it->second.settled) {
    then();
    return;
  }
  it->second.waiting.push_back(std::move(then));
  if (!fresh)
    return;
  auto settle = [self, peer] {
    tsan_turn turn{self}; // the actor's state (tsan.hpp)
    auto i = self->state.routes.find(peer);
    if (i == self->state.routes.end())
      return;
    i->second.settled = true;
    auto waiting = std::move(i->second.waiting);
    i->second.waiting.clear();
    for (auto& f : waiting)
      f();
  };
  caf::io::middleman_actor mm = sys.has_openssl_manager()
                                  ? sys.openssl_manager().actor_handle()
                                  : sys.middleman().actor_handle();
  // Whatever the outcome, the waits go: through the connection when it was
  // made, the way CAF knew before when not (a node behind a firewall, a
  // name that resolves elsewhere, a restarted node at that address).
  self->request(mm, connect_timeout, caf::connect_atom_v, host, port)
    .then([settle](caf::node_id&, caf::strong_actor_ptr&, std::set<std::string>&) { settle(); },
          [settle](caf::error&) { settle(); });
}

// -- batches sent in parts -------------------------------------------------------

using batch_key = std::pair<caf::actor_addr, uint64_t>;

/// Batches one sender may have open at once (a link of this library has one).
constexpr std::ptrdiff_t max_open_batches = 8;

/// Tasks of a batch sent in parts pushed at once (per message handled): as
/// many as a one-message batch holds, so a full queue still holds it back.
constexpr std::size_t batch_slice = 4096;

/// Binds `part`, part number `n` of batch `key`, and holds its tasks with
/// those of the batch's earlier parts. Throws `std::invalid_argument`, the
/// batch dropped, when a spec does not bind or the part is not the one
/// expected; nothing is scheduled then.
device_state::staged_batch& stage(self_ptr self, const batch_key& key, uint32_t n,
                                  const std::vector<task_spec>& part) {
  auto& st = self->state;
  const auto& name = st.core->name();
  auto it = st.batches.find(key);
  if (it == st.batches.end()) {
    if (n != 0)
      throw std::invalid_argument(fmt::format(
        "schedule_batch on {}: part {} of batch {} belongs to no open batch (its part 0 "
        "never came, or an earlier part was refused and the batch dropped)",
        name, n, key.second));
    auto open = std::count_if(st.batches.begin(), st.batches.end(),
                              [&](const auto& kv) { return kv.first.first == key.first; });
    if (open >= max_open_batches)
      throw std::invalid_argument(fmt::format(
        "schedule_batch on {}: batch {}: its sender has {} batches open already (at most {})",
        name, key.second, open, max_open_batches));
    watch(self, key.first); // one monitor per peer, shared with the waits
    it = st.batches.emplace(key, device_state::staged_batch{}).first;
  } else if (n != it->second.next_part) {
    auto expected = it->second.next_part;
    st.batches.erase(it);
    throw std::invalid_argument(
      fmt::format("schedule_batch on {}: batch {}: part {} came where part {} was expected; "
                  "the batch is dropped",
                  name, key.second, n, expected));
  }
  std::size_t held = 0; // the tasks of every open batch of this device
  for (const auto& [k, b] : st.batches)
    held += b.work.size();
  if (part.size() > wire_limits::batch_tasks - std::min(held, wire_limits::batch_tasks)) {
    st.batches.erase(it);
    throw std::invalid_argument(fmt::format(
      "schedule_batch on {}: batch {}: part {} of {} tasks: the open batches hold {} tasks "
      "and may hold at most {}; the batch is dropped",
      name, key.second, n, part.size(), held, wire_limits::batch_tasks));
  }
  try {
    auto& work = it->second.work; // grown geometrically: no reserve per part
    for (const auto& spec : part)
      work.push_back(bind_spec(st.core, spec).work);
    ++it->second.next_part;
  } catch (...) {
    st.batches.erase(key);
    throw;
  }
  return it->second;
}

/// The last part of a batch sent in parts, as a deferred request: binds the
/// part, then pushes the whole batch, `batch_slice` tasks per turn while the
/// queue has room (it stays first in `deferred` until the batch is in, so
/// nothing else goes in between), and replies with every seq.
struct batch_commit {
  struct job {
    caf::typed_response_promise<std::vector<uint64_t>> rp;
    batch_key key;
    uint32_t part = 0;
    std::vector<task_spec> last;
    std::vector<task> work;
    std::size_t next = 0;
    std::vector<uint64_t> seqs;
    bool bound = false;
  };
  self_ptr self;
  std::shared_ptr<job> j;

  void operator()(bool refuse) {
    auto& st = self->state;
    auto c = st.core;
    if (refuse) {
      st.batches.erase(j->key);
      j->rp.deliver(make_error(errc::device_failed, c->name(),
                               "the device actor stopped before this request was handled"));
      return;
    }
    auto step = [this, &st, &c] {
      if (!j->bound) {
        auto& b = stage(self, j->key, j->part, j->last);
        j->work = std::move(b.work);
        st.batches.erase(j->key);
        j->last.clear();
        j->bound = true;
        j->seqs.reserve(j->work.size());
      }
      auto end = std::min(j->work.size(), j->next + batch_slice);
      for (; j->next < end; ++j->next)
        j->seqs.push_back(c->push(std::move(j->work[j->next]), false));
      return j->next == j->work.size();
    };
    auto done = attempt(*c, step);
    if (!done) {
      st.batches.erase(j->key);
      j->rp.deliver(std::move(done.error()));
    } else if (*done) {
      j->work.clear();
      j->rp.deliver(std::move(j->seqs));
    } else {
      st.deferred.push_front(*this); // the rest, when the runner has made room
    }
  }
};

/// `schedule` with a batch id: see the protocol.
caf::result<std::vector<uint64_t>> batch_part(self_ptr self, uint64_t batch, uint32_t part,
                                              std::vector<task_spec> specs, bool last) {
  batch_key key{caf::actor_cast<caf::actor_addr>(self->current_sender()), batch};
  if (auto err = refused(*self->state.core, [&] { check_schedule(specs); }))
    return std::move(*err);
  if (!last) {
    auto p = std::make_shared<const std::vector<task_spec>>(std::move(specs));
    return ordered(self, [self, key, part, p] {
      stage(self, key, part, *p);
      return std::vector<uint64_t>{};
    });
  }
  auto j = std::make_shared<batch_commit::job>();
  j->rp = self->make_response_promise<std::vector<uint64_t>>();
  j->key = key;
  j->part = part;
  j->last = std::move(specs);
  auto rp = j->rp;
  if (auto err = deferral_refused(self->state)) {
    rp.deliver(std::move(*err));
    return rp;
  }
  self->state.deferred.emplace_back(batch_commit{self, std::move(j)});
  drain(self);
  return rp;
}

/// Fails the gates waiting on `owner` with `msg` and remembers it dead (a
/// later `depend` on it is refused).
void fail_owner(self_ptr self, const caf::actor_addr& owner, const std::string& msg) {
  auto& st = self->state;
  // Remembered even without gates: a `lost` may overtake the `depend` it
  // is about (they come from different actors).
  if (std::find(st.dead_owners.begin(), st.dead_owners.end(), owner) == st.dead_owners.end()) {
    st.dead_owners.push_back(owner);
    if (st.dead_owners.size() > 256)
      st.dead_owners.pop_front();
  }
  auto [first, last] = st.remote_gates.equal_range(owner);
  for (auto i = first; i != last; ++i)
    if (auto g = i->second.lock())
      st.core->resolve_gate(*g, &msg); // no-op for gates already open
  st.remote_gates.erase(first, last);
  std::erase_if(st.incoming, [&owner](const auto& kv) { return kv.second.source == owner; });
  // Its node may be gone, or our connection to it: a later wait there
  // connects again.
  if (auto i = st.routes.find(owner.node()); i != st.routes.end() && i->second.settled)
    st.routes.erase(i);
}

/// `depend`: a gate on `owner`'s `seq`, opened by the reply to a `wait`
/// request; `owner_name` (may be empty) names it in the errors.
caf::result<uint64_t> depend_on(self_ptr self, const caf::actor& owner, uint64_t seq,
                                std::string owner_name, std::string host = {},
                                uint16_t port = 0) {
  auto c = self->state.core;
  if (auto err = refused(*c, [&] { check_depend(owner_name, host); }))
    return std::move(*err);
  const auto& sender = self->current_sender();
  caf::node_id via = sender ? sender->node() : caf::node_id{};
  // `owner_name` is the sender's name for the owner; one of this process's
  // own devices (sent by another actor system of it) comes as
  // `<host>:<pid>/<name>`: named as we name it.
  to_our_name(owner_name, {});
  return ordered(self, [self, c, owner, seq, owner_name, via, host, port]() -> uint64_t {
    if (!owner)
      throw std::invalid_argument(
        fmt::format("depend on {}: the owner is an invalid actor handle", c->name()));
    if (owner == caf::actor_cast<caf::actor>(self))
      return c->queue().scheduled(); // waiting on our own schedule: a no-op
    auto& dead = self->state.dead_owners;
    auto who = owner_name.empty() ? fmt::format("actor {}", owner.id()) : owner_name;
    if (std::find(dead.begin(), dead.end(), owner.address()) != dead.end()) {
      // Refused, and a failed wait queued all the same: the work sent after
      // this message must not run as if it had waited.
      auto why = fmt::format("cannot wait for seq {} of {}: it is down", seq, who);
      auto g = make_gate();
      g->owner_seq = seq;
      g->remote = true;
      g->owner_name = who;
      c->push_gate(g);
      c->resolve_gate(*g, &why);
      throw device_error(c->name(), why);
    }
    auto g = make_gate();
    g->owner_seq = seq;
    g->remote = true;
    g->owner_name = owner_name;
    g->label = owner_name.empty() ? fmt::format("seq {} of actor {}", seq, owner.id())
                                  : fmt::format("{} seq {}", owner_name, seq);
    c->push_gate(g);
    try {
      // A vanished owner (a node gone) may never answer: the monitor's
      // down message fails the gate instead. One monitor per owner (`watch`);
      // gates already resolved are dropped here.
      auto& gates = self->state.remote_gates;
      std::erase_if(gates, [](const auto& kv) { return kv.second.expired(); });
      watch(self, owner.address());
      gates.emplace(owner.address(), g);
      std::weak_ptr<device_core> weak = c;
      auto& sink = self->state.sink;
      if (!sink)
        sink = reply_sink::make(self->system());
      caf::actor_system* sys = &self->system();
      auto on_reply = [weak, g, sys, owner_name](const caf::message& m) {
        auto me = weak.lock();
        if (!me)
          return;
        if (m.match_elements<uint64_t>()) {
          me->resolve_gate(*g, nullptr);
          return;
        }
        fail_gate(*me, *g,
                  m.match_elements<caf::error>() ? m.get_as<caf::error>(0)
                                                 : caf::make_error(caf::sec::unexpected_response),
                  *sys, owner_name);
      };
      // Once this process has its own route to the owner's node, if it
      // can have one (`with_route`).
      with_route(self, owner.node(), via, host, port,
                 [weak, g, sink, owner, seq, on_reply = std::move(on_reply)]() mutable {
                   if (sink->wait(owner, seq, std::move(on_reply)))
                     return;
                   static const std::string why = "could not send the wait request";
                   if (auto me = weak.lock())
                     me->resolve_gate(*g, &why);
                 });
    } catch (...) {
      // Queued but never to be answered: fail it rather than hold the
      // device forever.
      static const std::string why = "could not send the wait request";
      c->resolve_gate(*g, &why);
      throw;
    }
    return g->seq;
  });
}

// -- copies between devices of two other processes ---------------------------------

/// `copy_from`: a gate that the bytes from `source` open, then their write
/// into pool `id` at `offset`, queued in order; the reply (the write's seq
/// and the transfer's id) once this process has its own route to `source`'s
/// node (`with_route`), so that the sender's `copy_to` makes `source` send
/// the bytes straight here.
caf::result<uint64_t, uint64_t> copy_from(self_ptr self, int32_t id, uint64_t offset,
                                          uint64_t size, const caf::actor& source,
                                          std::string source_name, std::string host,
                                          uint16_t port) {
  auto rp = self->make_response_promise<uint64_t, uint64_t>();
  if (auto err = refused(*self->state.core, [&] { check_copy_from(source_name, host); })) {
    rp.deliver(std::move(*err));
    return rp;
  }
  if (!(self->state.deferred.empty() && self->state.core->has_room()))
    if (auto err = deferral_refused(self->state)) {
      rp.deliver(std::move(*err));
      return rp;
    }
  const auto& sender = self->current_sender();
  caf::node_id via = sender ? sender->node() : caf::node_id{};
  to_our_name(source_name, {});
  // The core, not the state: a refusal may come from the state's destructor.
  auto go = [self, c = self->state.core, rp, id, offset, size, source, source_name, host, port,
             via](bool refuse) mutable {
    if (refuse) {
      rp.deliver(make_error(errc::device_failed, c->name(),
                            "the device actor stopped before this request was handled"));
      return;
    }
    auto push = [&] {
      if (!source || source == caf::actor_cast<caf::actor>(self))
        throw std::invalid_argument(fmt::format(
          "copy_from on {}: the source must be another device's actor", c->name()));
      auto& st = self->state;
      if (std::find(st.dead_owners.begin(), st.dead_owners.end(), source.address())
          != st.dead_owners.end())
        throw device_error(c->name(), fmt::format("cannot copy from {}: it is down",
                                                  source_name));
      auto p = c->pools().span(id, offset, size, fmt::format("copy_from {}", source_name));
      auto transfer = ++st.last_transfer;
      auto g = make_gate();
      g->remote = true;
      g->owner_name = source_name;
      g->label = fmt::format("the bytes of {} (transfer {})", source_name, transfer);
      auto parts = std::make_shared<std::vector<std::string>>();
      c->push_gate(g);
      auto* d = &c->drv();
      auto seq = c->push(task{fmt::format("copy from {} into pool {} [{}, {})", source_name, id,
                                          offset, offset + size),
                              [d, p, offset, parts] {
                                auto* to = p->base() + offset;
                                for (const auto& part : *parts) {
                                  d->copy(to, reinterpret_cast<const std::byte*>(part.data()),
                                          part.size());
                                  to += part.size();
                                }
                              },
                              {},
                              trace_kind::copy},
                         false);
      // A source that goes down fails the gate (`fail_owner`).
      std::erase_if(st.remote_gates, [](const auto& kv) { return kv.second.expired(); });
      watch(self, source.address());
      st.remote_gates.emplace(source.address(), g);
      if (size == 0)
        c->resolve_gate(*g, nullptr); // no part will come
      else
        st.incoming.emplace(transfer, device_state::incoming_copy{source.address(), g, parts,
                                                                  size, 0, source_name});
      return std::pair{seq, transfer};
    };
    auto r = attempt(*c, push);
    if (!r) {
      rp.deliver(std::move(r.error()));
      return;
    }
    with_route(self, source.node(), via, host, port,
               [rp, r = *r]() mutable { rp.deliver(r.first, r.second); });
  };
  now_or_deferred(self, std::move(go));
  return rp;
}

/// The copy `transfer` waiting for its bytes from the sender of the message
/// being handled; none when there is no such copy (it failed already: its
/// source went down) or the sender is not its source.
device_state::incoming_copy* find_incoming(self_ptr self, uint64_t transfer) {
  auto& in = self->state.incoming;
  auto i = in.find(transfer);
  if (i == in.end()
      || caf::actor_cast<caf::actor_addr>(self->current_sender()) != i->second.source)
    return nullptr;
  return &i->second;
}

/// `bytes`: the next part of copy `transfer`; the last one opens its gate.
void receive_part(self_ptr self, uint64_t transfer, std::string& part) {
  auto* in = find_incoming(self, transfer);
  if (!in)
    return;
  auto& c = *self->state.core;
  in->received += part.size();
  if (in->received > in->size) {
    auto why = fmt::format("{} sent more than the {} bytes of the copy", in->source_name,
                           in->size);
    c.resolve_gate(*in->g, &why);
    self->state.incoming.erase(transfer);
    return;
  }
  // Read by the write after the gate, once it opens.
  in->parts->push_back(std::move(part));
  if (in->received < in->size)
    return;
  auto g = std::move(in->g);
  self->state.incoming.erase(transfer);
  c.resolve_gate(*g, nullptr);
}

/// Bytes of a copy between processes per `bytes` message: the source's
/// runner reads the next part while its middleman sends the last one, and
/// every buffer stays small enough for the allocator to reuse (a 64 MiB
/// buffer is a fresh mapping each time, its pages faulted in one by one).
constexpr std::size_t copy_part_bytes = std::size_t{1} << 20;

/// Sends `msg` to `to` from `from` (a device actor), from any thread.
void send_from(const caf::strong_actor_ptr& from, const caf::actor& to, caf::message msg) noexcept {
  try {
    if (auto dest = caf::actor_cast<caf::strong_actor_ptr>(to))
      dest->enqueue(from, caf::make_message_id(), std::move(msg), nullptr);
  } catch (...) {
    // Out of memory: the destination's monitor of this actor ends its wait.
  }
}

/// `copy_to`: a read of pool `id` at `offset`, queued in order, whose bytes
/// (or failure) the runner sends straight to `destination` once read.
caf::result<uint64_t> copy_to(self_ptr self, int32_t id, uint64_t offset, uint64_t size,
                              const caf::actor& destination, uint64_t transfer) {
  auto c = self->state.core;
  auto me = caf::actor_cast<caf::strong_actor_ptr>(self);
  return ordered(self, [c, id, offset, size, destination, transfer, me]() -> uint64_t {
    if (!destination)
      throw std::invalid_argument(
        fmt::format("copy_to on {}: the destination is an invalid actor handle", c->name()));
    try {
      auto p = c->pools().span(id, offset, size, "copy_to");
      // The parts go as they are read; a failure or a cancellation (of the
      // read, or of an item before it) goes after the parts sent, if any.
      auto seq = c->push(task{fmt::format("copy pool {} [{}, {}) to actor {}", id, offset,
                                          offset + size, destination.id()),
                              [p, offset, size, me, destination, transfer] {
                                const auto* from = reinterpret_cast<const char*>(p->base())
                                                   + offset;
                                for (uint64_t done = 0; done < size;) {
                                  auto n = std::min<uint64_t>(copy_part_bytes, size - done);
                                  send_from(me, destination,
                                            caf::make_message(bytes_atom::value, transfer,
                                                              std::string(from + done, n)));
                                  done += n;
                                }
                              },
                              {},
                              trace_kind::copy},
                         false);
      c->events().when_resolved(seq, [me, destination, transfer](const failure* cause) {
        if (cause)
          send_from(me, destination,
                    caf::make_message(bytes_atom::value, transfer, make_error(*cause)));
      });
      return seq;
    } catch (const std::exception& e) {
      // The destination waits for these bytes: it fails instead.
      send_from(me, destination,
                caf::make_message(bytes_atom::value, transfer,
                                  make_error(errc::device_failed, c->name(), e.what())));
      throw;
    }
  });
}

device_actor_full::behavior_type device_impl(self_ptr self,
                                             std::shared_ptr<device_core> core,
                                             std::shared_ptr<const device_identity> id,
                                             std::shared_ptr<const peer_guard> guard) {
  tsan_acquire(core.get()); // see spawn_device_actor
  tsan_turn turn{self};       // passes that on to the handlers' turns
  self->state.core = std::move(core);
  self->state.id = *id;
  self->state.key = random_key();
  self->state.turn_key = self;
  self->set_down_handler([self](caf::down_msg& dm) {
    tsan_turn turn{self}; // remote_waiters, shared with `wait` (tsan.hpp)
    auto& st = self->state;
    st.monitored.erase(dm.source);
    if (st.remote_waiters.erase(dm.source) > 0)
      st.core->events().drop_waiters([&dm](const device_core::resolver& r) {
        auto* w = r.target<wait_reply>();
        return w != nullptr && w->requester == dm.source;
      });
    std::erase_if(st.batches, [&dm](const auto& kv) { return kv.first.first == dm.source; });
    fail_owner(self, dm.source,
               fmt::format("the actor owning the awaited event is down ({})",
                           self->system().render(dm.reason)));
  });
  // The actor owns its device's life: once it is gone (a kill, an exit
  // message, an exception), nothing is accepted any more and the work not
  // yet started fails with the reason. After the backend's own shutdown the
  // device has drained already, and this changes nothing. However the actor
  // ends, the replies that would open its remote gates can no longer arrive:
  // those gates fail too, or the device would wait on them until its backend
  // goes.
  std::weak_ptr<device_core> weak = self->state.core;
  caf::actor_system* sys = &self->system();
  auto kill_device = [weak, sys](const caf::error& reason) {
    auto c = weak.lock();
    if (!c)
      return;
    std::string text;
    try {
      text = reason ? sys->render(reason) : std::string{"normal"};
    } catch (...) {
      text = "unknown reason";
    }
    c->life().kill("the device actor exited (" + text + ")"); // idempotent
    // Left by a kill of a device already stopping: the answers cannot come.
    static const std::string why = "the device's actor stopped before the answer came";
    c->life().cancel_remote_waits(why);
  };
  self->set_exit_handler([self, kill_device](caf::exit_msg& msg) {
    // On whichever thread delivers it (the multiplexer's, for a link's
    // exit): the state the init turn made, handed over by CAF (tsan.hpp).
    tsan_turn turn{self};
    if (msg.reason == caf::exit_reason::normal)
      return;
    // Killed here, before quitting: CAF runs the attachables of an ending
    // actor newest first, so a user's monitor (attached after the functor
    // below) would otherwise hear of the end before the device is killed,
    // and work released meanwhile could still run.
    kill_device(msg.reason);
    self->state.refuse_deferred(); // the state's destructor would, too
    self->quit(msg.reason);
  });
  // A message that is only an error is a reply to nothing this actor asked
  // (its requests have error handlers of their own): a peer's, or the
  // refusal an actor that a `copy_to` sent bytes to answered them with.
  // CAF's default handler quit the device with it.
  self->set_error_handler([](caf::error&) {});
  // Any other end (a kill, an exception).
  self->attach_functor(kill_device);
  return {
    [self](schedule_atom, const task_spec& spec) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto c = self->state.core;
      if (auto err = refused(*c, [&] { check_schedule(spec); }))
        return std::move(*err);
      return ordered(self, [c, spec] { return c->push(bind_spec(c, spec).work, false); });
    },
    [self](schedule_atom, const std::vector<task_spec>& specs)
      -> caf::result<std::vector<uint64_t>> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto c = self->state.core;
      if (auto err = refused(*c, [&] { check_schedule(specs); }))
        return std::move(*err);
      return ordered(self, [c, specs] { return push_batch(c, specs); });
    },
    [self](schedule_atom, uint64_t batch, uint32_t part, std::vector<task_spec>& specs,
           bool last) -> caf::result<std::vector<uint64_t>> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return batch_part(self, batch, part, std::move(specs), last);
    },
    [self, guard](wait_atom, uint64_t seq) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // remote_waiters, shared with the down handler
      auto& st = self->state;
      if (st.core->outcomes().is_done(seq))
        return seq;
      auto c = st.core;
      const auto& sender = self->current_sender();
      caf::actor_addr remote;
      if (sender && sender->node() != self->node())
        remote = caf::actor_cast<caf::actor_addr>(sender);
      reply_to to{sender, self->current_message_id(), self->current_forwarding_stack(),
                  self->address()};
      auto registered = [&] {
        c->check_scheduled(seq, "wait");
        auto ticket = guard ? guard->waits.take(guard->who, seq) : nullptr;
        if (remote && st.remote_waiters.insert(remote).second)
          watch(self, remote);
        // Every registered seq resolves once (done, failed, cancelled, or
        // killed with the device), so every wait gets exactly one reply,
        // even after this actor has stopped -- unless its requester went
        // away first (the down handler).
        c->events().when_resolved(seq, wait_reply{remote, std::move(to), seq, std::move(ticket)});
        return true;
      };
      auto r = attempt(*c, registered);
      if (!r)
        return std::move(r.error());
      return caf::delegated<uint64_t>{};
    },
    [self](wait_atom, cancel_atom, uint64_t seq, uint64_t request) {
      // A requester gave up one wait (its deadline passed): only that wait
      // goes, found by its sender and request id among the waits on `seq`.
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      const auto& sender = self->current_sender();
      if (!sender)
        return;
      self->state.core->events().drop_waiter(seq, [&](const device_core::resolver& r) {
        auto* w = r.target<wait_reply>();
        return w != nullptr && w->to.sender == sender
               && w->to.mid.request_id().integer_value() == request;
      });
    },
    [self](room_atom, uint64_t key) {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      if (key != self->state.key)
        return;
      // The oldest deferred request goes in now, room or not (its push never
      // waits): host producers are woken at once when the runner makes room
      // and may fill it again before this message arrives, which would
      // otherwise starve the message path.
      if (!self->state.deferred.empty())
        run_next(self);
      drain(self);
    },
    [self](depend_atom, const caf::actor& owner, uint64_t seq) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return depend_on(self, owner, seq, {});
    },
    [self](depend_atom, const caf::actor& owner, uint64_t seq,
           std::string& owner_name) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return depend_on(self, owner, seq, std::move(owner_name));
    },
    [self](depend_atom, const caf::actor& owner, uint64_t seq, std::string& owner_name,
           std::string& host, uint16_t port) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return depend_on(self, owner, seq, std::move(owner_name), std::move(host), port);
    },
    [self](lost_atom, const caf::actor& owner, const std::string& why) {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      if (refused(*self->state.core, [&] { check_lost(why); }))
        return; // no reply to give: dropped
      if (owner)
        fail_owner(self, owner.address(), why);
    },
    [self](copy_from_atom, int32_t id, uint64_t offset, uint64_t size, const caf::actor& source,
           std::string& source_name, std::string& host,
           uint16_t port) -> caf::result<uint64_t, uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return copy_from(self, id, offset, size, source, std::move(source_name), std::move(host),
                       port);
    },
    [self](copy_to_atom, int32_t id, uint64_t offset, uint64_t size,
           const caf::actor& destination, uint64_t transfer) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return copy_to(self, id, offset, size, destination, transfer);
    },
    [self](bytes_atom, uint64_t transfer, std::string& part) {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      receive_part(self, transfer, part);
    },
    [self](bytes_atom, uint64_t transfer, const caf::error& err) {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto* in = find_incoming(self, transfer);
      if (!in)
        return;
      auto g = std::move(in->g);
      auto name = std::move(in->source_name);
      self->state.incoming.erase(transfer);
      fail_gate(*self->state.core, *g, err, self->system(), name);
    },
    [self, guard](alloc_atom, int32_t id, uint64_t size, uint64_t alignment,
                  int32_t mode) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto c = self->state.core;
      if (auto err = refused(*c, [&] { check_alloc(id, alignment, mode); }))
        return std::move(*err);
      return ordered(self, [c, id, size, alignment, mode, guard] {
        if (guard) // the session's quota, checked when the allocation is made
          guard->check_alloc_quota(id, size);
        std::optional<memory_mode> m;
        if (mode >= 0 && mode <= static_cast<int32_t>(memory_mode::materialized))
          m = static_cast<memory_mode>(mode);
        c->memory().alloc_pool(id, size, alignment, m);
        return static_cast<uint64_t>(c->pools().used_memory());
      });
    },
    [self](free_atom, int32_t id) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto c = self->state.core;
      return ordered(self, [c, id] {
        c->memory().free_pool(id);
        return static_cast<uint64_t>(c->pools().used_memory());
      });
    },
    [self](memset_atom, int32_t id, uint64_t offset,
           uint64_t size) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto c = self->state.core;
      return ordered(self,
                     [c, id, offset, size] { return c->memory().memset_zero(id, offset, size); });
    },
    [self, guard](write_atom, int32_t id, uint64_t offset,
                  const std::string& bytes) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto c = self->state.core;
      auto data = std::make_shared<const std::string>(bytes);
      return ordered(self, [c, id, offset, data, guard] {
        if (!guard)
          return c->memory().write_bytes(id, offset, data);
        // A session's bytes held until the write ran count against its quota.
        auto n = data->size();
        guard->take_transfer(n, "write");
        uint64_t seq = 0;
        try {
          seq = c->memory().write_bytes(id, offset, data);
          c->events().when_resolved(seq, [guard, n](const failure*) { guard->release_transfer(n); });
        } catch (...) {
          if (seq == 0)
            guard->release_transfer(n);
          throw;
        }
        return seq;
      });
    },
    [self, guard](read_atom, int32_t id, uint64_t offset,
                  uint64_t size) -> caf::result<std::string> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      // Pushed in mailbox order (behind deferred requests, like `ordered`);
      // the reply comes from the runner once the read is done.
      auto c = self->state.core;
      auto go = [c, id, offset, size, guard,
                 to = reply_to{self->current_sender(), self->current_message_id(),
                               self->current_forwarding_stack(), self->address()}](bool refuse) mutable {
        if (refuse) {
          reply_from_runner(to, caf::make_message(make_error(
                                  errc::device_failed, c->name(),
                                  "the device actor stopped before this request was handled")));
          return;
        }
        auto push_read = [&] {
          // Sized here, inside `attempt`: a size no pool holds is refused
          // (read_bytes checks the span; an impossible allocation throws
          // before it), never fatal to the actor.
          c->pools().span(id, offset, size, "read");
          // A session's read buffer counts against its quota until the reply.
          if (guard)
            guard->take_transfer(size, "read");
          uint64_t seq = 0;
          try {
            auto out = std::make_shared<std::string>(size, '\0');
            seq = c->memory().read_bytes(id, offset, out);
            c->events().when_resolved(seq, [to, out, guard, size](const failure* cause) mutable {
              if (guard)
                guard->release_transfer(size);
              reply_from_runner(to, cause ? caf::make_message(make_error(*cause))
                                          : caf::make_message(std::move(*out)));
            });
          } catch (...) {
            if (guard && seq == 0)
              guard->release_transfer(size);
            throw;
          }
          return true;
        };
        auto r = attempt(*c, push_read);
        if (!r)
          reply_from_runner(to, caf::make_message(std::move(r.error())));
      };
      if (!(self->state.deferred.empty() && c->has_room()))
        if (auto err = deferral_refused(self->state))
          return std::move(*err);
      now_or_deferred(self, std::move(go));
      return caf::delegated<std::string>{};
    },
    [self](all_work_atom) -> caf::result<uint64_t> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto c = self->state.core;
      return ordered(self, [c] { return c->queue().scheduled(); });
    },
    [self](idle_atom) -> bool {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return self->state.deferred.empty() && self->state.core->inspect().is_idle();
    },
    [self](memory_atom) -> uint64_t { return self->state.core->pools().used_memory(); },
    [self](debug_atom) -> std::string {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto info = self->state.core->inspect().debug_info();
      info.push_back(wait_graph_info_of(self->state.core));
      return info.to_string();
    },
    [self](why_atom, uint64_t seq) {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      remote_hop hop;
      auto rest = wait_chain_rest(*st.core, seq, &hop);
      caf::actor next;
      if (hop.at) {
        // The owner of that wait: a `depend`'s (remote_gates), or an
        // attached device's.
        for (const auto& [addr, w] : st.remote_gates)
          if (w.lock() == hop.at)
            next = caf::actor_cast<caf::actor>(addr);
        if (!next)
          if (auto ep = hop.at->remote_owner.lock())
            next = caf::actor_cast<caf::actor>(ep->actor());
        if (!next)
          rest += std::string{", which "} + remote_silent_end;
      }
      return caf::make_result(std::move(rest), std::move(next), next ? hop.seq : uint64_t{0});
    },
    [self](identify_atom) {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      return caf::make_result(caf::to_string(self->system().node()), st.id.device_id,
                              st.core->name(), st.id.driver,
                              static_cast<int32_t>(st.core->ordinal()));
    },
    [self](status_atom, uint64_t seq) {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& c = *self->state.core;
      // Scheduled first: a seq resolved after this read is still counted.
      auto scheduled = c.queue().scheduled();
      auto state = static_cast<uint8_t>(c.outcomes().state(seq));
      return caf::make_result(state, c.outcomes().finished(), scheduled);
    },
    [self](cancel_atom) -> uint64_t {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return self->state.core->life().cancel("cancelled by cancel(device)");
    },
    [self](recover_atom) -> bool {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      return self->state.core->life().recover();
    },
    [self](trace_atom) -> device_trace { return self->state.core->inspect().trace(); },
    [self](result_atom, const std::string& name) -> caf::result<bool, kernel_result> {
      tsan_turn turn{self}; // the actor's state (tsan.hpp)
      if (auto err = refused(*self->state.core, [&] { check_result(name); }))
        return std::move(*err);
      auto r = self->state.core->results().get(name);
      return {r.has_value(), r.value_or(kernel_result{})};
    },
  };
}

/// A session's device actor (peer_guard): the device actor, which drops
/// what the guard does not admit before it reaches the mailbox.
class guarded_device : public caf::stateful_actor<device_state, device_actor_full::base> {
public:
  using super = caf::stateful_actor<device_state, device_actor_full::base>;

  guarded_device(caf::actor_config& cfg, std::shared_ptr<device_core> core,
                 std::shared_ptr<const device_identity> id,
                 std::shared_ptr<const peer_guard> guard)
    : super(cfg), core_(std::move(core)), id_(std::move(id)), guard_(std::move(guard)) {}

  behavior_type make_behavior() override {
    return device_impl(this, std::move(core_), std::move(id_), guard_);
  }

  using super::enqueue;

  void enqueue(caf::mailbox_element_ptr x, caf::execution_unit* host) override {
    if (x && !admitted(*x, host)) {
      refuse(*x, host);
      return; // dropped here: no handler sees it
    }
    super::enqueue(std::move(x), host);
  }

private:
  bool admitted(const caf::mailbox_element& x, caf::execution_unit* host) const {
    if (!x.sender)
      return host == nullptr; // see peer_guard
    return guard_->admits(x.sender->node());
  }

  /// A request gets an error reply, so its sender does not wait forever.
  void refuse(caf::mailbox_element& x, caf::execution_unit* host) const {
    if (!x.sender || !x.mid.is_request())
      return;
    try {
      auto why = fmt::format("refused a message from node {}: only the session's client "
                             "(and the nodes it vouched for) may send to its devices",
                             caf::to_string(x.sender->node()));
      x.sender->enqueue(nullptr, x.mid.response_id(),
                        caf::make_message(make_error(errc::invalid_argument, guard_->who, why)),
                        host);
    } catch (...) {
      // Out of memory: the requester's timeout ends its wait.
    }
  }

  std::shared_ptr<device_core> core_;
  std::shared_ptr<const device_identity> id_;
  std::shared_ptr<const peer_guard> guard_;
};

} // namespace

bool peer_guard::admits(const caf::node_id& n) const {
  if (n == home || n == client)
    return true;
  std::lock_guard guard{mu_};
  return std::find(vouched_.begin(), vouched_.end(), n) != vouched_.end();
}

void peer_guard::count(std::shared_ptr<const device_core> core) {
  std::lock_guard guard{mu_};
  cores_.push_back(std::move(core));
}

std::size_t peer_guard::used_memory() const {
  std::lock_guard guard{mu_};
  std::size_t n = 0;
  for (const auto& weak : cores_)
    if (auto c = weak.lock())
      n += c->pools().used_memory();
  return n;
}

void peer_guard::check_alloc_quota(int id, std::size_t size) const {
  if (memory_limit == 0)
    return;
  auto used = used_memory();
  if (size > memory_limit || used > memory_limit - size)
    throw std::invalid_argument(
      fmt::format("{}: alloc_pool {} of {} bytes refused: the session holds {} bytes and its "
                  "memory limit is {} bytes (multidev node --memory-limit)",
                  who, id, size, used, memory_limit));
}

void peer_guard::take_transfer(std::size_t n, const char* what) const {
  if (memory_limit == 0)
    return;
  auto held = in_transit_.load(std::memory_order_relaxed);
  do {
    if (n > memory_limit || held > memory_limit - n)
      throw std::invalid_argument(fmt::format(
        "{}: {} of {} bytes refused: the session's transfers in flight hold {} bytes and may "
        "hold at most its memory limit, {} bytes (multidev node --memory-limit)",
        who, what, n, held, memory_limit));
  } while (!in_transit_.compare_exchange_weak(held, held + n, std::memory_order_relaxed));
}

void peer_guard::release_transfer(std::size_t n) const noexcept {
  if (memory_limit > 0)
    in_transit_.fetch_sub(n, std::memory_order_relaxed);
}

void peer_guard::vouch(const caf::node_id& n) {
  check_trust(n);
  std::lock_guard guard{mu_};
  if (std::find(vouched_.begin(), vouched_.end(), n) != vouched_.end())
    return;
  if (vouched_.size() >= wire_limits::vouched_nodes)
    throw std::invalid_argument(fmt::format("trust: {} vouches for {} nodes already (at most {})",
                                            who, vouched_.size(), wire_limits::vouched_nodes));
  vouched_.push_back(n);
}

device_actor spawn_device_actor(caf::actor_system& sys, std::shared_ptr<device_core> core,
                                device_identity id, std::shared_ptr<const peer_guard> guard) {
  // What this thread did before spawn() happens before device_impl runs, but
  // CAF's scheduler hands the new actor to a worker through atomics
  // ThreadSanitizer never sees (see tsan.hpp). `id` travels behind a pointer
  // so that the worker copies it in device_impl, after the acquire, not in
  // CAF's argument forwarding before it.
  auto shared_id = std::make_shared<const device_identity>(std::move(id));
  tsan_release(core.get());
  if (guard)
    return sys.spawn<guarded_device>(std::move(core), std::move(shared_id), std::move(guard));
  return sys.spawn(device_impl, std::move(core), std::move(shared_id),
                   std::shared_ptr<const peer_guard>{});
}

void fail_gate(device_core& c, gate& g, const caf::error& err, caf::actor_system& sys,
               const std::string& owner_name) {
  if (auto f = failure_of(err)) { // the owner's provenance
    // Named as the owner's process names its devices: in ours, so
    // that the devices of that node keep its name on the next hop.
    to_our_names(*f, owner_name);
    c.resolve_gate(g, std::make_shared<const failure>(std::move(*f)));
    return;
  }
  auto msg = describe_error(sys, err);
  c.resolve_gate(g, &msg);
}

} // namespace multidev::detail
