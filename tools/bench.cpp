#include "bench.hpp"

#include "scenario/scenario.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/node_id.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <malloc.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <unistd.h>

#include <multidev/kernels.hpp>
#include <multidev/protocol.hpp>

#include "bench_peers.hpp"
#include "gradient_merge.hpp"

extern char** environ;

namespace multidev::tools {

namespace {

using clock_type = std::chrono::steady_clock;

/// Copies per bandwidth sample: a few back to back smooth out the guest's
/// memory-bandwidth noise.
constexpr int copies_per_sample = 4;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

/// Runs each of `fns` in turn, `repeats` rounds, so drift on a shared machine
/// hits them alike; the medians of what each returns, in the order of `fns`.
/// One unrecorded round first warms caches, pages and sleeping threads.
std::vector<double> medians_of(int repeats, const std::vector<std::function<double()>>& fns) {
  for (const auto& f : fns)
    f();
  std::vector<std::vector<double>> xs(fns.size());
  for (int i = 0; i < repeats; ++i)
    for (std::size_t j = 0; j < fns.size(); ++j)
      xs[j].push_back(fns[j]());
  std::vector<double> ms;
  for (auto& x : xs)
    ms.push_back(median(std::move(x)));
  return ms;
}

/// `medians_of` for one baseline and multidev: {baseline, ours}.
template <class Base, class Ours>
std::pair<double, double> medians(int repeats, Base base, Ours ours) {
  auto ms = medians_of(repeats, {base, ours});
  return {ms[0], ms[1]};
}

bench_result make(std::string name, std::string unit, double value, std::string baseline,
                  double baseline_value, std::string better, std::optional<double> target) {
  bench_result r{std::move(name), std::move(unit), value, std::move(baseline),
                 baseline_value, value / baseline_value, std::move(better), target};
  return r;
}

// -- baselines ------------------------------------------------------------------

/// The counter the independent_tasks items bump (multidev, the mutex+cv
/// queue, the SPSC ring: the same work for all three), alone on its cache
/// line. A counter on the producer's stack shares a line with the
/// producer's frame: each item the consumer runs then pulls that line away,
/// and the producer's next push misses on its own stack (~130 ns a line on
/// this guest). That charged whichever queue's consumer ran on another CPU
/// about 30 ns per task that is not the queue's, and the ring, whose counter
/// was a global, never paid it.
struct alignas(64) item_counter {
  std::atomic<int> value{0};
};
static_assert(sizeof(item_counter) == 64);
item_counter items_run;

/// The textbook queue: std::function under a mutex, a condition variable
/// notified on every push, one consumer thread.
class cv_queue {
public:
  cv_queue() : worker_([this] { loop(); }) {}
  ~cv_queue() {
    {
      std::lock_guard g{mu_};
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }
  void push(std::function<void()> f) {
    {
      std::lock_guard g{mu_};
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock lk{mu_};
        cv_.wait(lk, [this] { return stop_ || !q_.empty(); });
        if (q_.empty())
          return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::thread worker_;
};

/// ns per task: push n tasks, wait until the last one ran. The queue (and
/// its thread) lives across samples, like a device's runner.
double cv_queue_ns_per_task(cv_queue& q, int n) {
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    q.push([] { items_run.value.fetch_add(1, std::memory_order_relaxed); });
  std::promise<void> all;
  q.push([&all] { all.set_value(); });
  all.get_future().wait();
  return seconds_since(t0) * 1e9 / n;
}

/// ns per hop: two threads hand a token back and forth by spinning on one
/// atomic (pauses, a yield every 4,096 in case both share a CPU): the least
/// a hand-off between two threads costs, with no sleep and no wake-up.
double spin_ping_pong_ns_per_hop(int hops) {
  std::atomic<int> turn{-1};
  auto player = [&turn, hops](int me) {
    for (int i = me; i < hops; i += 2) {
      for (int spins = 1; turn.load(std::memory_order_acquire) != i; ++spins) {
        if (spins % 4096 == 0)
          std::this_thread::yield();
        else
          __builtin_ia32_pause();
      }
      turn.store(i + 1, std::memory_order_release);
    }
  };
  std::thread other(player, 1);
  auto t0 = clock_type::now();
  turn.store(0, std::memory_order_release);
  player(0);
  other.join();
  return seconds_since(t0) * 1e9 / hops;
}

/// us per round of `fan_dag_<N>dev`'s DAG on N plain threads, one per
/// device, with no queue and no task objects: thread 0 runs the source,
/// releases the others (an atomic round counter), each runs its share of
/// the `width` empty tasks, counts itself done, and thread 0 runs the sink
/// once all are. Waits poll 256 pauses, then sleep (atomic wait/notify): a
/// plain thread per device for this DAG, its waits not tuned further, so a
/// comparison rather than a proven floor.
double threads_fan_dag_us(int n, int width, int rounds) {
  std::atomic<int> go{-1};
  std::atomic<int> done{0};
  auto wait_until = [](std::atomic<int>& a, auto ready) {
    for (int spins = 0;; ++spins) {
      int v = a.load(std::memory_order_acquire);
      if (ready(v))
        return;
      if (spins < 256)
        __builtin_ia32_pause();
      else
        a.wait(v, std::memory_order_acquire);
    }
  };
  auto empty = [] { asm volatile("" ::: "memory"); }; // an empty task, not optimised away
  auto share = [n, width, empty](int me) {
    for (int i = me; i < width; i += n)
      empty();
  };
  std::vector<std::thread> workers;
  for (int j = 1; j < n; ++j)
    workers.emplace_back([&, j] {
      for (int r = 0; r < rounds; ++r) {
        wait_until(go, [r](int v) { return v >= r; });
        share(j);
        done.fetch_add(1, std::memory_order_acq_rel);
        done.notify_one();
      }
    });
  auto t0 = clock_type::now();
  for (int r = 0; r < rounds; ++r) {
    empty(); // the source
    go.store(r, std::memory_order_release);
    go.notify_all();
    share(0);
    int want = (n - 1) * (r + 1);
    wait_until(done, [want](int v) { return v >= want; });
    empty(); // the sink
  }
  auto us = seconds_since(t0) * 1e6 / rounds;
  for (auto& w : workers)
    w.join();
  return us;
}

/// ns per hop: two threads hand a token back and forth with atomic wait/notify.
double atomic_ping_pong_ns_per_hop(int hops) {
  std::atomic<int> turn{0};
  auto player = [&turn, hops](int me) {
    for (int i = me; i < hops; i += 2) {
      int v;
      while ((v = turn.load(std::memory_order_acquire)) != i)
        turn.wait(v);
      turn.store(i + 1, std::memory_order_release);
      turn.notify_one();
    }
  };
  auto t0 = clock_type::now();
  std::thread other(player, 1);
  player(0);
  other.join();
  return seconds_since(t0) * 1e9 / hops;
}

/// The lock-free floor under a task queue: one producer thread pushes plain
/// function pointers into a ring, one long-lived consumer thread pops and
/// calls them. Producer- and consumer-written fields sit on separate cache
/// lines (NOTES.md: each line that moves between the vCPUs costs up to
/// ~130 ns), the consumer publishes its position once per batch, and both
/// prefetch the slots ahead. An idle consumer spins briefly, then sleeps on
/// `sleeping_`; the producer wakes it when it sees the flag, and again while
/// it waits for room or for the ring to drain, so a wake-up missed by a push
/// (the flag read may pass the position store) is made good there.
/// `Slot`: a function pointer (8 bytes, the floor), or `std::function` (32
/// bytes: what a task's closure is when it reaches a device), which the
/// consumer destroys once called, as a runner does.
template <class Slot>
class spsc_ring {
public:
  spsc_ring() : worker_([this] { loop(); }) {}
  ~spsc_ring() {
    stop_.store(true);
    wake();
    worker_.join();
  }
  spsc_ring(const spsc_ring&) = delete;
  spsc_ring& operator=(const spsc_ring&) = delete;

  void push(Slot f) {
    auto h = producer_.head;
    if (h - producer_.tail == capacity)
      wait_until([&] { return h - (producer_.tail = tail_.load(std::memory_order_acquire))
                              < capacity; });
    __builtin_prefetch(&slots_[(h + prefetch_distance) & mask], 1);
    slots_[h & mask] = std::move(f);
    producer_.head = h + 1;
    head_.store(h + 1, std::memory_order_release);
    if (sleeping_.load(std::memory_order_relaxed))
      wake();
  }

  /// Returns once the consumer has called everything pushed so far.
  void drain() {
    auto h = producer_.head;
    wait_until([&] { return tail_.load(std::memory_order_acquire) == h; });
    producer_.tail = h;
  }

private:
  static constexpr std::size_t capacity = 4096;
  static constexpr std::size_t mask = capacity - 1;
  static constexpr std::size_t prefetch_distance = 16;
  static constexpr int spins_before_sleep = 4096;

  static void pause() { __builtin_ia32_pause(); }

  /// Producer side: spins, then yields, until `done()`, waking a sleeping
  /// consumer on the way.
  template <class Pred>
  void wait_until(Pred done) {
    for (int i = 0; !done(); ++i) {
      if (sleeping_.load(std::memory_order_relaxed))
        wake();
      if (i < 64)
        pause();
      else
        std::this_thread::yield();
    }
  }

  void wake() {
    sleeping_.store(0, std::memory_order_seq_cst);
    sleeping_.notify_one();
  }

  void loop() {
    std::size_t t = 0;
    for (;;) {
      std::size_t h = head_.load(std::memory_order_acquire);
      for (int spins = 0; h == t; h = head_.load(std::memory_order_acquire)) {
        if (stop_.load(std::memory_order_relaxed))
          return;
        if (++spins < spins_before_sleep) {
          pause();
          continue;
        }
        sleeping_.store(1, std::memory_order_seq_cst);
        if (head_.load(std::memory_order_seq_cst) == t && !stop_.load())
          sleeping_.wait(1);
        sleeping_.store(0, std::memory_order_relaxed);
        spins = 0;
      }
      for (; t != h; ++t) {
        __builtin_prefetch(&slots_[(t + prefetch_distance) & mask]);
        slots_[t & mask]();
        if constexpr (!std::is_pointer_v<Slot>)
          slots_[t & mask] = nullptr;
      }
      tail_.store(t, std::memory_order_release);
    }
  }

  struct alignas(64) producer_state {
    std::size_t head = 0; // next slot to write
    std::size_t tail = 0; // the consumer's position as last seen
  };
  producer_state producer_;
  alignas(64) std::atomic<std::size_t> head_{0};
  alignas(64) std::atomic<std::size_t> tail_{0};
  alignas(64) std::atomic<int> sleeping_{0};
  alignas(64) std::atomic<bool> stop_{false};
  alignas(64) std::array<Slot, capacity> slots_{};
  std::thread worker_; // last: starts once everything above exists
};

/// A function pointer padded to the size of a device queue's entry (a
/// task's `std::function` and the pointer to its extra): the ring then moves
/// as many bytes an item between the threads as a device's queue does, and
/// does no more with them than the ring of plain function pointers. On this
/// guest the ring's cost an item follows the bytes a slot holds, not what
/// the consumer does with them (docs/design.md, "What a dependency hop
/// executes").
struct entry_sized_slot {
  void (*f)() = nullptr;
  std::array<std::byte, 32> rest{};
  entry_sized_slot() = default;
  entry_sized_slot(void (*g)()) : f(g) {}
  entry_sized_slot& operator=(std::nullptr_t) {
    f = nullptr;
    return *this;
  }
  void operator()() const { f(); }
};
static_assert(sizeof(entry_sized_slot) == sizeof(std::function<void()>) + sizeof(void*));

/// What the ring's items do: the same work as the tasks it is compared with.
void ring_item() {
  items_run.value.fetch_add(1, std::memory_order_relaxed);
}

/// ns per item: push n function pointers (as `Slot`s), wait until the last
/// one ran.
template <class Slot>
double spsc_ring_ns_per_item(spsc_ring<Slot>& q, int n) {
  int before = items_run.value.load();
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    q.push(&ring_item);
  q.drain();
  auto ns = seconds_since(t0) * 1e9 / n;
  if (items_run.value.load() - before != n) // the floor must do the whole job
    throw std::logic_error("multidev bench: the SPSC ring lost items");
  return ns;
}

// -- CAF baselines ---------------------------------------------------------------

/// `cfg` set up as a backend's own actor system is (actors/backend.cpp, kept in
/// step by hand): `configure_system` (the middleman, the work-sharing
/// scheduler) with `opts.scheduler_threads` workers (0: the hardware threads).
void configure_like_backend(caf::actor_system_config& cfg, const backend_options& opts) {
  auto threads = opts.scheduler_threads > 0
                   ? opts.scheduler_threads
                   : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  configure_system(cfg);
  cfg.set("scheduler.max-threads", static_cast<size_t>(threads));
}

using hop_atom = caf::atom_constant<caf::atom("hop")>;
using start_atom = caf::atom_constant<caf::atom("start")>;

/// Exchanges finished by `hop_player`s; the host thread waits on it.
struct hop_counter {
  std::atomic<int> finished{0};
};

/// An event-based actor that passes `hop` back to its sender, counting down;
/// the one that receives the last hop bumps `done`. `(start, other, n)` sends
/// the first of n hops to `other` (a local actor or a remote proxy).
caf::behavior hop_player(caf::event_based_actor* self, hop_counter* done) {
  return {
    [=](start_atom, const caf::actor& other, int hops) {
      self->send(other, hop_atom::value, hops);
    },
    [=](hop_atom, int left) {
      if (left > 1) {
        self->send(caf::actor_cast<caf::actor>(self->current_sender()), hop_atom::value,
                   left - 1);
        return;
      }
      done->finished.fetch_add(1, std::memory_order_release);
      done->finished.notify_one();
    },
  };
}

/// Seconds for `hops` hops between `from` and `to` (`from` sends the first),
/// from the host's start message until the last hop arrived.
double hop_seconds(const caf::actor& from, const caf::actor& to, hop_counter& done, int hops) {
  int before = done.finished.load(std::memory_order_acquire);
  auto t0 = clock_type::now();
  caf::anon_send(from, start_atom::value, to, hops);
  for (int v; (v = done.finished.load(std::memory_order_acquire)) == before;)
    done.finished.wait(v);
  return seconds_since(t0);
}

/// Stops an actor when it goes out of scope: ~actor_system waits for every
/// actor still alive (NOTES.md, pitfall 4).
struct actor_stopper {
  caf::actor a;
  ~actor_stopper() {
    if (a)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
};

/// Two event-based actors ping-ponging a message in an actor system
/// configured as a backend's own: the CAF hop that a multidev dependency
/// hop is compared with. Build and destroy on one thread (NOTES.md, pitfall 9).
/// On the work-sharing scheduler both actors run on its workers, and most
/// hops stay on the worker that sent them: the receiver is queued while the
/// sender's worker is still awake to take it. `with_detached`: a second pair
/// in the same system, each actor on a thread of its own (`caf::detached`),
/// so that every hop crosses threads, as every multidev hop between two
/// devices does.
class caf_ping_pong {
public:
  caf_ping_pong(const backend_options& opts, bool with_detached) {
    configure_like_backend(cfg_, opts);
    sys_.emplace(cfg_);
    spawn_pair<caf::no_spawn_options>(sharing_);
    if (with_detached)
      spawn_pair<caf::detached>(detached_);
  }
  double ns_per_hop(int hops) { return ns_per_hop(sharing_, hops); }
  double ns_per_hop_detached(int hops) { return ns_per_hop(detached_, hops); }

private:
  struct pair {
    actor_stopper a, b;
  };
  template <caf::spawn_options Os>
  void spawn_pair(pair& p) {
    p.a.a = sys_->spawn<Os>(hop_player, &done_);
    p.b.a = sys_->spawn<Os>(hop_player, &done_);
  }
  double ns_per_hop(const pair& p, int hops) {
    return hop_seconds(p.a.a, p.b.a, done_, hops) * 1e9 / hops;
  }

  caf::actor_system_config cfg_;
  std::optional<caf::actor_system> sys_;
  hop_counter done_;
  pair sharing_, detached_; // stopped before sys_ goes
};

// -- remote baselines ------------------------------------------------------------

[[noreturn]] void throw_errno(const char* what) {
  throw std::runtime_error(fmt::format("multidev bench: {}: {}", what, std::strerror(errno)));
}

/// A file descriptor that closes itself.
struct unique_fd {
  int fd = -1;
  explicit unique_fd(int f) : fd(f) {
    if (fd < 0)
      throw_errno("socket");
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { ::close(fd); }
};

/// A TCP connection on 127.0.0.1 between two sockets of this process,
/// `client` and `server`, both blocking; TCP_NODELAY when asked.
struct loopback_connection {
  explicit loopback_connection(bool no_delay)
    : listener(::socket(AF_INET, SOCK_STREAM, 0)), client(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0
        || ::listen(listener.fd, 1) != 0
        || ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      throw_errno("listen on 127.0.0.1");
    if (::connect(client.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0)
      throw_errno("connect to 127.0.0.1");
    server.emplace(::accept(listener.fd, nullptr, nullptr));
    int one = 1;
    if (no_delay)
      for (int fd : {client.fd, server->fd})
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  /// Writes (or reads) all `n` bytes at `buf`; false on end of file or error.
  static bool transfer(int fd, char* buf, std::size_t n, bool write) {
    for (std::size_t done = 0; done < n;) {
      auto k = write ? ::write(fd, buf + done, n - done) : ::read(fd, buf + done, n - done);
      if (k <= 0)
        return false;
      done += static_cast<std::size_t>(k);
    }
    return true;
  }

  unique_fd listener, client;
  std::optional<unique_fd> server;
};

/// The floor under any remote round trip here: 64 bytes ping-ponged over a
/// TCP connection on 127.0.0.1 (TCP_NODELAY) between this thread and an echo
/// thread, both blocking in read.
class tcp_ping_pong {
public:
  tcp_ping_pong() : conn_(true) {
    echo_ = std::thread([fd = conn_.server->fd] {
      std::array<char, message_bytes> buf{};
      while (transfer(fd, buf.data(), false) && transfer(fd, buf.data(), true)) {
      }
    });
  }
  ~tcp_ping_pong() {
    ::shutdown(conn_.client.fd, SHUT_RDWR); // the echo thread reads end of file
    echo_.join();
  }

  double us_per_round_trip(int n) {
    std::array<char, message_bytes> buf{};
    auto t0 = clock_type::now();
    for (int i = 0; i < n; ++i)
      if (!transfer(conn_.client.fd, buf.data(), true)
          || !transfer(conn_.client.fd, buf.data(), false))
        throw_errno("TCP ping-pong");
    return seconds_since(t0) * 1e6 / n;
  }

private:
  static constexpr std::size_t message_bytes = 64;

  static bool transfer(int fd, char* buf, bool write) {
    return loopback_connection::transfer(fd, buf, message_bytes, write);
  }

  loopback_connection conn_;
  std::thread echo_;
};

/// The floor under a copy between two nodes of one machine: `n` bytes sent
/// over a TCP connection on 127.0.0.1 by a writer thread, from a buffer of
/// its own, and read by this thread into another, both blocking.
class tcp_stream {
public:
  explicit tcp_stream(std::size_t n) : conn_(false), from_(n, 1), to_(n, 0) {}

  /// GB/s of one transfer, from the writer's start to the last byte read.
  double gbps() {
    auto t0 = clock_type::now();
    bool sent = false;
    std::thread writer([&] {
      sent = loopback_connection::transfer(conn_.client.fd, from_.data(), from_.size(), true);
    });
    bool got = loopback_connection::transfer(conn_.server->fd, to_.data(), to_.size(), false);
    auto secs = seconds_since(t0);
    writer.join();
    if (!sent || !got)
      throw_errno("TCP transfer");
    return static_cast<double>(to_.size()) / secs / 1e9;
  }

private:
  loopback_connection conn_;
  std::vector<char> from_, to_;
};

/// Two actor systems with the middleman, each configured as a backend's own
/// (`configure_like_backend`), connected over TCP on 127.0.0.1: `server()`
/// publishes actors, `client()` reaches them through proxies. The setup that
/// every remote figure shares (`caf_remote_round_trip`, `remote_hop`). Both
/// live in this process: CAF 0.17.6 gives each actor system of a process its
/// own node id (the last byte of the host id counts the systems started), so
/// BASP accepts the connection; `connect` checks that what it
/// returns is a proxy of the server's node. Build, use and destroy on one
/// thread (NOTES.md, pitfall 9), after stopping the actors spawned on it.
class remote_pair {
public:
  explicit remote_pair(const backend_options& opts) {
    for (auto* cfg : {&server_cfg_, &client_cfg_}) {
      configure_like_backend(*cfg, opts);
    }
    server_.emplace(server_cfg_);
    client_.emplace(client_cfg_);
  }
  caf::actor_system& server() { return *server_; }
  caf::actor_system& client() { return *client_; }

  /// `a`, an actor of `server()`, as `client()` sees it: published on an
  /// ephemeral port of 127.0.0.1 and looked up with `remote_actor`. BASP
  /// keeps one connection per pair of nodes, so every proxy uses the same.
  caf::actor connect(const caf::actor& a) {
    auto port = server_->middleman().publish(a, 0, "127.0.0.1");
    if (!port)
      throw std::runtime_error("multidev bench: publish: " + server_->render(port.error()));
    auto proxy = client_->middleman().remote_actor("127.0.0.1", *port);
    if (!proxy)
      throw std::runtime_error("multidev bench: remote_actor: "
                               + client_->render(proxy.error()));
    if (proxy->node() != server_->node() || proxy->node() == client_->node())
      throw std::runtime_error("multidev bench: remote_actor returned no proxy of the "
                               "server's node (same node ids?)");
    return *proxy;
  }

private:
  caf::actor_system_config server_cfg_, client_cfg_;
  std::optional<caf::actor_system> server_, client_;
};

/// The kernel the remote figures schedule: it does nothing.
void register_bench_noop() {
  static const bool registered = [] {
    kernel_def def;
    def.body = [](kernel_call&) {};
    def.doc = "bench_noop: does nothing (`multidev bench` remote figures)";
    register_kernel("bench_noop", std::move(def));
    return true;
  }();
  (void)registered;
}

/// Holds a device's runner with a task that waits for a flag, so that what
/// is scheduled meanwhile queues behind it, until `release`. The destructor
/// releases too, so that a figure that throws while scheduling never leaves
/// a runner blocked (its backend could not shut down); the task shares the
/// flag, which therefore outlives it.
class runner_hold {
public:
  runner_hold(backend& b, const device& d) {
    b.schedule_task(d, task{{}, [go = go_] { go->wait(false); }, {}});
  }
  ~runner_hold() { release(); }
  runner_hold(const runner_hold&) = delete;
  runner_hold& operator=(const runner_hold&) = delete;
  void release() noexcept {
    go_->store(true);
    go_->notify_one();
  }

private:
  std::shared_ptr<std::atomic<bool>> go_ = std::make_shared<std::atomic<bool>>(false);
};

/// us per crossing of a chain of waits that goes back and forth between
/// `local` and `remote` (a device of another actor system, reached through
/// its actor over the connection): each crossing is a wait of one device on
/// the other's event. The chain is built while `local` is held, then timed
/// from its release to the last event, like `will_wait_for_chain`.
double remote_us_per_hop(backend& b, const device& local, const device& remote,
                         int crossings) {
  register_bench_noop();
  context lctx = b.make_context(local), rctx = b.make_context(remote);
  runner_hold hold{b, local};
  event last = b.all_work(local);
  for (int i = 0; i < crossings / 2; ++i) {
    b.will_wait_for(rctx, last); // remote waits on local
    auto theirs = b.schedule_named(remote, task_spec{"bench_noop", {}});
    b.will_wait_for(lctx, theirs); // local waits on remote
    b.schedule_task(local, task{{}, [] {}, {}});
    last = b.all_work(local);
  }
  auto t0 = clock_type::now();
  hold.release();
  b.sync(last);
  return seconds_since(t0) * 1e6 / (2 * (crossings / 2));
}

/// A CAF remote round trip: `hop_player`s on both systems of `pair`, the
/// server's reached through its proxy.
class caf_remote_ping_pong {
public:
  explicit caf_remote_ping_pong(remote_pair& pair) {
    pong_.a = pair.server().spawn(hop_player, &done_);
    ping_.a = pair.client().spawn(hop_player, &done_);
    proxy_ = pair.connect(pong_.a);
  }
  double us_per_round_trip(int n) { return hop_seconds(ping_.a, proxy_, done_, 2 * n) * 1e6 / n; }
  /// One message across the connection, either way: half a round trip.
  double us_per_hop(int hops) { return hop_seconds(ping_.a, proxy_, done_, hops) * 1e6 / hops; }

private:
  hop_counter done_;
  actor_stopper pong_, ping_;
  caf::actor proxy_;
};

/// GB/s of a plain memcpy of `n` bytes between the very buffers the device
/// copy uses, timed on the runner thread of `d` itself: the guest's vCPUs and
/// pages differ in memory bandwidth, so the baseline runs where the device's
/// copies run, on the same memory, and without multidev's scheduling.
double memcpy_gbps(backend& b, const device& d, std::byte* dst, const std::byte* src,
                   std::size_t n) {
  double secs = 0;
  b.schedule_task(d, task{"memcpy baseline",
                          [&] {
                            auto t0 = clock_type::now();
                            for (int i = 0; i < copies_per_sample; ++i)
                              std::memcpy(dst, src, n);
                            secs = seconds_since(t0);
                          },
                          {}});
  b.sync(b.all_work(d));
  return static_cast<double>(n) * copies_per_sample / secs / 1e9;
}

/// Where `ctx` keeps `t`, as `ctx.device`'s runner sees it (for the memcpy
/// baselines): a kernel linked against `ctx` reports its buffer's address,
/// through the public kernel API only.
std::byte* node_bytes(backend& b, const context& ctx, const tnode& t) {
  auto address = std::make_shared<std::atomic<std::byte*>>(nullptr);
  kernel_def def;
  def.params = {arg_kind::buffer};
  def.reads = {0};
  def.body = [address](kernel_call& call) { address->store(call.buffer(0).data()); };
  def.doc = "bench_node_address NODE: reports NODE's address to `multidev bench`";
  register_kernel("bench_node_address", std::move(def));
  b.sync(b.run(b.link(ctx, "bench_node_address", {t})));
  return address->load();
}

/// Bytes of the pool `pool_calls` allocates, zeroes and frees.
constexpr std::size_t pool_call_bytes = 4096;

/// ns per `std::aligned_alloc` + `memset` + `free` of 4 KiB on this thread.
double aligned_alloc_ns_per_iteration(int n) {
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) {
    void* p = std::aligned_alloc(64, pool_call_bytes);
    std::memset(p, 0, pool_call_bytes);
    asm volatile("" : : "r"(p) : "memory"); // keep the allocation and the memset
    std::free(p);
  }
  return seconds_since(t0) * 1e9 / n;
}

/// CPU time of the whole process (every thread), in seconds.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// CPU ms per second of wall time the process spends over `window_s` while
/// this thread sleeps: with nothing else running, what the idle backend costs.
double idle_cpu_ms_per_s(double window_s) {
  auto w0 = clock_type::now();
  double c0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
  double c1 = process_cpu_seconds();
  return (c1 - c0) * 1e3 / seconds_since(w0);
}

/// Devices, settling time and window of `idle_cpu_8dev`.
constexpr int idle_devices = 8;
constexpr auto idle_settle = std::chrono::milliseconds(100);

/// `idle_cpu_ms_per_s` of `b` once all its devices exist and have settled.
double idle_backend_cpu(backend& b, double window_s) {
  for (int i = 0; i < idle_devices; ++i)
    b.get_device(i);
  std::this_thread::sleep_for(idle_settle);
  return idle_cpu_ms_per_s(window_s);
}

std::vector<std::byte> random_bytes(std::size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng{42};
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    auto x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  return v;
}

// -- multidev figures ----------------------------------------------------------

/// The work of the independent_tasks items: counts itself, captures nothing.
void count_item() {
  items_run.value.fetch_add(1, std::memory_order_relaxed);
}

/// What `independent_tasks_described` and `bytes_per_queued_task_described`
/// name each task, copied into each as a user naming a task does. Within
/// std::string's inline room: the figures are what multidev does with a
/// description, not the caller's allocation of its string (past 15
/// characters, a malloc and a free on the caller's thread, ~20 ns here).
constexpr std::string_view described_task_name = "layer_3 matmul";

/// A task of `count_item`, bare or with `described_task_name`.
task counting_task(bool described) {
  return described ? task{std::string{described_task_name}, [] { count_item(); }, {}}
                   : task{{}, [] { count_item(); }, {}};
}

/// ns per task of `n` tasks scheduled back to back on `d` from this thread,
/// then waited for: bare closures, or the same with a description.
double multidev_ns_per_task(backend& b, const device& d, int n, bool described = false) {
  auto t0 = clock_type::now();
  if (described) {
    for (int i = 0; i < n; ++i)
      b.schedule_task(d, counting_task(true));
  } else {
    for (int i = 0; i < n; ++i)
      b.schedule_task(d, counting_task(false));
  }
  b.sync(b.all_work(d));
  return seconds_since(t0) * 1e9 / n;
}

/// ns per alloc_pool + memset_zero + free_pool of 4 KiB from this host
/// thread on `d`, `n` times, then waiting for `d`.
double multidev_pool_calls_ns(backend& b, const device& d, int n) {
  constexpr int pool_id = 1'000'000; // far from the ids alloc_node hands out
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) {
    b.alloc_pool(d, pool_id, pool_call_bytes, 64);
    b.memset_zero(d, pool_id, 0, pool_call_bytes);
    b.free_pool(d, pool_id);
  }
  b.sync(b.all_work(d));
  return seconds_since(t0) * 1e9 / n;
}

/// ns per hop of a chain of empty tasks alternating between two devices,
/// each waiting for the previous one through will_wait_for. `prebuilt`: the
/// chain is scheduled while device 0 is held, and only its execution is timed
/// (the dependency latency); otherwise the host schedules it while it runs.
double multidev_ns_per_hop(backend& b, const device& d0, const device& d1, int hops,
                           bool prebuilt) {
  context ctx[2] = {b.make_context(d0), b.make_context(d1)};
  runner_hold hold{b, d0};
  if (!prebuilt)
    hold.release(); // the chain runs as it is scheduled
  auto t0 = clock_type::now();
  event last = b.all_work(d0);
  for (int i = 1; i <= hops; ++i) {
    auto& c = ctx[i % 2];
    b.will_wait_for(c, last);
    b.schedule_task(c.device, task{{}, [] {}, {}});
    last = b.all_work(c.device);
  }
  if (prebuilt) {
    t0 = clock_type::now();
    hold.release();
  }
  b.sync(last);
  return seconds_since(t0) * 1e9 / hops;
}

/// `will_wait_for_chain_replay`: the chain of `multidev_ns_per_hop`, 64
/// hops a round, recorded once (issue 41) and replayed until `hops` hops
/// ran; timed from the first replay to the last hop, the host's replays
/// included. A round starts and ends on `d0`, so replays join in `d0`'s order.
double multidev_ns_per_hop_replay(backend& b, const device& d0, const device& d1, int hops) {
  constexpr int per_round = 64;
  context ctx[2] = {b.make_context(d0), b.make_context(d1)};
  auto r = b.record("chain", [&] {
    b.schedule_task(d0, task{{}, [] {}, {}});
    event last = b.all_work(d0);
    for (int i = 1; i <= per_round; ++i) {
      auto& c = ctx[i % 2];
      b.will_wait_for(c, last);
      b.schedule_task(c.device, task{{}, [] {}, {}});
      last = b.all_work(c.device);
    }
  });
  int rounds = std::max(1, hops / per_round);
  auto t0 = clock_type::now();
  event last;
  for (int i = 0; i < rounds; ++i)
    last = b.replay(r).all_work_of(d0);
  b.sync(last);
  return seconds_since(t0) * 1e9 / (rounds * per_round);
}

} // namespace

bool bench_result::meets_target() const {
  if (!skipped.empty())
    return true;
  auto meets = [this](double x, std::optional<double> bound) {
    return !bound || (better == "lower" ? x <= *bound : x >= *bound);
  };
  return meets(ratio, target) && meets(value, value_target);
}

namespace {

bool is_wanted(const bench_options& o, const std::string& name) {
  if (!o.only.empty() && std::find(o.only.begin(), o.only.end(), name) == o.only.end())
    return false;
  return o.filter.empty() || name.find(o.filter) != std::string::npos;
}

/// An entry for a baseline that could not be measured here.
bench_result skipped_result(std::string name, std::string unit, std::string baseline,
                            std::string better, std::optional<double> target, std::string why) {
  bench_result r{std::move(name), std::move(unit), 0, std::move(baseline), 0, 0,
                 std::move(better), target};
  r.skipped = std::move(why);
  return r;
}

std::string tbb_missing() {
  return peers::have_tbb() ? std::string{} : "skipped: oneTBB not installed";
}
std::string starpu_missing() {
  return peers::have_starpu() ? std::string{} : "skipped: StarPU not installed";
}

/// One baseline of a figure: the figure's name, the baseline's label, the
/// ratio target (none: informative) and the measurement.
struct baseline_run {
  std::string figure;
  std::string label;
  std::optional<double> target;
  std::function<double()> run;
  /// Non-empty: the peer is not in this build; the entry says this instead.
  std::string missing = {};
};

/// The figures of `bases` that `o` wants, each the median of `ours` beside
/// the median of its baseline, all run in turn by `medians_of` ("lower" is
/// better). One measurement of multidev serves every baseline.
void compare(std::vector<bench_result>& out, const bench_options& o, int reps,
             const std::string& unit, std::function<double()> ours,
             std::vector<baseline_run> bases, const std::string& better = "lower") {
  std::erase_if(bases, [&o](const baseline_run& x) { return !is_wanted(o, x.figure); });
  std::vector<std::function<double()>> fns;
  for (const auto& x : bases)
    if (x.missing.empty())
      fns.push_back(x.run);
  if (fns.empty() && bases.empty())
    return;
  std::vector<double> ms;
  if (!fns.empty()) {
    fns.push_back(std::move(ours));
    ms = medians_of(reps, fns);
  }
  std::size_t k = 0;
  for (const auto& x : bases) {
    if (!x.missing.empty()) {
      out.push_back(skipped_result(x.figure, unit, x.label, better, x.target, x.missing));
      continue;
    }
    out.push_back(make(x.figure, unit, ms.back(), x.label, ms[k++], better, x.target));
  }
}

/// Bytes the heap hands out now (glibc's `mallinfo2`): what a set of
/// objects costs is the difference around making them.
std::size_t heap_in_use() {
  auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

/// An empty task: what the task figures schedule.
task empty_task() {
  return task{{}, [] {}, {}};
}

/// Heap bytes per task of `n` tasks queued on the one device of a fresh
/// backend (its queue sized for all of them) whose runner is held:
/// `counting_task`s, bare or described.
double multidev_bytes_per_queued_task(const backend_options& opts, int n, bool described) {
  auto bopts = opts;
  bopts.num_devices = 1;
  bopts.queue_capacity = static_cast<std::size_t>(n) + 16;
  backend b{bopts};
  auto d = b.get_device(0);
  runner_hold hold{b, d};
  auto before = heap_in_use();
  for (int i = 0; i < n; ++i)
    b.schedule_task(d, counting_task(described));
  double bytes = static_cast<double>(heap_in_use() - before) / n;
  hold.release();
  b.sync(b.all_work(d));
  return bytes;
}

/// The bound on what a description adds to a queued task (issue 36).
constexpr double described_task_bytes = 128;

/// One round of case 3's DAG (see `multidev_fan_dag_us`), call by call.
void schedule_fan_dag_round(backend& b, const std::vector<device>& devs,
                            const std::vector<context>& ctx, int width) {
  auto n = devs.size();
  b.schedule_task(devs[0], empty_task()); // the source
  auto source = b.all_work(devs[0]);
  for (std::size_t j = 1; j < n; ++j)
    b.will_wait_for(ctx[j], source);
  for (int i = 0; i < width; ++i)
    b.schedule_task(devs[static_cast<std::size_t>(i) % n], empty_task());
  for (std::size_t j = 1; j < n; ++j)
    b.will_wait_for(ctx[0], b.all_work(devs[j]));
  b.schedule_task(devs[0], empty_task()); // the sink
}

/// Case 3: µs per round of the fan-out/fan-in DAG on `devs`: a source task
/// on device 0, `width` empty tasks spread round-robin over the devices,
/// each after the source (one `will_wait_for` per other device; device 0's
/// own are after it in order), and a sink on device 0 after all of them
/// (one `will_wait_for` per other device). Rounds chain through device 0.
/// The host schedules every round, then waits for the last sink.
/// `prebuilt`: every round is scheduled while device 0 is held (by a task
/// that waits for a flag), and only their execution is timed, from the
/// flag's release: what oneTBB's prebuilt graph is timed on.
double multidev_fan_dag_us(backend& b, const std::vector<device>& devs,
                           const std::vector<context>& ctx, int width, int rounds,
                           bool prebuilt = false) {
  std::optional<runner_hold> hold;
  if (prebuilt)
    hold.emplace(b, devs[0]);
  auto t0 = clock_type::now();
  for (int r = 0; r < rounds; ++r)
    schedule_fan_dag_round(b, devs, ctx, width);
  if (hold) {
    t0 = clock_type::now();
    hold->release();
  }
  b.sync(b.all_work(devs[0]));
  return seconds_since(t0) * 1e6 / rounds;
}

/// `fan_dag_<N>dev_replay`: the same DAG as `multidev_fan_dag_us`, recorded
/// once as a round (issue 41) and replayed `rounds` times; timed from the
/// first replay to the last sink, so the host's replays are in the figure
/// (as the host's scheduling is in `fan_dag_<N>dev`). Rounds chain through
/// device 0 as there.
double multidev_fan_dag_replay_us(backend& b, const std::vector<device>& devs,
                                  const std::vector<context>& ctx, int width, int rounds) {
  auto r = b.record("fan_dag", [&] { schedule_fan_dag_round(b, devs, ctx, width); });
  auto t0 = clock_type::now();
  event last;
  for (int i = 0; i < rounds; ++i)
    last = b.replay(r).all_work_of(devs[0]);
  b.sync(last);
  return seconds_since(t0) * 1e6 / rounds;
}

/// Case 4, small copies: ns per 4 KiB `from_host` (back to back, then one
/// sync), beside a 4 KiB memcpy plus one empty task on the same device, and
/// beside the same copies handed to another thread through the lock-free
/// ring of `std::function` (the floor for a copy that runs elsewhere).
void copy_4k_figures(std::vector<bench_result>& out, backend& b, const device& d,
                     const bench_options& o, int reps) {
  constexpr std::size_t bytes = 4096;
  int n = o.quick ? 2'000 : 20'000;
  tnode t{900'001, "copy_4KiB", bytes, memory_mode::on_device};
  auto host = random_bytes(bytes);
  auto c = b.init_from_host(b.make_context(d), t, host);
  b.sync(b.all_work(d));
  std::vector<std::byte> dst(bytes);
  std::vector<std::byte> ring_dst(bytes);
  spsc_ring<std::function<void()>> ring;
  auto ms = medians_of(reps, {[&] {
                                auto t0 = clock_type::now();
                                for (int i = 0; i < n; ++i) {
                                  std::memcpy(dst.data(), host.data(), bytes);
                                  // Keep each copy: the compiler may not merge them.
                                  asm volatile("" : : "r"(dst.data()) : "memory");
                                }
                                return seconds_since(t0) * 1e9 / n;
                              },
                              [&] { return multidev_ns_per_task(b, d, n); },
                              [&] {
                                auto t0 = clock_type::now();
                                for (int i = 0; i < n; ++i)
                                  b.from_host(c, t, host);
                                b.sync(b.all_work(d));
                                return seconds_since(t0) * 1e9 / n;
                              },
                              [&] {
                                auto t0 = clock_type::now();
                                for (int i = 0; i < n; ++i)
                                  ring.push([to = ring_dst.data(), from = host.data()] {
                                    std::memcpy(to, from, bytes);
                                  });
                                ring.drain();
                                return seconds_since(t0) * 1e9 / n;
                              }});
  out.push_back(make("copy_4KiB", "ns/copy", ms[2], "memcpy 4KiB + one empty task",
                     ms[0] + ms[1], "lower", 3.0));
  out.push_back(make("copy_4KiB", "ns/copy", ms[2], "spsc ring of std::function, 4KiB memcpy",
                     ms[3], "lower", std::nullopt));
  b.sync_device(d);
}

/// Case 3 on a backend of 8 devices: `fan_dag_<N>dev` for N = 1, 2, 4, 8,
/// and `fan_dag_<N>dev_prebuilt`, the same rounds scheduled before they are
/// timed (informative: how the execution alone compares with oneTBB's
/// prebuilt graph, which the host builds once, not once a round).
void fan_dag_figures(std::vector<bench_result>& out, const backend_options& opts,
                     const bench_options& o) {
  const std::array<int, 4> counts{1, 2, 4, 8};
  auto name = [](int n) { return fmt::format("fan_dag_{}dev", n); };
  auto prebuilt_name = [](int n) { return fmt::format("fan_dag_{}dev_prebuilt", n); };
  auto replay_name = [](int n) { return fmt::format("fan_dag_{}dev_replay", n); };
  if (std::none_of(counts.begin(), counts.end(), [&](int n) {
        return is_wanted(o, name(n)) || is_wanted(o, prebuilt_name(n))
               || is_wanted(o, replay_name(n));
      }))
    return;
  auto bopts = opts;
  bopts.num_devices = 8;
  backend b{bopts};
  int reps = std::max(1, o.repeats);
  constexpr int width = 16;
  int rounds = o.quick ? 100 : 500;
  int starpu_rounds = std::max(1, rounds / 5);
  for (int n : counts) {
    if (!is_wanted(o, name(n)) && !is_wanted(o, prebuilt_name(n))
        && !is_wanted(o, replay_name(n)))
      continue;
    std::vector<device> devs;
    std::vector<context> ctx;
    for (int i = 0; i < n; ++i) {
      devs.push_back(b.get_device(i));
      ctx.push_back(b.make_context(devs.back()));
    }
    compare(out, o, reps, "us/round",
            [&] { return multidev_fan_dag_us(b, devs, ctx, width, rounds); },
            {{name(n), "oneTBB flow graph", 1.0,
              [&] { return peers::tbb_fan_dag_us(n, width, rounds); }, tbb_missing()},
             {name(n), "a thread per device, atomics", std::nullopt,
              [&] { return threads_fan_dag_us(n, width, rounds); },
              n == 1 ? "skipped: one device, no hand-off between threads" : std::string{}},
             {name(n), "StarPU", 1.0,
              [&] { return peers::starpu_fan_dag_us(n, width, starpu_rounds); },
              !starpu_missing().empty() ? starpu_missing()
              : n > peers::starpu_max_workers()
                ? fmt::format("skipped: this StarPU runs at most {} CPU workers",
                              peers::starpu_max_workers())
                : std::string{}}});
    compare(out, o, reps, "us/round",
            [&] { return multidev_fan_dag_us(b, devs, ctx, width, rounds, true); },
            {{prebuilt_name(n), "oneTBB flow graph", std::nullopt,
              [&] { return peers::tbb_fan_dag_us(n, width, rounds); }, tbb_missing()}});
    if (is_wanted(o, replay_name(n)))
      compare(out, o, reps, "us/round",
              [&] { return multidev_fan_dag_replay_us(b, devs, ctx, width, rounds); },
              {{replay_name(n), "oneTBB flow graph", 1.0,
                [&] { return peers::tbb_fan_dag_us(n, width, rounds); }, tbb_missing()},
               {replay_name(n), "the same rounds scheduled call by call (fan_dag)",
                std::nullopt,
                [&] { return multidev_fan_dag_us(b, devs, ctx, width, rounds); }}});
  }
}

/// Case 5: µs from scheduling a task onto a device idle for a while to
/// `sync` returning, beside pushing onto a condition-variable queue idle as
/// long and waiting for the item to run.
bench_result wake_figure(const backend_options& opts, const bench_options& o) {
  auto bopts = opts;
  bopts.num_devices = 1;
  backend b{bopts};
  auto d = b.get_device(0);
  auto idle = std::chrono::milliseconds(o.quick ? 2 : 10);
  int wakes = o.quick ? 5 : 20;
  cv_queue q;
  auto [base, ours] = medians(
    std::max(1, o.repeats),
    [&] {
      double total = 0;
      for (int i = 0; i < wakes; ++i) {
        std::this_thread::sleep_for(idle);
        auto t0 = clock_type::now();
        std::promise<void> ran;
        q.push([&ran] { ran.set_value(); });
        ran.get_future().wait();
        total += seconds_since(t0);
      }
      return total * 1e6 / wakes;
    },
    [&] {
      double total = 0;
      for (int i = 0; i < wakes; ++i) {
        std::this_thread::sleep_for(idle);
        auto t0 = clock_type::now();
        b.schedule_task(d, empty_task());
        b.sync(b.all_work(d));
        total += seconds_since(t0);
      }
      return total * 1e6 / wakes;
    });
  return make("wake_after_idle", "us/wake", ours,
              fmt::format("condition variable round trip, {} ms idle", idle.count()), base,
              "lower", 1.5);
}

/// Case 6, throughput: `n` empty tasks from this thread round-robin over
/// the first `devices` devices, then waiting for all; tasks per second.
double multidev_tasks_per_s(backend& b, int devices, int n) {
  std::vector<device> devs;
  for (int i = 0; i < devices; ++i)
    devs.push_back(b.get_device(i));
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    b.schedule_task(devs[static_cast<std::size_t>(i % devices)], empty_task());
  for (auto& d : devs)
    b.sync(b.all_work(d));
  return n / seconds_since(t0);
}

/// The same over `qs.size()` condition-variable queues.
double cv_queues_tasks_per_s(std::vector<std::unique_ptr<cv_queue>>& qs, int n) {
  std::atomic<int> done{0};
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i)
    qs[static_cast<std::size_t>(i) % qs.size()]->push(
      [&done] { done.fetch_add(1, std::memory_order_relaxed); });
  for (auto& q : qs) {
    std::promise<void> all;
    q->push([&all] { all.set_value(); });
    all.get_future().wait();
  }
  return n / seconds_since(t0);
}

/// Case 6: throughput as devices grow (`scale_<N>dev`) and as the queue
/// deepens (`scale_depth_<D>`: D tasks queued, then waited for, again and
/// again), beside as many mutex+cv queues; then the memory an idle device
/// and a queued task cost.
void scale_figures(std::vector<bench_result>& out, const backend_options& opts,
                   const bench_options& o) {
  int reps = std::max(1, o.quick ? 1 : std::min(o.repeats, 3));
  const std::array<int, 4> counts{1, 2, 4, 8};
  const std::array<int, 4> depths{1, 100, 10'000, 1'000'000};
  auto dev_name = [](int n) { return fmt::format("scale_{}dev", n); };
  auto depth_name = [](int d) { return fmt::format("scale_depth_{}", d); };
  bool any_dev = std::any_of(counts.begin(), counts.end(),
                             [&](int n) { return is_wanted(o, dev_name(n)); });
  bool any_depth = std::any_of(depths.begin(), depths.end(),
                               [&](int d) { return is_wanted(o, depth_name(d)); });
  if (any_dev || any_depth) {
    auto bopts = opts;
    bopts.num_devices = 8;
    bopts.queue_capacity = std::size_t{1} << 21; // room for the deepest queue
    backend b{bopts};
    int n = o.quick ? 50'000 : 400'000;
    for (int devices : counts) {
      if (!is_wanted(o, dev_name(devices)))
        continue;
      std::vector<std::unique_ptr<cv_queue>> qs;
      for (int i = 0; i < devices; ++i)
        qs.push_back(std::make_unique<cv_queue>());
      compare(out, o, reps, "tasks/s", [&] { return multidev_tasks_per_s(b, devices, n); },
              {{dev_name(devices), "a mutex+cv queue per device", std::nullopt,
                [&] { return cv_queues_tasks_per_s(qs, n); }}},
              "higher");
    }
    auto d0 = b.get_device(0);
    for (int depth : depths) {
      if (!is_wanted(o, depth_name(depth)))
        continue;
      int total = std::max(depth, o.quick ? 20'000 : 200'000);
      if (o.quick)
        total = std::min(total, 200'000);
      int batches = std::max(1, total / depth);
      int per = std::min(depth, total);
      cv_queue q;
      compare(
        out, o, reps, "tasks/s",
        [&] {
          auto t0 = clock_type::now();
          for (int k = 0; k < batches; ++k) {
            for (int i = 0; i < per; ++i)
              b.schedule_task(d0, empty_task());
            b.sync(b.all_work(d0));
          }
          return static_cast<double>(batches) * per / seconds_since(t0);
        },
        {{depth_name(depth), "mutex+cv queue", std::nullopt,
          [&] {
            auto t0 = clock_type::now();
            for (int k = 0; k < batches; ++k) {
              std::promise<void> all;
              for (int i = 0; i < per; ++i)
                q.push([] {});
              q.push([&all] { all.set_value(); });
              all.get_future().wait();
            }
            return static_cast<double>(batches) * per / seconds_since(t0);
          }}},
        "higher");
    }
  }
  if (is_wanted(o, "bytes_per_idle_device")) {
    constexpr int n = 64;
    auto bopts = opts;
    bopts.num_devices = n;
    auto before = heap_in_use();
    double ours = 0;
    {
      backend b{bopts};
      for (int i = 0; i < n; ++i)
        b.get_device(i);
      ours = static_cast<double>(heap_in_use() - before) / n;
    }
    before = heap_in_use();
    double base = 0;
    {
      std::vector<std::unique_ptr<cv_queue>> qs;
      for (int i = 0; i < n; ++i)
        qs.push_back(std::make_unique<cv_queue>());
      base = static_cast<double>(heap_in_use() - before) / n;
    }
    out.push_back(make("bytes_per_idle_device", "B", ours,
                       "a mutex+cv queue and its thread (heap; stacks not counted)",
                       std::max(base, 1.0), "lower", std::nullopt));
  }
  int queued = o.quick ? 100'000 : 1'000'000;
  if (is_wanted(o, "bytes_per_queued_task")) {
    int n = queued;
    double ours = multidev_bytes_per_queued_task(opts, n, false);
    // The same empty closures queued in the textbook queue, its consumer held.
    double base = 0;
    {
      std::atomic<bool> hold{false};
      cv_queue q;
      q.push([&hold] { hold.wait(false); });
      auto before = heap_in_use();
      for (int i = 0; i < n; ++i)
        q.push([] {});
      base = static_cast<double>(heap_in_use() - before) / n;
      hold.store(true);
      hold.notify_one();
    }
    auto r = make("bytes_per_queued_task", "B", ours,
                  "std::deque<std::function> behind a mutex", std::max(base, 1.0), "lower",
                  std::nullopt);
    r.value_target = 256.0; // an empty closure: nothing of its own
    out.push_back(r);
  }
  if (is_wanted(o, "bytes_per_queued_task_described")) {
    // Each on a backend of its own, built alike: a queue that grew once
    // keeps its room.
    double bare = multidev_bytes_per_queued_task(opts, queued, false);
    double ours = multidev_bytes_per_queued_task(opts, queued, true);
    auto r = make("bytes_per_queued_task_described", "B", ours,
                  "the same tasks, no description", std::max(bare, 1.0),
                  "lower", std::nullopt);
    // Issue 36: a description costs at most 128 B beyond the bare task (the
    // closure's captures are the same: none).
    r.value_target = r.baseline_value + described_task_bytes;
    out.push_back(r);
  }
}

/// The figures measured on one backend of at least 4 devices, shared by all.
void shared_backend_figures(std::vector<bench_result>& out, const backend_options& opts,
                            const bench_options& o) {
  auto wanted = [&o](const std::string& name) { return is_wanted(o, name); };
  auto bopts = opts;
  bopts.num_devices = std::max(4, opts.num_devices.value_or(4));
  backend b{bopts};
  auto d0 = b.get_device(0);
  auto d1 = b.get_device(1);
  int reps = std::max(1, o.repeats);

  int n_tasks = o.quick ? 20'000 : 200'000;
  {
    cv_queue q;
    spsc_ring<void (*)()> ring;
    spsc_ring<std::function<void()>> function_ring;
    spsc_ring<entry_sized_slot> entry_sized_ring;
    // StarPU's tasks cost microseconds each: fewer of them keep the sample
    // short, and the figure is per task.
    int n_starpu = std::max(1, n_tasks / 10);
    compare(out, o, reps, "ns/task", [&] { return multidev_ns_per_task(b, d0, n_tasks); },
            {{"independent_tasks", "spsc ring", 1.5,
              [&] { return spsc_ring_ns_per_item(ring, n_tasks); }},
             {"independent_tasks", "spsc ring of std::function", std::nullopt,
              [&] { return spsc_ring_ns_per_item(function_ring, n_tasks); }},
             {"independent_tasks", "spsc ring of 40-byte slots (a queue entry's size)",
              std::nullopt, [&] { return spsc_ring_ns_per_item(entry_sized_ring, n_tasks); }},
             {"independent_tasks", "mutex+cv queue", 0.5,
              [&] { return cv_queue_ns_per_task(q, n_tasks); }},
             {"independent_tasks", "oneTBB serial function_node", 0.25,
              [&] { return peers::tbb_ns_per_task(n_tasks); }, tbb_missing()},
             {"independent_tasks", "StarPU empty CPU tasks", 1.0 / 50,
              [&] { return peers::starpu_ns_per_task(n_starpu); }, starpu_missing()}});
  }
  // Users name their tasks: the same tasks with a description, beside the
  // bare ones, alternating.
  compare(out, o, reps, "ns/task", [&] { return multidev_ns_per_task(b, d0, n_tasks, true); },
          {{"independent_tasks_described", "the same tasks, no description", 1.5,
            [&] { return multidev_ns_per_task(b, d0, n_tasks); }}});
  int hops = o.quick ? 2'000 : 20'000;
  // The CAF system and its two actors only when a figure needs them.
  std::optional<caf_ping_pong> caf_hops;
  if (wanted("will_wait_for_chain") || wanted("will_wait_for_chain_scheduled"))
    caf_hops.emplace(opts, wanted("will_wait_for_chain"));
  auto atomic_hop = [&] { return atomic_ping_pong_ns_per_hop(hops); };
  auto caf_hop = [&] { return caf_hops->ns_per_hop(hops); };
  int starpu_hops = std::max(1, hops / 10);
  compare(out, o, reps, "ns/hop", [&] { return multidev_ns_per_hop(b, d0, d1, hops, true); },
          {{"will_wait_for_chain", "atomic wait/notify ping-pong", 3.0, atomic_hop},
           {"will_wait_for_chain", "spinning ping-pong", std::nullopt,
            [&] { return spin_ping_pong_ns_per_hop(hops); }},
           {"will_wait_for_chain", "oneTBB two-node ping-pong", 1.0,
            [&] { return peers::tbb_ns_per_hop(hops); }, tbb_missing()},
           {"will_wait_for_chain", "CAF actor ping-pong (sharing)", 1.0, caf_hop},
           {"will_wait_for_chain", "CAF actor ping-pong (detached)", std::nullopt,
            [&] { return caf_hops->ns_per_hop_detached(hops); }},
           {"will_wait_for_chain", "StarPU read-write chain on one handle", 1.0,
            [&] { return peers::starpu_ns_per_hop(starpu_hops); }, starpu_missing()}});
  compare(out, o, reps, "ns/hop", [&] { return multidev_ns_per_hop_replay(b, d0, d1, hops); },
          {{"will_wait_for_chain_replay", "oneTBB two-node ping-pong", 1.0,
            [&] { return peers::tbb_ns_per_hop(hops); }, tbb_missing()},
           {"will_wait_for_chain_replay", "the same chain scheduled call by call", std::nullopt,
            [&] { return multidev_ns_per_hop(b, d0, d1, hops, false); }}});
  compare(out, o, reps, "ns/hop", [&] { return multidev_ns_per_hop(b, d0, d1, hops, false); },
          {{"will_wait_for_chain_scheduled", "atomic wait/notify ping-pong", std::nullopt,
            atomic_hop},
           {"will_wait_for_chain_scheduled", "CAF actor ping-pong (sharing)", 2.5, caf_hop}});
  caf_hops.reset();
  std::size_t mib = 64;
  std::size_t bytes = mib << 20;
  auto copy_name = [mib](const char* what) { return fmt::format("{}_{}MiB", what, mib); };
  if (wanted(copy_name("copy_host_to_device")) || wanted(copy_name("copy_device_to_device"))) {
    auto host = random_bytes(bytes);
    tnode t{1, "copy", bytes, memory_mode::on_device};
    auto c0 = b.init_from_host(b.make_context(d0), t, host); // allocates, warms pages
    auto c1 = b.init_from_device(t, b.make_context(d1), c0);
    b.sync(b.all_work(d1));
    b.sync(b.all_work(d0));
    int copy_reps = o.quick ? 1 : reps;
    if (wanted(copy_name("copy_host_to_device"))) {
      auto* dst = node_bytes(b, c0, t);
      auto memcpy_base = [&] { return memcpy_gbps(b, d0, dst, host.data(), bytes); };
      auto [base, ours] = medians(copy_reps, memcpy_base, [&] {
        auto t0 = clock_type::now();
        for (int i = 0; i < copies_per_sample; ++i)
          b.from_host(c0, t, host);
        b.sync(b.all_work(d0));
        return static_cast<double>(bytes) * copies_per_sample / seconds_since(t0) / 1e9;
      });
      out.push_back(make(copy_name("copy_host_to_device"), "GB/s", ours,
                         "memcpy, same buffers+runner", base, "higher", 0.9));
    }
    if (wanted(copy_name("copy_device_to_device"))) {
      auto *dst = node_bytes(b, c1, t), *src = node_bytes(b, c0, t);
      auto memcpy_base = [&] { return memcpy_gbps(b, d1, dst, src, bytes); };
      auto [base, ours] = medians(copy_reps, memcpy_base, [&] {
        auto t0 = clock_type::now();
        for (int i = 0; i < copies_per_sample; ++i)
          b.device_to_device(t, merge_buffer_use::no, c1, c0);
        b.sync(b.all_work(d1));
        return static_cast<double>(bytes) * copies_per_sample / seconds_since(t0) / 1e9;
      });
      out.push_back(make(copy_name("copy_device_to_device"), "GB/s", ours,
                         "memcpy, same buffers+runner", base, "higher", 0.9));
    }
    b.sync_device(d0);
    b.sync_device(d1);
  }
  if (wanted("copy_4KiB"))
    copy_4k_figures(out, b, d0, o, reps);
  std::size_t n = o.quick ? (1u << 16) : (1u << 20);
  for (int devices : {1, 2, 4}) {
    auto name = fmt::format("gradient_merge_{}dev", devices);
    if (!wanted(name))
      continue;
    auto p = gradient_merge::setup(b, devices, n);
    std::vector<float> merged;
    gradient_merge::step(b, p, merged); // warm up
    auto [base, ours] = medians(
      reps,
      [&] {
        auto t0 = clock_type::now();
        auto sum = gradient_merge::host_sum(devices, n);
        volatile float sink = sum[n - 1];
        (void) sink;
        return seconds_since(t0) * 1e3;
      },
      [&] {
        auto t0 = clock_type::now();
        gradient_merge::step(b, p, merged, /*checksum=*/false);
        return seconds_since(t0) * 1e3;
      });
    out.push_back(make(name, "ms/step", ours, "same sum, host loop", base, "lower",
                       std::nullopt));
  }
  if (wanted("pool_calls")) {
    int n = o.quick ? 200 : 2'000;
    auto [base, ours] = medians(reps, [&] { return aligned_alloc_ns_per_iteration(100 * n); },
                                [&] { return multidev_pool_calls_ns(b, d0, n); });
    out.push_back(make("pool_calls", "ns/iter", ours, "aligned_alloc+memset+free 4KiB", base,
                       "lower", 20.0));
  }
}

/// Tasks per second through `schedule_batch` (or `schedule_named` one at a
/// time) onto `remote`, a device of another actor system: `n` empty named
/// tasks, timed until the last one is done.
double remote_tasks_per_s(backend& b, const device& remote, int n, bool batched) {
  register_bench_noop();
  std::vector<task_spec> specs(static_cast<std::size_t>(n), task_spec{"bench_noop", {}});
  auto t0 = clock_type::now();
  event last;
  if (batched) {
    last = b.schedule_batch(remote, specs).back();
  } else {
    for (const auto& spec : specs)
      last = b.schedule_named(remote, spec);
  }
  b.sync(last);
  return n / seconds_since(t0);
}

/// The figures across two actor systems connected over 127.0.0.1 (one
/// `remote_pair`, so all of them use the same connection): the server's
/// backend serves its device as a node (`spawn_node_actor`, `publish_node`),
/// the client's attaches it (`attach_node`), as `multidev node` and
/// `multidev run --node` do.
void remote_figures(std::vector<bench_result>& out, const backend_options& opts,
                    const bench_options& o) {
  bool hop = is_wanted(o, "remote_hop"), tasks = is_wanted(o, "remote_named_tasks");
  if (!is_wanted(o, "caf_remote_round_trip") && !hop && !tasks)
    return;
  int reps = std::max(1, o.repeats);
  int round_trips = o.quick ? 200 : 2'000;
  tcp_ping_pong tcp;
  remote_pair pair{opts};
  caf_remote_ping_pong caf_rt{pair};
  if (is_wanted(o, "caf_remote_round_trip")) {
    auto [base, ours] = medians(reps, [&] { return tcp.us_per_round_trip(round_trips); },
                                [&] { return caf_rt.us_per_round_trip(round_trips); });
    out.push_back(make("caf_remote_round_trip", "us/trip", ours, "raw TCP ping-pong, 64 B",
                       base, "lower", std::nullopt));
  }
  if (!hop && !tasks)
    return;
  auto one = opts;
  one.num_devices = 1;
  // The backends go before the pair's systems (declared after it).
  backend server_b{pair.server(), one};
  backend client_b{pair.client(), one};
  auto node = spawn_node_actor(server_b, "bench");
  auto port = publish_node(node, 0, "127.0.0.1");
  if (!port)
    throw std::runtime_error("multidev bench: publish_node: " + pair.server().render(port.error()));
  auto remote = attach_node(client_b, "127.0.0.1", *port).at(0);
  auto local = client_b.get_device(0);
  if (hop) {
    int crossings = o.quick ? 100 : 1'000;
    // Hop for hop: each multidev crossing is one resolution message over
    // the connection, as each CAF ping-pong hop is one message; the TCP
    // baseline is a whole round trip (two messages), as the issue states it.
    auto tcp_trip = [&] { return tcp.us_per_round_trip(round_trips); };
    auto caf_hop = [&] { return caf_rt.us_per_hop(crossings); };
    auto ours = [&] { return remote_us_per_hop(client_b, local, remote, crossings); };
    auto ms = medians_of(reps, {caf_hop, tcp_trip, ours});
    out.push_back(make("remote_hop", "us/hop", ms[2], "CAF remote ping-pong hop, same connection",
                       ms[0], "lower", 1.0));
    out.push_back(make("remote_hop_vs_tcp", "us/hop", ms[2], "raw TCP round trip, 64 B", ms[1],
                       "lower", 5.0));
  }
  if (tasks) {
    int n = o.quick ? 20'000 : 200'000;
    int unbatched = o.quick ? 200 : 2'000;
    auto [base, ours] = medians(reps, [&] { return remote_tasks_per_s(client_b, remote, unbatched, false); },
                                [&] { return remote_tasks_per_s(client_b, remote, n, true); });
    auto r = make("remote_named_tasks", "tasks/s", ours, "schedule_named, one round trip each",
                  base, "higher", std::nullopt);
    r.value_target = 200'000;
    out.push_back(r);
  }
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
}

// -- between two nodes -------------------------------------------------------------

/// Two nodes, a and b, and a client that attached both: three actor systems
/// of this process, each configured as a backend's own (`configure_like_backend`)
/// and connected over 127.0.0.1, as two `multidev node` processes and a
/// client are. Each node serves one device; `a` and `b` are those devices as
/// the client sees them. The client reaches each node through the
/// connection it attached it with; the nodes connect to each other when one
/// first waits on the other (the direct paths). Build, use and destroy on
/// one thread (NOTES.md, pitfall 9).
class node_pair {
public:
  explicit node_pair(const backend_options& opts) {
    for (auto* cfg : {&cfg_a_, &cfg_b_, &cfg_client_})
      configure_like_backend(*cfg, opts);
    sys_a_.emplace(cfg_a_);
    sys_b_.emplace(cfg_b_);
    sys_client_.emplace(cfg_client_);
    auto one = opts;
    one.num_devices = 1;
    node_a_.emplace(*sys_a_, one);
    node_b_.emplace(*sys_b_, one);
    client_.emplace(*sys_client_, one);
    a = serve(*node_a_, "a");
    b = serve(*node_b_, "b");
  }
  ~node_pair() {
    for (auto& n : nodes_)
      caf::anon_send_exit(n, caf::exit_reason::user_shutdown);
  }
  node_pair(const node_pair&) = delete;
  node_pair& operator=(const node_pair&) = delete;

  backend& client() { return *client_; }

  device a, b;

private:
  device serve(backend& node, const char* name) {
    auto n = spawn_node_actor(node, name);
    nodes_.push_back(caf::actor_cast<caf::actor>(n));
    auto port = publish_node(n, 0, "127.0.0.1");
    if (!port)
      throw std::runtime_error(fmt::format("multidev bench: publish_node {}: {}", name,
                                           node.system().render(port.error())));
    return attach_node(*client_, "127.0.0.1", *port).at(0);
  }

  caf::actor_system_config cfg_a_, cfg_b_, cfg_client_;
  std::optional<caf::actor_system> sys_a_, sys_b_, sys_client_;
  // The backends go before the systems (declared after them).
  std::optional<backend> node_a_, node_b_, client_;
  std::vector<caf::actor> nodes_;
};

/// us per crossing of a chain of waits that goes back and forth between the
/// devices of nodes a and b, scheduled by the client: each crossing is a
/// wait of one node's device on the other's event, which the nodes resolve
/// between them. Built while a's device waits on an event of the client's
/// own device, which is held, then timed from the release to the last
/// event, like `remote_us_per_hop` (one client -> a hop more in the
/// time). The hold cannot be on a's node backend: the client's work runs
/// in a session of its own there (docs/design.md, "Sessions and leases").
double node_us_per_hop(node_pair& p, int crossings) {
  register_bench_noop();
  auto& c = p.client();
  context ca = c.make_context(p.a), cb = c.make_context(p.b);
  const task_spec noop{"bench_noop", {}};
  auto here = c.get_device(0);
  runner_hold hold{c, here};
  c.will_wait_for(ca, c.schedule_named(here, noop)); // a on the held client
  event last;
  for (int i = 0; i < crossings / 2; ++i) {
    c.will_wait_for(cb, c.schedule_named(p.a, noop)); // b on a
    c.will_wait_for(ca, c.schedule_named(p.b, noop)); // a on b
  }
  last = c.schedule_named(p.a, noop);
  auto t0 = clock_type::now();
  hold.release();
  c.sync(last);
  return seconds_since(t0) * 1e6 / (2 * (crossings / 2));
}

/// GB/s of one copy of `t` from `ca` (on a) to `cb` (on b), asked by the
/// client and timed until b has written the bytes; `call_us` gets how long
/// the client's `device_to_device` call took.
double node_copy_gbps(node_pair& p, const tnode& t, const context& ca, const context& cb,
                      std::vector<double>& call_us) {
  auto& c = p.client();
  auto t0 = clock_type::now();
  if (!c.device_to_device(t, merge_buffer_use::no, cb, ca))
    throw std::runtime_error("multidev bench: device_to_device between the nodes did nothing");
  call_us.push_back(seconds_since(t0) * 1e6);
  c.sync(c.all_work(p.b));
  return static_cast<double>(t.size_in_bytes) / seconds_since(t0) / 1e9;
}

/// One round of `round_nodes_replay` on nodes a and b, call by call: 8
/// stages, each 4 empty named tasks on `a`, then 4 on `b`, then a cross-node
/// edge: `b` waits for the stage's last task on `a`. 64 tasks, 8 edges, all
/// from a to b: `a` never waits, so consecutive rounds may overlap and a
/// round's cost is what the client and the nodes spend on it, not a chain
/// of crossings (edges both ways would make every round at least a round
/// trip between the nodes, whatever the implementation).
///
/// `round_mixed_replay` passes `here` (a device of the client's own, with
/// its context `ch`): each stage has 4 empty named tasks there too, which
/// wait for the stage's last task on `b`: 96 tasks, 8 edges a -> b and 8
/// b -> here. Replayed, the client's part is pushed by the replaying thread
/// and b's notices come to the client's round actor.
void schedule_nodes_round(backend& c, const device& a, const device& b, const context& cb,
                          const device* here = nullptr, const context* ch = nullptr) {
  constexpr int stages = 8, tasks_per_stage_and_device = 4;
  const task_spec noop{"bench_noop", {}};
  for (int s = 0; s < stages; ++s) {
    event last_a, last_b;
    for (int i = 0; i < tasks_per_stage_and_device; ++i)
      last_a = c.schedule_named(a, noop);
    for (int i = 0; i < tasks_per_stage_and_device; ++i)
      last_b = c.schedule_named(b, noop);
    if (here)
      for (int i = 0; i < tasks_per_stage_and_device; ++i)
        c.schedule_named(*here, noop);
    c.will_wait_for(cb, last_a);
    if (here)
      c.will_wait_for(*ch, last_b);
  }
}

/// One round of `round_nodes_copy_replay` on nodes a and b: 8 stages,
/// each 2 empty named tasks on `a`, a copy of `t` (4 KiB, `ca` to `cb`)
/// from `a` to `b`, then 2 on `b`: 32 tasks and 8 copies, all from a to b
/// (a training step's transfers between nodes, small).
void schedule_copy_round(backend& c, const device& a, const device& b, const tnode& t,
                         const context& ca, const context& cb) {
  constexpr int stages = 8;
  const task_spec noop{"bench_noop", {}};
  for (int s = 0; s < stages; ++s) {
    c.schedule_named(a, noop);
    c.schedule_named(a, noop);
    if (!c.device_to_device(t, merge_buffer_use::no, cb, ca))
      throw std::runtime_error("multidev bench: device_to_device between the nodes did nothing");
    c.schedule_named(b, noop);
    c.schedule_named(b, noop);
  }
}

/// `round_nodes_replay`: µs per round of `schedule_nodes_round` on `p`'s
/// nodes, `rounds` of them, each a replay of `r` (recorded on the client),
/// or, when `r` is empty, the round's calls made again (call by call);
/// timed from the first replay (or call) until both devices ran the last
/// round, so the client's replays are in the figure, as in
/// `fan_dag_<N>dev_replay`. The events read are the last replay's: a
/// replay on nodes returns before the nodes answer, and reading its events
/// waits for their replies (a round trip), which a loop that syncs once
/// per epoch, not per step, does not pay per replay.
/// `calls`: the round's calls made again (`r` empty). `round_mixed_replay`
/// passes its own, and syncs the client's device too (`here_too`).
double nodes_round_us(node_pair& p, const context& cb, const multidev::round& r, int rounds,
                      const std::function<void()>& calls = {}, bool here_too = true) {
  auto& c = p.client();
  auto here = c.get_device(0);
  auto t0 = clock_type::now();
  std::vector<event> last;
  replay_events ev;
  for (int i = 0; i < rounds; ++i) {
    if (r)
      ev = c.replay(r);
    else if (calls)
      calls();
    else
      schedule_nodes_round(c, p.a, p.b, cb);
  }
  std::vector<device> devices{p.a, p.b};
  if (calls && here_too)
    devices.push_back(here);
  for (const auto& d : devices)
    last.push_back(r ? ev.all_work_of(d) : c.all_work(d));
  for (const auto& e : last)
    c.sync(e);
  return seconds_since(t0) * 1e6 / rounds;
}

/// Case `name`'s two rows, measured in turn: `ours` (µs a replay) beside
/// a hop of the CAF remote ping-pong (a pair of systems of its own, the
/// same kind of connection; `target` on the ratio) and beside `calls`, the
/// same round call by call.
void replay_beside_hop_and_calls(std::vector<bench_result>& out, const char* name,
                                 double target, const backend_options& opts,
                                 const bench_options& o, const std::function<double()>& calls,
                                 const std::function<double()>& ours) {
  int crossings = o.quick ? 100 : 1'000;
  remote_pair pair{opts};
  caf_remote_ping_pong caf_rt{pair};
  auto caf_hop = [&] { return caf_rt.us_per_hop(crossings); };
  auto ms = medians_of(std::max(1, o.repeats), {caf_hop, calls, ours});
  out.push_back(make(name, "us/replay", ms[2],
                     "CAF remote ping-pong hop, same kind of connection", ms[0], "lower", target));
  out.push_back(make(name, "us/replay", ms[2], "the same round scheduled call by call", ms[1],
                     "lower", std::nullopt));
}

/// The figures between two nodes (`node_pair`) beside their baselines,
/// measured alternately in this run: a crossing between the nodes' devices
/// beside a CAF remote hop over the same kind of connection and a raw TCP
/// round trip; a 64 MiB copy from a to b beside a raw TCP transfer of 64
/// MiB, and the client's call beside the whole copy; a recorded round
/// across both nodes replayed, beside a CAF remote hop (issue 41: at most
/// two a replay) and the same round scheduled call by call.
void node_figures(std::vector<bench_result>& out, const backend_options& opts,
                  const bench_options& o) {
  bool hop = is_wanted(o, "node_hop") || is_wanted(o, "node_hop_vs_tcp");
  bool copy = is_wanted(o, "copy_node_to_node_64MiB") || is_wanted(o, "copy_node_to_node_call");
  bool replay = is_wanted(o, "round_nodes_replay");
  bool mixed = is_wanted(o, "round_mixed_replay");
  bool copies = is_wanted(o, "round_nodes_copy_replay");
  if (!hop && !copy && !replay && !mixed && !copies)
    return;
  int reps = std::max(1, o.repeats);
  node_pair p{opts};
  if (hop) {
    int round_trips = o.quick ? 200 : 2'000;
    int crossings = o.quick ? 100 : 1'000;
    tcp_ping_pong tcp;
    remote_pair pair{opts};
    caf_remote_ping_pong caf_rt{pair};
    auto caf_hop = [&] { return caf_rt.us_per_hop(crossings); };
    auto tcp_trip = [&] { return tcp.us_per_round_trip(round_trips); };
    auto ours = [&] { return node_us_per_hop(p, crossings); };
    auto ms = medians_of(reps, {caf_hop, tcp_trip, ours});
    out.push_back(make("node_hop", "us/hop", ms[2],
                       "CAF remote ping-pong hop, same kind of connection", ms[0], "lower", 1.2));
    out.push_back(make("node_hop_vs_tcp", "us/hop", ms[2], "raw TCP round trip, 64 B", ms[1],
                       "lower", 4.0));
  }
  if (copy) {
    constexpr std::size_t n = std::size_t{64} << 20; // 64 MiB even in quick mode
    tnode t{1, "bench_copy", n, memory_mode::on_device};
    auto& c = p.client();
    auto ca = c.alloc_node(c.make_context(p.a), t);
    auto cb = c.alloc_node(c.make_context(p.b), t);
    c.schedule_named(p.a, task_spec{"fill", {buffer_arg{ca.buffers.at(t), n}, 1.0}});
    c.schedule_named(p.b, task_spec{"fill", {buffer_arg{cb.buffers.at(t), n}, 0.0}});
    c.sync(c.all_work(p.a));
    c.sync(c.all_work(p.b));
    tcp_stream tcp{n};
    std::vector<double> call_us, copy_us;
    auto ours = [&] {
      auto gbps = node_copy_gbps(p, t, ca, cb, call_us);
      copy_us.push_back(static_cast<double>(n) / gbps / 1e3);
      return gbps;
    };
    auto [base, gbps] = medians(reps, [&] { return tcp.gbps(); }, ours);
    out.push_back(make("copy_node_to_node_64MiB", "GB/s", gbps,
                       "raw TCP transfer of 64 MiB, loopback", base, "higher", 0.7));
    auto r = make("copy_node_to_node_call", "us/call", median(call_us),
                  "the whole copy, until written on b", median(copy_us), "lower", std::nullopt);
    r.value_target = 1000;
    out.push_back(r);
  }
  if (replay) {
    register_bench_noop();
    int rounds = o.quick ? 20 : 200;
    auto& c = p.client();
    auto cb = c.make_context(p.b);
    auto r = c.record("nodes", [&] { schedule_nodes_round(c, p.a, p.b, cb); });
    replay_beside_hop_and_calls(
      out, "round_nodes_replay", 2.0, opts, o,
      [&] { return nodes_round_us(p, cb, multidev::round{}, rounds); },
      [&] { return nodes_round_us(p, cb, r, rounds); });
  }
  if (mixed) {
    register_bench_noop();
    int rounds = o.quick ? 20 : 200;
    auto& c = p.client();
    auto here = c.get_device(0);
    auto cb = c.make_context(p.b), ch = c.make_context(here);
    auto again = [&] { schedule_nodes_round(c, p.a, p.b, cb, &here, &ch); };
    auto r = c.record("mixed", again);
    auto nodes_only = c.record("nodes", [&] { schedule_nodes_round(c, p.a, p.b, cb); });
    auto base = [&] { return nodes_round_us(p, cb, nodes_only, rounds); };
    auto calls = [&] { return nodes_round_us(p, cb, multidev::round{}, rounds, again); };
    auto ours = [&] { return nodes_round_us(p, cb, r, rounds, again); };
    auto ms = medians_of(reps, {base, calls, ours});
    out.push_back(make("round_mixed_replay", "us/replay", ms[2],
                       "round_nodes_replay's round, on the nodes only", ms[0], "lower",
                       std::nullopt));
    out.push_back(make("round_mixed_replay", "us/replay", ms[2],
                       "the same round scheduled call by call", ms[1], "lower", std::nullopt));
  }
  if (copies) {
    register_bench_noop();
    int rounds = o.quick ? 20 : 200;
    auto& c = p.client();
    tnode t{2, "bench_round_copy", 4096, memory_mode::on_device};
    auto ca = c.alloc_node(c.make_context(p.a), t);
    auto cb = c.alloc_node(c.make_context(p.b), t);
    auto again = [&] { schedule_copy_round(c, p.a, p.b, t, ca, cb); };
    auto r = c.record("copies", again);
    replay_beside_hop_and_calls(
      out, "round_nodes_copy_replay", 3.0, opts, o,
      [&] { return nodes_round_us(p, cb, multidev::round{}, rounds, again, false); },
      [&] { return nodes_round_us(p, cb, r, rounds, again, false); });
  }
}

/// `session_cleanup`: a client process (`multidev run` of a script that
/// allocates 1 MiB on node b and queues work there behind a wait on a held
/// local device, then waits) attaches a node served by this process (two
/// actor systems over 127.0.0.1, as in `remote_figures`); once the node
/// holds its session, the client is killed with SIGKILL. The figure is the
/// time from the kill to the node having ended the session and freed its
/// pools (its `debug` reply counts it cleaned), against the lease with the
/// default settings (lease 3 s, renewed every 1 s, margin 1 s): at most the
/// lease after the last renewal, so between the lease minus one renewal
/// interval and the lease, plus the node's timer and teardown. Needs this
/// process to be the `multidev` tool (skipped otherwise: `test_bench`).
bench_result session_cleanup_figure(const backend_options& opts, const bench_options& o) {
  node_attach_options settings; // the defaults, which the client uses
  auto base = fmt::format("the lease ({} ms; renewed every {} ms, margin {} ms)",
                          settings.lease.count(), settings.renew_every.count(),
                          settings.margin.count());
  auto lease_ms = static_cast<double>(settings.lease.count());
  std::array<char, 4096> self_path{};
  auto n = ::readlink("/proc/self/exe", self_path.data(), self_path.size() - 1);
  std::string tool = n > 0 ? std::string(self_path.data(), static_cast<std::size_t>(n)) : "";
  if (std::filesystem::path(tool).filename() != "multidev") {
    return skipped_result("session_cleanup", "ms", base, "lower", 1.1,
                          "skipped: needs the multidev tool to start a client process");
  }
  auto dir = std::filesystem::temp_directory_path();
  auto script = dir / fmt::format("multidev-session-cleanup-{}.scn", ::getpid());
  {
    std::ofstream f{script};
    f << "(scenario session-cleanup)\n(devices 1)\n(nodes (b 1))\n"
         "(tnode x (floats 262144))\n(context c0 0) (context cb b/0)\n(alloc cb x)\n"
         "(hold 0 (as held))\n(kernel c0 spin_ns 0 (as behind))\n(wait cb behind)\n"
         "(kernel cb spin_ns 0 (as queued))\n"
         "(expect (sync queued) ok)\n";
  }
  auto one = opts;
  one.num_devices = 1;
  auto sample = [&] {
    remote_pair pair{opts};
    backend server_b{pair.server(), one};
    auto node = spawn_node_actor(server_b, "b");
    auto port = publish_node(node, 0, "127.0.0.1");
    if (!port)
      throw std::runtime_error("multidev bench: publish_node: "
                               + pair.server().render(port.error()));
    auto debug = [&] {
      caf::scoped_actor self{pair.server()};
      std::string text;
      self->request(node, std::chrono::seconds{10}, atoms::debug_atom::value)
        .receive([&](std::string& t) { text = std::move(t); }, [](caf::error&) {});
      return text;
    };
    std::vector<std::string> args{tool, "run", script.string(), "--quiet", "--step-timeout",
                                  "300", "--node", fmt::format("b=127.0.0.1:{}", *port)};
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, tool.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
      throw std::runtime_error(fmt::format("multidev bench: cannot start a client: {}",
                                           std::strerror(rc)));
    auto limit = clock_type::now() + std::chrono::seconds{30};
    while (debug().find("(used_memory 1048576) (queued 2)") == std::string::npos
           && clock_type::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
    auto held = debug().find("(used_memory 1048576) (queued 2)") != std::string::npos;
    auto t0 = clock_type::now();
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    if (!held)
      throw std::runtime_error("multidev bench: session_cleanup: the client's session did not "
                               "show its pool and queue on the node within 30 s: "
                               + debug());
    limit = t0 + std::chrono::seconds{30};
    while (debug().find("(cleaned 1)") == std::string::npos && clock_type::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds{1});
    auto ms = seconds_since(t0) * 1e3;
    caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
    return ms;
  };
  std::vector<double> samples;
  try {
    for (int i = 0; i < std::clamp(o.repeats, 1, 3); ++i)
      samples.push_back(sample());
  } catch (...) {
    std::filesystem::remove(script);
    throw;
  }
  std::filesystem::remove(script);
  std::sort(samples.begin(), samples.end());
  return make("session_cleanup", "ms", samples[samples.size() / 2], base, lease_ms, "lower", 1.1);
}

/// `independent_tasks` with the runner trace on (`trace_capacity`, default
/// 4096) beside the same with it off, each on a backend of its own, built
/// alike, measured alternately in this run.
bench_result trace_figure(const backend_options& opts, const bench_options& o) {
  constexpr std::size_t default_trace_capacity = 4096;
  auto off = opts;
  off.num_devices = 1;
  off.trace_capacity = 0;
  auto on = off;
  on.trace_capacity = opts.trace_capacity > 0 ? opts.trace_capacity : default_trace_capacity;
  backend b_off{off};
  backend b_on{on};
  auto d_off = b_off.get_device(0);
  auto d_on = b_on.get_device(0);
  int n = o.quick ? 20'000 : 200'000;
  auto [base, ours] = medians(std::max(1, o.repeats),
                              [&] { return multidev_ns_per_task(b_off, d_off, n); },
                              [&] { return multidev_ns_per_task(b_on, d_on, n); });
  return make("independent_tasks_trace", "ns/task", ours, "independent_tasks, trace off", base,
              "lower", 1.5);
}

/// CPU ms per idle second of a backend that owns its actor system, beside
/// the same backend on a caller-owned system left at CAF's defaults (only
/// `scheduler.max-threads` set, as the tool does). Each sample builds its
/// backend, so nothing else runs in the process while it is measured.
bench_result idle_cpu_figure(const backend_options& opts, const bench_options& o) {
  auto iopts = opts;
  iopts.num_devices = idle_devices;
  double window_s = o.quick ? 0.25 : 3.0; // issue 11: CPU time over 3 s
  int reps = o.quick ? 1 : std::clamp(o.repeats, 1, 3);
  auto ours = [&] {
    backend b{iopts};
    return idle_backend_cpu(b, window_s);
  };
  auto base = [&] {
    caf::actor_system_config cfg;
    cfg.set("scheduler.max-threads",
            static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency())));
    caf::actor_system sys{cfg};
    backend b{sys, iopts};
    return idle_backend_cpu(b, window_s);
  };
  std::vector<double> xs, ys;
  for (int i = 0; i < reps; ++i) {
    xs.push_back(base());
    ys.push_back(ours());
  }
  auto r = make("idle_cpu_8dev", "ms/s", median(ys), "8 devices, CAF defaults", median(xs),
                "lower", std::nullopt);
  r.value_target = 2.0; // 0.2 % of a core
  return r;
}

/// Steps per second of a scenario script of `n` empty kernels (a
/// `repeat` of `body`), loaded and run (`multidev run` without outputs),
/// beside the same kernels scheduled through the C++ API the way the
/// runner does (a fresh context, `link`, `run`), on a backend with the
/// runner's options. `scenario_steps`: iterations all alike;
/// `scenario_steps_named`: each kernel named after its iteration (`(as
/// k$i)`), with a reference to an earlier iteration's name after the loop.
bench_result scenario_figure(const bench_options& o, const char* name, const char* body) {
  int n = o.quick ? 20'000 : 200'000;
  auto script = fmt::format("(devices 1)\n(repeat {} {})\n(await 0)\n{}", n, body,
                            std::string_view{body}.find("$i") != std::string_view::npos
                              ? fmt::format("(expect (state k{}) done)\n", n / 2)
                              : std::string{});
  auto steps_per_s = [&](auto body) {
    auto t0 = std::chrono::steady_clock::now();
    body();
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
    return static_cast<double>(n) / took.count();
  };
  auto api = [&] {
    backend_options bo;
    bo.num_devices = 1;
    bo.on_destroy = backend_options::destroy_policy::cancel;
    bo.trace_capacity = 2 * static_cast<std::size_t>(n) + 256; // as the runner sizes it
    backend b{bo};
    auto d = b.get_device(0);
    return steps_per_s([&] {
      for (int i = 0; i < n; ++i) {
        auto r = b.link(b.make_context(d), "spin_ns", {int64_t{0}});
        r.schedule.description = "spin_ns 0";
        b.run(r);
      }
      b.await(d);
    });
  };
  auto ours = [&] {
    return steps_per_s([&] {
      auto p = scenario::load(script, "bench.scn");
      scenario::run_options ro;
      ro.timeline = false;
      auto r = scenario::run(*p, ro);
      if (!r.ok())
        throw std::runtime_error(std::string{name} + ": " + scenario::summary(r));
    });
  };
  auto [base, value] = medians(o.quick ? 1 : std::clamp(o.repeats, 1, 3), api, ours);
  return make(name, "steps/s", value,
              "the same kernels through the C++ API", base, "higher", 0.05);
}

} // namespace

std::vector<bench_result> run_benchmarks(const backend_options& opts, const bench_options& o) {
  std::vector<bench_result> out;
  shared_backend_figures(out, opts, o);
  if (is_wanted(o, "independent_tasks_trace"))
    out.push_back(trace_figure(opts, o));
  remote_figures(out, opts, o);
  node_figures(out, opts, o);
  fan_dag_figures(out, opts, o);
  if (is_wanted(o, "wake_after_idle"))
    out.push_back(wake_figure(opts, o));
  scale_figures(out, opts, o);
  // Last, once the shared backend is gone: nothing else may run meanwhile.
  if (is_wanted(o, "idle_cpu_8dev"))
    out.push_back(idle_cpu_figure(opts, o));
  if (is_wanted(o, "session_cleanup"))
    out.push_back(session_cleanup_figure(opts, o));
  if (is_wanted(o, "scenario_steps"))
    out.push_back(scenario_figure(o, "scenario_steps", "(kernel 0 spin_ns 0)"));
  if (is_wanted(o, "scenario_steps_named"))
    out.push_back(scenario_figure(o, "scenario_steps_named", "(kernel 0 spin_ns 0 (as k$i))"));
  return out;
}

const std::vector<std::string>& case_names() {
  static const std::vector<std::string> names{
    "independent_tasks",        "independent_tasks_described", "will_wait_for_chain",
    "will_wait_for_chain_replay",                              "will_wait_for_chain_scheduled",
    "copy_host_to_device_64MiB", "copy_device_to_device_64MiB", "copy_4KiB",
    "gradient_merge_1dev",      "gradient_merge_2dev",         "gradient_merge_4dev",
    "pool_calls",               "independent_tasks_trace",     "caf_remote_round_trip",
    "remote_hop",               "remote_hop_vs_tcp",           "remote_named_tasks",
    "node_hop",                 "node_hop_vs_tcp",             "copy_node_to_node_64MiB",
    "copy_node_to_node_call",   "round_nodes_replay",          "round_mixed_replay",
    "round_nodes_copy_replay",
    "fan_dag_1dev",             "fan_dag_1dev_prebuilt",       "fan_dag_1dev_replay",
    "fan_dag_2dev",             "fan_dag_2dev_prebuilt",       "fan_dag_2dev_replay",
    "fan_dag_4dev",             "fan_dag_4dev_prebuilt",       "fan_dag_4dev_replay",
    "fan_dag_8dev",             "fan_dag_8dev_prebuilt",       "fan_dag_8dev_replay",
    "wake_after_idle",
    "scale_1dev",               "scale_2dev",                  "scale_4dev",
    "scale_8dev",               "scale_depth_1",               "scale_depth_100",
    "scale_depth_10000",        "scale_depth_1000000",         "bytes_per_idle_device",
    "bytes_per_queued_task",    "bytes_per_queued_task_described", "idle_cpu_8dev",
    "session_cleanup",          "scenario_steps",              "scenario_steps_named"};
  return names;
}

std::string format_quantity(double v, const std::string& unit) {
  std::string n;
  if (!std::isfinite(v)) {
    n = fmt::format("{}", v);
  } else if (std::abs(v) >= 1000) {
    auto digits = fmt::format("{:.0f}", std::abs(v));
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0)
        n += ',';
      n += digits[i];
    }
    if (v < 0)
      n.insert(n.begin(), '-');
  } else if (std::abs(v) >= 1 || v == 0) {
    n = fmt::format("{:.1f}", v);
  } else {
    n = fmt::format("{:.3g}", v);
  }
  return unit.empty() ? n : n + " " + unit;
}

std::string format_table(const std::vector<bench_result>& rs) {
  std::string s = fmt::format("{:<36} {:>20} {:<33} {:>20} {:>8}  {}\n", "benchmark",
                              "multidev", "baseline", "baseline", "ratio", "target");
  for (const auto& r : rs) {
    if (!r.skipped.empty()) {
      s += fmt::format("{:<36} {:>20} {:<33} {:>20} {:>8}  {}\n", r.name, "-", r.baseline, "-",
                       "-", r.skipped);
      continue;
    }
    auto op = r.better == "lower" ? "<=" : ">=";
    std::string target;
    if (r.target)
      target = fmt::format("{}{:g}", op, *r.target); // 0.02 stays 0.02
    if (r.value_target) // an absolute bound on the value, shown with its unit
      target += fmt::format("{}{}{}", target.empty() ? "" : ", ", op,
                            format_quantity(*r.value_target, r.unit));
    target = target.empty() ? "-" : target + (r.meets_target() ? " ok" : " MISSED");
    s += fmt::format("{:<36} {:>20} {:<33} {:>20} {:>8.3f}  {}\n", r.name,
                     format_quantity(r.value, r.unit), r.baseline,
                     format_quantity(r.baseline_value, r.unit), r.ratio, target);
  }
  return s;
}

std::string to_json(const std::vector<bench_result>& rs) {
  auto arr = nlohmann::json::array();
  for (const auto& r : rs) {
    nlohmann::json j{{"name", r.name},
                     {"unit", r.unit},
                     {"value", r.value},
                     {"baseline", r.baseline},
                     {"baseline_value", r.baseline_value},
                     {"ratio", r.ratio},
                     {"better", r.better}};
    j["target"] = r.target ? nlohmann::json(*r.target) : nlohmann::json(nullptr);
    j["value_target"] =
      r.value_target ? nlohmann::json(*r.value_target) : nlohmann::json(nullptr);
    j["meets_target"] = r.skipped.empty() ? nlohmann::json(r.meets_target()) : nlohmann::json(nullptr);
    if (!r.skipped.empty())
      j["skipped"] = r.skipped;
    arr.push_back(std::move(j));
  }
  return arr.dump(2);
}

namespace {

/// One line of a chart: its label and its (x, y) points.
struct series {
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;
};

/// A line chart as SVG, written directly: axes with ticks at the points' x
/// (labelled `x_labels`), a y axis from 0 to the largest value, a legend.
std::string line_chart(const std::string& title, const std::string& x_title,
                       const std::string& y_title, const std::vector<std::string>& x_labels,
                       const std::vector<series>& lines) {
  constexpr double w = 640, h = 400, left = 80, right = 40, top = 40, bottom = 60; // room for "1000000"
  double x_min = 1e300, x_max = -1e300, y_max = 0;
  for (const auto& l : lines)
    for (auto [x, y] : l.points) {
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
    }
  if (x_max <= x_min)
    x_max = x_min + 1;
  if (y_max <= 0)
    y_max = 1;
  y_max *= 1.25; // headroom: the legend sits above the lines
  auto px = [&](double x) { return left + (x - x_min) / (x_max - x_min) * (w - left - right); };
  auto py = [&](double y) { return h - bottom - y / y_max * (h - top - bottom); };
  std::string svg = fmt::format(
    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
    "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
    "<text x=\"{2}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
    w, h, w / 2, title);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n"
                     "<line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{1}\" stroke=\"black\"/>\n",
                     left, h - bottom, w - right, top);
  for (int i = 0; i <= 4; ++i) {
    double y = y_max * i / 4;
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" "
                       "stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4:.1f}\" "
                       "text-anchor=\"end\">{5:.3g}</text>\n",
                       left, py(y), w - right, left - 6, py(y) + 4, y);
  }
  if (!lines.empty())
    for (std::size_t i = 0; i < lines[0].points.size() && i < x_labels.size(); ++i) {
      double x = px(lines[0].points[i].first);
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x,
                         h - bottom + 18, x_labels[i]);
    }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     (left + w - right) / 2, h - 16, x_title);
  svg += fmt::format("<text x=\"16\" y=\"{0}\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 16 {0})\">{1}</text>\n",
                     (top + h - bottom) / 2, y_title);
  for (std::size_t k = 0; k < lines.size(); ++k) {
    const auto& l = lines[k];
    std::string pts;
    for (auto [x, y] : l.points)
      pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" "
                       "stroke-width=\"2\"/>\n",
                       pts, l.color);
    for (auto [x, y] : l.points)
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n",
                         px(x), py(y), l.color);
    double ly = top + 8 + 18.0 * static_cast<double>(k);
    svg += fmt::format("<rect x=\"{0}\" y=\"{1:.1f}\" width=\"14\" height=\"4\" fill=\"{2}\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\">{5}</text>\n",
                       left + 12, ly, l.color, left + 32, ly + 5, l.label);
  }
  return svg + "</svg>\n";
}

} // namespace

