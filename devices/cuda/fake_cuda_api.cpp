// The fake CUDA runtime: one lock for all of its state, one host thread per
// stream that runs the stream's operations in order (the work itself outside
// the lock), and one condition variable notified on every change.
#include "devices/cuda/fake_cuda_api.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <thread>

namespace multidev::detail::cuda {

namespace {
/// Set while the calling thread runs a host function (`launch_host_func`).
thread_local bool in_host_func = false;
} // namespace

namespace {

constexpr std::size_t device_memory = std::size_t{141} << 30;
constexpr std::size_t alignment = 256;

/// The bytes `aligned(n)` allocates.
std::size_t rounded(std::size_t n) {
  return std::max<std::size_t>(alignment, (n + alignment - 1) / alignment * alignment);
}

/// 256-aligned host memory of at least `n` bytes (never 0), or null.
void* aligned(std::size_t n) {
  if (n > SIZE_MAX - alignment)
    return nullptr;
  return std::aligned_alloc(alignment, rounded(n));
}

/// A token for the calling thread, unique for the process's lifetime (a
/// `std::thread::id` may be reused by a later thread).
uint64_t thread_token() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t token = next.fetch_add(1, std::memory_order_relaxed);
  return token;
}

} // namespace

struct fake_api::event_state {
  int device = 0;
  uint64_t recorded = 0;      // generation of the last `event_record` call
  std::set<uint64_t> pending; // generations queued whose record has not run
};

struct fake_api::op {
  enum class kind { kernel, memset, memcpy, peer_copy, host_func, free, record, wait, wait_value };
  kind k = kind::kernel;
  std::function<void()> work; // kernel, memset, memcpy, peer_copy, host_func
  void* ptr = nullptr;        // free
  std::shared_ptr<event_state> ev; // record, wait
  uint64_t gen = 0;                // record, wait
  status fault = code::success;    // kernel: the sticky error it raises when it runs
  const uint32_t* word = nullptr;  // wait_value: the word and the value it waits for
  uint32_t value = 0;
};

struct fake_api::stream_state {
  int device = 0;
  std::deque<op> queue; // not started
  bool running = false; // an op taken from the queue has not finished
  bool closing = false; // stream_destroy: drain (ignoring pause), then end
  int syncing = 0;      // stream_synchronize calls waiting on it
  std::thread worker;
};

fake_api::fake_api(int devices)
    : devices_(std::max(devices, 0)), devs_(static_cast<std::size_t>(devices_)) {
  for (auto& d : devs_)
    d.peer_enabled.assign(static_cast<std::size_t>(devices_), false);
}

fake_api::~fake_api() {
  {
    std::lock_guard guard{mu_};
    for (auto& d : devs_)
      d.paused = false;
    ending_ = true; // a word nobody will set again ends its waits
    for (auto& [h, st] : streams_)
      st->closing = true;
    cv_.notify_all();
  }
  // The map does not change any more: the threads only touch their stream.
  for (auto& [h, st] : streams_)
    if (st->worker.joinable())
      st->worker.join();
  for (auto& [p, a] : allocations_)
    std::free(p);
  for (auto& [device, blocks] : reusable_)
    for (auto& [size, p] : blocks)
      std::free(p);
  for (auto& [p, n] : pinned_)
    std::free(p);
}

// -- Helpers (all with mu_ held) ---------------------------------------------

/// Counts the call, then runs `body(lock)` unless the driver is missing or a
/// failure is injected; a failure other than `not_ready` becomes the
/// thread's last error.
template <class F>
status fake_api::call(const char* name, F&& body) {
  std::unique_lock lk{mu_};
  auto r = enter(name);
  if (r == code::success)
    r = body(lk);
  if (r != code::success && r != code::not_ready)
    me().last_error = r;
  cv_.notify_all();
  return r;
}

status fake_api::enter(const char* name) {
  ++st_.calls[name];
  if (in_host_func) {
    ++st_.calls_in_host_funcs;
    return code::not_permitted;
  }
  if (no_driver_)
    return code::insufficient_driver;
  if (devices_ == 0)
    return code::no_device;
  if (auto f = fail_next_.find(name); f != fail_next_.end() && !f->second.empty()) {
    auto s = f->second.front();
    f->second.pop_front();
    return s;
  }
  return code::success;
}

