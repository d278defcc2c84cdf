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
  owner->check_scheduled(seq, "will_wait_for");
  auto g = std::make_shared<gate>();
  g->owner = owner;
  g->owner_seq = seq;
  push_gate(g);
  // The callback may run at once, on this thread, or later on owner's runner.
  std::weak_ptr<device_core> self = weak_from_this();
  try {
    owner->when_done(seq, [self, g](const std::string* error) {
      if (auto me = self.lock())
        me->resolve_gate(*g, error);
    });
  } catch (...) {
    // The gate is queued: left pending, it would hold this device forever.
    static const std::string reason = "could not register the wait (out of memory)";
    resolve_gate(*g, &reason);
    throw;
  }
  return true;
}

std::string gate::what() const noexcept {
  try {
    if (auto o = owner.lock())
      return fmt::format("{} seq {}", o->name(), owner_seq);
    return label.empty() ? fmt::format("seq {} of a device gone", owner_seq) : label;
  } catch (...) {
    return {};
  }
}

std::shared_ptr<gate> device_core::push_gate(std::shared_ptr<gate> g) {
  {
    // Registered before the push: `shutdown` sets stopping_ before it collects
    // these, so a gate is either collected (and maybe cancelled) or refused.
    std::lock_guard guard{waiters_mu_};
    std::erase_if(gates_, [](const auto& w) {
      auto p = w.lock();
      return !p || p->state.load() != gate::pending;
    });
    gates_.push_back(g);
  }
  gates_pending_.fetch_add(1);
  try {
    // A wait never waits for room: will_wait_for returns at once, and an
    // actor handler must not block.
    g->seq = enqueue(task{}, g, false);
  } catch (...) {
    gates_pending_.fetch_sub(1);
    throw;
  }
  return g;
}

void device_core::resolve_gate(gate& g, const std::string* error) noexcept {
  // `resolving` makes the first resolution win and publishes `error` before
  // the final state; the runner only acts on open or failed. Nothing between
  // the two may throw, or the gate would stay half-open forever.
  int expected = gate::pending;
  if (!g.state.compare_exchange_strong(expected, gate::resolving))
    return;
  if (error) {
    try {
      g.error = *error;
    } catch (...) {
      g.error.clear(); // the runner reports the failure without its reason
    }
    g.state.store(gate::failed, std::memory_order_seq_cst);
  } else {
    g.state.store(gate::open, std::memory_order_seq_cst);
  }
  ring();
}

void device_core::wait_for_room() {
  if (current_runner != nullptr)
    return;
  std::unique_lock lk{mu_};
  while (queue_.size() >= capacity_ && !failed_ && !stopping_) {
    ++producers_waiting_;
    room_.wait(lk);
    --producers_waiting_;
  }
}

bool device_core::has_room() const noexcept {
  std::lock_guard guard{mu_};
  return queue_.size() < capacity_ || failed_ || stopping_;
}

bool device_core::notify_when_room(std::function<void()> cb) {
  std::lock_guard guard{mu_};
  if (queue_.size() < capacity_ || failed_ || stopping_)
    return false;
  room_cb_ = std::move(cb);
  return true;
}

