// The live wait-for graph: blocked threads, cycle refusal, wait chains and
// the graph as an s-expression (see wait_graph.hpp).
#include "actors/wait_graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/core/device_core.hpp"
#include "actors/endpoint.hpp"
#include "actors/core/gate.hpp"

namespace multidev::detail {

namespace {

/// The blocked threads of the process. Never destroyed: a thread may still
/// block (and unregister) while static objects are torn down at exit.
struct wait_table {
  std::mutex mu;
  std::vector<const blocked_wait*> waits;
};

wait_table& table() {
  static auto* t = new wait_table;
  return *t;
}

/// A step of a search through the graph: `dev`'s `seq`, reached from the
/// step at `parent` by the wait `how` describes.
struct step {
  const device_core* dev;
  uint64_t seq;
  std::size_t parent;
  std::string how;
};

/// Bounds a search: the graph is walked on a blocking call, never on the
/// hot path, but a host far ahead of its devices may have queued thousands
/// of gates.
constexpr std::size_t max_steps = 1 << 16;

/// The edges out of (`d`, `seq`), which is not yet done: the gates `d`
/// queued at or before `seq`, and a task of `d` at or before `seq` blocked
/// in a sync. Calls `edge(owner, owner_seq, how)` for each local one, with
/// only the latest seq per owner (waiting for an owner's later seq covers
/// its earlier ones). Call with the table locked; `keep` holds the owners
/// found, so that none is destroyed under the lock.
template <class Edge>
void edges_of(const wait_table& t, const device_core& d, uint64_t seq,
              std::vector<std::shared_ptr<device_core>>& keep, Edge edge) {
  std::vector<std::pair<const device_core*, std::pair<uint64_t, std::string>>> latest;
  auto offer = [&](const device_core* o, uint64_t os, auto how) {
    auto i = std::find_if(latest.begin(), latest.end(), [o](auto& x) { return x.first == o; });
    if (i == latest.end())
      latest.emplace_back(o, std::pair{os, how()});
    else if (i->second.first < os)
      i->second = {os, how()};
  };
  for (const auto& g : d.inspect().pending_gates()) {
    auto at = g->seq.load();
    if (at == 0 || at > seq || g->state.load() == gate::failed)
      continue; // a failed gate holds nothing: it fails its device when reached
    if (auto o = g->owner.lock()) {
      offer(o.get(), g->owner_seq, [&] { return fmt::format("a wait at {} seq {}", d.name(), at); });
      keep.push_back(std::move(o));
    }
  }
  for (const auto* b : t.waits)
    if (b->runner == &d && b->owner && b->item <= seq)
      offer(b->owner, b->seq,
            [&] { return fmt::format("its task at seq {} blocked in {}", b->item, b->what); });
  for (auto& [o, x] : latest)
    edge(o, x.first, std::move(x.second));
}

/// Throws `deadlock_error` when `w` (a task's sync) would close a cycle: when
/// the awaited event needs, through gates and other blocked tasks, the
/// runner's own item or a later one. Call with the table locked.
void refuse_cycle(const wait_table& t, const blocked_wait& w,
                  std::vector<std::shared_ptr<device_core>>& keep) {
  std::vector<step> steps{{w.owner, w.seq, 0, {}}};
  std::unordered_map<const device_core*, uint64_t> explored;
  for (std::size_t i = 0; i < steps.size() && steps.size() < max_steps; ++i) {
    auto [d, seq] = std::pair{steps[i].dev, steps[i].seq};
    if (seq <= d->outcomes().finished())
      continue;
    if (auto e = explored.find(d); e != explored.end() && e->second >= seq)
      continue;
    explored[d] = seq;
    std::size_t closing = 0;
    edges_of(t, *d, seq, keep, [&](const device_core* o, uint64_t os, std::string how) {
      steps.push_back({o, os, i, std::move(how)});
      if (o == w.runner && os >= w.item && closing == 0)
        closing = steps.size() - 1;
    });
    if (closing == 0)
      continue;
    // Name the cycle, from the awaited event to the runner's own work.
    std::vector<std::size_t> path;
    for (auto j = closing; j != 0; j = steps[j].parent)
      path.push_back(j);
    std::reverse(path.begin(), path.end());
    auto chain = fmt::format("{} seq {}", w.owner->name(), w.seq);
    auto cycle = w.runner->name() + " -> " + w.owner->name();
    for (auto j : path) {
      chain += fmt::format(" waits on {} seq {} ({}), which", steps[j].dev->name(), steps[j].seq,
                           steps[j].how);
      cycle += " -> " + steps[j].dev->name();
    }
    throw deadlock_error(fmt::format(
      "{} on {} seq {} from a task of {} (its seq {}) would deadlock: {} cannot start "
      "before that task ends; cycle: {}",
      w.what, w.owner->name(), w.seq, w.runner->name(), w.item, chain, cycle));
  }
}

/// The local owner of a gate, or null for a remote wait.
std::shared_ptr<device_core> local_owner(const gate& g) {
  return g.remote ? nullptr : g.owner.lock();
}

/// `, which is not running: ...` for a remote wait whose node is lost, or
/// that it is elsewhere.
std::string remote_end(const gate* g) {
  if (g)
    if (auto ep = g->remote_owner.lock())
      if (auto why = ep->gone())
        return fmt::format(", which is not running: its node is lost ({})", *why);
  return std::string{", which "} + remote_silent_end;
}

} // namespace

blocked_scope::blocked_scope(blocked_wait w) : w_(std::move(w)) {
  auto& t = table();
  // Declared before the lock: owners found by the search are released after it.
  std::vector<std::shared_ptr<device_core>> keep;
  std::lock_guard guard{t.mu};
  if (w_.runner && w_.owner)
    refuse_cycle(t, w_, keep);
  t.waits.push_back(&w_);
}

blocked_scope::~blocked_scope() {
  auto& t = table();
  std::lock_guard guard{t.mu};
  std::erase(t.waits, &w_);
}

std::string wait_chain(const device_core& owner, uint64_t seq) {
  return owner.name() + " " + wait_chain_rest(owner, seq, nullptr);
}

std::string wait_chain_rest(const device_core& owner, uint64_t seq, remote_hop* next) {
  auto& t = table();
  std::vector<std::shared_ptr<device_core>> keep;
  std::lock_guard guard{t.mu};
  std::string out;
  std::vector<std::pair<const device_core*, uint64_t>> seen;
  const device_core* d = &owner;
  for (int hop = 0; hop < 64; ++hop) {
    if (hop > 0)
      out += ", which ";
    auto finished = d->outcomes().finished();
    if (seq <= finished)
      return out + fmt::format("has finished seq {} now", seq);
    if (auto err = d->life().error())
      return out + fmt::format("has failed: {}", *err);
    if (std::find(seen.begin(), seen.end(), std::pair{d, seq}) != seen.end())
      return out + "closes a cycle";
    seen.emplace_back(d, seq);
    // What holds the runner: the gate it is parked on, or its task blocked
    // in a sync; else it is running (or about to run) its next item.
    const gate* parked = nullptr;
    auto gates = d->inspect().pending_gates(&parked);
    std::shared_ptr<gate> held_by;
    for (auto& g : gates)
      if (g.get() == parked && g->seq.load() <= seq)
        held_by = g;
    if (held_by) {
      out += fmt::format("waits on event {} of {}", held_by->owner_seq, held_by->owner_label());
      auto o = local_owner(*held_by);
      if (!o) {
        auto end = remote_end(held_by.get());
        if (next && end.ends_with(remote_silent_end)) {
          next->at = held_by; // the caller asks that process
          next->seq = held_by->owner_seq;
          return out;
        }
        return out + end;
      }
      seq = held_by->owner_seq;
      d = o.get();
      keep.push_back(std::move(o));
      continue;
    }
    const blocked_wait* blocked = nullptr;
    for (const auto* b : t.waits)
      if (b->runner == d && b->item <= seq && b->item > finished)
        blocked = b;
    if (blocked) {
      out += fmt::format("is in its task at seq {}, blocked in {} on event {} of {}",
                         blocked->item, blocked->what, blocked->seq, blocked->owner_name);
      if (!blocked->owner)
        return out + remote_end(nullptr);
      seq = blocked->seq;
      d = blocked->owner;
      continue;
    }
    auto ahead = seq - finished - 1;
    // The task it runs, by its description when the trace holds it.
    auto what = d->inspect().running_description(finished + 1);
    auto running = what.empty() ? fmt::format("is running its seq {}", finished + 1)
                                : fmt::format("is running '{}' (its seq {})", what, finished + 1);
    if (ahead == 0)
      return out + running;
    return out + fmt::format("{}, {} item{} before seq {}", running, ahead, ahead == 1 ? "" : "s",
                             seq);
  }
  return out + "... (the chain goes on)";
}

namespace {

sexp event_info(const device_core* d, const std::string& name, uint64_t seq) {
  auto e = sexp::list({sexp::atom("event"), sexp::field("device", name),
                       sexp::field("seq", std::to_string(seq))});
  if (!d) {
    e.push_back(sexp::field("node", "remote"));
    e.push_back(sexp::field("state", "unknown"));
    return e;
  }
  auto st = d->outcomes().state(seq);
  e.push_back(sexp::field("state", to_string(st)));
  if (st == event_state::pending) {
    auto f = d->outcomes().finished();
    e.push_back(sexp::list({sexp::atom("held_by"), sexp::field("device", name),
                            sexp::field("running_seq", std::to_string(f + 1))}));
  } else if (auto c = d->outcomes().cause_of(seq)) {
    e.push_back(sexp::list({sexp::atom("poisoned_by"), sexp::field("device", c->device),
                            sexp::field("task", c->task.empty() ? "none" : c->task),
                            sexp::field("message", c->message)}));
  }
  return e;
}

} // namespace

namespace {
sexp graph_info(std::span<const std::shared_ptr<device_core>> devices, bool only_theirs);
} // namespace

sexp wait_graph_info(std::span<const std::shared_ptr<device_core>> devices) {
  return graph_info(devices, false);
}

sexp wait_graph_info_of(const std::shared_ptr<device_core>& d) {
  return graph_info(std::span{&d, 1}, true);
}

namespace {

/// Goes on with `out` (a chain that ended at `hop`, a wait of a device of
/// this process on one of another) into other processes.
std::string go_on(std::string out, const remote_hop& hop,
                  std::chrono::steady_clock::time_point deadline) {
  auto ep = hop.at->remote_owner.lock();
  if (!ep)
    return out + ", which " + remote_silent_end;
  auto seq = hop.seq;
  for (int n = 0; n < 16; ++n) {
    out += ", which ";
    if (const auto& c = ep->core()) {
      remote_hop next;
      out += wait_chain_rest(*c, seq, &next);
      if (!next.at)
        return out;
      auto o = next.at->remote_owner.lock();
      if (!o)
        return out + ", which " + remote_silent_end;
      ep = std::move(o);
      seq = next.seq;
      continue;
    }
    auto step = ep->why(seq, deadline);
    out += step.rest;
    if (!step.next)
      return out;
    ep = std::move(step.next);
    seq = step.next_seq;
  }
  return out + "... (the chain goes on)";
}

} // namespace

std::string follow_chain(const device_core& owner, uint64_t seq,
                         std::chrono::steady_clock::time_point deadline) {
  remote_hop hop;
  auto out = owner.name() + " " + wait_chain_rest(owner, seq, &hop);
  return hop.at ? go_on(std::move(out), hop, deadline) : out;
}

std::string follow_remote_chain(const std::string& name, chain_step first,
                                std::chrono::steady_clock::time_point deadline) {
  auto out = name + " " + first.rest;
  if (!first.next)
    return out;
  // The first hop's owner, as a wait of this process would reach it.
  auto g = std::make_shared<gate>();
  g->remote_owner = first.next;
  return go_on(std::move(out), remote_hop{g, first.next_seq}, deadline);
}

namespace {

sexp graph_info(std::span<const std::shared_ptr<device_core>> devices, bool only_theirs) {
  auto info = sexp::list({sexp::atom("wait_for")});
  for (const auto& d : devices) {
    const gate* parked = nullptr;
    for (const auto& g : d->inspect().pending_gates(&parked)) {
      auto o = local_owner(*g);
      auto w = sexp::list({sexp::atom("wait"), sexp::field("waiter", d->name()),
                           sexp::field("at_seq", std::to_string(g->seq.load())),
                           sexp::field("kind", "gate"),
                           sexp::field("parked", g.get() == parked ? "true" : "false")});
      if (!o && g->remote)
        if (auto ep = g->remote_owner.lock(); ep && ep->gone())
          w.push_back(sexp::field("lost", *ep->gone()));
      w.push_back(event_info(o.get(), g->owner_label(), g->owner_seq));
      info.push_back(std::move(w));
    }
  }
  auto& t = table();
  std::lock_guard guard{t.mu};
  auto now = std::chrono::steady_clock::now();
  for (const auto* b : t.waits) {
    if (only_theirs && std::none_of(devices.begin(), devices.end(),
                                    [b](const auto& d) { return d.get() == b->runner; }))
      continue;
    auto w = sexp::list({sexp::atom("wait")});
    if (b->runner) {
      w.push_back(sexp::field("waiter", b->runner->name()));
      w.push_back(sexp::field("at_seq", std::to_string(b->item)));
    } else {
      w.push_back(sexp::field("waiter", "host"));
    }
    w.push_back(sexp::field("kind", b->what));
    w.push_back(sexp::field(
      "for_ms", std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - b->since)
                                 .count())));
    w.push_back(event_info(b->owner, b->owner_name, b->seq));
    info.push_back(std::move(w));
  }
  return info;
}

} // namespace

} // namespace multidev::detail