fake_api::thread_state& fake_api::me() { return threads_[thread_token()]; }

status fake_api::current_sticky() { return sticky(me().device); }

const std::pair<void* const, fake_api::allocation>*
fake_api::find_allocation(const void* p) const {
  auto i = allocations_.upper_bound(const_cast<void*>(p));
  if (i == allocations_.begin())
    return nullptr;
  --i;
  auto base = reinterpret_cast<std::uintptr_t>(i->first);
  auto at = reinterpret_cast<std::uintptr_t>(p);
  return at < base + std::max<std::size_t>(i->second.size, 1) ? &*i : nullptr;
}

status fake_api::ptr_sticky(const void* p) const {
  auto* a = p ? find_allocation(p) : nullptr;
  return a ? sticky(a->second.device) : code::success;
}

status fake_api::find_stream(stream_t s, stream_state*& out) {
  auto i = streams_.find(s);
  if (s == nullptr || i == streams_.end() || i->second->closing)
    return code::invalid_value;
  out = i->second.get();
  if (auto r = sticky(out->device))
    return r;
  return current_sticky();
}

status fake_api::find_event(event_t e, std::shared_ptr<event_state>& out) {
  auto i = events_.find(e);
  if (e == nullptr || i == events_.end())
    return code::invalid_value;
  out = i->second;
  if (auto r = sticky(out->device))
    return r;
  return current_sticky();
}

void fake_api::enqueue(stream_state& st, op o, std::unique_lock<std::mutex>& lk) {
  if (st.queue.size() >= queue_limit_) {
    // As the runtime's launch queue: a full stream blocks the launching
    // thread until it drains below the limit.
    ++st_.launches_blocked;
    ++st.syncing; // the stream stays while a call waits on it
    cv_.wait(lk, [&] {
      return st.queue.size() < queue_limit_ || st.closing || dev(st.device).sticky != code::success;
    });
    --st.syncing;
    cv_.notify_all();
    if (dev(st.device).sticky != code::success) {
      ++st_.ops_discarded; // launched as the device broke: dropped with the rest
      return;
    }
  }
  st.queue.push_back(std::move(o));
  cv_.notify_all();
}

fake_api::device_state& fake_api::dev(int device) {
  return devs_[static_cast<std::size_t>(device)];
}

void fake_api::check_device(int device, const char* what) const {
  if (device < 0 || device >= devices_)
    throw std::invalid_argument(
      fmt::format("fake_api::{}: no device {} (there are {})", what, device, devices_));
}

void fake_api::make_sticky_locked(int device, status s) {
  if (dev(device).sticky != code::success || s == code::success)
    return;
  // As CUDA documents its sticky errors: the process's CUDA state is
  // inconsistent, so every device of the process reports `s` from now on.
  for (auto& d : devs_)
    if (d.sticky == code::success)
      d.sticky = s;
  for (auto& [h, st] : streams_) {
    st_.ops_discarded += st->queue.size();
    st->queue.clear(); // records stay pending: their events report `s`
  }
  cv_.notify_all();
}

// -- Stream threads ----------------------------------------------------------

