// A node's port with bounded costs for unauthenticated peers (see
// node_listener.hpp). The doorman, scribe and stream follow CAF 0.17.6's
// doorman_impl, scribe_impl and stream_impl (libcaf_io, BSD-3-Clause,
// Dominik Charousset), with the checks described in the header.
#include "actors/remote/node_listener.hpp"

#include "actors/logger_tie.hpp"
#include "actors/remote/tls_middleman.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/detail/socket_guard.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/doorman.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/acceptor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/interfaces.hpp>
#include <caf/io/network/stream.hpp>
#include <caf/io/scribe.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/policy/tcp.hpp>
#include <caf/send.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <iostream>
#include <list>
#include <map>
#include <mutex>
#include <memory>
#include <vector>

namespace multidev::detail {

namespace {

using native_socket = caf::io::network::native_socket;
using default_mpx = caf::io::network::default_multiplexer;
using rw_state = caf::io::network::rw_state;
using operation = caf::io::network::operation;
using clock_type = std::chrono::steady_clock;

class guarded_scribe_base;

/// Who skips the limits (issue 38 point 3): a *connection*, not a node id.
/// Per actor system and node id: the connection that carried that node's
/// first BASP handshake and is still open (its claimant: CAF's route to the
/// node, basp::instance keeping the first direct route per node id and
/// dropping later handshakes), and whether the node actor admitted the
/// node. A second connection claiming the id is no claimant: it stays held
/// to the limits, whatever the node actor admitted.
struct peer_claim {
  const guarded_scribe_base* conn = nullptr; // none yet (admitted before it came)
  bool admitted = false;
};

using claim_key = std::pair<const caf::actor_system*, caf::node_id>;

std::mutex claims_mu;

std::map<claim_key, peer_claim>& claims() {
  static std::map<claim_key, peer_claim> all;
  return all;
}

/// Whether `conn`, whose handshake says it is node `n`, is `n`'s claimant
/// now (it becomes it if `n` has none).
bool claim_peer(const caf::actor_system* sys, const caf::node_id& n,
                const guarded_scribe_base* conn) {
  std::lock_guard guard{claims_mu};
  auto& c = claims()[{sys, n}];
  if (c.conn == nullptr)
    c.conn = conn;
  return c.conn == conn;
}

/// Whether `conn` is `n`'s claimant and `n` is admitted.
bool admitted_conn(const caf::actor_system* sys, const caf::node_id& n,
                   const guarded_scribe_base* conn) {
  std::lock_guard guard{claims_mu};
  auto i = claims().find({sys, n});
  return i != claims().end() && i->second.conn == conn && i->second.admitted;
}

/// `conn` closes: if it was `n`'s claimant, `n` is forgotten.
void release_claim(const caf::actor_system* sys, const caf::node_id& n,
                   const guarded_scribe_base* conn) {
  std::lock_guard guard{claims_mu};
  auto i = claims().find({sys, n});
  if (i != claims().end() && i->second.conn == conn)
    claims().erase(i);
}
using guarded_ptr = caf::intrusive_ptr<guarded_scribe_base>;

/// Why the node closed an unauthenticated connection; each is noted on the
/// node's stderr the first time only (an attacker must not fill a log).
enum class closed_for { payload, messages, timeout, crowd, count };

/// A port's shared state. Touched on the multiplexer's thread only.
struct listener_state {
  /// The system whose node actor admits peers (`admit_peer`).
  const caf::actor_system* sys = nullptr;
  node_transport_limits limits;
  std::size_t max_unauthenticated = 0; // limits', capped by RLIMIT_NOFILE
  std::string name;
  /// The unauthenticated connections, oldest first.
  std::list<guarded_ptr> pending;
  /// Connections taken off `pending` from inside one of their own member
  /// functions: released at the next sweep or accept, not under their feet.
  std::vector<guarded_ptr> released;
  bool noted[static_cast<int>(closed_for::count)] = {};
  bool noted_fd_limit = false;

