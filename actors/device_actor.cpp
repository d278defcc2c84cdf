#include "actors/device_actor.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <fmt/format.h>

#include <map>
#include <unordered_map>

#include "actors/binding.hpp"

namespace multidev::detail {

namespace {

using namespace atoms;

struct device_state {
  std::shared_ptr<device_core> core;
  /// A reply owed to a `wait` request: the seq awaited and its promise.
  struct pending_wait {
    uint64_t seq;
    caf::typed_response_promise<uint64_t> rp;
  };
  /// Replies owed to `wait` requests, by token.
  std::unordered_map<uint64_t, pending_wait> waits;
  uint64_t next_token = 0;
  /// Gates waiting on remote owners, so a vanished owner fails them.
  std::multimap<caf::actor_addr, std::weak_ptr<gate>> remote_gates;
  static inline const char* name = "multidev_device";
};

using self_ptr = device_actor::stateful_pointer<device_state>;

/// Runs `f`, turning the exceptions of the public edge into error values.
template <class F>
auto guarded(const device_core& core, F f) -> caf::result<decltype(f())> {
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

device_actor::behavior_type device_impl(self_ptr self, std::shared_ptr<device_core> core) {
  self->state.core = std::move(core);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto [first, last] = st.remote_gates.equal_range(dm.source);
    auto msg = fmt::format("the actor owning the awaited event is down ({})",
                           self->system().render(dm.reason));
    for (auto i = first; i != last; ++i)
      if (auto g = i->second.lock())
        st.core->resolve_gate(*g, &msg); // no-op for gates already open
    st.remote_gates.erase(first, last);
  });
  return {
    [self](schedule_atom, const task_spec& spec) -> caf::result<uint64_t> {
      auto& c = self->state.core;
      return guarded(*c, [&] { return c->push(bind_spec(c, spec).work, false); });
    },
    [self](wait_atom, uint64_t seq) -> caf::result<uint64_t> {
      auto& st = self->state;
      if (st.core->is_done(seq))
        return seq;
      auto token = st.next_token++;
      auto rp = self->make_response_promise<uint64_t>();
      st.waits.emplace(token, device_state::pending_wait{seq, rp});
      // The resolution arrives as a message, so the promise is only ever
      // touched by this actor.
      caf::actor_addr addr = self->address();
      st.core->when_done(seq, [addr, token](const std::string* error) {
        if (auto me = caf::actor_cast<device_actor>(addr))
          caf::anon_send(me, resolved_atom::value, token,
                         error ? *error : std::string{});
      });
      return caf::delegated<uint64_t>{};
    },
    [self](resolved_atom, uint64_t token, const std::string& error) {
      auto& st = self->state;
      auto i = st.waits.find(token);
      if (i == st.waits.end())
        return;
      // The reply names the seq awaited, as when it was already done.
      if (error.empty())
        i->second.rp.deliver(i->second.seq);
      else // the bare message: the error carries the device name apart
        i->second.rp.deliver(make_error(errc::device_failed, st.core->name(),
                                        st.core->error().value_or(error)));
      st.waits.erase(i);
    },
    [self](depend_atom, const caf::actor& owner, uint64_t seq) -> caf::result<uint64_t> {
      auto& c = self->state.core;
      return guarded(*c, [&] {
        if (owner == caf::actor_cast<caf::actor>(self))
          return c->scheduled(); // waiting on our own schedule: a no-op
        auto g = std::make_shared<gate>();
        g->owner_seq = seq;
        g->label = fmt::format("seq {} of actor {}", seq, owner.id());
        c->push_gate(g, true);
        // A vanished owner (a node gone) may never answer: the monitor's
        // down message fails the gate instead. One monitor per owner; gates
        // already resolved are dropped here.
        auto& gates = self->state.remote_gates;
        std::erase_if(gates, [](const auto& kv) { return kv.second.expired(); });
        if (gates.find(owner.address()) == gates.end())
          self->monitor(owner);
        gates.emplace(owner.address(), g);
        std::weak_ptr<device_core> weak = c;
        self->request(owner, caf::infinite, wait_atom::value, seq)
          .then([weak, g](uint64_t) {
                  if (auto me = weak.lock())
                    me->resolve_gate(*g, nullptr);
                },
                [self, weak, g](caf::error& err) {
                  if (auto me = weak.lock()) {
                    auto msg = describe_error(self->system(), err);
                    me->resolve_gate(*g, &msg);
                  }
                });
        return g->seq;
      });
    },
    [self](alloc_atom, int32_t id, uint64_t size, uint64_t alignment,
           int32_t mode) -> caf::result<uint64_t> {
      auto& c = self->state.core;
      return guarded(*c, [&] {
        std::optional<memory_mode> m;
        if (mode >= 0 && mode <= static_cast<int32_t>(memory_mode::materialized))
          m = static_cast<memory_mode>(mode);
        c->alloc_pool(id, size, alignment, m);
        return static_cast<uint64_t>(c->used_memory());
      });
    },
    [self](free_atom, int32_t id) -> caf::result<uint64_t> {
      auto& c = self->state.core;
      return guarded(*c, [&] {
        c->free_pool(id);
        return static_cast<uint64_t>(c->used_memory());
      });
    },
    [self](memset_atom, int32_t id, uint64_t offset,
           uint64_t size) -> caf::result<uint64_t> {
      auto& c = self->state.core;
      return guarded(*c, [&] { return c->memset_zero(id, offset, size); });
    },
    [self](all_work_atom) -> uint64_t { return self->state.core->scheduled(); },
    [self](idle_atom) -> bool { return self->state.core->is_idle(); },
    [self](memory_atom) -> uint64_t { return self->state.core->used_memory(); },
    [self](debug_atom) -> std::string {
      return self->state.core->debug_info().to_string();
    },
  };
}

} // namespace

device_actor spawn_device_actor(caf::actor_system& sys, std::shared_ptr<device_core> core) {
  return sys.spawn(device_impl, std::move(core));
}

} // namespace multidev::detail
