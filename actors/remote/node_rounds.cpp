// A session's recorded rounds on a node (node_rounds.hpp).
#include "actors/remote/node_rounds.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message_id.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include "actors/backend_impl.hpp"
#include "actors/core/device_core.hpp"
#include "actors/core/gate.hpp"
#include "actors/device_actor.hpp"
#include "actors/logger_tie.hpp"
#include "actors/remote/endpoint_remote.hpp"
#include "actors/remote/message_checks.hpp"
#include "actors/round_state.hpp"
#include "messages/tsan.hpp"
#include "multidev/backend.hpp"

namespace multidev::detail {

namespace {


/// Tells a peer that an item of a replay it waits on resolved: run by the
/// item's device (a resolver, on its runner, or at once when resolved
/// already), it adds the notice to the peer's outbox. A copy's read
/// (`round_step::send`) done: its bytes go with it, as parts of at most
/// `wire_limits::round_part_bytes`.
struct notice {
  std::shared_ptr<round_outbox> box;
  uint64_t round = 0;
  uint64_t n = 0;
  uint32_t item = 0;
  uint64_t seq = 0;
  /// A send's bytes, and whether the part's own write reads them too
  /// (then they are copied, not moved).
  std::shared_ptr<round_bytes> bytes;
  bool shared = false;

