#include "actors/device_core.hpp"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

namespace multidev::detail {

namespace {
/// The device whose runner this thread is, if any.
thread_local const device_core* current_runner = nullptr;

/// How a runner polls before it sleeps: a producer in a burst or a device
/// about to resolve a wait usually comes back within microseconds, and a poll
/// is far cheaper for both sides than a futex sleep and wake-up. The poll
/// pauses first, then yields, so a producer sharing this CPU gets to run.
constexpr int spin_pauses = 64;
constexpr int spin_yields = 8;

/// When fewer items than this are waiting, the runner pauses up to
/// `coalesce_pauses` times (about a microsecond) to take them in one batch.
constexpr uint64_t coalesce_items = 32;
constexpr int coalesce_pauses = 64;

/// How many queue entries ahead a producer prefetches for writing, and the
/// runner for reading.
constexpr std::size_t prefetch_items = 6;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

/// Polls `ready` for a while, every `stride` pauses; true as soon as it
/// holds. A poll of a line another core keeps writing (the producer's
/// counter) costs that core a cache miss on its next write, so such polls
/// use a longer stride.
template <class Pred>
bool spin_until(Pred ready, int stride = 1) {
  for (int i = 0; i < spin_pauses + spin_yields; ++i) {
    if ((i % stride == 0 || i >= spin_pauses) && ready())
      return true;
    if (i < spin_pauses)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  return ready();
}
} // namespace

void spin_mutex::lock() noexcept {
  for (int i = 0;; ++i) {
    if (!locked_.load(std::memory_order_relaxed) && try_lock())
      return;
    if (i < 64)
      cpu_relax();
    else
      std::this_thread::yield(); // the holder may have been preempted
  }
}

void result_board::publish(const std::string& name, kernel_result r) {
  std::lock_guard guard{mu_};
  results_[name] = r;
}

std::optional<kernel_result> result_board::get(const std::string& name) const {
  std::lock_guard guard{mu_};
  if (auto i = results_.find(name); i != results_.end())
    return i->second;
  return std::nullopt;
}

pool::pool(int id, std::size_t size, std::size_t alignment,
           std::optional<memory_mode> mode, std::unique_ptr<allocation> mem,
           std::shared_ptr<std::atomic<std::size_t>> used)
  : id(id), size(size), alignment(alignment), mode(mode), mem(std::move(mem)),
    used(std::move(used)) {
  *this->used += size;
}

pool::~pool() {
  *used -= size;
}

device_core::device_core(std::string name, int ordinal, std::shared_ptr<driver> drv,
                         std::size_t queue_capacity,
                         std::shared_ptr<result_board> results)
  : name_(std::move(name)), ordinal_(ordinal), driver_(std::move(drv)),
    capacity_(queue_capacity == 0 ? 1 : queue_capacity),
    results_(std::move(results)),
    used_(std::make_shared<std::atomic<std::size_t>>(0)) {
  thread_ = std::thread([this] { run(); });
}

device_core::~device_core() {
  shutdown();
}

// -- queue --------------------------------------------------------------------

uint64_t device_core::enqueue(task&& t, std::shared_ptr<gate> g, bool may_wait) {
  item it{std::move(t.work), nullptr};
  if (!t.description.empty() || t.keep_alive || g)
    it.extra = std::make_unique<item_extra>(
      item_extra{std::move(t.description), std::move(t.keep_alive), std::move(g)});
  bool wake;
  uint64_t seq;
  {
    std::unique_lock lk{mu_};
    if (queue_.size() >= capacity_ && may_wait && current_runner == nullptr) {
      // Backpressure: wait for room, never drop. Runner threads (of any
      // device) and actor handlers never wait: a runner waiting for room in a
      // queue parked on its own next event, or an actor that must first
      // process the reply opening that queue's gate, would wait forever.
      while (queue_.size() >= capacity_ && !failed_ && !stopping_) {
        ++producers_waiting_;
        room_.wait(lk);
        --producers_waiting_;
      }
    }
    if (failed_)
      throw device_error(name_, error_);
    if (stopping_)
      throw device_error(name_, "device is shut down; no new work is accepted");
    queue_.push_back(std::move(it));
    // The next entries' lines were last read by the runner (the buffers swap
    // back and forth): ask for them now, so the transfer overlaps this push.
    if (auto ahead = queue_.size() + prefetch_items; ahead < queue_.capacity())
      __builtin_prefetch(queue_.data() + ahead, 1, 3);
    seq = scheduled_.load(std::memory_order_relaxed) + 1;
    scheduled_.store(seq, std::memory_order_release);
    // The runner sets sleeping_ for an empty queue under mu_, so a plain
    // load suffices to skip the read-modify-write on the common path.
    wake = sleeping_.load(std::memory_order_relaxed) && sleeping_.exchange(false);
  }
  if (wake)
    ring_bell();
  return seq;
}

uint64_t device_core::push(task&& t, bool may_wait) {
  return enqueue(std::move(t), nullptr, may_wait);
}

bool device_core::push_wait(const std::shared_ptr<device_core>& owner, uint64_t seq) {
  if (owner.get() == this || owner->is_done(seq))
    return false;
  auto g = std::make_shared<gate>();
  g->owner = owner;
  g->owner_seq = seq;
  push_gate(g);
  // The callback may run at once, on this thread, or later on owner's runner.
  std::weak_ptr<device_core> self = weak_from_this();
  owner->when_done(seq, [self, g](const std::string* error) {
    if (auto me = self.lock())
      me->resolve_gate(*g, error);
  });
  return true;
}

std::string gate::what() const {
  if (auto o = owner.lock())
    return fmt::format("{} seq {}", o->name(), owner_seq);
  return label.empty() ? fmt::format("seq {} of a device gone", owner_seq) : label;
}

std::shared_ptr<gate> device_core::push_gate(std::shared_ptr<gate> g, bool remote) {
  if (remote) {
    // Registered before the push: `shutdown` sets stopping_ before it collects
    // these, so a gate is either collected (and cancelled) or refused.
    std::lock_guard guard{waiters_mu_};
    std::erase_if(remote_gates_, [](const auto& w) { return w.expired(); });
    remote_gates_.push_back(g);
  }
  gates_pending_.fetch_add(1);
  try {
    g->seq = enqueue(task{}, g, !remote);
  } catch (...) {
    gates_pending_.fetch_sub(1);
    throw;
  }
  return g;
}

void device_core::resolve_gate(gate& g, const std::string* error) {
  // `resolving` makes the first resolution win and publishes `error` before
  // the final state; the runner only acts on open or failed.
  int expected = gate::pending;
  if (!g.state.compare_exchange_strong(expected, gate::resolving))
    return;
  if (error) {
    g.error = *error;
    g.state.store(gate::failed, std::memory_order_seq_cst);
  } else {
    g.state.store(gate::open, std::memory_order_seq_cst);
  }
  ring();
}

void device_core::ring() {
  if (sleeping_.exchange(false, std::memory_order_seq_cst))
    ring_bell();
}

void device_core::ring_bell() {
  bell_.fetch_add(1);
  bell_.notify_one();
}

void device_core::run() {
  current_runner = this;
  std::vector<item> batch;
  auto pending = [&] { return scheduled_.load(std::memory_order_acquire) - taken_; };
  for (;;) {
    if (pending() == 0 && !spin_until([&] { return pending() != 0; }, 16)) {
      std::unique_lock lk{mu_};
      while (queue_.empty()) {
        if (stopping_)
          return;
        auto b = bell_.load();
        sleeping_.store(true, std::memory_order_seq_cst);
        lk.unlock();
        bell_.wait(b);
        sleeping_.store(false, std::memory_order_relaxed);
        lk.lock();
      }
    } else if (pending() < coalesce_items) {
      // A producer in a burst is appending right now: taking the lock for
      // each item would move its cache line back and forth on every push.
      // Reading scheduled_ pulls the producer's cache line, so look rarely.
      for (int i = 0; i < coalesce_pauses && pending() < coalesce_items; i += 16)
        for (int j = 0; j < 16; ++j)
          cpu_relax();
    }
    {
      std::lock_guard guard{mu_};
      if (queue_.empty()) {
        if (stopping_)
          return;
        continue;
      }
      batch.swap(queue_);
      taken_ += batch.size();
      if (producers_waiting_ > 0)
        room_.notify_all();
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      // The entries were just written on the producer's core: fetch ahead.
      if (i + prefetch_items < batch.size())
        __builtin_prefetch(&batch[i + prefetch_items], 0, 3);
      auto& it = batch[i];
      if (!failed_now())
        execute(it);
      else if (it.as_gate())
        gates_pending_.fetch_sub(1);
    }
    batch.clear();
  }
}

void device_core::execute(item& it) {
  auto seq = ++executed_; // runner-only count of items run or skipped
  if (auto* gp = it.as_gate()) {
    auto& g = *gp;
    {
      std::lock_guard guard{waiters_mu_};
      parked_on_ = &g;
    }
    spin_until([&] {
      auto st = g.state.load(std::memory_order_acquire);
      return st == gate::open || st == gate::failed;
    });
    for (;;) {
      auto b = bell_.load();
      sleeping_.store(true, std::memory_order_seq_cst);
      auto st = g.state.load(std::memory_order_seq_cst);
      if (st == gate::open || st == gate::failed)
        break;
      bell_.wait(b);
    }
    sleeping_.store(false, std::memory_order_relaxed);
    {
      std::lock_guard guard{waiters_mu_};
      parked_on_ = nullptr;
    }
    gates_pending_.fetch_sub(1);
    if (g.state.load() == gate::failed) {
      poison(fmt::format("waited for {}, which failed: {}", g.what(), g.error));
      return;
    }
  } else if (it.work) {
    try {
      it.work();
    } catch (const std::exception& e) {
      poison(fmt::format("task {} failed: {}", describe(it), e.what()));
      return;
    } catch (...) {
      poison(fmt::format("task {} failed: unknown exception", describe(it)));
      return;
    }
  }
  // Release what a described task held (a freed pool's memory, captured
  // buffers) before its event is done, so whoever syncs on it sees the memory
  // gone. A bare closure is left for batch.clear(): writing to the entry here
  // would pull its cache line back from the producer on every item.
  if (it.extra) {
    it.work = nullptr;
    it.extra->keep_alive.reset();
  }
  complete(seq);
}

std::string device_core::describe(const item& it) {
  if (auto* g = it.as_gate())
    return "'wait for " + g->what() + "'";
  if (!it.extra || it.extra->description.empty())
    return "(no description)";
  return "'" + it.extra->description + "'";
}

void device_core::complete(uint64_t seq) {
  // Store-then-load against `when_done`'s store-then-load of min_waiter_ and
  // progress_ (Dekker): both sides need StoreLoad order, or a waiter that
  // registers at this very moment and this check could both miss each other,
  // and the event would stay unresolved -- forever if the next task waits for
  // whoever is waiting on this event.
  progress_.store(seq, std::memory_order_seq_cst);
  if (seq >= min_waiter_.load(std::memory_order_seq_cst))
    fire(seq, nullptr);
}

void device_core::poison(const std::string& message) {
  std::vector<item> dropped;
  {
    std::lock_guard guard{mu_};
    if (failed_)
      return;
    failed_ = true;
    error_ = message;
    dropped.swap(queue_);
    taken_ += dropped.size(); // or the runner would see them as pending forever
    room_.notify_all();
  }
  progress_.fetch_or(fail_bit, std::memory_order_seq_cst);
  auto err = fmt::format("{}: {}", name_, message);
  fire(UINT64_MAX, &err);
  for (auto& it : dropped)
    if (it.as_gate())
      gates_pending_.fetch_sub(1);
}

// -- events -------------------------------------------------------------------

uint64_t device_core::finished() const noexcept {
  return progress_.load(std::memory_order_acquire) & ~fail_bit;
}

bool device_core::failed_now() const noexcept {
  return (progress_.load(std::memory_order_acquire) & fail_bit) != 0;
}

bool device_core::is_done(uint64_t seq) const noexcept {
  return (progress_.load(std::memory_order_acquire) & ~fail_bit) >= seq;
}

bool device_core::is_failed(uint64_t seq) const noexcept {
  auto p = progress_.load(std::memory_order_acquire);
  return (p & fail_bit) != 0 && (p & ~fail_bit) < seq;
}

void device_core::fire(uint64_t upto, const std::string* error) {
  // Usually one waiter is due: keep it out of the heap.
  waiter first;
  std::vector<waiter> more;
  {
    std::lock_guard guard{waiters_mu_};
    auto end = upto == UINT64_MAX ? waiters_.end() : waiters_.upper_bound(upto);
    for (auto i = waiters_.begin(); i != end; ++i) {
      if (!first)
        first = std::move(i->second);
      else
        more.push_back(std::move(i->second));
    }
    waiters_.erase(waiters_.begin(), end);
    min_waiter_.store(waiters_.empty() ? UINT64_MAX : waiters_.begin()->first,
                      std::memory_order_seq_cst);
  }
  if (first)
    first(error);
  for (auto& w : more)
    w(error);
}

void device_core::when_done(uint64_t seq, waiter w) {
  {
    std::unique_lock guard{waiters_mu_};
    auto p = progress_.load(std::memory_order_seq_cst);
    if ((p & ~fail_bit) < seq && (p & fail_bit) == 0 && !closed_) {
      waiters_.emplace(seq, std::move(w));
      min_waiter_.store(waiters_.begin()->first, std::memory_order_seq_cst);
      // Re-check: the runner may have advanced between our load and store
      // without seeing the new minimum. Either it fires us, or we fire here.
      p = progress_.load(std::memory_order_seq_cst);
      guard.unlock();
      if (p & fail_bit) {
        auto err = fmt::format("{}: {}", name_, error().value_or("failed"));
        fire(UINT64_MAX, &err);
      } else if (p >= seq) {
        fire(p, nullptr);
      }
      return;
    }
  }
  if ((progress_.load() & ~fail_bit) >= seq) {
    w(nullptr);
  } else {
    auto err = fmt::format("{}: {}", name_, error().value_or("device is shut down"));
    w(&err);
  }
}

void device_core::sync(uint64_t seq) {
  if (is_done(seq))
    return;
  if (current_runner == this && !is_failed(seq))
    throw deadlock_error(fmt::format(
      "sync on {} seq {} from a task of the same device, which has finished "
      "only up to seq {}: waiting would deadlock",
      name_, seq, finished()));
  if (!is_failed(seq)) {
    // Shared: the waiter may still be notifying after we saw the value.
    struct signal {
      std::atomic<uint32_t> flag{0};
    };
    auto sig = std::make_shared<signal>();
    when_done(seq, [sig](const std::string* error) {
      sig->flag.store(error ? 2 : 1);
      sig->flag.notify_one();
    });
    uint32_t v;
    while ((v = sig->flag.load()) == 0)
      sig->flag.wait(0);
    if (v == 1)
      return;
  }
  if (is_done(seq))
    return;
  throw device_error(name_, error().value_or("failed"));
}

std::optional<std::string> device_core::error() const {
  std::lock_guard guard{mu_};
  if (failed_)
    return error_;
  return std::nullopt;
}

void device_core::check() const {
  if (auto e = error())
    throw device_error(name_, *e);
}

void device_core::request_stop() {
  {
    std::lock_guard guard{mu_};
    if (stopping_)
      return;
    stopping_ = true;
    room_.notify_all();
  }
  // Remote answers may never come once we stop: cancel those waits.
  std::vector<std::shared_ptr<gate>> remote;
  {
    std::lock_guard guard{waiters_mu_};
    for (auto& w : remote_gates_)
      if (auto g = w.lock())
        remote.push_back(std::move(g));
    remote_gates_.clear();
  }
  for (auto& g : remote) {
    auto err = fmt::format("{}: device is shut down; the wait for {} was cancelled",
                           name_, g->what());
    resolve_gate(*g, &err);
  }
  ring();
}

void device_core::shutdown() {
  request_stop();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id())
    thread_.join();
  // Anything still awaited can never complete now: the message first, then
  // the fail bit that makes waiters read it.
  if (finished() < scheduled()) {
    {
      std::lock_guard guard{mu_};
      if (!failed_) {
        failed_ = true;
        error_ = "device is shut down";
      }
    }
    progress_.fetch_or(fail_bit);
  }
  {
    std::lock_guard guard{waiters_mu_};
    closed_ = true; // later waits for seqs not reached fail at once
  }
  auto err = fmt::format("{}: device is shut down", name_);
  fire(UINT64_MAX, &err);
  std::lock_guard guard{pools_mu_};
  pools_.clear();
}

// -- pools --------------------------------------------------------------------

void device_core::alloc_pool(int id, std::size_t size, std::size_t alignment,
                             std::optional<memory_mode> mode) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument(fmt::format(
      "alloc_pool on {}: pool {}: alignment {} is not a power of two", name_, id,
      alignment));
  if (id < 0)
    throw std::invalid_argument(
      fmt::format("alloc_pool on {}: pool id {} is negative", name_, id));
  check();
  std::unique_ptr<allocation> mem;
  try {
    mem = driver_->allocate(ordinal_, size, alignment, mode);
  } catch (const std::bad_alloc&) {
    throw std::invalid_argument(fmt::format(
      "alloc_pool on {}: pool {}: cannot allocate {} bytes aligned to {}", name_,
      id, size, alignment));
  }
  auto p = std::make_shared<pool>(id, size, alignment, mode, std::move(mem), used_);
  std::shared_ptr<pool> old;
  {
    std::lock_guard guard{pools_mu_};
    auto& slot = pools_[id];
    old = std::move(slot);
    slot = std::move(p);
  }
  // A replaced pool lives until the work scheduled before now is done.
  if (old)
    release_later(std::move(old), "release replaced pool");
}