void fake_api::run(stream_state& st, op& o, std::unique_lock<std::mutex>& lk) {
  auto& d = dev(st.device);
  auto unlocked = [&] {
    lk.unlock();
    o.work();
    lk.lock();
  };
  switch (o.k) {
    case op::kind::kernel:
      if (o.fault != code::success) {
        make_sticky_locked(st.device, o.fault);
        return;
      }
      if (d.fail_kernel != code::success) {
        auto s = std::exchange(d.fail_kernel, code::success);
        make_sticky_locked(st.device, s);
        return;
      }
      unlocked();
      ++st_.kernels_run;
      return;
    case op::kind::memset:
      unlocked();
      ++st_.memsets;
      return;
    case op::kind::memcpy:
      unlocked();
      ++st_.memcpys;
      return;
    case op::kind::peer_copy:
      unlocked();
      ++st_.peer_copies;
      return;
    case op::kind::host_func: {
      // As CUDA allows: the host functions of all streams are serialized,
      // one at a time in the process (as if on one thread), and a stream
      // waits while its host function runs. (A lock, not a hand-over to a
      // thread of their own: the same order, without two context switches
      // per function.)
      lk.unlock();
      {
        std::lock_guard one_at_a_time{host_func_mu_};
        in_host_func = true; // the runtime forbids CUDA calls in there
        o.work();
        in_host_func = false;
      }
      lk.lock();
      ++st_.host_funcs_run;
      return;
    }
    case op::kind::free: {
      auto i = allocations_.find(o.ptr);
      if (i == allocations_.end())
        return; // cannot happen: free_async marked it
      dev(i->second.device).held -= i->second.size;
      st_.bytes_held -= i->second.size;
      // Kept by the device's pool, as the runtime's (release threshold: all):
      // the next allocation of its size gets these bytes, as they are.
      reusable_[i->second.device].emplace(rounded(i->second.size), i->first);
      allocations_.erase(i);
      ++st_.frees;
      return;
    }
    case op::kind::record:
      o.ev->pending.erase(o.gen);
      return;
    case op::kind::wait: {
      auto& ev = *o.ev;
      cv_.wait(lk, [&] {
        return !ev.pending.contains(o.gen) || sticky(ev.device) != code::success
               || d.sticky != code::success;
      });
      return;
    }
    case op::kind::wait_value: {
      // `host_signal` stores under mu_ and notifies.
      cv_.wait(lk, [&] {
        auto now = std::atomic_ref<const uint32_t>(*o.word).load(std::memory_order_acquire);
        return static_cast<int32_t>(now - o.value) >= 0 || d.sticky != code::success || ending_;
      });
      ++st_.value_waits_run;
      return;
    }
  }
}

void fake_api::serve(stream_state& st) {
  std::unique_lock lk{mu_};
  auto& d = dev(st.device);
  for (;;) {
    // A sticky device has no queued ops (make_sticky_locked drops them).
    cv_.wait(lk, [&] { return st.closing || (!st.queue.empty() && !d.paused); });
    if (st.queue.empty())
      return; // closing, drained
    auto o = std::move(st.queue.front());
    st.queue.pop_front();
    st.running = true;
    cv_.notify_all();
    run(st, o, lk);
    o = op{}; // what it holds goes before the op counts as done
    st.running = false;
    cv_.notify_all();
  }
}

// -- Devices -----------------------------------------------------------------

status fake_api::get_device_count(int* n) {
  std::lock_guard guard{mu_};
  auto r = enter("get_device_count");
  if (r == code::insufficient_driver || r == code::no_device) {
    if (n != nullptr)
      *n = 0;
  } else if (r == code::success) {
    if (n == nullptr)
      r = code::invalid_value;
    else
      *n = devices_;
  }
  if (r != code::success)
    me().last_error = r;
  cv_.notify_all();
  return r;
}

status fake_api::get_device_properties(device_props* p, int device) {
  return call("get_device_properties", [&](auto&) {
    if (p == nullptr)
      return code::invalid_value;
    if (device < 0 || device >= devices_)
      return code::invalid_device;
    bool small = device == 1;
    *p = device_props{.name = fmt::format("fake H200 {}", device),
                      .major = 9,
                      .minor = 0,
                      .multiprocessors = 132,
                      .total_memory = device_memory,
                      .async_engines = 3,
                      .max_threads_per_block = small ? 512 : 1024,
                      .max_block_dims = {1024, 1024, 64},
                      .max_grid_dims = {2147483647, 65535, 65535},
                      .shared_memory_per_block = small ? std::size_t{32768} : 49152,
                      .warp_size = 32};
    return code::success;
  });
}

status fake_api::set_device(int device) {
  return call("set_device", [&](auto&) {
    if (device < 0 || device >= devices_)
      return code::invalid_device;
    me().device = device;
    return code::success;
  });
}

status fake_api::get_device(int* device) {
  return call("get_device", [&](auto&) {
    if (device == nullptr)
      return code::invalid_value;
    *device = me().device;
    return code::success;
  });
}

status fake_api::mem_get_info(std::size_t* free, std::size_t* total) {
  return call("mem_get_info", [&](auto&) {
    if (free == nullptr || total == nullptr)
      return code::invalid_value;
    if (auto r = current_sticky())
      return r;
    auto held = dev(me().device).held;
    *total = device_memory;
    *free = held < device_memory ? device_memory - held : 0;
    return code::success;
  });
}