  void note(closed_for why, const std::string& text) {
    auto& done = noted[static_cast<int>(why)];
    if (done)
      return;
    done = true;
    std::cerr << fmt::format("multidev node {}: closed an unauthenticated connection: {} (further "
                             "ones for this reason are not noted)\n",
                             name, text)
              << std::flush;
  }
};

/// What the scribes' template shares: the place in `pending`, the close.
class guarded_scribe_base : public caf::io::scribe {
public:
  explicit guarded_scribe_base(native_socket fd)
    : scribe(caf::io::network::conn_hdl_from_socket(fd)), accepted_(clock_type::now()) {}

  ~guarded_scribe_base() override { drop_claim(); }

  clock_type::time_point accepted() const { return accepted_; }

  /// Whether the peer is admitted now (its node opened a session since, or
  /// was vouched for, and this connection carried its handshake first);
  /// takes the connection off `pending` if so. Once admitted, a connection
  /// stays so until it closes.
  bool admitted_now() {
    if (!admitted_ && claimant_ && admitted_conn(sys_, peer_, this))
      admit();
    return admitted_;
  }

  /// The connection closes: it is no longer its node's claimant.
  void drop_claim() {
    if (claimant_) {
      claimant_ = false;
      release_claim(sys_, peer_, this);
    }
  }

  /// Closes the connection (the peer sees a reset or FIN), and tells the
  /// broker as for a peer that closed it.
  virtual void refuse(caf::execution_unit* ctx, closed_for why, const std::string& text) = 0;

  void enlist(const std::shared_ptr<listener_state>& st) {
    st_ = st;
    sys_ = st->sys;
    st->pending.emplace_back(this);
    where_ = std::prev(st->pending.end());
    listed_ = true;
  }

  /// Takes it off `pending` (if on it).
  void unlist() {
    if (!listed_)
      return;
    listed_ = false;
    if (auto st = st_.lock()) { // else the list went with the port
      st->released.push_back(std::move(*where_));
      st->pending.erase(where_);
    }
  }

protected:
  void admit() {
    admitted_ = true;
    unlist();
  }

  /// Looks at `n` bytes just read, before the broker does; false: the
  /// connection must be refused (`why`, `text` say why).
  bool check(caf::execution_unit* ctx, const char* bytes, size_t n, closed_for& why,
             std::string& text) {
    if (payload_next_) {
      payload_next_ = false;
      if (handshake_next_ && !peer_) {
        // Both handshakes' payloads start with the sender's node id
        // (basp/instance.cpp, write_server_handshake, write_client_handshake).
        caf::binary_deserializer source{ctx, bytes, n};
        caf::node_id nid;
        if (!source(nid) && nid) {
          peer_ = nid;
          claimant_ = claim_peer(sys_, nid, this);
        }
      }
      return true;
    }
    if (n != caf::io::basp::header_size)
      return true; // not what the broker asked for: it judges
    caf::io::basp::header hdr;
    caf::binary_deserializer source{ctx, bytes, n};
    if (source(hdr))
      return true; // the broker refuses it itself
    if (admitted_now())
      return true;
    auto st = st_.lock();
    if (!st) {
      why = closed_for::timeout;
      text = "the node's port was closed";
      return false;
    }
    auto& limits = st->limits;
    // A token bucket: a burst of `max_unauthenticated_messages`, refilled
    // at as many a second.
    auto rate = static_cast<double>(limits.max_unauthenticated_messages);
    auto now = clock_type::now();
    if (headers_ == 0)
      tokens_ = rate;
    else
      tokens_ = std::min(rate, tokens_ + rate * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    ++headers_;
    if (tokens_ < 1.0) {
      why = closed_for::messages;
      text = fmt::format("more than {} BASP messages a second before a session opened ({} in all)",
                         limits.max_unauthenticated_messages, headers_);
      return false;
    }
    tokens_ -= 1.0;
    if (hdr.payload_len > limits.max_unauthenticated_payload) {
      why = closed_for::payload;
      text = fmt::format("a BASP header announced a payload of {} bytes before a session opened "
                         "(at most {})",
                         hdr.payload_len, limits.max_unauthenticated_payload);
      return false;
    }
    if (hdr.payload_len > 0) {
      payload_next_ = true;
      handshake_next_ = caf::io::basp::is_handshake(hdr);
    }
    return true;
  }

  bool admitted_ = false;
  /// Weak: the port's state holds its unauthenticated connections.
  std::weak_ptr<listener_state> st_;

private:
  clock_type::time_point accepted_;
  const caf::actor_system* sys_ = nullptr;
  caf::node_id peer_;
  /// Whether this connection is `peer_`'s claimant (`claim_peer`).
  bool claimant_ = false;
  std::list<guarded_ptr>::iterator where_;
  bool listed_ = false;
  bool payload_next_ = false;
  bool handshake_next_ = false;
  std::uint64_t headers_ = 0;
  double tokens_ = 0;
  clock_type::time_point last_;
};

/// Plain TCP: CAF's policy.
struct plain_policy : caf::policy::tcp {
  static bool handshake_pending(native_socket) { return false; }
};

/// TLS: CAF's session through tls_middleman's clean policy.
struct tls_policy : clean_ssl_policy {
  using clean_ssl_policy::clean_ssl_policy;
  /// Whether the TLS handshake still waits for the peer: with no bytes
  /// asked, `read_some` drives SSL_accept and says `indeterminate` once it
  /// is done (caf::openssl::session::do_some).
  bool handshake_pending(native_socket fd) {
    size_t n = 0;
    return read_some(n, fd, nullptr, 0) != rw_state::indeterminate;
  }
};

/// CAF's `stream_impl`, which stops polling for writes while a TLS
/// handshake waits for the peer. Why: CAF's session answers a write made
/// during SSL_accept that wants to read with "success, 0 bytes"
/// (session.cpp do_some), and the BASP broker queued its server handshake
/// on the connection at once; a socket that can take bytes polls writable
/// all the time, so the multiplexer called the write again at once, for as
/// long as the peer stayed silent (one idle connection: 70% of a core).
/// Writes resume at the peer's next bytes.
template <class Policy>
class guarded_stream : public caf::io::network::stream {
public:
  template <class... Ts>
  guarded_stream(default_mpx& mpx, native_socket fd, Ts&&... xs)
    : stream(mpx, fd), policy_(std::forward<Ts>(xs)...) {}