  void operator()(const failure* cause) const {
    try {
      if (cause || !bytes) {
        box->add(round_notice{round, n, item, seq, cause ? make_error(*cause) : caf::error{}},
                 box);
        return;
      }
      auto& data = bytes->data;
      std::vector<round_notice> parts;
      if (data.size() <= wire_limits::round_part_bytes) {
        parts.push_back(round_notice{round, n, item, seq, {}, 0,
                                     shared ? data : std::move(data)});
      } else {
        for (std::size_t at = 0; at < data.size(); at += wire_limits::round_part_bytes)
          parts.push_back(round_notice{round, n, item, seq, {}, at,
                                       data.substr(at, wire_limits::round_part_bytes)});
      }
      box->add(std::move(parts), box);
    } catch (...) {
      // Out of memory: a failure instead, small, if that can be told; else
      // the peer's wait fails when this node or its session goes.
      try {
        box->add(round_notice{round, n, item, seq,
                              make_error(errc::device_failed, "round notice",
                                         "out of memory for the notice of this item")},
                 box);
      } catch (...) {
      }
    }
  }
};

} // namespace

void round_outbox::add(round_notice n, const std::shared_ptr<round_outbox>& me) {
  bool first = false;
  {
    std::lock_guard guard{mu};
    first = notices.empty();
    notices.push_back(std::move(n));
  }
  if (first)
    if (auto a = caf::actor_cast<caf::actor>(node))
      caf::anon_send(a, round_flush_atom::value, me);
}

void round_outbox::add(std::vector<round_notice> ns, const std::shared_ptr<round_outbox>& me) {
  bool first = false;
  {
    std::lock_guard guard{mu};
    first = notices.empty();
    if (first)
      notices = std::move(ns);
    else
      std::move(ns.begin(), ns.end(), std::back_inserter(notices));
  }
  if (first)
    if (auto a = caf::actor_cast<caf::actor>(node))
      caf::anon_send(a, round_flush_atom::value, me);
}

std::vector<std::vector<round_notice>> round_outbox::take() {
  std::vector<round_notice> all;
  {
    std::lock_guard guard{mu};
    all = std::move(notices);
  }
  std::vector<std::vector<round_notice>> out;
  std::size_t bytes = 0;
  for (auto& x : all) {
    if (out.empty() || out.back().size() >= wire_limits::round_steps
        || (bytes + x.bytes.size() > wire_limits::round_part_bytes && !x.bytes.empty())) {
      out.emplace_back();
      bytes = 0;
    }
    bytes += x.bytes.size();
    out.back().push_back(std::move(x));
  }
  return out;
}

session_rounds::session_rounds(caf::actor_system& sys, home_fn home, std::string who,
                               caf::actor_addr node)
  : sys_(&sys), home_(std::move(home)), who_(std::move(who)), node_(std::move(node)) {}

session_rounds::~session_rounds() = default;

void session_rounds::put(round_part part, const std::vector<device>& lanes,
                         const std::shared_ptr<round_state>& source,
                         const std::vector<int32_t>& closures) {
  if (rounds_.contains(part.round))
    throw std::invalid_argument(
      fmt::format("round_put: {} holds a part of round {} already", who_, part.round));
  auto live = std::count_if(rounds_.begin(), rounds_.end(),
                            [](const auto& kv) { return !kv.second.dropped; });
  if (static_cast<std::size_t>(live) >= wire_limits::session_rounds)
    throw std::invalid_argument(
      fmt::format("round_put: {} holds parts of {} rounds already (at most {}): round {} refused",
                  who_, rounds_.size(), wire_limits::session_rounds, part.round));
  auto b = home_();
  if (!b)
    throw device_error(who_, "round_put: the session ended");
  part_state r;
  for (std::size_t l = 0; l < part.devices.size(); ++l) {
    auto d = lanes.empty() ? b->get_device(static_cast<int>(part.devices[l])) : lanes.at(l);
    auto& rec = record_of(d);
    if (!rec.r.local_core())
      throw std::invalid_argument(
        fmt::format("round_put: {}: device {} is not a device of this node", who_,
                    part.devices[l]));
    r.cores.push_back(rec.r.core());
    r.lanes.push_back(rec.r.local_core());
    r.lane_steps.push_back(0);
  }
  auto st = std::make_shared<round_state>();
  st->name = part.name;
  st->items.resize(part.steps.size());
  for (std::size_t k = 0; k < part.steps.size(); ++k) {
    const auto& s = part.steps[k];
    st->items[k].name = s.name;
    r.steps.push_back(bulk_step{s.lane, 0, s.wait_on});
    r.step_ordinal.push_back(++r.lane_steps[s.lane]);
    if (s.wait_on == -1 && s.op == round_step::write) // one each an item (check_round_part)
      r.write_of.emplace(s.item, static_cast<uint32_t>(k));
    if (s.wait_on == -1 && s.op == round_step::send)
      r.send_of.emplace(s.item, static_cast<uint32_t>(k));
    if (s.wait_on != bulk_step::external)
      continue;
    r.externals.push_back(static_cast<uint32_t>(k));
    auto [at, fresh] = r.expects.emplace(s.peer_item, s.peer);
    if (!fresh && at->second != s.peer)
      throw std::invalid_argument(fmt::format(
        "round_put: round {}: item {} is awaited from peers {} and {}; an item is one node's",
        part.round, s.peer_item, at->second, s.peer));
  }
  r.st = std::move(st);
  r.dead.assign(part.peers.size(), std::string{});
  r.part = std::move(part);
  for (std::size_t k = 0; k < r.part.notify_steps.size(); ++k) {
    const auto& peer = r.part.peers[r.part.notify_peers[k]];
    auto& box = outboxes_[{peer.node.address(), peer.session}];
    if (!box) {
      box = std::make_shared<round_outbox>();
      box->to = peer.node;
      box->session = peer.session;
      box->node = node_;
    }
    r.boxes.push_back(box);
  }
  r.source = source;
  r.closures = closures;
  r.closures.resize(r.part.steps.size(), -1);
  auto& kept = rounds_.emplace(r.part.round, std::move(r)).first->second;
  for (std::size_t k = 0; k < kept.part.steps.size(); ++k) {
    const auto& s = kept.part.steps[k];
    kept.specs.push_back(s.wait_on == -1 && kept.closures[k] < 0 ? &s : nullptr);
  }
}

bool session_rounds::drop(uint64_t round) {
  auto it = rounds_.find(round);
  if (it == rounds_.end() || it->second.dropped)
    return false;
  it->second.dropped = true;
  erase_if_done(it);
  return true;
}

void session_rounds::erase_if_done(std::map<uint64_t, part_state>::iterator it) {
  auto& r = it->second;
  if (!r.dropped || !r.pending.empty())
    return;
  for (auto& [key, held] : r.early)
    forget_early(held);
  rounds_.erase(it);
}

bool session_rounds::has_room(uint64_t round) const {
  auto it = rounds_.find(round);
  if (it == rounds_.end())
    return true;
  for (auto* c : it->second.lanes)
    if (!c->has_room())
      return false;
  return true;
}

std::vector<uint64_t> session_rounds::run(uint64_t round, uint64_t n,
                                          const std::vector<wire_arg>& slots) {
  auto it = rounds_.find(round);
  if (it == rounds_.end())
    throw std::invalid_argument(fmt::format(
      "round_run: {} holds no part of round {} (round_put it first)", who_, round));
  auto& r = it->second;
  if (r.dropped)
    throw std::invalid_argument(fmt::format(
      "round_run: round '{}' ({}) was let go by the client (round_drop)", r.part.name, round));
  if (n <= r.last)
    throw std::invalid_argument(fmt::format(
      "round_run: replay {} of round '{}' comes after replay {}: replays go in order", n,
      r.part.name, r.last));
  check_round_run(r.part, slots);
  auto b = home_();
  if (!b)
    throw device_error(who_, "round_run: the session ended");
  for (std::size_t k = 0; k < slots.size(); ++k)
    r.part.steps[r.part.slot_steps[k]].spec.args[r.part.slot_args[k]] = from_wire(slots[k]);
  // This replay's copies: a write's bytes, shared with the part's send of
  // the item (the same node) or filled by its notices (`done`).
  r.bytes.assign(r.part.steps.size(), nullptr);
  auto span_size = [&r](uint32_t k) {
    return std::get<buffer_arg>(r.part.steps[k].spec.args.at(0)).size_in_bytes;
  };
  for (auto [item, w] : r.write_of) {
    auto b = std::make_shared<round_bytes>();
    b->size = span_size(w);
    r.bytes[w] = b;
    if (auto sent = r.send_of.find(item); sent != r.send_of.end())
      r.bytes[sent->second] = std::move(b);
  }
  for (auto [item, k] : r.send_of)
    if (!r.bytes[k]) {
      r.bytes[k] = std::make_shared<round_bytes>();
      r.bytes[k]->size = span_size(k);
    }
  std::vector<std::shared_ptr<gate>> gates;
  gates.reserve(r.externals.size());
  for (auto k : r.externals) {
    const auto& s = r.part.steps[k];
    const auto& peer = r.part.peers[s.peer];
    auto g = make_gate();
    g->remote = true;
    g->owner_name = s.peer_device.empty() ? peer.name + "/?" : s.peer_device;
    g->label = fmt::format("item {} of replay {} of round '{}' on node {}", s.peer_item, n,
                           r.part.name, peer.name);
    gates.push_back(std::move(g));
  }
  std::vector<uint64_t> ends(r.lanes.size());
  auto source = r.source.lock(); // this process's part: the round replaying it
  try {
    push_part(b->impl(), r.st, r.lanes, r.cores, r.steps, r.specs, n, gates, ends, source,
              r.closures, r.bytes);
  } catch (const std::exception& e) {
    r.bytes.clear();
    r.last = n;
    drop_early_up_to(r, n);
    throw;
  }
  r.last = n;
  ++replays_;
  for (std::size_t x = 0; x < r.externals.size(); ++x) {
    const auto& s = r.part.steps[r.externals[x]];
    held_gate h{r.cores[s.lane], gates[x], nullptr};
    if (auto w = r.write_of.find(s.peer_item); w != r.write_of.end())
      h.bytes = r.bytes[w->second];
    if (!r.broken.empty()) {
      h.core->resolve_gate(*h.g, &r.broken);
    } else if (!r.dead[s.peer].empty()) {
      h.core->resolve_gate(*h.g, &r.dead[s.peer]);
    } else {
      // Its notices may have come first.
      bool settled = false;
      if (auto e = r.early.find({n, s.peer_item}); e != r.early.end())
        for (const auto& told : e->second)
          if (!settled)
            settled = apply(r, h, s.peer, told);
      if (!settled)
        r.pending[{n, s.peer_item}].push_back(std::move(h));
    }
  }
  drop_early_up_to(r, n);
  // The items other nodes wait on: each tells them once resolved.
  for (std::size_t k = 0; k < r.part.notify_steps.size(); ++k) {
    auto step = r.part.notify_steps[k];
    const auto& s = r.part.steps[step];
    auto seq = ends[s.lane] - r.lane_steps[s.lane] + r.step_ordinal[step];
    notice tell{r.boxes[k], r.part.round, n, s.item, seq, nullptr, false};
    if (s.op == round_step::send && s.wait_on == -1) {
      tell.bytes = r.bytes[step];
      tell.shared = r.write_of.contains(s.item);
    }
    r.lanes[s.lane]->events().when_resolved(seq, std::move(tell));
  }
  r.bytes.clear();
  return ends;
}

void session_rounds::settle(part_state& r, const held_gate& h, uint32_t peer,
                            const caf::error& err) {
  if (!err)
    h.core->resolve_gate(*h.g, std::shared_ptr<const failure>{});
  else // named as the awaited node names its devices: `a/...` here
    fail_gate(*h.core, *h.g, err, *sys_, r.part.peers[peer].name + "/");
}

bool session_rounds::apply(part_state& r, const held_gate& h, uint32_t peer,
                           const round_notice& x) {
  auto fail = [&](const std::string& why) {
    h.core->resolve_gate(*h.g, &why);
    return true;
  };
  if (!h.bytes || x.error) {
    if (!x.bytes.empty())
      return fail(fmt::format("node {} sent bytes for item {} of replay {} of round '{}', which "
                              "is no copy here",
                              r.part.peers[peer].name, x.item, x.replay, r.part.name));
    h.g->owner_seq = x.seq;
    settle(r, h, peer, x.error);
    return true;
  }
  // A part at its offset: parts may come in any order (a peer's later
  // `round_done`s may take a direct route its earlier ones did not), but
  // each byte once, inside the span.
  auto& b = *h.bytes;
  const auto len = x.bytes.size();
  auto what = [&] {
    return fmt::format("node {} sent bytes [{}, {}) of copy {} of replay {} of round '{}'",
                       r.part.peers[peer].name, x.offset, x.offset + len, x.item, x.replay,
                       r.part.name);
  };
  if (x.offset > b.size || len > b.size - x.offset)
    return fail(fmt::format("{}, past its {} bytes", what(), b.size));
  if (len == 0 && b.size != 0)
    return false; // nothing (a sender sends an empty part only for an empty copy)
  auto next = b.parts.lower_bound(x.offset);
  bool overlaps = next != b.parts.end() && next->first < x.offset + len;
  if (next != b.parts.begin()) {
    auto prev = std::prev(next);
    overlaps = overlaps || prev->first + prev->second > x.offset;
  }
  if (overlaps)
    return fail(fmt::format("{}, some of which had come already ({} of its {} bytes had come)",
                            what(), b.received, b.size));
  try {
    if (b.data.size() != b.size)
      b.data.resize(b.size);
    b.parts.emplace(x.offset, len);
  } catch (const std::bad_alloc&) {
    return fail(fmt::format("{}: out of memory for its {} bytes", what(), b.size));
  }
  std::copy(x.bytes.begin(), x.bytes.end(), b.data.begin() + static_cast<std::ptrdiff_t>(x.offset));
  b.received += len;
  if (b.received < b.size)
    return false; // more parts to come
  h.g->owner_seq = x.seq;
  settle(r, h, peer, {});
  return true;
}

void session_rounds::forget_early(std::vector<round_notice>& held) {
  for (const auto& x : held)
    early_bytes_ -= x.bytes.size();
  early_ -= held.size();
}

void session_rounds::break_round(part_state& r, std::string why) {
  r.broken = std::move(why);
  for (auto& [key, gates] : r.pending)
    for (const auto& h : gates)
      h.core->resolve_gate(*h.g, &r.broken);
  r.pending.clear();
  for (auto& [key, held] : r.early)
    forget_early(held);
  r.early.clear();
}

void session_rounds::drop_early_up_to(part_state& r, uint64_t n) {
  auto end = r.early.upper_bound({n, UINT32_MAX});
  for (auto i = r.early.begin(); i != end;) {
    forget_early(i->second);
    i = r.early.erase(i);
  }
}

std::optional<std::string> session_rounds::done(const caf::node_id& from,
                                                const round_notice& x) {
  auto round = x.round;
  auto n = x.replay;
  auto item = x.item;
  auto drop = [this](std::string why) -> std::optional<std::string> {
    ++dropped_;
    return why;
  };
  auto it = rounds_.find(round);
  if (it == rounds_.end())
    return drop(fmt::format("round_done for round {}, of which {} holds no part", round, who_));
  auto& r = it->second;
  auto e = r.expects.find(item);
  if (e == r.expects.end())
    return drop(fmt::format("round_done for item {} of round '{}', which no step here waits on",
                            item, r.part.name));
  auto peer = e->second;
  if (r.part.peers[peer].node.node() != from)
    return drop(fmt::format("round_done for item {} of round '{}' from node {}, not from {}",
                            item, r.part.name, caf::to_string(from), r.part.peers[peer].name));
  if (!r.broken.empty())
    return std::nullopt; // its waits failed already
  if (n <= r.last) {
    auto pe = r.pending.find({n, item});
    if (pe == r.pending.end())
      return drop(fmt::format("round_done for item {} of replay {} of round '{}': none waits "
                              "(the replay was refused here, or told already)",
                              item, n, r.part.name));
    bool settled = true;
    for (const auto& h : pe->second)
      settled = apply(r, h, peer, x) && settled;
    if (settled) {
      r.pending.erase(pe);
      erase_if_done(it);
    }
    return std::nullopt;
  }
  if (early_ >= wire_limits::round_early
      || early_bytes_ + x.bytes.size() > wire_limits::round_early_bytes) {
    // More than a peer running ahead would send: the round fails here.
    break_round(r, fmt::format("round '{}' failed on {}: more than {} notices or {} bytes of "
                               "copies from other nodes came before their replays",
                               r.part.name, who_, wire_limits::round_early,
                               wire_limits::round_early_bytes));
    auto why = r.broken;
    erase_if_done(it);
    return drop(why);
  }
  r.early[{n, item}].push_back(x);
  ++early_;
  early_bytes_ += x.bytes.size();
  return std::nullopt;
}

void session_rounds::peer_down(const caf::actor_addr& peer, const std::string& why) {
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    auto& r = it->second;
    for (uint32_t p = 0; p < r.part.peers.size(); ++p) {
      if (r.part.peers[p].node.address() != peer || !r.dead[p].empty())
        continue;
      r.dead[p] = fmt::format("node {} went down: {}", r.part.peers[p].name, why);
      fail_waits_on(r, p, r.dead[p], 0, UINT64_MAX);
    }
    auto next = std::next(it);
    erase_if_done(it);
    it = next;
  }
}

