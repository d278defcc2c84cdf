// Endpoints: the registry of devices by key, the local endpoint (calls go
// straight to the core), and `wait_for`, which picks one of the four ways
// a device waits for another's event.
#include "actors/endpoint.hpp"
#include "actors/wait_graph.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <fmt/format.h>

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "actors/binding.hpp"
#include "actors/core/device_core.hpp"
#include "actors/logger_tie.hpp"

namespace multidev::detail {

namespace {

/// Every live endpoint of the process by key. A key may have several: the
/// local one (in the process that owns the device) and those of the
/// backends that attached it.
struct registry {
  std::mutex mu;
  std::unordered_map<device_key, std::vector<std::weak_ptr<endpoint>>> by_key;

  static registry& get() {
    static auto* r = new registry; // never destroyed: endpoints may outlive main
    return *r;
  }
};

constexpr auto request_timeout = std::chrono::minutes(5);

} // namespace

endpoint::endpoint(device_key key, std::string name, std::shared_ptr<device_core> core)
  : key_(key), name_(std::move(name)), core_(std::move(core)) {
}

endpoint::~endpoint() {
  auto& r = registry::get();
  std::lock_guard guard{r.mu};
  auto i = r.by_key.find(key_);
  if (i == r.by_key.end())
    return;
  std::erase_if(i->second, [](const auto& w) { return w.expired(); });
  if (i->second.empty())
    r.by_key.erase(i);
}

uint64_t endpoint::copy_from(endpoint& source, int, std::size_t, int, std::size_t, std::size_t) {
  throw std::invalid_argument(fmt::format(
    "device_to_device {} -> {}: a copy straight between processes needs two devices of other "
    "processes",
    source.name(), name()));
}

chain_step endpoint::why(uint64_t, std::chrono::steady_clock::time_point) {
  return {remote_silent_end, nullptr, 0};
}

std::function<sexp()> endpoint::debug_info_until(std::chrono::steady_clock::time_point) {
  return [self = shared_from_this()] { return self->debug_info(); };
}

std::shared_ptr<endpoint> find_endpoint_of(const caf::actor_addr& actor) {
  if (!actor)
    return nullptr;
  std::vector<std::shared_ptr<endpoint>> all;
  {
    auto& r = registry::get();
    std::lock_guard guard{r.mu};
    for (const auto& [key, ws] : r.by_key)
      for (const auto& w : ws)
        if (auto ep = w.lock())
          all.push_back(std::move(ep));
  }
  // Asked outside the lock: the last reference may go here.
  std::shared_ptr<endpoint> found;
  for (auto& ep : all)
    if (ep->actor().address() == actor && (!found || ep->core()))
      found = ep;
  return found;
}

void register_endpoint(const std::shared_ptr<endpoint>& ep) {
  auto& r = registry::get();
  std::lock_guard guard{r.mu};
  r.by_key[ep->key()].push_back(ep);
}

std::shared_ptr<endpoint> find_endpoint(const device_key& key) {
  auto& r = registry::get();
  std::lock_guard guard{r.mu};
  auto i = r.by_key.find(key);
  if (i == r.by_key.end())
    return nullptr;
  std::shared_ptr<endpoint> found;
  for (const auto& w : i->second)
    if (auto ep = w.lock()) {
      if (ep->core())
        return ep; // the device itself beats any attachment of it
      if (!found)
        found = std::move(ep);
    }
  return found;
}

namespace {

/// A device of this process: every call goes to its core, as before
/// endpoints existed; only `flush` and `actor` involve its actor.
class local_endpoint final : public endpoint {
public:
  local_endpoint(device_key key, std::shared_ptr<device_core> core, caf::actor_addr actor)
    : endpoint(key, core->name(), core), c_(*core), actor_(std::move(actor)) {}

  bool known_done(uint64_t seq) const noexcept override { return c_.outcomes().is_done(seq); }
  bool is_done(uint64_t seq) override { return c_.outcomes().is_done(seq); }
  bool is_failed(uint64_t seq) override { return c_.outcomes().is_failed(seq); }
  event_state state(uint64_t seq) override { return c_.outcomes().state(seq); }
  void sync(uint64_t seq) override { c_.events().sync(seq); }
  void sync_until(uint64_t seq, std::chrono::steady_clock::time_point deadline) override {
    c_.events().sync_until(seq, deadline);
  }
  void when_done(uint64_t seq, on_resolved cb) override {
    c_.check_scheduled(seq, "when_done");
    c_.events().when_resolved(seq, std::move(cb));
  }
  void cancel() override { c_.life().cancel("cancelled by cancel(device)"); }
  bool recover() override { return c_.life().recover(); }