  void handle_event(operation op) override {
    if (op == operation::write && !handshake_done_) {
      if (policy_.handshake_pending(fd())) {
        parked_ = true;
        backend().del(operation::write, fd(), this);
        return;
      }
      handshake_done_ = true;
    }
    if (op == operation::read && parked_) {
      parked_ = false;
      backend().add(operation::write, fd(), this);
    }
    handle_event_impl(op, policy_);
  }

  void removed_from_loop(operation op) override {
    if (op == operation::write && parked_)
      return; // keeps its writer for when the handshake goes on
    stream::removed_from_loop(op);
  }

  /// For a close: the writer a parked stream keeps goes.
  void drop_parked_writer() {
    if (!parked_)
      return;
    parked_ = false;
    stream::removed_from_loop(operation::write);
  }

private:
  Policy policy_;
  bool handshake_done_ = false;
  bool parked_ = false;
};

template <class Policy>
class guarded_scribe final : public guarded_scribe_base {
public:
  template <class... Ts>
  guarded_scribe(default_mpx& mpx, native_socket fd, Ts&&... xs)
    : guarded_scribe_base(fd), stream_(mpx, fd, std::forward<Ts>(xs)...) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_)
      launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    // A stream parked in its TLS handshake would wait for the peer forever
    // to send what it has queued (and keep its socket): it has nothing worth
    // sending before the handshake anyway.
    stream_.drop_parked_writer();
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string{};
  }
  uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void launch() {
    launched_ = true;
    stream_.start(this);
    if constexpr (std::is_same_v<Policy, tls_policy>)
      stream_.force_empty_write(this); // SSL_accept may have more to do
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override {
    // Every close passes here (detach): by the broker, the peer or us.
    unlist();
    drop_claim();
    stream_.passivate();
  }

  bool consume(caf::execution_unit* ctx, const void* buf, size_t num_bytes) override {
    if (!admitted_ && !detached()) {
      closed_for why{};
      std::string text;
      if (!check(ctx, static_cast<const char*>(buf), num_bytes, why, text)) {
        // Returns before the broker sees the header: it never asks for the
        // payload, so nothing is allocated for it.
        refuse(ctx, why, text);
        return false;
      }
    }
    return scribe::consume(ctx, buf, num_bytes);
  }

  void refuse(caf::execution_unit* ctx, closed_for why, const std::string& text) override {
    if (detached())
      return;
    caf::intrusive_ptr<guarded_scribe> keep{this};
    if (auto st = st_.lock())
      st->note(why, fmt::format("{}:{}: {}", addr(), port(), text));
    // The peer sees the close; a write still pending fails and lets go.
    ::shutdown(stream_.fd(), SHUT_RDWR);
    stream_.drop_parked_writer();
    io_failure(ctx, operation::read); // detach: the broker's connection_closed_msg
  }

private:
  bool launched_ = false;
  guarded_stream<Policy> stream_;
};

/// Accepts as CAF's `policy::tcp`; at the descriptor limit, takes the
/// connection with a spare descriptor kept for it and closes it: otherwise
/// the connection stays pending, the listening socket readable, and the
/// multiplexer calls `accept` again at once, forever (a node at its limit
/// used a core and served nobody).
class spare_fd_accept {
public:
  spare_fd_accept() : spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}
  ~spare_fd_accept() {
    if (spare_ >= 0)
      ::close(spare_);
  }
  spare_fd_accept(const spare_fd_accept&) = delete;
  spare_fd_accept& operator=(const spare_fd_accept&) = delete;

