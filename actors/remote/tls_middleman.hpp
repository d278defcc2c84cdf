#pragma once
/// \file
/// TLS connections whose failure stays their own.
///
/// CAF 0.17.6's OpenSSL module (libcaf_openssl/src/openssl/session.cpp)
/// calls `SSL_read`/`SSL_write`/`SSL_connect`/`SSL_accept` without clearing
/// the calling thread's OpenSSL error queue first, and drains that queue only
/// inside `CAF_LOG_INFO(... get_ssl_error())` (session.cpp:108 and :296),
/// which a build at `CAF_LOG_LEVEL_QUIET` (Debian's) compiles out. OpenSSL 3
/// queues an error when a peer's connection ends without a TLS close
/// (`unexpected eof while reading`, a process killed or exited) or is reset;
/// the next `SSL_read` of *any other* connection on the multiplexer's thread
/// that would block returns -1, `SSL_get_error` sees the stale error and says
/// `SSL_ERROR_SSL` instead of `SSL_ERROR_WANT_READ` (session.cpp:104-120,
/// 283-299), and CAF closes that healthy connection: losing one node lost
/// every node attached over TLS.
///
/// `use_clean_tls` replaces the OpenSSL manager's middleman actor (the one
/// `caf::openssl::publish` and `caf::openssl::remote_actor` ask) with one
/// whose connections use the same `caf::openssl::session` but clear the
/// thread's error queue before each OpenSSL call and after each failure.

#include <caf/io/network/native_socket.hpp>
#include <caf/io/network/rw_state.hpp>
#include <caf/openssl/session.hpp>

#include <openssl/err.h>

namespace caf {
class actor_system;
}

namespace multidev::detail {

/// Empties this thread's OpenSSL error queue when it goes out of scope, and
/// once at construction: what an OpenSSL call finds there must be its own.
struct clean_error_queue {
  clean_error_queue() { ERR_clear_error(); }
  ~clean_error_queue() { ERR_clear_error(); }
  clean_error_queue(const clean_error_queue&) = delete;
  clean_error_queue& operator=(const clean_error_queue&) = delete;
};

/// CAF's `ssl_policy` with the queue cleared around each call.
struct clean_ssl_policy {
  explicit clean_ssl_policy(caf::openssl::session_ptr session)
    : session_(std::move(session)) {}

  caf::io::network::rw_state read_some(size_t& result, caf::io::network::native_socket fd,
                                       void* buf, size_t len) {
    clean_error_queue clean;
    return session_->read_some(result, fd, buf, len);
  }

  caf::io::network::rw_state write_some(size_t& result, caf::io::network::native_socket fd,
                                        const void* buf, size_t len) {
    clean_error_queue clean;
    return session_->write_some(result, fd, buf, len);
  }

  bool must_read_more(caf::io::network::native_socket fd, size_t threshold) {
    return session_->must_read_more(fd, threshold);
  }

private:
  caf::openssl::session_ptr session_;
};

/// `caf::openssl::make_session` with a clean queue for its handshake start.
caf::openssl::session_ptr make_clean_session(caf::actor_system& sys,
                                             caf::io::network::native_socket fd, bool accepted);

/// On a system with CAF's OpenSSL manager: makes its connections made from
/// now on clear OpenSSL's error queue around each call (see above). Once per
/// system (later calls return at once); a no-op without the manager. Call it
/// before the system's first `caf::openssl::publish` or `remote_actor`.
void use_clean_tls(caf::actor_system& sys);

} // namespace multidev::detail