status fake_api::can_access_peer(int* can, int device, int peer) {
  return call("can_access_peer", [&](auto&) {
    if (can == nullptr)
      return code::invalid_value;
    if (device < 0 || device >= devices_ || peer < 0 || peer >= devices_)
      return code::invalid_device;
    *can = device != peer ? 1 : 0;
    return code::success;
  });
}

status fake_api::enable_peer_access(int peer) {
  return call("enable_peer_access", [&](auto&) {
    auto self = me().device;
    if (peer < 0 || peer >= devices_ || peer == self)
      return code::invalid_device;
    if (auto r = current_sticky())
      return r;
    if (auto r = sticky(peer))
      return r;
    auto&& enabled = dev(self).peer_enabled[static_cast<std::size_t>(peer)];
    if (enabled)
      return code::peer_access_already_enabled;
    enabled = true;
    return code::success;
  });
}

status fake_api::get_last_error() {
  std::lock_guard guard{mu_};
  auto r = enter("get_last_error");
  if (r == code::success) {
    auto& t = me();
    r = std::exchange(t.last_error, code::success);
    if (auto s = sticky(t.device))
      r = s;
  }
  cv_.notify_all();
  return r;
}

// -- Streams and events ------------------------------------------------------

status fake_api::stream_create(stream_t* s) {
  return call("stream_create", [&](auto&) {
    if (s == nullptr)
      return code::invalid_value;
    if (auto r = current_sticky())
      return r;
    auto st = std::make_unique<stream_state>();
    st->device = me().device;
    auto* raw = st.get();
    auto* handle = reinterpret_cast<stream_t>(next_handle_ += 0x10);
    streams_.emplace(handle, std::move(st));
    raw->worker = std::thread([this, raw] { serve(*raw); });
    ++st_.streams_created;
    *s = handle;
    return code::success;
  });
}

status fake_api::stream_destroy(stream_t s) {
  return call("stream_destroy", [&](std::unique_lock<std::mutex>& lk) {
    auto i = streams_.find(s);
    if (s == nullptr || i == streams_.end() || i->second->closing)
      return code::invalid_value;
    auto& st = *i->second;
    auto r = sticky(st.device);
    if (r == code::success)
      r = current_sticky();
    st.closing = true; // runs what is queued, then ends
    cv_.notify_all();
    cv_.wait(lk, [&] { return st.syncing == 0; });
    lk.unlock();
    st.worker.join();
    lk.lock();
    streams_.erase(s);
    ++st_.streams_destroyed;
    return r;
  });
}

status fake_api::stream_query(stream_t s) {
  return call("stream_query", [&](auto&) {
    stream_state* st = nullptr;
    if (auto r = find_stream(s, st))
      return r;
    return st->queue.empty() && !st->running ? code::success : code::not_ready;
  });
}

status fake_api::stream_synchronize(stream_t s) {
  return call("stream_synchronize", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    if (auto r = find_stream(s, st))
      return r;
    ++st->syncing;
    // A sticky device's queue is empty; its running op still finishes
    // first, so the caller may free what that op uses.
    cv_.wait(lk, [&] { return st->queue.empty() && !st->running; });
    --st->syncing;
    cv_.notify_all();
    if (auto r = sticky(st->device))
      return r;
    return current_sticky();
  });
}

status fake_api::stream_wait_event(stream_t s, event_t e) {
  return call("stream_wait_event", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    std::shared_ptr<event_state> ev;
    if (auto r = find_stream(s, st))
      return r;
    if (auto r = find_event(e, ev))
      return r;
    auto gen = ev->recorded;
    enqueue(*st, op{.k = op::kind::wait, .ev = std::move(ev), .gen = gen}, lk);
    ++st_.stream_waits;
    return code::success;
  });
}

status fake_api::event_create(event_t* e) {
  return call("event_create", [&](auto&) {
    if (e == nullptr)
      return code::invalid_value;
    if (auto r = current_sticky())
      return r;
    auto ev = std::make_shared<event_state>();
    ev->device = me().device;
    auto* handle = reinterpret_cast<event_t>(next_handle_ += 0x10);
    events_.emplace(handle, std::move(ev));
    ++st_.events_created;
    *e = handle;
    return code::success;
  });
}

