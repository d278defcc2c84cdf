// TLS connections whose failure stays their own (see tls_middleman.hpp).
//
// The scribe, doorman and middleman actor below follow CAF 0.17.6's
// libcaf_openssl/src/openssl/middleman_actor.cpp (BSD-3-Clause, Dominik
// Charousset), with a policy that brackets each OpenSSL call with
// ERR_clear_error(); the session (handshake, certificates, cipher list) is
// CAF's own `caf::openssl::session`.
#include "actors/remote/tls_middleman.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/detail/socket_guard.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/interfaces.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/session.hpp>
#include <caf/send.hpp>

#include <openssl/err.h>

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>

#include <cstring>
#include <mutex>

#include "actors/logger_tie.hpp"

namespace multidev::detail {

namespace {

using native_socket = caf::io::network::native_socket;
using default_mpx = caf::io::network::default_multiplexer;
using rw_state = caf::io::network::rw_state;

/// How long `connect` may take to finish the TLS handshake and hear from
/// the server: CAF's own connect has no bound but the peer's.
constexpr auto tls_handshake_bound = std::chrono::seconds{5};

/// Waits until `fd` has `events` (POLLIN, POLLOUT) or `deadline` passed;
/// whether it has.
bool wait_for(native_socket fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return false;
    pollfd p{fd, events, 0};
    auto r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
    if (r > 0)
      return true;
    if (r < 0 && errno != EINTR)
      return false;
  }
}

/// Completes the client's TLS handshake on `fd` and waits until the server
/// has sent something after it (its BASP handshake follows its TLS one at
/// once), without reading it. Why: CAF 0.17.6's BASP broker files a
/// connection it made under a context whose `last_seen` is the clock's epoch
/// (basp_broker.cpp, `this->ctx[hdl]` in the `connect_atom` handler) and only
/// moves it when data comes. Its next heartbeat tick (within one interval)
/// then closes the connection as timed out unless the server's handshake
/// came first. A TLS handshake run by the multiplexer after the broker took
/// the connection, on a loaded machine, often did not: the connection was
/// closed after the server had taken our client handshake, so the server
/// routed to us over a connection that then closed and dropped every proxy
/// of ours (`purge_state`): messages its actors sent through them (a copy's
/// bytes) were lost. Done here, the broker takes a connection whose server
/// handshake is already on its way, and reads it in its next poll.
bool finish_client_handshake(caf::openssl::session& session, native_socket fd) {
  auto deadline = std::chrono::steady_clock::now() + tls_handshake_bound;
  for (;;) {
    clean_error_queue clean;
    size_t n = 0;
    // With no bytes asked, `read_some` drives SSL_connect: `success` while
    // it wants more, `indeterminate` once done, `failure` if it failed
    // (caf::openssl::session::do_some).
    switch (session.read_some(n, fd, nullptr, 0)) {
      case rw_state::indeterminate:
        return wait_for(fd, POLLIN, deadline);
      case rw_state::failure:
        return false;
      case rw_state::success:
        break;
    }
    // It wants the server's next flight; or room to send (rare, for a
    // handshake): tried again after a short wait either way.
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 20);
  }
}

class scribe_impl : public caf::io::scribe {
public:
  scribe_impl(default_mpx& mpx, native_socket fd, caf::openssl::session_ptr session)
    : scribe(caf::io::network::conn_hdl_from_socket(fd)), stream_(mpx, fd, std::move(session)) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_)
      launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
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
    // Schedules the scribe in case SSL_connect or SSL_accept has more to do.
    stream_.force_empty_write(this);
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

private:
  bool launched_ = false;
  caf::io::network::stream_impl<clean_ssl_policy> stream_;
};

class doorman_impl : public caf::io::network::doorman_impl {
public:
  doorman_impl(default_mpx& mpx, native_socket fd) : caf::io::network::doorman_impl(mpx, fd) {}

  bool new_connection() override {
    if (detached())
      return false; // closed by the broker; the multiplexer has not dropped it yet
    auto& mpx = acceptor_.backend();
    auto fd = acceptor_.accepted_socket();
    caf::detail::socket_guard guard{fd};
    caf::io::network::nonblocking(fd, true);
    auto session = make_clean_session(parent()->system(), fd, true);
    if (session == nullptr)
      return false;
    auto scribe = caf::make_counted<scribe_impl>(mpx, fd, std::move(session));
    guard.release(); // the scribe owns the socket
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mpx, hdl);
  }
};

class clean_middleman_actor : public caf::io::middleman_actor_impl {
public:
  clean_middleman_actor(caf::actor_config& cfg, caf::actor broker)
    : caf::io::middleman_actor_impl(cfg, std::move(broker)) {}

  const char* name() const override { return "multidev_tls_middleman"; }

protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, uint16_t port) override {
    auto fd = caf::io::network::new_tcp_connection(host, port);
    if (!fd)
      return std::move(fd.error());
    caf::io::network::nonblocking(*fd, true);
    auto session = make_clean_session(system(), *fd, false);
    if (!session || !finish_client_handshake(*session, *fd)) {
      caf::io::network::close_socket(*fd);
      return caf::sec::cannot_connect_to_node;
    }
    return caf::make_counted<scribe_impl>(mpx(), *fd, std::move(session));
  }

  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd)
      return std::move(fd.error());
    return caf::make_counted<doorman_impl>(mpx(), *fd);
  }

private:
  default_mpx& mpx() { return static_cast<default_mpx&>(system().middleman().backend()); }
};

std::mutex swap_mu;

} // namespace

/// `caf::openssl::make_session` with a clean queue for its handshake start.
caf::openssl::session_ptr make_clean_session(caf::actor_system& sys, native_socket fd,
                                             bool accepted) {
  clean_error_queue clean;
  return caf::openssl::make_session(sys, fd, accepted);
}

void use_clean_tls(caf::actor_system& sys) {
  if (!sys.has_openssl_manager())
    return;
  std::lock_guard guard{swap_mu};
  auto& manager = sys.openssl_manager();
  // The manager keeps its actor in a member it hands out by const reference;
  // the manager itself is not const. Its stop() ends whichever actor is there.
  auto& slot = const_cast<caf::io::middleman_actor&>(manager.actor_handle());
  if (slot && dynamic_cast<clean_middleman_actor*>(caf::actor_cast<caf::abstract_actor*>(slot)))
    return; // done before
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  caf::io::middleman_actor clean;
  {
    logger_tie_guard untie; // spawning ties this thread to the system
    // Spawned as CAF spawns the one it replaces (make_middleman_actor).
    clean = caf::get_or(sys.config(), "middleman.attach-utility-actors", false)
              ? sys.spawn<clean_middleman_actor, caf::hidden>(std::move(broker))
              : sys.spawn<clean_middleman_actor, caf::detached + caf::hidden>(std::move(broker));
  }
  auto old = std::exchange(slot, std::move(clean));
  if (old)
    caf::anon_send_exit(old, caf::exit_reason::kill);
}

} // namespace multidev::detail