bool session_rounds::refused(uint64_t round, uint64_t n, const caf::actor_addr& peer,
                             const std::string& why) {
  auto it = rounds_.find(round);
  if (it == rounds_.end() || n > it->second.last)
    return false; // the client tells only nodes that pushed the replay
  auto& r = it->second;
  bool failed = false;
  for (uint32_t p = 0; p < r.part.peers.size(); ++p)
    if (r.part.peers[p].node.address() == peer)
      failed = fail_waits_on(r, p, why, n, n) || failed;
  erase_if_done(it);
  return failed;
}

bool session_rounds::fail_waits_on(part_state& r, uint32_t peer, const std::string& why,
                                   uint64_t first, uint64_t last) {
  bool failed = false;
  auto i = r.pending.lower_bound({first, 0});
  while (i != r.pending.end() && i->first.first <= last) {
    if (r.expects[i->first.second] != peer) {
      ++i;
      continue;
    }
    for (const auto& h : i->second)
      h.core->resolve_gate(*h.g, &why);
    failed = true;
    i = r.pending.erase(i);
  }
  return failed;
}

std::vector<round_peer> session_rounds::peers() const {
  std::vector<round_peer> out;
  for (const auto& [id, r] : rounds_)
    for (const auto& p : r.part.peers)
      if (std::none_of(out.begin(), out.end(), [&p](const auto& x) { return x.node == p.node; }))
        out.push_back(p);
  return out;
}