status fake_api::event_destroy(event_t e) {
  return call("event_destroy", [&](auto&) {
    auto i = events_.find(e);
    if (e == nullptr || i == events_.end())
      return code::invalid_value;
    auto r = sticky(i->second->device);
    if (r == code::success)
      r = current_sticky();
    events_.erase(i); // released even so; queued ops hold their own reference
    ++st_.events_destroyed;
    return r;
  });
}

status fake_api::event_record(event_t e, stream_t s) {
  return call("event_record", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    std::shared_ptr<event_state> ev;
    if (auto r = find_stream(s, st))
      return r;
    if (auto r = find_event(e, ev))
      return r;
    if (ev->device != st->device)
      return code::invalid_value;
    auto gen = ++ev->recorded;
    ev->pending.insert(gen);
    enqueue(*st, op{.k = op::kind::record, .ev = std::move(ev), .gen = gen}, lk);
    ++st_.event_records;
    return code::success;
  });
}

status fake_api::event_query(event_t e) {
  return call("event_query", [&](auto&) {
    std::shared_ptr<event_state> ev;
    if (auto r = find_event(e, ev))
      return r;
    return ev->pending.contains(ev->recorded) ? code::not_ready : code::success;
  });
}

status fake_api::stream_wait_value(stream_t s, const uint32_t* addr, uint32_t value) {
  return call("stream_wait_value", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    if (auto r = find_stream(s, st))
      return r;
    if (addr == nullptr || reinterpret_cast<std::uintptr_t>(addr) % 4 != 0)
      return code::invalid_value;
    // The word must be page-locked host memory (CUDA needs it mapped).
    auto i = pinned_.upper_bound(const_cast<uint32_t*>(addr));
    if (i == pinned_.begin())
      return code::invalid_value;
    --i;
    if (static_cast<const std::byte*>(static_cast<const void*>(addr))
        >= static_cast<const std::byte*>(i->first) + i->second)
      return code::invalid_value;
    enqueue(*st, op{.k = op::kind::wait_value, .word = addr, .value = value}, lk);
    return code::success;
  });
}

void fake_api::host_signal(uint32_t* addr, uint32_t value) noexcept {
  std::lock_guard guard{mu_};
  std::atomic_ref<uint32_t>(*addr).store(value, std::memory_order_release);
  ++st_.host_signals;
  cv_.notify_all();
}

status fake_api::launch_host_func(stream_t s, void (*fn)(void*), void* user) {
  return call("launch_host_func", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    if (auto r = find_stream(s, st))
      return r;
    if (fn == nullptr)
      return code::invalid_value;
    enqueue(*st, op{.k = op::kind::host_func, .work = [fn, user] { fn(user); }}, lk);
    ++st_.host_funcs_launched;
    return code::success;
  });
}

// -- Memory ------------------------------------------------------------------

status fake_api::configure_mem_pool() {
  return call("configure_mem_pool", [&](auto&) {
    if (auto r = current_sticky())
      return r;
    ++dev(me().device).pools_configured;
    ++st_.mem_pools_configured;
    return code::success;
  });
}

status fake_api::malloc_async(void** p, std::size_t n, stream_t s) {
  return call("malloc_async", [&](auto&) {
    // The null stream (the legacy default stream) allocates on the current
    // device; any other stream on its own.
    int device = 0;
    if (s == nullptr) {
      if (auto r = current_sticky())
        return r;
      device = me().device;
    } else {
      stream_state* st = nullptr;
      if (auto r = find_stream(s, st))
        return r;
      device = st->device;
    }
    if (p == nullptr)
      return code::invalid_value;
    auto& d = dev(device); // the stream's device's pool, as in the runtime
    if (n > device_memory - d.held)
      return code::memory_allocation;
    void* mem = nullptr;
    auto& pool = reusable_[device];
    if (auto i = pool.find(rounded(n)); i != pool.end()) {
      mem = i->second; // freed memory is reused first, as by the runtime's pool
      pool.erase(i);
      ++st_.reused;
    } else if ((mem = aligned(n)) == nullptr) {
      return code::memory_allocation;
    }
    allocations_.emplace(mem, allocation{.device = device, .size = n});
    d.held += n;
    st_.bytes_held += n;
    ++st_.mallocs;
    *p = mem;
    return code::success;
  });
}

