// Nodes: one actor per process lists its devices to other processes
// (spawn_node_actor), and a backend attaches all the devices of a node at
// once (attach_node), after its own in ordinal order.
#include "actors/backend_impl.hpp"
#include "actors/device_actor.hpp"
#include "actors/remote/endpoint_remote.hpp"
#include "actors/remote/message_checks.hpp"
#include "messages/tsan.hpp"
#include "actors/logger_tie.hpp"
#include "actors/remote/node_listener.hpp"
#include "actors/remote/node_rounds.hpp"
#include "actors/remote/tls_middleman.hpp"

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/send.hpp>
#include <fmt/ranges.h>

#include "actors/remote/endpoint_remote.hpp"
#include "actors/reaper.hpp"

#include <multidev/protocol.hpp>

namespace multidev {

namespace {

using check_atom = caf::atom_constant<caf::atom("lease_chk")>;
/// Retries a session's replays deferred for room.
using round_retry_atom = caf::atom_constant<caf::atom("round_rtry")>;
using detail::round_flush_atom;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// The leases a node grants: what the client asks, within these bounds.
constexpr int64_t min_lease_ns = 50'000'000;            // 50 ms
constexpr int64_t max_lease_ns = 3'600'000'000'000;     // 1 h

/// One client's session: a backend of its own, with the node's options.
struct node_session {
  std::string client;
  std::shared_ptr<backend> b;
  /// Its devices' runners start an item only before this (steady ns); 0
  /// once over (device_life::set_lease).
  std::shared_ptr<std::atomic<int64_t>> lease;
  int64_t lease_ns = 0;
  /// When the node received each renewal whose acknowledgement the client
  /// may not have yet (0: the `open`), steady ns; the lease is extended from
  /// the one the client says it was acknowledged.
  std::map<uint64_t, int64_t> heard;
  std::vector<caf::actor> devices;
  /// Who may send the session's devices messages: the client's node (the
  /// sender of `open`), and the nodes it vouches for (`trust`).
  std::shared_ptr<detail::peer_guard> guard;
  /// The nodes this session admitted to the node's port (its client, the
  /// nodes it vouched for): forgotten there when no session names them.
  std::vector<caf::node_id> admitted;
  /// Its recorded rounds' parts and their waits between nodes.
  std::unique_ptr<detail::session_rounds> rounds;
};

struct node_state {
  std::string name;
  std::string identity;
  /// What opens a session (`load_cookie`).
  std::string cookie;
  /// What each session's pools may hold, in bytes.
  std::size_t memory_limit = 0;
  backend_options opts;
  uint64_t last_session = 0;
  std::map<uint64_t, node_session> sessions;
  std::map<uint64_t, std::string> ended; // why each ended session ended
  /// Ended sessions whose teardown finished (devices stopped, pools freed).
  std::shared_ptr<std::atomic<uint64_t>> cleaned = std::make_shared<std::atomic<uint64_t>>(0);
  /// The other nodes' actors the sessions' rounds wait on (monitored once),
  /// and those connected to directly (so their notices come straight).
  std::set<caf::actor_addr> watched;
  /// `round_done`s dropped and logged (the first few; the rest counted).
  std::size_t round_drops_logged = 0;
};

using node_ptr = caf::stateful_actor<node_state>*;

/// What the node prints about its sessions: on its stderr, for its operator.
void node_log(const node_state& st, const std::string& text) {
  std::cerr << fmt::format("multidev node {}: {}\n", st.name, text) << std::flush;
}

/// Ends session `id` because of `why`: its lease is over for good (a late
/// renewal is refused), its work not started is cancelled, and its backend
/// is torn down off this thread (a running task cannot be stopped: the
/// teardown waits for it, and its result goes nowhere), which frees its
/// pools and stops its device actors.
void end_session(node_ptr self, uint64_t id, const std::string& why) {
  auto& st = self->state;
  auto i = st.sessions.find(id);
  if (i == st.sessions.end())
    return;
  auto s = std::move(i->second);
  st.sessions.erase(i);
  auto message = fmt::format("session ended: session {} of node {} ({}): {}", id, st.name,
                             s.client, why);
  st.ended[id] = message;
  s.lease->store(0, std::memory_order_release);
  // The replays waiting for room are refused: a promise dropped unanswered
  // sends nothing in CAF 0.17, and the client tells the other nodes of a
  // refusal only once it hears it.
  for (auto& d : s.rounds->deferred)
    try {
      d.rp.deliver(make_error(errc::device_failed, st.name,
                              fmt::format("round_run: replay {} refused: {}", d.n, message)));
    } catch (...) {
      // Out of memory: the client finds the session's end at its next
      // renewal; the session's teardown goes on.
    }
  s.rounds->deferred.clear();
  for (const auto& n : s.admitted) {
    auto named = std::any_of(st.sessions.begin(), st.sessions.end(), [&](const auto& kv) {
      const auto& a = kv.second.admitted;
      return std::find(a.begin(), a.end(), n) != a.end();
    });
    if (!named)
      detail::forget_peer(self->system(), n);
  }
  std::size_t queued = 0;
  std::vector<std::string> running;
  for (int k = 0; k < s.b->num_devices(); ++k) {
    try {
      auto d = s.b->get_device(k);
      auto& ep = s.b->impl().endpoint_of(d);
      queued += ep.queue_length();
      if (!ep.is_idle())
        running.push_back(d.name());
      ep.cancel(); // fails what waits on it too
      if (auto* c = d.get_runner().local_core())
        c->life().cancel(message);
    } catch (const std::exception&) {
      // A device that failed to come up: nothing to cancel.
    }
  }
  node_log(st, fmt::format("{}; {} item(s) not finished, those not started are cancelled{}",
                           message, queued,
                           running.empty()
                             ? std::string{}
                             : fmt::format("; the item running on {} cannot be stopped: "
                                           "its result is discarded",
                                           fmt::join(running, ", "))));
  // The teardown joins the runners: on a thread of its own.
  auto name = st.name;
  auto cleaned = st.cleaned;
  auto end_ns = trace_clock_ns();
  std::function<void()> job = [b = std::move(s.b), name, id, cleaned, end_ns]() mutable {
    // What the session's runners did last, in the node's log: an item the
    // client saw fail shows as cancelled, never as run after the end.
    std::size_t after = 0;
    std::vector<std::string> last;
    for (int k = 0; k < b->num_devices(); ++k) {
      try {
        auto d = b->get_device(k);
        try {
          b->await(d); // the running item ends, the cancelled ones resolve
        } catch (const std::exception&) {
          // Failed or cancelled: resolved all the same.
        }
        auto t = b->trace(d);
        auto n = t.records.size();
        for (std::size_t r = n > 8 ? n - 8 : 0; r < n; ++r) {
          const auto& rec = t.records[r];
          if (rec.kind != trace_kind::cancel && rec.start_ns > end_ns)
            ++after;
          last.push_back(to_sexp(rec).to_string());
        }
      } catch (const std::exception&) {
      }
    }
    b.reset(); // waits for a running item; frees the pools
    cleaned->fetch_add(1);
    std::cerr << fmt::format("multidev node {}: session {} cleaned up: devices stopped, pools "
                             "freed; {} item(s) started after it ended; its last items: {}\n",
                             name, id, after, fmt::join(last, " "))
              << std::flush;
  };
  if (!detail::reaper::instance().adopt(job))
    job(); // no thread to be had: here, late rather than never
}

/// Why session `id` is not open.
std::string session_gone(const node_state& st, uint64_t id) {
  auto e = st.ended.find(id);
  return e != st.ended.end()
           ? e->second
           : fmt::format("session ended: node {} has no session {} (a node restarted since?)",
                         st.name, id);
}

/// Replay `n` of round `round` of session `s`: its lanes' last seqs, or
/// the refusal as an error.
caf::expected<std::vector<uint64_t>> run_round(node_ptr self, node_session& s, uint64_t round,
                                               uint64_t n, const std::vector<wire_arg>& slots) {
  try {
    return s.rounds->run(round, n, slots);
  } catch (const std::invalid_argument& e) {
    return make_error(errc::invalid_argument, "node " + self->state.name, e.what());
  } catch (const device_error& e) {
    return make_error(errc::device_failed, e.device_name(), e.message());
  } catch (const std::exception& e) {
    return make_error(errc::device_failed, self->state.name, e.what());
  }
}

/// Monitors the nodes session `s`'s rounds wait on (once each: a node that
/// goes down fails their waits), and, over plain TCP, connects to them, so
/// that their notices come straight rather than through the client's
/// middleman.
void watch_peers(node_ptr self, node_session& s) {
  auto& st = self->state;
  auto& sys = self->system();
  for (const auto& peer : s.rounds->peers()) {
    if (!st.watched.insert(peer.node.address()).second)
      continue;
    self->monitor(peer.node);
    // One side of each pair connects (the one of the smaller node id): two
    // nodes connecting to each other at once may have CAF drop one of the
    // two connections, and the proxies it carried with it
    // (`remote_link_unreachable`), failing the waits across it.
    // Over TLS none does: a direct TLS connection made while the peer's
    // proxy (routed through the client) is monitored lost that proxy the
    // same way in 2 of 8 runs under ThreadSanitizer's timing (the peer
    // alive, its notices arriving after its waits had failed; 0 of 8 with
    // no connection), so the notices keep the client's route.
    if (peer.host.empty() || peer.port == 0 || !sys.has_middleman()
        || sys.has_openssl_manager() || !(self->node() < peer.node.node()))
      continue;
    // As a device's `with_route` does: CAF routes to a node this one never
    // connected to through the node that introduced it (the client). The
    // notices wait for nothing meanwhile; a failed connection leaves them
    // that route.
    caf::io::middleman_actor mm = sys.middleman().actor_handle();
    self->request(mm, std::chrono::seconds{2}, caf::connect_atom_v, peer.host, peer.port)
      .then([](caf::node_id&, caf::strong_actor_ptr&, std::set<std::string>&) {},
            [](caf::error&) {});
  }
}

/// The refusal of a session message (`renew`, `detach`, `trust`) whose
/// sender is not on session `s`'s client's node; none for the client.
std::optional<caf::error> not_the_client(node_ptr self, uint64_t id, const node_session& s) {
  const auto& sender = self->current_sender();
  if (sender && sender->node() == s.guard->client)
    return std::nullopt;
  auto& st = self->state;
  auto from = sender ? caf::to_string(sender->node()) : std::string{"an anonymous sender"};
  node_log(st, fmt::format("refused a message about session {} from {}: not its client", id,
                           from));
  return make_error(errc::invalid_argument, "node " + st.name,
                    fmt::format("session {} refused a message from {}: only its client may "
                                "renew, detach, vouch or send it rounds",
                                id, from));
}

/// Session `id`, when the sender is its client; otherwise why not (it is
/// not open, or the sender is not its client).
caf::expected<node_session*> client_session(node_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.sessions.find(id);
  if (i == st.sessions.end())
    return make_error(errc::device_failed, st.name, session_gone(st, id));
  if (auto refused = not_the_client(self, id, i->second))
    return std::move(*refused);
  return &i->second;
}

/// Checks session `id`'s lease (a timer set at each grant): ends it once over.
void check_lease(node_ptr self, uint64_t id) {
  auto& st = self->state;
  auto i = st.sessions.find(id);
  if (i == st.sessions.end())
    return;
  auto deadline = i->second.lease->load(std::memory_order_acquire);
  auto now = steady_ns();
  if (deadline > now) {
    self->delayed_send(self, std::chrono::nanoseconds{deadline - now}, check_atom::value, id);
    return;
  }
  end_session(self, id,
              fmt::format("its lease of {:.3f} s ran out (no renewal from the client)",
                          static_cast<double>(i->second.lease_ns) / 1e9));
}

/// The node actor: sessions on `open`, its backend's devices on `list`.
caf::behavior node_impl(node_ptr self, std::string name, std::string cookie,
                        std::size_t memory_limit, backend_options opts) {
  detail::tsan_turn turn{self}; // the actor's state, which the handlers share (tsan.hpp)
  auto& st = self->state;
  st.memory_limit = memory_limit;
  st.name = std::move(name);
  st.cookie = std::move(cookie);
  st.opts = std::move(opts);
  st.identity = fmt::format("{}#{}", caf::to_string(self->system().node()),
                            std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
  // A message that is only an error is a reply to nothing the node asked
  // (CAF's default handler quits with it): a peer's, dropped.
  self->set_error_handler([](caf::error&) {});
  // A node the sessions' rounds wait on went down: those waits fail.
  self->set_down_handler([self](caf::down_msg& dm) {
    detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
    auto& st = self->state;
    st.watched.erase(dm.source);
    auto why = describe_error(self->system(), dm.reason);
    for (auto& [id, s] : st.sessions)
      s.rounds->peer_down(dm.source, why);
  });
  self->set_exit_handler([self](caf::exit_msg& msg) {
    detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
    // The node stops: every session ends with it.
    std::vector<uint64_t> ids;
    for (auto& [id, s] : self->state.sessions)
      ids.push_back(id);
    for (auto id : ids)
      end_session(self, id, "the node stopped");
    self->quit(msg.reason);
  });
  return {
    [self](atoms::open_atom, const std::string& client, int64_t lease_ns,
           const std::string& cookie) -> caf::result<std::string, std::string, uint64_t, int64_t,
                                                     std::vector<caf::actor>> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      const auto& sender = self->current_sender();
      // The secret first; never echoed (issue 38 point 1).
      if (!same_cookie(cookie, st.cookie) || !sender) {
        node_log(st, fmt::format("refused a session to {} ({}): {}", client,
                                 sender ? caf::to_string(sender->node()) : std::string{"anonymous"},
                                 sender ? "wrong cookie" : "anonymous sender"));
        return make_error(errc::invalid_argument, "node " + st.name,
                          sender ? "session refused: wrong cookie"
                                 : "session refused: an anonymous sender");
      }
      try {
        detail::check_open(client);
      } catch (const std::invalid_argument& e) {
        return make_error(errc::invalid_argument, "node " + st.name, e.what());
      }
      auto open = std::count_if(st.sessions.begin(), st.sessions.end(), [&](const auto& kv) {
        return kv.second.guard->client == sender->node();
      });
      if (static_cast<std::size_t>(open) >= detail::wire_limits::sessions_per_client) {
        node_log(st, fmt::format("refused a session to {} ({}): {} sessions open already",
                                 client, caf::to_string(sender->node()), open));
        return make_error(errc::invalid_argument, "node " + st.name,
                          fmt::format("open: client node {} holds {} sessions already (at "
                                      "most {}): session refused",
                                      caf::to_string(sender->node()), open,
                                      detail::wire_limits::sessions_per_client));
      }
      lease_ns = std::clamp(lease_ns, min_lease_ns, max_lease_ns);
      auto id = ++st.last_session;
      node_session s;
      s.client = client;
      s.guard = std::make_shared<detail::peer_guard>();
      s.guard->home = self->node();
      s.guard->client = sender->node();
      s.guard->who = fmt::format("session {} of node {}", id, st.name);
      s.guard->memory_limit = st.memory_limit;
      s.lease_ns = lease_ns;
      auto now = steady_ns();
      s.lease = std::make_shared<std::atomic<int64_t>>(now + lease_ns);
      s.heard[0] = now;
      try {
        s.b = std::make_shared<backend>(self->system(), st.opts);
        s.b->impl().lease = s.lease;
        s.b->impl().guard = s.guard;
        s.rounds = std::make_unique<detail::session_rounds>(
          self->system(), [b = std::weak_ptr<backend>{s.b}] { return b.lock(); }, s.guard->who,
          self->address());
        s.b->impl().lease_why = fmt::format(
          "session ended: session {} of node {} ({}): its lease ran out", id, st.name, client);
        for (int k = 0; k < s.b->num_devices(); ++k)
          s.devices.push_back(
            caf::actor_cast<caf::actor>(device_actor_of(*s.b, s.b->get_device(k))));
      } catch (const std::exception& e) {
        return make_error(errc::device_failed, st.name,
                          fmt::format("cannot open a session: {}", e.what()));
      }
      auto devices = s.devices;
      // Its node's connections leave the limits of the unauthenticated
      // (issue 38 point 3): recorded before the reply leaves, so the
      // client's next message finds it.
      detail::admit_peer(self->system(), sender->node());
      s.admitted.push_back(sender->node());
      st.sessions.emplace(id, std::move(s));
      node_log(st, fmt::format("session {} opened for {} (lease {:.3f} s)", id, client,
                               static_cast<double>(lease_ns) / 1e9));
      self->delayed_send(self, std::chrono::nanoseconds{lease_ns}, check_atom::value, id);
      return {st.name, st.identity, id, lease_ns, std::move(devices)};
    },
    [self](atoms::renew_atom, uint64_t id, uint64_t n,
           uint64_t acked) -> caf::result<int64_t> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      auto i = st.sessions.find(id);
      if (i != st.sessions.end())
        if (auto refused = not_the_client(self, id, i->second))
          return std::move(*refused);
      if (i == st.sessions.end()) {
        auto e = st.ended.find(id);
        return make_error(errc::device_failed, st.name,
                          e != st.ended.end()
                            ? e->second
                            : fmt::format("session ended: node {} has no session {} (a node "
                                          "restarted since?)",
                                          st.name, id));
      }
      auto& s = i->second;
      // A renewal that comes after the lease ran out does not bring it
      // back: a runner may have found it over and cancelled the queue.
      auto d = s.lease->load(std::memory_order_acquire);
      auto now = steady_ns();
      // From when this node received the renewal the client last heard
      // acknowledged: the client counts its lease from that acknowledgement,
      // which came later. One whose acknowledgement is lost extends nothing.
      auto from = s.heard.find(acked);
      auto until = from != s.heard.end() ? from->second + s.lease_ns : d;
      while (d > now && until > d && !s.lease->compare_exchange_weak(d, until)) {
      }
      if (d <= now) {
        end_session(self, id,
                    fmt::format("its lease of {:.3f} s ran out before the renewal came",
                                static_cast<double>(s.lease_ns) / 1e9));
        return make_error(errc::device_failed, st.name, st.ended[id]);
      }
      if (n > acked && s.heard.size() < 64) // a client keeps few unacknowledged
        s.heard.emplace(n, now);
      s.heard.erase(s.heard.begin(), s.heard.lower_bound(acked));
      return s.lease_ns;
    },
    [self](atoms::detach_atom, uint64_t id) -> caf::result<bool> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto i = self->state.sessions.find(id);
      if (i == self->state.sessions.end())
        return false;
      if (auto refused = not_the_client(self, id, i->second))
        return std::move(*refused);
      end_session(self, id, "the client detached");
      return true;
    },
    [self](atoms::trust_atom, uint64_t id, const caf::node_id& peer) -> caf::result<bool> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto i = self->state.sessions.find(id);
      if (i == self->state.sessions.end())
        return false;
      if (auto refused = not_the_client(self, id, i->second))
        return std::move(*refused);
      try {
        i->second.guard->vouch(peer);
      } catch (const std::invalid_argument& e) {
        return make_error(errc::invalid_argument, "node " + self->state.name, e.what());
      }
      // Its direct connection to this node (with_route).
      detail::admit_peer(self->system(), peer);
      auto& a = i->second.admitted;
      if (std::find(a.begin(), a.end(), peer) == a.end())
        a.push_back(peer);
      return true;
    },
    [self](atoms::round_put_atom, uint64_t id, round_part& part) -> caf::result<bool> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      auto found = client_session(self, id);
      if (!found)
        return std::move(found.error());
      auto& s = **found;
      try {
        detail::check_round_part(part, s.devices.size(), self->node());
        s.rounds->put(std::move(part));
      } catch (const std::invalid_argument& e) {
        return make_error(errc::invalid_argument, "node " + st.name, e.what());
      } catch (const std::exception& e) {
        return make_error(errc::device_failed, st.name, e.what());
      }
      watch_peers(self, s);
      return true;
    },
    [self](atoms::round_run_atom, uint64_t id, uint64_t round, uint64_t n,
           std::vector<wire_arg>& slots) -> caf::result<std::vector<uint64_t>> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      auto found = client_session(self, id);
      if (!found)
        return std::move(found.error());
      auto& s = **found;
      if (!s.rounds->deferred.empty() || !s.rounds->has_room(round)) {
        // Behind a full queue: later, in order (an actor must not block).
        if (s.rounds->deferred.size() >= detail::wire_limits::deferred_requests)
          return make_error(errc::invalid_argument, "node " + st.name,
                            fmt::format("round_run: {} holds {} replays waiting for room "
                                        "already: replay {} refused",
                                        s.guard->who, s.rounds->deferred.size(), n));
        auto rp = self->make_response_promise<std::vector<uint64_t>>();
        s.rounds->deferred.push_back({rp, round, n, std::move(slots)});
        if (s.rounds->deferred.size() == 1)
          self->delayed_send(self, std::chrono::milliseconds{1}, round_retry_atom::value, id);
        return rp;
      }
      auto r = run_round(self, s, round, n, slots);
      if (!r)
        return std::move(r.error());
      return std::move(*r);
    },
    [self](atoms::round_drop_atom, uint64_t id, uint64_t round) -> caf::result<bool> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto i = self->state.sessions.find(id);
      if (i == self->state.sessions.end())
        return false;
      if (auto refused = not_the_client(self, id, i->second))
        return std::move(*refused);
      return i->second.rounds->drop(round);
    },
    [self](atoms::round_refused_atom, uint64_t id, uint64_t round, uint64_t n,
           const caf::actor& peer, const std::string& why) -> caf::result<bool> {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      auto found = client_session(self, id);
      if (!found)
        return std::move(found.error());
      try {
        detail::check_lost(why);
      } catch (const std::invalid_argument& e) {
        return make_error(errc::invalid_argument, "node " + st.name,
                          fmt::format("round_refused: {}", e.what()));
      }
      return peer && (*found)->rounds->refused(round, n, peer.address(), why);
    },
    [self](atoms::lost_atom, uint64_t id, const caf::actor& peer, const std::string& why) {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto i = self->state.sessions.find(id);
      if (i == self->state.sessions.end() || !peer || not_the_client(self, id, i->second))
        return;
      try {
        detail::check_lost(why);
      } catch (const std::invalid_argument&) {
        return;
      }
      i->second.rounds->peer_down(peer.address(), fmt::format("its client lost it: {}", why));
    },
    [self](round_flush_atom, const std::shared_ptr<detail::round_outbox>& box) {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      for (auto& notices : box->take())
        self->send(box->to, atoms::round_done_atom::value, box->session, std::move(notices));
    },
    [self](atoms::round_done_atom, uint64_t id, const std::vector<round_notice>& notices) {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      auto i = st.sessions.find(id);
      const auto& sender = self->current_sender();
      if (i == st.sessions.end() || !sender)
        return; // ended: its devices' queues were cancelled
      auto& s = i->second;
      auto drop = [&](const std::string& why) {
        if (st.round_drops_logged < 8) {
          ++st.round_drops_logged;
          node_log(st, fmt::format("dropped a round_done: {}", why));
        }
      };
      if (!s.guard->admits(sender->node()))
        return drop(fmt::format("from node {}, which {} does not admit",
                                caf::to_string(sender->node()), s.guard->who));
      if (notices.size() > detail::wire_limits::round_steps)
        return drop(fmt::format("{} notices from node {} exceed the limit of {}",
                                notices.size(), caf::to_string(sender->node()),
                                detail::wire_limits::round_steps));
      for (const auto& x : notices)
        if (auto dropped = s.rounds->done(sender->node(), x))
          drop(*dropped);
    },
    [self](round_retry_atom, uint64_t id) {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      auto i = st.sessions.find(id);
      if (i == st.sessions.end())
        return;
      auto& s = i->second;
      auto& q = s.rounds->deferred;
      while (!q.empty() && s.rounds->has_room(q.front().round)) {
        auto d = std::move(q.front());
        q.pop_front();
        auto r = run_round(self, s, d.round, d.n, d.slots);
        if (r)
          d.rp.deliver(std::move(*r));
        else
          d.rp.deliver(std::move(r.error()));
      }
      if (!q.empty())
        self->delayed_send(self, std::chrono::milliseconds{1}, round_retry_atom::value, id);
    },
    [self](atoms::debug_atom) -> std::string {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      auto& st = self->state;
      std::vector<sexp> sessions{sexp::atom("sessions")};
      auto now = steady_ns();
      for (auto& [id, s] : st.sessions) {
        std::size_t used = 0, queued = 0;
        for (int k = 0; k < s.b->num_devices(); ++k) {
          try {
            auto d = s.b->get_device(k);
            used += s.b->get_used_memory(d);
            queued += s.b->impl().endpoint_of(d).queue_length();
          } catch (const std::exception&) {
          }
        }
        auto left = std::max<int64_t>(0, s.lease->load() - now) / 1'000'000;
        sessions.push_back(sexp::list({sexp::atom("session"),
                                       sexp::field("id", std::to_string(id)),
                                       sexp::field("client", s.client),
                                       sexp::field("lease_left_ms", std::to_string(left)),
                                       // Where the lease ends, in this node's steady
                                       // clock: what a renewal moved (tests read it).
                                       sexp::field("lease_until_ns",
                                                   std::to_string(s.lease->load())),
                                       sexp::field("used_memory", std::to_string(used)),
                                       sexp::field("queued", std::to_string(queued)),
                                       // The waits its devices hold (wait_budget).
                                       sexp::field("waits",
                                                   std::to_string(s.guard->waits.held())),
                                       // Its replays waiting for room (round_run).
                                       sexp::field("deferred_replays",
                                                   std::to_string(s.rounds->deferred.size())),
                                       // Its recorded rounds (node_rounds.hpp).
                                       sexp::list({sexp::atom("rounds"),
                                                   sexp::field("parts",
                                                               std::to_string(s.rounds->parts())),
                                                   sexp::field("replays",
                                                               std::to_string(s.rounds->replays())),
                                                   sexp::field("early",
                                                               std::to_string(s.rounds->early())),
                                                   sexp::field("dropped",
                                                               std::to_string(s.rounds->dropped()))})}));
      }
      return detail::handed_off_text(
        sexp::list({sexp::atom("node"), sexp::field("name", st.name),
                    sexp::field("identity", st.identity), sexp::list(std::move(sessions)),
                    sexp::field("ended", std::to_string(st.ended.size())),
                    sexp::field("cleaned", std::to_string(st.cleaned->load()))})
          .to_string());
    },
    [self](check_atom, uint64_t id) {
      detail::tsan_turn turn{self}; // the actor's state (tsan.hpp)
      check_lease(self, id);
    },
  };
}