namespace {

/// The actor of a `host_rounds` (node_rounds.hpp).
caf::behavior host_rounds_actor(caf::event_based_actor* self, std::shared_ptr<host_rounds> h) {
  tsan_acquire(h.get()); // made by the spawning thread, handed over by CAF (tsan.hpp)
  self->set_down_handler([h](caf::down_msg& dm) {
    std::lock_guard guard{h->mu};
    if (h->rounds)
      h->rounds->peer_down(dm.source, dm.reason ? to_string(dm.reason) : "it stopped");
  });
  return {
    [self, h](round_watch_atom, const std::vector<caf::actor>& peers) {
      std::lock_guard guard{h->mu};
      for (const auto& p : peers)
        if (p && std::find(h->watched.begin(), h->watched.end(), p.address()) == h->watched.end()) {
          h->watched.push_back(p.address());
          self->monitor(p);
        }
    },
    [h](round_let_go_atom) {
      std::vector<uint64_t> rounds;
      {
        std::lock_guard guard{h->drop_mu};
        rounds.swap(h->dropping);
      }
      std::lock_guard guard{h->mu};
      if (h->rounds)
        for (auto r : rounds)
          h->rounds->drop(r);
    },
    [self, h](round_flush_atom, const std::shared_ptr<round_outbox>& box) {
      caf::actor to;
      uint64_t session = 0;
      std::vector<std::vector<round_notice>> messages;
      {
        std::lock_guard guard{h->mu}; // `put` made the box, on the replaying thread
        to = box->to;
        session = box->session;
        messages = box->take();
      }
      for (auto& notices : messages)
        self->send(to, atoms::round_done_atom::value, session, std::move(notices));
    },
    [self, h](atoms::round_done_atom, uint64_t, const std::vector<round_notice>& notices) {
      const auto& sender = self->current_sender();
      if (!sender || notices.size() > wire_limits::round_steps)
        return; // not from a node of ours
      std::lock_guard guard{h->mu};
      if (h->rounds)
        for (const auto& x : notices)
          h->rounds->done(sender->node(), x); // `done` checks the sender per item
    },
  };
}

} // namespace

