// What a peer's message may carry (message_checks.hpp).
#include "actors/remote/message_checks.hpp"

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <variant>

#include "multidev/protocol.hpp"
#include "multidev/types.hpp"

namespace multidev::detail {

namespace {

/// Refuses `text`, field `field` of message `kind`, when longer than `limit`.
void check_length(const char* kind, const char* field, const std::string& text,
                  std::size_t limit) {
  if (text.size() > limit)
    throw std::invalid_argument(fmt::format("{}: {} of {} bytes exceeds the limit of {} bytes",
                                            kind, field, text.size(), limit));
}

} // namespace

void check_schedule(const task_spec& spec) {
  check_length("schedule", "kernel name", spec.kernel, wire_limits::name_bytes);
  if (spec.args.size() > wire_limits::kernel_args)
    throw std::invalid_argument(
      fmt::format("schedule: kernel '{}': argument count {} exceeds the limit of {}", spec.kernel,
                  spec.args.size(), wire_limits::kernel_args));
  for (std::size_t i = 0; i < spec.args.size(); ++i)
    if (const auto* text = std::get_if<std::string>(&spec.args[i]); text != nullptr
        && text->size() > wire_limits::text_bytes)
      throw std::invalid_argument(fmt::format(
        "schedule: kernel '{}' argument {}: text of {} bytes exceeds the limit of {} bytes",
        spec.kernel, i, text->size(), wire_limits::text_bytes));
}

void check_schedule(const std::vector<task_spec>& specs) {
  if (specs.size() > wire_limits::batch_tasks)
    throw std::invalid_argument(
      fmt::format("schedule: batch of {} tasks exceeds the limit of {} tasks", specs.size(),
                  wire_limits::batch_tasks));
  for (const auto& spec : specs)
    check_schedule(spec);
}

void check_depend(const std::string& owner_name, const std::string& host) {
  check_length("depend", "owner name", owner_name, wire_limits::name_bytes);
  check_length("depend", "host", host, wire_limits::host_bytes);
}

void check_lost(const std::string& why) {
  check_length("lost", "reason", why, wire_limits::text_bytes);
}

void check_copy_from(const std::string& source_name, const std::string& host) {
  check_length("copy_from", "source name", source_name, wire_limits::name_bytes);
  check_length("copy_from", "host", host, wire_limits::host_bytes);
}

void check_alloc(int32_t id, uint64_t alignment, int32_t mode) {
  constexpr auto last = static_cast<int32_t>(memory_mode::materialized);
  if (mode < -1 || mode > last)
    throw std::invalid_argument(fmt::format(
      "alloc: pool {}: mode {} is not a memory mode (-1 for none, 0 to {})", id, mode, last));
  if (alignment > wire_limits::alignment)
    throw std::invalid_argument(
      fmt::format("alloc: pool {}: alignment {} exceeds the limit of {}", id, alignment,
                  wire_limits::alignment));
}

void check_result(const std::string& name) {
  check_length("result", "name", name, wire_limits::name_bytes);
}

void check_open(const std::string& client) {
  check_length("open", "client name", client, wire_limits::name_bytes);
}

void check_trust(const caf::node_id& peer) {
  if (!peer)
    throw std::invalid_argument("trust: node is the invalid node id");
}

namespace {

/// The copies of part `p` (`round_step::send`, `write`), whole: an item
/// has at most one send and one write here; a write's bytes come from
/// exactly one place, waited for on its lane before it: the part's send of
/// the item (of the same size, on another lane), or the item from a peer
/// (that wait the only one here on the item); a send's go to one taker (the
/// part's write, or one peer it tells: a notice may move them). So a write
/// never reads bytes that its lane did not wait for.
template <class Refuse>
void check_round_copies(const round_part& p, Refuse& refuse) {
  std::map<uint32_t, std::size_t> sends, writes;
  std::map<uint32_t, std::size_t> awaited; // item -> how many external waits on it
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const auto& s = p.steps[i];
    if (s.wait_on == -2)
      ++awaited[s.peer_item];
    if (s.wait_on != -1 || (s.op != round_step::send && s.op != round_step::write))
      continue;
    auto& ends = s.op == round_step::send ? sends : writes;
    if (!ends.emplace(s.item, i).second)
      refuse(fmt::format("steps {} and {} are both the {} of item {}", ends[s.item], i,
                         s.op == round_step::send ? "send" : "write", s.item));
  }
  auto size = [&p](std::size_t k) {
    return std::get<buffer_arg>(p.steps[k].spec.args[0]).size_in_bytes;
  };
  for (auto [item, w] : writes) {
    const auto& ws = p.steps[w];
    bool waited = false;
    if (auto s = sends.find(item); s != sends.end()) {
      if (s->second > w || p.steps[s->second].lane == ws.lane)
        refuse(fmt::format("step {} writes item {}, whose send (step {}) is not an earlier step "
                           "of another device",
                           w, item, s->second));
      if (size(s->second) != size(w))
        refuse(fmt::format("step {} writes {} bytes of item {}, whose send (step {}) reads {}",
                           w, size(w), item, s->second, size(s->second)));
      if (awaited.contains(item))
        refuse(fmt::format("step {} writes item {}, which is both sent here and awaited from a "
                           "peer",
                           w, item));
      for (std::size_t k = s->second + 1; k < w && !waited; ++k)
        waited = p.steps[k].lane == ws.lane && p.steps[k].wait_on == static_cast<int32_t>(s->second);
    } else {
      if (awaited[item] != 1)
        refuse(fmt::format("step {} writes item {}, which {} step here awaits from a peer (one "
                           "must)",
                           w, item, awaited[item] == 0 ? "no" : "more than one"));
      for (std::size_t k = 0; k < w && !waited; ++k)
        waited = p.steps[k].lane == ws.lane && p.steps[k].wait_on == -2
                 && p.steps[k].peer_item == item;
    }
    if (!waited)
      refuse(fmt::format("step {} writes the bytes of item {} with no earlier wait for them on "
                         "its device",
                         w, item));
  }
  // One taker each: the notice that carries the bytes away may move them.
  for (auto [item, k] : sends) {
    std::size_t takers = writes.contains(item) ? 1 : 0;
    for (std::size_t x = 0; x < p.notify_steps.size(); ++x)
      takers += p.notify_steps[x] == k ? 1 : 0;
    if (takers == 0)
      refuse(fmt::format("step {} sends item {}, which no write here and no peer takes", k,
                         item));
    if (takers > 1)
      refuse(fmt::format("step {} sends item {} to {} takers (the part's write or one peer)", k,
                         item, takers));
  }
}

} // namespace