/// The node actor, which drops an exit message from another node before it
/// reaches the mailbox: BASP carries an `exit_msg` as content like any
/// other, and one with `exit_reason::kill` ends an actor whatever its exit
/// handler says (CAF 0.17), so any peer could stop the node for every
/// session. The node's owner stops it from this process (~backend, the tool).
class node_actor_impl : public caf::stateful_actor<node_state> {
public:
  using super = caf::stateful_actor<node_state>;

  node_actor_impl(caf::actor_config& cfg, std::string name, std::string cookie,
                  std::size_t memory_limit, backend_options opts)
    : super(cfg), log_name_(name), name_(std::move(name)), cookie_(std::move(cookie)),
      memory_limit_(memory_limit), opts_(std::move(opts)) {
    detail::tsan_release(this); // the members, read by make_behavior (tsan.hpp)
  }

  caf::behavior make_behavior() override {
    // On the thread CAF first runs the actor on: its spawn handed it over.
    detail::tsan_acquire(this);
    return node_impl(this, std::move(name_), std::move(cookie_), memory_limit_,
                     std::move(opts_));
  }

  using super::enqueue;

  void enqueue(caf::mailbox_element_ptr x, caf::execution_unit* host) override {
    if (x && x->sender && x->sender->node() != node()
        && x->content().match_elements<caf::exit_msg>()) {
      std::cerr << fmt::format("multidev node {}: dropped an exit message from node {}\n",
                               log_name_, caf::to_string(x->sender->node()))
                << std::flush;
      return;
    }
    super::enqueue(std::move(x), host);
  }

private:
  const std::string log_name_; // read by enqueue, on any thread
  std::string name_;
  std::string cookie_;
  std::size_t memory_limit_;
  backend_options opts_;
};

} // namespace