status fake_api::free_async(void* p, stream_t s) {
  return call("free_async", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    if (s != nullptr)
      if (auto r = find_stream(s, st))
        return r;
    auto i = allocations_.find(p);
    if (p == nullptr || i == allocations_.end() || i->second.freeing)
      return code::invalid_value;
    if (auto r = sticky(i->second.device))
      return r;
    if (s == nullptr) {
      // The legacy default stream: what used it is done (the caller
      // ordered it so); freed at once.
      dev(i->second.device).held -= i->second.size;
      st_.bytes_held -= i->second.size;
      reusable_[i->second.device].emplace(rounded(i->second.size), i->first);
      allocations_.erase(i);
      ++st_.frees;
      return code::success;
    }
    i->second.freeing = true;
    enqueue(*st, op{.k = op::kind::free, .ptr = p}, lk);
    return code::success;
  });
}

status fake_api::malloc_host(void** p, std::size_t n) {
  return call("malloc_host", [&](auto&) {
    if (p == nullptr)
      return code::invalid_value;
    if (auto r = current_sticky())
      return r;
    auto* mem = aligned(n);
    if (mem == nullptr)
      return code::memory_allocation;
    pinned_.emplace(mem, n);
    st_.pinned_bytes_held += n;
    ++st_.host_mallocs;
    *p = mem;
    return code::success;
  });
}

status fake_api::free_host(void* p) {
  return call("free_host", [&](auto&) {
    if (auto r = current_sticky())
      return r;
    if (p == nullptr)
      return code::success;
    auto i = pinned_.find(p);
    if (i == pinned_.end())
      return code::invalid_value;
    st_.pinned_bytes_held -= i->second;
    std::free(i->first);
    pinned_.erase(i);
    ++st_.host_frees;
    return code::success;
  });
}

status fake_api::memset_async(void* p, int value, std::size_t n, stream_t s) {
  return call("memset_async", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    if (auto r = find_stream(s, st))
      return r;
    if (p == nullptr && n > 0)
      return code::invalid_value;
    if (auto r = ptr_sticky(p))
      return r;
    enqueue(*st, op{.k = op::kind::memset, .work = [p, value, n] {
                      if (n > 0)
                        std::memset(p, value, n);
                    }}, lk);
    return code::success;
  });
}

status fake_api::memcpy_async(void* dst, const void* src, std::size_t n, stream_t s) {
  return call("memcpy_async", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    if (auto r = find_stream(s, st))
      return r;
    if ((dst == nullptr || src == nullptr) && n > 0)
      return code::invalid_value;
    if (auto r = ptr_sticky(dst))
      return r;
    if (auto r = ptr_sticky(src))
      return r;
    enqueue(*st, op{.k = op::kind::memcpy, .work = [dst, src, n] {
                      if (n > 0)
                        std::memcpy(dst, src, n);
                    }}, lk);
    return code::success;
  });
}

status fake_api::memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                                   std::size_t n, stream_t s) {
  return call("memcpy_peer_async", [&](std::unique_lock<std::mutex>& lk) {
    stream_state* st = nullptr;
    if (auto r = find_stream(s, st))
      return r;
    if (dst_device < 0 || dst_device >= devices_ || src_device < 0 || src_device >= devices_)
      return code::invalid_device;
    if (auto r = sticky(dst_device))
      return r;
    if (auto r = sticky(src_device))
      return r;
    if (n > 0) {
      // Both ranges must lie in device memory of the devices named.
      auto inside = [&](const void* p, int device) {
        auto* a = p ? find_allocation(p) : nullptr;
        if (a == nullptr || a->second.device != device)
          return false;
        auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(p)
                                               - static_cast<const std::byte*>(a->first));
        return n <= a->second.size - offset;
      };
      if (!inside(dst, dst_device) || !inside(src, src_device))
        return code::invalid_value;
    }
    enqueue(*st, op{.k = op::kind::peer_copy, .work = [dst, src, n] {
                      if (n > 0)
                        std::memcpy(dst, src, n);
                    }}, lk);
    return code::success;
  });
}