  uint64_t schedule_named(const task_spec& spec) override {
    return c_.push(bind_spec(core(), spec).work);
  }
  std::vector<uint64_t> schedule_batch(std::span<const task_spec> specs) override {
    return push_batch(core(), specs, true);
  }
  uint64_t all_work() override { return c_.queue().scheduled(); }
  void await() override { await_until(std::chrono::steady_clock::time_point::max()); }
  void await_until(std::chrono::steady_clock::time_point deadline) override {
    c_.events().sync_until(c_.queue().scheduled(), deadline, "await");
  }
  bool is_idle() override { return c_.inspect().is_idle(); }
  std::size_t queue_length() override { return c_.queue().scheduled() - c_.outcomes().finished(); }

  void flush() override {
    if (current_runner != nullptr)
      throw deadlock_error(fmt::format(
        "flush({}) from a task: the round trip may wait behind a full queue that "
        "only this runner drains",
        name()));
    auto a = actor();
    if (!a)
      throw device_error(name(), "its actor is gone (the backend was shut down)");
    logger_tie_guard untie;
    caf::scoped_actor self{a->home_system()};
    caf::error err;
    bool replied = false;
    self->request(a, request_timeout, atoms::all_work_atom::value)
      .receive([&](uint64_t) { replied = true; }, [&](caf::error& e) { err = e; });
    if (err || !replied)
      throw_error(err, name());
  }

  void depend(endpoint& owner, uint64_t seq) override {
    if (owner.core()) {
      c_.push_wait(owner.core(), seq);
      return;
    }
    // Owned by another process: a gate the reply to a `wait` request opens
    // (or fails; a vanished owner fails it too, see the remote endpoint).
    auto g = make_gate();
    g->owner_seq = seq;
    g->remote = true;
    g->owner_name = owner.name();
    g->label = fmt::format("{} seq {}", owner.name(), seq);
    g->remote_owner = owner.weak_from_this();
    c_.push_gate(g);
    std::weak_ptr<device_core> weak = core();
    try {
      owner.when_done(seq, [weak, g](const failure* cause) {
        auto me = weak.lock();
        if (!me)
          return;
        if (!cause) {
          me->resolve_gate(*g, device_core::failure_ptr{});
          return;
        }
        // The runner adds this wait to the cause's path when it reaches
        // the gate, so the owner's provenance goes on down the chain.
        device_core::failure_ptr shared;
        try {
          shared = std::make_shared<const failure>(*cause);
        } catch (...) {
          static const std::string why = "the awaited event failed (out of memory)";
          me->resolve_gate(*g, &why);
          return;
        }
        me->resolve_gate(*g, shared);
      });
    } catch (...) {
      static const std::string why = "could not send the wait request";
      c_.resolve_gate(*g, &why);
      throw;
    }
  }

  void alloc_pool(int id, std::size_t size, std::size_t alignment,
                  std::optional<memory_mode> mode) override {
    c_.memory().alloc_pool(id, size, alignment, mode);
  }
  void free_pool(int id) override { c_.memory().free_pool(id); }
  uint64_t memset_zero(int id, std::size_t offset, std::size_t size) override {
    return c_.memory().memset_zero(id, offset, size);
  }
  uint64_t write_bytes(int id, std::size_t offset, std::string bytes) override {
    c_.wait_for_room();
    return c_.memory().write_bytes(id, offset,
                                   std::make_shared<const std::string>(std::move(bytes)));
  }
  std::string read_bytes(int id, std::size_t offset, std::size_t size) override {
    c_.wait_for_room();
    auto out = std::make_shared<std::string>(size, '\0');
    c_.events().sync(c_.memory().read_bytes(id, offset, out));
    return std::move(*out);
  }
  std::size_t used_memory() override { return c_.pools().used_memory(); }
  sexp debug_info() override { return c_.inspect().debug_info(); }
  device_trace trace() override { return c_.inspect().trace(); }
  std::optional<kernel_result> result(const std::string& name) override {
    return c_.results().get(name);
  }
  device_actor actor() const override { return caf::actor_cast<device_actor>(actor_); }

private:
  device_core& c_;
  caf::actor_addr actor_;
};

} // namespace

std::shared_ptr<endpoint> make_local_endpoint(device_key key, std::shared_ptr<device_core> core,
                                              caf::actor_addr actor) {
  auto ep = std::make_shared<local_endpoint>(key, std::move(core), std::move(actor));
  register_endpoint(ep);
  return ep;
}

void wait_for(endpoint& waiting, endpoint& owner, uint64_t seq) {
  if (&owner == &waiting || owner.key() == waiting.key() || owner.known_done(seq))
    return;
  // Refused rather than queued to fail later: nothing can come from there.
  if (auto why = owner.gone())
    throw device_error(owner.name(), fmt::format("{} cannot wait for its seq {}: {}",
                                                 waiting.name(), seq, *why));
  if (auto why = waiting.gone())
    throw device_error(waiting.name(), fmt::format("it cannot wait for {} seq {}: {}",
                                                   owner.name(), seq, *why));
  waiting.depend(owner, seq);
}

} // namespace multidev::detail