std::size_t default_session_memory_limit() {
  auto pages = ::sysconf(_SC_PHYS_PAGES);
  auto page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0)
    return std::size_t{1} << 30; // unknown: 1 GiB
  return static_cast<std::size_t>(pages) / 2 * static_cast<std::size_t>(page);
}

node_actor spawn_node_actor(backend& b, std::string name, const std::string& cookie_file,
                            std::size_t session_memory_limit) {
  auto cookie = load_cookie(cookie_file); // throws, naming the file
  if (session_memory_limit == 0)
    session_memory_limit = default_session_memory_limit();
  auto opts = b.impl().opts;
  // A session's backend counts its devices as the node's does, made on the
  // node's system: never one of its own, and never MULTIDEV_TRACE's file
  // per session (the node's settings stand).
  opts.num_devices = b.impl().drv->device_count();
  node_actor node;
  {
    detail::logger_tie_guard untie; // spawning ties this thread to the system
    node = caf::actor_cast<node_actor>(
      b.system().spawn<node_actor_impl>(std::move(name), std::move(cookie), session_memory_limit,
                       std::move(opts)));
  }
  // It serves the backend's devices: it goes with them (~backend stops it).
  auto& impl = b.impl();
  std::lock_guard guard{impl.mu};
  impl.node_actors.push_back(node.address());
  return node;
}