void check_round_part(const round_part& p, std::size_t devices, const caf::node_id& home) {
  auto refuse = [&p](const std::string& what) {
    throw std::invalid_argument(fmt::format("round_put: round {}: {}", p.round, what));
  };
  check_length("round_put", "round name", p.name, wire_limits::name_bytes);
  if (p.devices.empty() || p.devices.size() > devices)
    refuse(fmt::format("{} devices, the session has {}", p.devices.size(), devices));
  for (std::size_t l = 0; l < p.devices.size(); ++l) {
    if (p.devices[l] >= devices)
      refuse(fmt::format("device {} is ordinal {}, the session has {} devices", l, p.devices[l],
                         devices));
    for (std::size_t k = 0; k < l; ++k)
      if (p.devices[k] == p.devices[l])
        refuse(fmt::format("devices {} and {} are both ordinal {}", k, l, p.devices[l]));
  }
  if (p.steps.size() > wire_limits::round_steps)
    refuse(fmt::format("{} steps exceed the limit of {}", p.steps.size(),
                       wire_limits::round_steps));
  if (p.peers.size() > wire_limits::round_peers)
    refuse(fmt::format("{} peers exceed the limit of {}", p.peers.size(),
                       wire_limits::round_peers));
  for (std::size_t k = 0; k < p.peers.size(); ++k) {
    const auto& peer = p.peers[k];
    if (!peer.node || peer.node.node() == home)
      refuse(fmt::format("peer {} is {}", k,
                         peer.node ? "this node itself" : "an invalid actor handle"));
    check_length("round_put", "peer name", peer.name, wire_limits::name_bytes);
    check_length("round_put", "peer host", peer.host, wire_limits::host_bytes);
  }
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const auto& s = p.steps[i];
    check_length("round_put", "item name", s.name, wire_limits::name_bytes);
    if (s.lane >= p.devices.size())
      refuse(fmt::format("step {} is on device {}, the part has {}", i, s.lane,
                         p.devices.size()));
    if (s.op > round_step::write) {
      refuse(fmt::format("step {} has op {}, not 0 (a task), 1 (a memset), 2 (an alloc_pool), "
                         "3 (a free_pool), 4 (a copy's send) or 5 (a copy's write)",
                         i, s.op));
    } else if (s.op != round_step::run_spec) {
      static constexpr const char* what[] = {"",          "a memset",     "an alloc_pool",
                                             "a free_pool", "a copy's send", "a copy's write"};
      if (s.wait_on != -1 || !s.spec.kernel.empty() || s.spec.args.size() != 1
          || !std::holds_alternative<buffer_arg>(s.spec.args[0]))
        refuse(fmt::format("step {} is {} but not one buffer argument and no kernel, "
                           "with no wait",
                           i, what[s.op]));
      const auto& pool = std::get<buffer_arg>(s.spec.args[0]);
      if ((s.op == round_step::alloc || s.op == round_step::free) && pool.loc.offset != 0)
        refuse(fmt::format("step {} is {} at offset {}, not 0", i, what[s.op],
                           pool.loc.offset));
      if (s.op == round_step::alloc) {
        try {
          check_alloc(pool.loc.pool_id, s.alignment, s.mode);
        } catch (const std::invalid_argument& e) {
          refuse(fmt::format("step {}: {}", i, e.what()));
        }
      }
    } else if (s.wait_on == -1) {
      check_schedule(s.spec);
    } else if (s.wait_on == -2) {
      if (s.peer >= p.peers.size())
        refuse(fmt::format("step {} waits on peer {}, the part has {}", i, s.peer,
                           p.peers.size()));
    } else if (s.wait_on < 0 || static_cast<std::size_t>(s.wait_on) >= i) {
      refuse(fmt::format("step {} waits on step {}, not an earlier one", i, s.wait_on));
    } else if (p.steps[static_cast<std::size_t>(s.wait_on)].lane == s.lane) {
      refuse(fmt::format("step {} waits on step {} of its own device", i, s.wait_on));
    }
  }
  if (p.slot_steps.size() != p.slot_args.size() || p.slot_steps.size() > wire_limits::round_steps)
    refuse(fmt::format("{} slot steps and {} slot arguments", p.slot_steps.size(),
                       p.slot_args.size()));
  for (std::size_t k = 0; k < p.slot_steps.size(); ++k) {
    auto i = p.slot_steps[k];
    if (i >= p.steps.size() || p.steps[i].wait_on != -1 || p.steps[i].op != round_step::run_spec
        || p.slot_args[k] >= p.steps[i].spec.args.size())
      refuse(fmt::format("slot {} names argument {} of step {}, which has no such argument", k,
                         p.slot_args[k], i));
  }
  if (p.notify_steps.size() != p.notify_peers.size()
      || p.notify_steps.size() > wire_limits::round_steps)
    refuse(fmt::format("{} notice steps and {} notice peers", p.notify_steps.size(),
                       p.notify_peers.size()));
  for (std::size_t k = 0; k < p.notify_steps.size(); ++k)
    if (p.notify_steps[k] >= p.steps.size() || p.notify_peers[k] >= p.peers.size())
      refuse(fmt::format("notice {} names step {} and peer {}; the part has {} steps and {} "
                         "peers",
                         k, p.notify_steps[k], p.notify_peers[k], p.steps.size(),
                         p.peers.size()));
  check_round_copies(p, refuse);
}