  bool try_accept(native_socket& result, native_socket fd) {
    result = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (result != caf::io::network::invalid_native_socket)
      return true;
    if ((errno == EMFILE || errno == ENFILE) && spare_ >= 0) {
      ::close(spare_);
      auto c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0)
        ::close(c);
      spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      at_limit = true;
    }
    return false;
  }

  static constexpr bool must_read_more(native_socket, size_t) { return false; }

  bool at_limit = false;

private:
  int spare_;
};

/// Closes the unauthenticated connections older than the timeout, oldest
/// first, and lets go of those released since the last sweep.
void sweep(listener_state& st, caf::execution_unit* ctx) {
  st.released.clear();
  auto now = clock_type::now();
  while (!st.pending.empty()) {
    auto s = st.pending.front(); // a reference of its own
    if (s->detached() || s->admitted_now()) {
      s->unlist(); // if it is still listed
      continue;
    }
    if (now - s->accepted() < st.limits.handshake_timeout)
      break;
    s->refuse(ctx, closed_for::timeout,
              fmt::format("no session within the handshake timeout ({} ms)",
                          st.limits.handshake_timeout.count()));
    s->unlist();
  }
  st.released.clear();
}

class guarded_doorman final : public caf::io::doorman {
public:
  guarded_doorman(default_mpx& mpx, native_socket fd, std::shared_ptr<listener_state> st,
                  bool tls)
    : doorman(caf::io::network::accept_hdl_from_socket(fd)),
      acceptor_(mpx, fd),
      st_(std::move(st)),
      tls_(tls) {}

  bool new_connection() override {
    if (detached())
      return false; // closed by the broker; the multiplexer has not dropped it yet
    auto& mpx = acceptor_.backend();
    auto fd = acceptor_.accepted_socket();
    caf::detail::socket_guard guard{fd};
    caf::io::network::nonblocking(fd, true);
    auto& st = *st_;
    sweep(st, &mpx);
    // Room for this one: the oldest unauthenticated connections go.
    while (st.pending.size() >= st.max_unauthenticated) {
      auto s = st.pending.front();
      if (!s->detached() && !s->admitted_now())
        s->refuse(&mpx, closed_for::crowd,
                  fmt::format("{} unauthenticated connections are open (at most {}): the "
                              "oldest is closed for a new one",
                              st.pending.size(), st.max_unauthenticated));
      s->unlist();
    }
    st.released.clear();
    guarded_ptr scribe;
    if (tls_) {
      auto session = make_clean_session(parent()->system(), fd, true);
      if (session == nullptr)
        return false;
      scribe = caf::make_counted<guarded_scribe<tls_policy>>(mpx, fd, std::move(session));
    } else {
      caf::io::network::keepalive(fd, true);
      scribe = caf::make_counted<guarded_scribe<plain_policy>>(mpx, fd);
    }
    guard.release(); // the scribe owns the socket
    scribe->enlist(st_);
    auto hdl = scribe->hdl();
    parent()->add_scribe(caf::io::scribe_ptr{scribe});
    return doorman::new_connection(&mpx, hdl);
  }