caf::expected<uint16_t> publish_node(const node_actor& node, uint16_t port,
                                     const std::string& address,
                                     const node_transport_limits& limits) {
  if (!node)
    return caf::sec::cannot_publish_invalid_actor;
  auto& sys = node.home_system();
  if (sys.has_openssl_manager())
    detail::use_clean_tls(sys); // one peer's loss must not close the others
  // Through our doorman (node_listener.hpp), plain TCP or TLS: what a peer
  // costs before it opened a session is bounded (issue 38 point 3).
  return detail::publish_guarded(caf::actor_cast<caf::actor>(node), sys.message_types(node),
                                 port, address, limits);
}

void configure_tls(caf::actor_system_config& cfg, const tls_files& files) {
  auto readable = [](const std::string& what, const std::string& path) {
    if (path.empty())
      throw std::invalid_argument(fmt::format("TLS: no {} file given", what));
    if (!std::ifstream{path})
      throw std::invalid_argument(fmt::format("TLS: cannot read the {} file '{}'", what, path));
  };
  readable("certificate", files.certificate);
  readable("private key", files.key);
  readable("CA certificate", files.ca_file);
  cfg.openssl_certificate = files.certificate;
  cfg.openssl_key = files.key;
  cfg.openssl_cafile = files.ca_file;
  cfg.openssl_passphrase = files.passphrase;
  cfg.load<caf::openssl::manager>();
}