void device_core::release_later(std::shared_ptr<pool> old, const char* what) {
  // A failed or stopping device runs nothing more: the memory goes at once.
  if (failed_now())
    return;
  auto id = old->id;
  try {
    push(task{fmt::format("{} {}", what, id), [] {}, std::move(old)}, false);
  } catch (const device_error&) {
  }
}

void device_core::free_pool(int id) {
  std::shared_ptr<pool> old;
  {
    std::lock_guard guard{pools_mu_};
    auto i = pools_.find(id);
    if (i == pools_.end())
      throw std::invalid_argument(fmt::format(
        "free_pool on {}: unknown pool {} (never allocated or already freed)",
        name_, id));
    old = std::move(i->second);
    pools_.erase(i);
  }
  // Ordered with the device's work, like cudaFreeAsync.
  release_later(std::move(old), "free_pool");
}

uint64_t device_core::memset_zero(int id, std::size_t offset, std::size_t size) {
  auto p = try_pool(id);
  if (!p)
    throw std::invalid_argument(
      fmt::format("memset_zero on {}: unknown pool {}", name_, id));
  if (offset > p->size || size > p->size - offset)
    throw std::invalid_argument(fmt::format(
      "memset_zero on {}: pool {}: range [{}, {}) is outside the pool's {} bytes",
      name_, id, offset, offset + size, p->size));
  auto* d = driver_.get();
  return push(task{fmt::format("memset_zero pool {} [{}, {})", id, offset, offset + size),
                   [d, p, offset, size] { d->zero(p->base() + offset, size); },
                   {}},
              false);
}