  void graceful_shutdown() override {
    acceptor_.graceful_shutdown();
    detach(&acceptor_.backend(), false);
  }
  void launch() override { acceptor_.start(this); }
  std::string addr() const override {
    auto x = caf::io::network::local_addr_of_fd(acceptor_.fd());
    return x ? *x : std::string{};
  }
  uint16_t port() const override {
    auto x = caf::io::network::local_port_of_fd(acceptor_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { acceptor_.activate(this); }
  void remove_from_loop() override { acceptor_.passivate(); }

private:
  caf::io::network::acceptor_impl<spare_fd_accept> acceptor_;
  std::shared_ptr<listener_state> st_;
  bool tls_;
};

using sweep_atom = caf::atom_constant<caf::atom("conn_sweep")>;

/// Sweeps a port's connections every quarter of its timeout (so one is
/// closed within 1.25 timeouts), on the multiplexer's thread, for as long
/// as the port or one of its connections lives.
caf::behavior sweeper(caf::event_based_actor* self, std::weak_ptr<listener_state> weak,
                      default_mpx* mpx, caf::timespan period) {
  self->delayed_send(self, period, sweep_atom::value);
  return {
    [=](sweep_atom) {
      if (weak.expired()) {
        self->quit();
        return;
      }
      mpx->post([weak, mpx] {
        if (auto st = weak.lock())
          sweep(*st, mpx);
      });
      self->delayed_send(self, period, sweep_atom::value);
    },
  };
}

} // namespace

void admit_peer(const caf::actor_system& sys, const caf::node_id& n) {
  if (!n)
    return;
  std::lock_guard guard{claims_mu};
  claims()[{&sys, n}].admitted = true;
}

void forget_peer(const caf::actor_system& sys, const caf::node_id& n) {
  std::lock_guard guard{claims_mu};
  auto i = claims().find({&sys, n});
  if (i == claims().end())
    return;
  if (i->second.conn == nullptr)
    claims().erase(i);
  else
    i->second.admitted = false;
}

caf::expected<uint16_t> publish_guarded(const caf::actor& whom, std::set<std::string> sigs,
                                        uint16_t port, const std::string& address,
                                        const node_transport_limits& limits) {
  auto& sys = whom.home_system();
  auto& mpx = static_cast<default_mpx&>(sys.middleman().backend());
  auto fd = caf::io::network::new_tcp_acceptor_impl(port, address.empty() ? nullptr
                                                                          : address.c_str(),
                                                    true);
  if (!fd)
    return std::move(fd.error());
  auto st = std::make_shared<listener_state>();
  st->sys = &sys;
  st->limits = limits;
  st->limits.handshake_timeout = std::max(limits.handshake_timeout, std::chrono::milliseconds{1});
  // Half the descriptors at most, so that sessions' connections, their
  // files and the spare for `accept` keep room.
  std::size_t room = 1024;
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
    room = static_cast<std::size_t>(nofile.rlim_cur) / 2;
  st->max_unauthenticated = std::max<std::size_t>(1, std::min(limits.max_unauthenticated, room));
  auto dm = caf::make_counted<guarded_doorman>(mpx, *fd, st, sys.has_openssl_manager());
  auto actual = dm->port();
  st->name = fmt::format("on port {}", actual);
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  // What CAF's middleman actor does for `publish` (middleman_actor_impl::put).
  caf::anon_send(broker, caf::publish_atom_v, caf::io::doorman_ptr{std::move(dm)}, actual,
                 caf::actor_cast<caf::strong_actor_ptr>(whom), std::move(sigs));
  auto period = std::max<caf::timespan>(std::chrono::milliseconds{20},
                                        std::chrono::duration_cast<caf::timespan>(
                                          st->limits.handshake_timeout / 4));
  {
    logger_tie_guard untie; // spawning ties this thread to the system
    sys.spawn<caf::hidden>(sweeper, std::weak_ptr<listener_state>{st}, &mpx, period);
  }
  return actual;
}

} // namespace multidev::detail