void device_core::call_room_callback() noexcept {
  std::function<void()> cb;
  {
    std::lock_guard guard{mu_};
    cb.swap(room_cb_);
  }
  if (cb) {
    try {
      cb();
    } catch (...) {
      // A producer that cannot be told keeps its work deferred; it asks again
      // on its next message.
    }
  }
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
  bool wants_room = false;
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
      wants_room = static_cast<bool>(room_cb_);
    }
    if (wants_room)
      call_room_callback();
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
      poison([&] {
        if (g.error.empty())
          return fmt::format("waited for {}, which failed", g.what());
        // The owner's error starts with its name, which what() gives already.
        std::string_view why = g.error;
        if (auto o = g.owner.lock())
          if (why.starts_with(o->name()) && why.substr(o->name().size()).starts_with(": "))
            why.remove_prefix(o->name().size() + 2);
        return fmt::format("waited for {}, which failed: {}", g.what(), why);
      });
      return;
    }
  } else if (it.work) {
    try {
      it.work();
    } catch (const std::exception& e) {
      poison([&] { return fmt::format("task {} failed: {}", describe(it), e.what()); });
      return;
    } catch (...) {
      poison([&] { return fmt::format("task {} failed: unknown exception", describe(it)); });
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

template <class MakeMessage>
void device_core::poison(MakeMessage make) noexcept {
  // Runs on the runner, outside any handler: nothing here may throw. A
  // message that cannot be formatted (out of memory) becomes a fixed text
  // short enough to need no allocation.
  std::string message;
  try {
    message = make();
  } catch (...) {
    message = "task failed"; // fits the small-string buffer
  }
  std::vector<item> dropped;
  {
    std::lock_guard guard{mu_};
    if (failed_)
      return;
    failed_ = true;
    error_.swap(message);
    dropped.swap(queue_);
    taken_ += dropped.size(); // or the runner would see them as pending forever
    room_.notify_all();
  }
  progress_.fetch_or(fail_bit, std::memory_order_seq_cst);
  fail_waiters("task failed");
  for (auto& it : dropped)
    if (it.as_gate())
      gates_pending_.fetch_sub(1);
  call_room_callback();
}

void device_core::fail_waiters(const char* fallback) noexcept {
  static const std::string unformatted =
    "device failed (its reason could not be formatted: out of memory)";
  std::string err;
  try {
    err = fmt::format("{}: {}", name_, error().value_or(fallback));
  } catch (...) {
    fire(UINT64_MAX, &unformatted);
    return;
  }
  fire(UINT64_MAX, &err);
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

void device_core::check_scheduled(uint64_t seq, const char* what) const {
  auto s = scheduled();
  if (seq > s)
    throw std::invalid_argument(fmt::format(
      "{}: seq {} was never scheduled on {} (it has scheduled {} so far)", what, seq,
      name_, s));
}

void device_core::invoke(waiter& w, const std::string* error) noexcept {
  try {
    w(error);
  } catch (...) {
    // A waiter's own failure is its business: the others still fire.
  }
}

void device_core::fire(uint64_t upto, const std::string* error) noexcept {
  // The due waiters' nodes move to a local map: no allocation, so nothing
  // can throw half-way and strand a waiter.
  std::multimap<uint64_t, waiter> due;
  {
    std::lock_guard guard{waiters_mu_};
    auto end = upto == UINT64_MAX ? waiters_.end() : waiters_.upper_bound(upto);
    while (waiters_.begin() != end)
      due.insert(waiters_.extract(waiters_.begin()));
    min_waiter_.store(waiters_.empty() ? UINT64_MAX : waiters_.begin()->first,
                      std::memory_order_seq_cst);
  }
  // A seq at or below progress is done, forever, for every observer: even
  // when this fires because the device failed, the waiters of seqs that
  // finished before the failure (a waiter that registered while `complete`
  // was looking the other way) are told done.
  auto finished_now = finished();
  for (auto& [seq, w] : due)
    invoke(w, seq <= finished_now ? nullptr : error);
}

void device_core::add_waiter_unchecked(uint64_t seq, waiter w) {
  std::lock_guard guard{waiters_mu_};
  waiters_.emplace(seq, std::move(w));
  min_waiter_.store(waiters_.begin()->first, std::memory_order_seq_cst);
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
      if (p & fail_bit)
        fail_waiters("failed");
      else if (p >= seq)
        fire(p, nullptr);
      return;
    }
  }
  if ((progress_.load() & ~fail_bit) >= seq) {
    invoke(w, nullptr);
  } else {
    auto err = fmt::format("{}: {}", name_, error().value_or("device is shut down"));
    invoke(w, &err);
  }
}

void device_core::sync(uint64_t seq) {
  if (is_done(seq))
    return;
  check_scheduled(seq, "sync");
  if (current_runner == this && !is_failed(seq))
    throw deadlock_error(fmt::format(
      "sync on {} seq {} from a task of the same device, which has finished "
      "only up to seq {}: waiting would deadlock",
      name_, seq, finished()));
  if (!is_failed(seq)) {
    // Shared: the waiter may still be notifying after we saw the value.
    struct signal {
      std::atomic<uint32_t> flag{0};
      std::string reason; // written before flag becomes 2
    };
    auto sig = std::make_shared<signal>();
    when_done(seq, [sig](const std::string* error) {
      if (error)
        sig->reason = *error;
      sig->flag.store(error ? 2 : 1);
      sig->flag.notify_one();
    });
    uint32_t v;
    while ((v = sig->flag.load()) == 0)
      sig->flag.wait(0);
    if (v == 1 || is_done(seq))
      return;
    throw device_error(name_, reason_of(sig->reason));
  }
  if (is_done(seq))
    return;
  throw device_error(name_, error().value_or("device is shut down"));
}

std::string device_core::reason_of(std::string_view error) const {
  if (error.starts_with(name_) && error.substr(name_.size()).starts_with(": "))
    error.remove_prefix(name_.size() + 2);
  return std::string{error};
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
  cancel_gates([](const gate& g) { return g.remote; });
  call_room_callback();
  ring();
}

bool device_core::stopping() const {
  std::lock_guard guard{mu_};
  return stopping_;
}

template <class Pred>
void device_core::cancel_gates(Pred which) {
  std::vector<std::shared_ptr<gate>> chosen;
  {
    std::lock_guard guard{waiters_mu_};
    for (auto& w : gates_)
      if (auto g = w.lock(); g && g->state.load() == gate::pending && which(*g))
        chosen.push_back(std::move(g));
  }
  for (auto& g : chosen) {
    static const std::string why = "the wait was cancelled at shutdown";
    resolve_gate(*g, &why);
  }
}

void device_core::shutdown() {
  request_stop();
  // A local wait opens only if its owner drains too (devices of the same
  // backend stop together, so every one of them is stopping by now). An
  // owner in another backend, or one already gone, may never get there:
  // joining behind it could block forever.
  cancel_gates([](const gate& g) {
    if (g.remote)
      return true;
    auto o = g.owner.lock();
    return !o || !o->stopping();
  });
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
  fail_waiters("device is shut down");
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

namespace {
std::invalid_argument unknown_pool(std::string_view who, int id, const std::string& device) {
  return std::invalid_argument(fmt::format(
    "{}: pool {} is not allocated on {} (never allocated, or freed)", who, id, device));
}
} // namespace

void device_core::free_pool(int id) {
  std::shared_ptr<pool> old;
  {
    std::lock_guard guard{pools_mu_};
    auto i = pools_.find(id);
    if (i == pools_.end())
      throw unknown_pool("free_pool", id, name_);
    old = std::move(i->second);
    pools_.erase(i);
  }
  // Ordered with the device's work, like cudaFreeAsync.
  release_later(std::move(old), "free_pool");
}

std::shared_ptr<pool> device_core::pool_span(int id, std::size_t offset, std::size_t size,
                                             std::string_view who) const {
  auto p = try_pool(id);
  if (!p)
    throw unknown_pool(who, id, name_);
  if (offset > p->size || size > p->size - offset)
    throw std::invalid_argument(fmt::format(
      "{}: bytes [{}, {}) are outside pool {} of {} ({} bytes)", who, offset,
      offset + size, id, name_, p->size));
  return p;
}

uint64_t device_core::memset_zero(int id, std::size_t offset, std::size_t size) {
  auto p = pool_span(id, offset, size, "memset_zero");
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