std::shared_ptr<pool> device_core::try_pool(int id) const {
  std::lock_guard guard{pools_mu_};
  auto i = pools_.find(id);
  return i == pools_.end() ? nullptr : i->second;
}

sexp device_core::debug_info() const {
  auto s = scheduled();
  auto f = finished();
  std::size_t waiting;
  std::string parked;
  {
    std::lock_guard guard{waiters_mu_};
    waiting = waiters_.size();
    if (parked_on_)
      parked = parked_on_->what();
  }
  auto pools = sexp::list({sexp::atom("pools")});
  {
    std::lock_guard guard{pools_mu_};
    for (const auto& [id, p] : pools_)
      pools.push_back(sexp::list(
        {sexp::atom("pool"), sexp::field("id", std::to_string(id)),
         sexp::field("size", std::to_string(p->size)),
         sexp::field("alignment", std::to_string(p->alignment)),
         sexp::field("mode", p->mode ? to_string(*p->mode) : std::string{"none"})}));
  }
  auto err = error();
  return sexp::list({sexp::atom("device"), sexp::field("name", name_),
                     sexp::field("queue_length", std::to_string(s - f)),
                     sexp::field("scheduled", std::to_string(s)),
                     sexp::field("finished", std::to_string(f)),
                     sexp::field("pending_waits", std::to_string(gates_pending_.load())),
                     sexp::field("waiters", std::to_string(waiting)),
                     sexp::field("parked_on", parked.empty() ? "none" : parked),
                     sexp::field("error", err ? *err : std::string{"none"}),
                     sexp::field("used_memory", std::to_string(used_memory())),
                     pools});
}

} // namespace multidev::detail