void host_rounds::watch(const std::vector<round_peer>& peers) const {
  std::vector<caf::actor> nodes;
  for (const auto& p : peers)
    nodes.push_back(p.node);
  if (auto a = caf::actor_cast<caf::actor>(actor))
    caf::anon_send(a, round_watch_atom::value, std::move(nodes));
}

void host_rounds::drop(uint64_t round) {
  {
    std::lock_guard guard{drop_mu};
    dropping.push_back(round);
  }
  if (auto a = caf::actor_cast<caf::actor>(actor))
    caf::anon_send(a, round_let_go_atom::value);
}

void host_rounds::close() {
  caf::actor gone;
  {
    std::lock_guard guard{mu};
    rounds.reset();
    gone = std::move(alive);
  }
  if (gone)
    caf::anon_send_exit(gone, caf::exit_reason::user_shutdown);
}

std::shared_ptr<host_rounds> host_rounds_of(backend& b) {
  auto& impl = b.impl();
  std::lock_guard guard{impl.mu};
  if (impl.here_rounds)
    return impl.here_rounds;
  auto h = std::make_shared<host_rounds>();
  std::lock_guard init{h->mu}; // the actor's handlers take it
  caf::actor actor;
  {
    logger_tie_guard untie; // spawning ties this thread to the system
    tsan_release(h.get()); // to the actor's init, on a worker (tsan.hpp)
    actor = impl.sys->spawn(host_rounds_actor, h);
  }
  h->actor = actor.address();
  h->alive = actor;
  // Not owning: the backend outlives its rounds (`close`, at its teardown).
  h->rounds = std::make_unique<session_rounds>(
    *impl.sys, [p = &b] { return std::shared_ptr<backend>{std::shared_ptr<backend>{}, p}; },
    fmt::format("this process ({})", this_process()), h->actor);
  impl.here_rounds = h;
  return h;
}

} // namespace multidev::detail