// -- Kernels -----------------------------------------------------------------

status fake_api::launch(const char* name, stream_t s, std::initializer_list<const void*> buffers,
                        std::size_t n, std::function<void()> work) {
  // As the real layer launches: `kernel<<<...>>>` then `cudaGetLastError`,
  // which returns (and clears) the launch's own error or, failing none, any
  // earlier one the thread left uncleared.
  std::unique_lock lk{mu_};
  auto r = enter(name);
  if (r == code::success)
    r = [&] {
      stream_state* st = nullptr;
      if (auto r = find_stream(s, st))
        return r;
      if (st->device != me().device) // a kernel goes to the current device
        return code::invalid_value;
      status fault = code::success;
      for (const auto* b : buffers) {
        if (b == nullptr && n > 0)
          return code::invalid_value;
        if (auto r = ptr_sticky(b))
          return r;
        // Every kernel here reads floats: an address that is not a multiple
        // of 4 faults on the device when the kernel runs, as on a GPU.
        if (n > 0 && reinterpret_cast<std::uintptr_t>(b) % alignof(float) != 0)
          fault = code::misaligned_address;
      }
      enqueue(*st, op{.k = op::kind::kernel, .work = std::move(work), .fault = fault}, lk);
      ++st_.kernels_launched;
      return code::success;
    }();
  auto& t = me();
  if (r == code::success)
    r = t.last_error;
  t.last_error = code::success;
  cv_.notify_all();
  return r;
}

status fake_api::launch_fill(float* dst, std::size_t n, float value, stream_t s) {
  return launch("launch_fill", s, {dst}, n, [=] {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = value;
  });
}

status fake_api::launch_iota(float* dst, std::size_t n, double start, stream_t s) {
  return launch("launch_iota", s, {dst}, n, [=] {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = static_cast<float>(start + static_cast<double>(i));
  });
}

status fake_api::launch_scale(float* dst, std::size_t n, float factor, stream_t s) {
  return launch("launch_scale", s, {dst}, n, [=] {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] *= factor;
  });
}

status fake_api::launch_axpy(float* y, float a, const float* x, std::size_t n, stream_t s) {
  return launch("launch_axpy", s, {y, x}, n, [=] {
    for (std::size_t i = 0; i < n; ++i)
      y[i] += a * x[i];
  });
}

status fake_api::launch_add(float* dst, const float* src, std::size_t n, stream_t s) {
  return launch("launch_add", s, {dst, src}, n, [=] {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] += src[i];
  });
}

status fake_api::launch_spin(int64_t ns, stream_t s) {
  if (ns < 0) {
    return call("launch_spin", [&](auto&) {
      stream_state* st = nullptr;
      if (auto r = find_stream(s, st))
        return r;
      return code::invalid_value;
    });
  }
  return launch("launch_spin", s, {}, 0, [ns] {
    auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
    while (std::chrono::steady_clock::now() < until) {
    }
  });
}

// -- Errors ------------------------------------------------------------------