namespace {

using tick_atom = caf::atom_constant<caf::atom("keep_tick")>;
using due_atom = caf::atom_constant<caf::atom("lease_due")>;

/// The client's side of a session: renews its lease every `every`, and
/// declares the node lost (its devices' calls fail with "session ended")
/// once no renewal was acknowledged for the lease plus `margin`, or at once
/// when the node says the session ended. Until then a session's device
/// whose actor went down holds its calls (endpoint_remote.hpp): the node may
/// still run the session's work until its lease ends there, which is no
/// later than the last acknowledgement plus the lease.
struct keeper_state {
  node_actor node;
  uint64_t session = 0;
  std::string name;    // the node's
  std::string address; // where it was attached
  std::chrono::nanoseconds lease{0}, every{0}, margin{0};
  std::chrono::steady_clock::time_point last_ack;
  uint64_t sent = 0;  // renewals sent
  uint64_t acked = 0; // the last one acknowledged (0: the open)
  std::vector<caf::actor> links;
  std::shared_ptr<std::atomic<bool>> ended;
};

using keeper_ptr = caf::stateful_actor<keeper_state>*;

/// Closes the session's devices with `why`, tells the node (if it hears it),
/// and stops.
void session_over(keeper_ptr self, const std::string& why) {
  auto& st = self->state;
  st.ended->store(true);
  for (auto& l : st.links)
    self->send(l, atoms::lost_atom::value, why);
  self->send(st.node, atoms::detach_atom::value, st.session);
  self->quit();
}

caf::behavior keeper_impl(keeper_ptr self, keeper_state init) {
  detail::tsan_acquire(init.ended.get()); // `init`, made by the spawning thread
  detail::tsan_turn turn{self}; // the actor's state, which its handlers share (tsan.hpp)
  auto ended = init.ended;
  self->state = std::move(init);
  self->set_exit_handler([self](caf::exit_msg& msg) {
    detail::tsan_turn turn{self};
    // The backend stops: the node may free the session at once.
    self->state.ended->store(true);
    self->send(self->state.node, atoms::detach_atom::value, self->state.session);
    self->quit(msg.reason);
  });
  self->send(self, tick_atom::value);
  self->delayed_send(self, self->state.lease + self->state.margin, due_atom::value);
  return {
    [self](tick_atom) {
      detail::tsan_turn turn{self};
      auto& st = self->state;
      auto n = ++st.sent;
      self->request(st.node, caf::duration{st.lease}, atoms::renew_atom::value, st.session, n,
                    st.acked)
        .then(
          [self, n](int64_t granted) {
            detail::tsan_turn turn{self};
            auto& st = self->state;
            if (n <= st.acked)
              return;
            st.acked = n;
            st.last_ack = std::chrono::steady_clock::now();
            st.lease = std::chrono::nanoseconds{granted};
            self->delayed_send(self, st.lease + st.margin, due_atom::value);
          },
          [self](caf::error& e) {
            detail::tsan_turn turn{self};
            // The node refused: the session ended there, nothing of it runs
            // any more. Anything else (no answer, the connection lost) is
            // for the deadline to decide.
            if (e.category() == error_category)
              session_over(self, describe_error(e));
          });
      self->delayed_send(self, st.every, tick_atom::value);
    },
    [self](due_atom) {
      detail::tsan_turn turn{self};
      auto& st = self->state;
      auto silent = std::chrono::steady_clock::now() - st.last_ack;
      if (silent < st.lease + st.margin)
        return; // renewed since
      session_over(
        self, fmt::format("session ended: node {} ({}) acknowledged no renewal of session {} "
                          "for {:.3f} s (lease {:.3f} s + margin {:.3f} s): it is lost",
                          st.name, st.address, st.session,
                          std::chrono::duration<double>(silent).count(),
                          std::chrono::duration<double>(st.lease).count(),
                          std::chrono::duration<double>(st.margin).count()));
    },
  };
}

std::chrono::nanoseconds left_until(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::nanoseconds{1},
                  std::chrono::duration_cast<std::chrono::nanoseconds>(
                    deadline - std::chrono::steady_clock::now()));
}