std::vector<std::string> write_plots(const std::vector<bench_result>& rs, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> files;
  auto chart = [&](const std::string& prefix, const std::string& file, const std::string& title,
                   const std::string& x_title, bool log_x) {
    series ours{"multidev", "#1f77b4", {}};
    series base{"", "#d62728", {}};
    std::vector<std::string> labels;
    for (const auto& r : rs) {
      if (!r.name.starts_with(prefix) || !r.skipped.empty() ||
          (prefix == "scale_" && r.name.starts_with("scale_depth_")))
        continue;
      auto tail = r.name.substr(prefix.size());
      double x = std::stod(tail); // "4dev" -> 4, "10000" -> 10000
      if (log_x)
        x = std::log10(x);
      labels.push_back(tail);
      ours.points.emplace_back(x, r.value / 1e6);
      base.label = r.baseline;
      base.points.emplace_back(x, r.baseline_value / 1e6);
    }
    if (ours.points.empty())
      return;
    auto path = (std::filesystem::path(dir) / file).string();
    std::ofstream f{path};
    f << line_chart(title, x_title, "million tasks per second", labels, {ours, base});
    if (!f.good())
      throw std::runtime_error("multidev bench: cannot write " + path);
    files.push_back(path);
  };
  chart("scale_depth_", "scale_queue_depth.svg",
        "Throughput by queue depth (empty tasks, one device)", "tasks queued before waiting",
        true);
  chart("scale_", "scale_devices.svg", "Throughput by device count (empty tasks, one producer)",
        "devices", false);
  return files;
}

} // namespace multidev::tools