namespace {
/// What the fake runtime says of each code it returns: the CUDA runtime's
/// `cudaGetErrorName` and `cudaGetErrorString` for it, side by side.
struct error_text {
  status code;
  const char* name;
  const char* text;
};
constexpr error_text error_texts[] = {
  {code::success, "cudaSuccess", "no error"},
  {code::invalid_value, "cudaErrorInvalidValue", "invalid argument"},
  {code::memory_allocation, "cudaErrorMemoryAllocation", "out of memory"},
  {code::insufficient_driver, "cudaErrorInsufficientDriver",
   "CUDA driver version is insufficient for CUDA runtime version"},
  {code::no_device, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
  {code::invalid_device, "cudaErrorInvalidDevice", "invalid device ordinal"},
  {code::not_ready, "cudaErrorNotReady", "device not ready"},
  {code::illegal_address, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
  {code::launch_out_of_resources, "cudaErrorLaunchOutOfResources",
   "too many resources requested for launch"},
  {code::launch_timeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
  {code::peer_access_already_enabled, "cudaErrorPeerAccessAlreadyEnabled",
   "peer access is already enabled"},
  {code::assert_failed, "cudaErrorAssert", "device-side assert triggered"},
  {code::hardware_stack_error, "cudaErrorHardwareStackError", "hardware stack error"},
  {code::illegal_instruction, "cudaErrorIllegalInstruction",
   "an illegal instruction was encountered"},
  {code::misaligned_address, "cudaErrorMisalignedAddress", "misaligned address"},
  {code::invalid_address_space, "cudaErrorInvalidAddressSpace",
   "operation not supported on global/shared address space"},
  {code::invalid_pc, "cudaErrorInvalidPc", "invalid program counter"},
  {code::launch_failure, "cudaErrorLaunchFailure", "unspecified launch failure"},
  {code::ecc_uncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
  {code::nvlink_uncorrectable, "cudaErrorNvlinkUncorrectable",
   "uncorrectable NVLink error detected during the execution"},
  {code::contained, "cudaErrorContained",
   "Invalid access of peer GPU memory over nvlink or a hardware error"},
  {code::external_device, "cudaErrorExternalDevice",
   "an async error has occurred in an external device"},
  {code::unknown, "cudaErrorUnknown", "unknown error"},
  {code::not_permitted, "cudaErrorNotPermitted", "operation not permitted"},
};

const error_text* find_error_text(status s) {
  for (const auto& e : error_texts)
    if (e.code == s)
      return &e;
  return nullptr;
}
} // namespace

std::string fake_api::error_name(status s) {
  {
    std::lock_guard guard{mu_};
    ++st_.calls["error_name"];
    cv_.notify_all();
  }
  if (const auto* e = find_error_text(s))
    return e->name;
  return fmt::format("cudaError{}", s);
}

std::string fake_api::error_string(status s) {
  {
    std::lock_guard guard{mu_};
    ++st_.calls["error_string"];
    cv_.notify_all();
  }
  if (const auto* e = find_error_text(s))
    return e->text;
  return "unrecognized error code";
}

// -- Test controls -----------------------------------------------------------

void fake_api::set_no_driver(bool on) {
  std::lock_guard guard{mu_};
  no_driver_ = on;
  cv_.notify_all();
}

void fake_api::fail_next(std::string call, status s) {
  std::lock_guard guard{mu_};
  fail_next_[std::move(call)].push_back(s);
  cv_.notify_all();
}

void fake_api::make_sticky(int device, status s) {
  check_device(device, "make_sticky");
  if (s == code::success)
    throw std::invalid_argument("fake_api::make_sticky: status 0 is not an error");
  std::lock_guard guard{mu_};
  make_sticky_locked(device, s);
}

void fake_api::fail_kernel_sticky(int device, status s) {
  check_device(device, "fail_kernel_sticky");
  if (s == code::success)
    throw std::invalid_argument("fake_api::fail_kernel_sticky: status 0 is not an error");
  std::lock_guard guard{mu_};
  dev(device).fail_kernel = s;
  cv_.notify_all();
}

void fake_api::set_queue_limit(std::size_t ops) {
  std::lock_guard guard{mu_};
  queue_limit_ = std::max<std::size_t>(ops, 1);
  cv_.notify_all();
}

void fake_api::pause(int device) {
  check_device(device, "pause");
  std::lock_guard guard{mu_};
  dev(device).paused = true;
  cv_.notify_all();
}

void fake_api::resume(int device) {
  check_device(device, "resume");
  std::lock_guard guard{mu_};
  dev(device).paused = false;
  cv_.notify_all();
}

fake_stats fake_api::stats() const {
  std::lock_guard guard{mu_};
  return st_;
}

std::size_t fake_api::bytes_held(int device) const {
  check_device(device, "bytes_held");
  std::lock_guard guard{mu_};
  return devs_[static_cast<std::size_t>(device)].held;
}

uint64_t fake_api::mem_pools_configured(int device) const {
  check_device(device, "mem_pools_configured");
  std::lock_guard guard{mu_};
  return devs_[static_cast<std::size_t>(device)].pools_configured;
}

bool fake_api::wait_until(std::function<bool(const fake_stats&)> pred,
                          std::chrono::milliseconds limit) const {
  std::unique_lock lk{mu_};
  return cv_.wait_for(lk, limit, [&] { return pred(st_); });
}

} // namespace multidev::detail::cuda