/// The client vouches for the node just attached as `name` to the other
/// nodes of `b` whose sessions are open, and for them to it (`trust`): a
/// session's devices take messages only from its client and the nodes it
/// vouched for, and the devices of two nodes of one client wait on each
/// other and copy between each other directly. Waits for each answer (so
/// that the devices' first messages find the vouch made); a node that
/// does not answer by `deadline` gets none (its waits on the other node are
/// then refused, naming it).
void vouch_between(backend& b, const std::string& name,
                   std::chrono::steady_clock::time_point deadline) {
  struct open_session {
    caf::actor node;
    uint64_t session;
  };
  std::optional<open_session> fresh;
  std::vector<open_session> others;
  {
    auto& impl = b.impl();
    std::lock_guard guard{impl.mu};
    for (auto& n : impl.nodes) {
      if (n.session == 0 || !n.node || n.ended->load())
        continue;
      (n.name == name ? fresh.emplace() : others.emplace_back()) = {n.node, n.session};
    }
  }
  if (!fresh)
    return;
  caf::scoped_actor self{b.system()};
  auto tell = [&](const open_session& to, const caf::node_id& peer) {
    if (to.node.node() == peer)
      return; // the same process, attached under two names
    self->request(caf::actor_cast<node_actor>(to.node), caf::duration{left_until(deadline)},
                  atoms::trust_atom::value, to.session, peer)
      .receive([](bool) {}, [](caf::error&) {});
  };
  for (auto& o : others) {
    tell(o, fresh->node.node());
    tell(*fresh, o.node.node());
  }
}

} // namespace