void check_round_run(const round_part& p, const std::vector<wire_arg>& slots) {
  if (slots.size() != p.slot_steps.size())
    throw std::invalid_argument(fmt::format("round_run: round {}: {} slot values for {} slots",
                                            p.round, slots.size(), p.slot_steps.size()));
  for (std::size_t k = 0; k < slots.size(); ++k) {
    if (slots[k].kind > 4)
      throw std::invalid_argument(fmt::format(
        "round_run: round {}: slot {} has kind {}, not a kernel argument's", p.round, k,
        slots[k].kind));
    check_length("round_run", "slot text", slots[k].text, wire_limits::text_bytes);
  }
}

std::shared_ptr<void> wait_budget::take(const std::string& who, uint64_t seq) const {
  auto held = held_->load(std::memory_order_relaxed);
  do {
    if (held >= wire_limits::session_waits)
      throw std::invalid_argument(fmt::format(
        "wait: {} holds {} waits for their requesters already (at most {} at once): the wait "
        "for seq {} is refused",
        who, held, wire_limits::session_waits, seq));
  } while (!held_->compare_exchange_weak(held, held + 1, std::memory_order_relaxed));
  return std::shared_ptr<void>{nullptr, [counter = held_](void*) {
                                 counter->fetch_sub(1, std::memory_order_relaxed);
                               }};
}

} // namespace multidev::detail