std::vector<device> attach_node(backend& b, const std::string& host, uint16_t port,
                                std::chrono::milliseconds timeout) {
  node_attach_options o;
  o.timeout = timeout;
  return attach_node(b, host, port, o);
}

std::vector<device> attach_node(backend& b, const std::string& host, uint16_t port,
                                const node_attach_options& opts) {
  auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  auto& sys = b.system();
  auto address = fmt::format("{}:{}", host, port);
  if (!sys.has_middleman())
    throw std::invalid_argument(fmt::format(
      "attach_node {}: the backend's actor system has no middleman (call "
      "multidev::configure_system on its config)",
      address));
  if (caf::get_or(sys.config(), "middleman.heartbeat-interval", caf::timespan{0})
      <= caf::timespan{0})
    throw std::invalid_argument(fmt::format(
      "attach_node {}: the backend's actor system sends no heartbeats "
      "(middleman.heartbeat-interval is 0), so a node behind a cut link would hang every "
      "wait on it; set middleman.heartbeat-interval and middleman.connection-timeout, or call "
      "multidev::configure_system on its config",
      address));
  if (opts.lease <= std::chrono::milliseconds{0} || opts.renew_every <= std::chrono::milliseconds{0}
      || opts.renew_every >= opts.lease || opts.margin < std::chrono::milliseconds{0})
    throw std::invalid_argument(fmt::format(
      "attach_node {}: the lease ({} ms) must be longer than its renewal interval ({} ms), both "
      "above 0, and the margin ({} ms) at least 0",
      address, opts.lease.count(), opts.renew_every.count(), opts.margin.count()));
  bool tls = sys.has_openssl_manager();
  if (tls)
    detail::use_clean_tls(sys); // one node's loss must not close the others
  auto connect = [&] {
    return tls ? caf::openssl::remote_actor<node_actor>(sys, host, port)
               : sys.middleman().remote_actor<node_actor>(host, port);
  };
  auto node = connect();
  // CAF gives up a handshake that hears nothing after one heartbeat
  // interval: a node that is slow to answer (stopped, busy) gets tries until
  // the timeout (each at most one interval past it). One that cannot be
  // reached gets them only when asked (`retry_unreachable`), a pause between
  // two, doubling from 50 ms up to 1 s, cut at the deadline.
  auto pause = std::chrono::milliseconds{50};
  int tries = 1;
  while (!node && std::chrono::steady_clock::now() < deadline) {
    if (node.error() == caf::sec::cannot_connect_to_node && opts.retry_unreachable) {
      ++tries;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        pause, deadline - std::chrono::steady_clock::now()));
      pause = std::min(2 * pause, std::chrono::milliseconds{1000});
    } else if (node.error() != caf::sec::connection_timeout) {
      break;
    }
    node = connect();
  }
  if (!node) {
    auto why = sys.render(node.error());
    if (node.error() == caf::sec::disconnect_during_handshake)
      why += tls ? " (does the node use TLS, and did the same CA sign both certificates?)"
                 : " (does the node use TLS? then this side needs it too)";
    if (node.error() == caf::sec::connection_timeout)
      throw device_error(address, fmt::format("attach_node: the node at {} did not answer within "
                                              "{} ms{}: {}",
                                              address, opts.timeout.count(),
                                              tls ? " over TLS" : "", why));
    if (opts.retry_unreachable)
      throw device_error(address, fmt::format("attach_node: cannot reach a node at {}{} within {} "
                                              "ms ({} tries): {}",
                                              address, tls ? " over TLS" : "",
                                              opts.timeout.count(), tries, why));
    throw device_error(address, fmt::format("attach_node: cannot reach a node at {}{}: {}", address,
                                            tls ? " over TLS" : "", why));
  }
  // The secret the node asks for (issue 38 point 1); read before connecting,
  // so a bad file is named without a node's round trip.
  std::string cookie;
  try {
    cookie = load_cookie(opts.cookie_file);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("attach_node {}: {}", address, e.what()));
  }
  std::string name, identity;
  uint64_t session = 0;
  int64_t lease_ns = 0;
  std::vector<caf::actor> actors;
  std::chrono::steady_clock::time_point opened;
  {
    caf::scoped_actor self{sys};
    std::optional<caf::error> err;
    self
      ->request(*node, caf::duration{left_until(deadline)}, atoms::open_atom::value,
                detail::this_process(),
                static_cast<int64_t>(
                  std::chrono::duration_cast<std::chrono::nanoseconds>(opts.lease).count()),
                cookie)
      .receive(
        [&](std::string& n, std::string& id, uint64_t s, int64_t l, std::vector<caf::actor>& as) {
          name = std::move(n), identity = std::move(id), session = s, lease_ns = l;
          actors = std::move(as);
        },
        [&](caf::error& e) { err = std::move(e); });
    opened = std::chrono::steady_clock::now();
    if (err && err->category() == error_category)
      throw device_error(address, fmt::format("attach_node: the node at {} refused: {}", address,
                                              describe_error(*err)));
    if (err)
      throw device_error(address, fmt::format("attach_node: the node at {} did not open a "
                                              "session within {} ms: {}",
                                              address, opts.timeout.count(), sys.render(*err)));
  }
  // What this call opened goes when it fails.
  bool keep_session = false;
  struct closer {
    caf::actor_system& sys;
    const node_actor& node;
    uint64_t session;
    bool& keep;
    ~closer() {
      if (keep || session == 0)
        return;
      // From this node, not anonymously: the node takes `detach` from the
      // session's client only.
      try {
        caf::scoped_actor self{sys};
        self->send(node, atoms::detach_atom::value, session);
      } catch (...) {
        // The lease ends it instead.
      }
    }
  } close_unless_kept{sys, *node, session, keep_session};
  if (!opts.expected_name.empty() && name != opts.expected_name)
    throw std::invalid_argument(fmt::format(
      "attach_node {}: expected node '{}' there, but the node at {} calls itself '{}'", address,
      opts.expected_name, address, name));
  auto node_name = std::move(name); // the node's own
  name = opts.name.empty() ? node_name : opts.name; // this backend's for it
  // All or none: nothing is attached when the count is wrong, and what this
  // call attached is undone when a later step throws.
  auto& impl = b.impl();
  using node_it = std::vector<detail::backend_impl::attached_node>::iterator;
  // The node attached before under this name, if any; throws when this one
  // cannot take its place. Under impl.mu.
  auto previous = [&]() -> node_it {
    auto it = std::find_if(impl.nodes.begin(), impl.nodes.end(),
                           [&](const auto& n) { return n.name == name; });
    if (it == impl.nodes.end())
      return it;
    bool alive = it->session != 0 && !it->ended->load();
    if (alive && it->identity != identity)
      throw std::invalid_argument(fmt::format(
        "attach_node {}: node names are unique in a backend: '{}' is attached already from {} "
        "(identity {}) and its session is open; the node at {} (identity {}) calls itself '{}' "
        "too",
        address, name, it->address, it->identity, address, identity, name));
    if (it->devices.size() != actors.size())
      throw std::invalid_argument(fmt::format(
        "attach_node {}: node '{}' was attached before with {} device(s), it has {} now",
        address, name, it->devices.size(), actors.size()));
    return it;
  };
  std::string prefix = name + "/";
  int incarnation = 1;
  {
    std::lock_guard guard{impl.mu};
    auto it = previous();
    if (it != impl.nodes.end()) {
      if (it->session != 0 && !it->ended->load())
        return it->devices; // attached and open: this call's session goes
      // A restarted node (another identity) is named apart from the dead one.
      incarnation = it->incarnation + (it->identity != identity ? 1 : 0);
      if (incarnation > 1)
        prefix = fmt::format("{}@{}/", name, incarnation);
    }
  }
  std::vector<device> result;
  std::vector<device> fresh;
  try {
    std::optional<std::chrono::nanoseconds> left;
    for (auto& a : actors) {
      bool is_new = false;
      result.push_back(impl.attach(caf::actor_cast<device_actor>(a), prefix, &is_new,
                                   session != 0, left_until(deadline)));
      // Its devices' peers on other nodes connect to it there (direct paths).
      detail::set_node_address(impl.endpoint_of(result.back()), host, port);
      if (is_new)
        fresh.push_back(result.back());
    }
    caf::actor keeper;
    std::shared_ptr<std::atomic<bool>> ended = std::make_shared<std::atomic<bool>>(false);
    if (session != 0) {
      keeper_state ks;
      ks.node = *node;
      ks.session = session;
      ks.name = name;
      ks.address = address;
      ks.lease = std::chrono::nanoseconds{lease_ns};
      ks.every = std::min<std::chrono::nanoseconds>(opts.renew_every, ks.lease / 2);
      ks.margin = opts.margin;
      ks.last_ack = opened;
      ks.ended = ended;
      {
        std::lock_guard guard{impl.mu};
        for (auto& d : result)
          if (auto l = impl.links.find(d.get_runner().key()); l != impl.links.end())
            ks.links.push_back(l->second);
      }
      detail::logger_tie_guard untie; // spawning ties this thread to the system
      detail::tsan_release(ended.get()); // `ks`, handed to the keeper by CAF (tsan.hpp)
      keeper = sys.spawn(keeper_impl, std::move(ks));
    }
    std::lock_guard guard{impl.mu};
    auto it = previous(); // again: another thread may have attached it meanwhile
    auto local = impl.drv->device_count();
    // A node attached before under this name (restarted): its ordinals again.
    int first = it != impl.nodes.end() && !it->devices.empty()
                  ? it->devices.front().ordinal()
                  : local + static_cast<int>(impl.node_devices.size());
    for (std::size_t i = 0; i < result.size(); ++i) {
      // The record is this backend's view of the device: its ordinal here.
      auto& rec = *result[i].record();
      rec.ordinal = first + static_cast<int>(i);
      auto slot = static_cast<std::size_t>(rec.ordinal - local);
      if (slot < impl.node_devices.size())
        impl.node_devices[slot] = result[i];
      else
        impl.node_devices.push_back(result[i]);
    }
    if (it == impl.nodes.end()) {
      impl.nodes.push_back({name, address, result});
      it = std::prev(impl.nodes.end());
    }
    it->address = address;
    it->devices = result;
    it->identity = identity;
    it->session = session;
    it->keeper = keeper;
    it->node = caf::actor_cast<caf::actor>(*node);
    it->ended = ended;
    it->incarnation = incarnation;
  } catch (...) {
    for (auto& d : fresh)
      impl.detach(d);
    throw;
  }
  keep_session = true;
  if (session != 0)
    vouch_between(b, name, deadline);
  return result;
}

void detach_node(backend& b, const std::string& name, std::chrono::milliseconds timeout) {
  auto& impl = b.impl();
  node_actor node;
  caf::actor keeper;
  uint64_t session = 0;
  std::vector<device> devices;
  std::shared_ptr<std::atomic<bool>> ended;
  {
    std::lock_guard guard{impl.mu};
    auto it = std::find_if(impl.nodes.begin(), impl.nodes.end(),
                           [&](const auto& n) { return n.name == name; });
    if (it == impl.nodes.end()) {
      std::vector<std::string> names;
      for (auto& n : impl.nodes)
        names.push_back(n.name);
      throw std::invalid_argument(fmt::format(
        "detach_node: no node '{}' is attached to this backend (attached: {})", name,
        names.empty() ? std::string{"none"} : fmt::format("{}", fmt::join(names, ", "))));
    }
    keeper = it->keeper;
    session = it->session;
    devices = it->devices;
    ended = it->ended;
    it->keeper = nullptr;
  }
  auto& sys = b.system();
  auto why = fmt::format("session ended: node {} was detached (detach_node)", name);
  caf::scoped_actor self{sys};
  if (keeper) {
    caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown); // tells the node too
  }
  ended->store(true);
  // The devices' calls fail from now on: each link has closed when it answers.
  for (auto& d : devices) {
    caf::actor link;
    {
      std::lock_guard guard{impl.mu};
      if (auto l = impl.links.find(d.get_runner().key()); l != impl.links.end())
        link = l->second;
    }
    if (!link)
      continue;
    self->request(link, caf::duration{timeout}, atoms::lost_atom::value, why)
      .receive([] {}, [](caf::error&) {});
  }
  (void) session;
}

} // namespace multidev
