// What bad bytes cost a `multidev node` (issue 38 point 3): a peer that has
// not opened a session cannot make it allocate much, hold a connection past
// the handshake timeout, or keep it from serving sessions with idle
// connections, over plain TCP and TLS. Each case starts a node process
// (scenario/node_process.hpp), attacks it over raw sockets (or a raw
// OpenSSL client), reads its RSS and CPU time from /proc, and checks that
// a session is still served. The figures it prints (BOOST_TEST_MESSAGE) are
// the README's "Security model" measurements.
//
// The tool's path is the test's first argument.
#define BOOST_TEST_MODULE node_transport
#include <boost/test/unit_test.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/middleman.hpp>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "node_support.hpp"
#include "scenario/node_process.hpp"
#include "test_certs.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using namespace multidev;
using multidev::scenario::node_process;
using steady = std::chrono::steady_clock;

namespace {

using test_support::have_certificates;
using test_support::node_tls_args;
using test_support::test_certificates;
using test_support::tool;

/// A client's actor system config: plain TCP, or TLS with the test's files.
std::unique_ptr<caf::actor_system_config> client_cfg(bool tls) {
  auto c = std::make_unique<caf::actor_system_config>();
  c->load<caf::io::middleman>();
  register_types(*c);
  c->set("scheduler.max-threads", size_t{2});
  c->set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds{500}});
  c->set("middleman.connection-timeout", caf::timespan{std::chrono::seconds{3}});
  if (tls)
    configure_tls(*c, *test_certificates());
  return c;
}

/// A client of the node at `port` with one session open (its one device in
/// `ds[0]`), plain TCP.
struct client_session {
  std::unique_ptr<caf::actor_system_config> cfg = client_cfg(false);
  caf::actor_system sys{*cfg};
  backend b{sys, {.num_devices = 1}};
  std::vector<device> ds;

  explicit client_session(uint16_t port) {
    ds = attach_node(b, "127.0.0.1", port, 20s);
    BOOST_TEST_REQUIRE(ds.size() == 1u);
  }
  /// Pool 1 of 1 KiB on the node's device, filled (the session in use).
  void fill_pool() {
    b.alloc_pool(ds[0], 1, 1024, 64);
    b.sync(b.schedule_named(ds[0], {"fill", {buffer_arg{buffer_loc{1, 0}, 1024}, 1.0}}));
  }
};

/// A field of /proc/PID/status in KiB: VmRSS (the resident set now) or
/// VmHWM (its peak so far, which a buffer allocated and freed between two
/// looks still shows).
long status_kib(pid_t pid, const std::string& field) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0)
      return std::stol(line.substr(field.size() + 1));
  return -1;
}

/// The CPU time the node used so far, user and system, in seconds
/// (/proc/PID/stat, fields 14 and 15).
double cpu_seconds(pid_t pid) {
  std::ifstream in{"/proc/" + std::to_string(pid) + "/stat"};
  std::string all{std::istreambuf_iterator<char>{in}, {}};
  auto rest = all.substr(all.rfind(')') + 2); // from field 3 (state)
  std::istringstream fields{rest};
  std::string f;
  double utime = 0, stime = 0;
  for (int k = 3; k <= 15 && fields >> f; ++k) {
    if (k == 14)
      utime = std::stod(f);
    if (k == 15)
      stime = std::stod(f);
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// The share of one core the node used over `window`.
double core_share(pid_t pid, std::chrono::milliseconds window) {
  auto c0 = cpu_seconds(pid);
  auto t0 = steady::now();
  std::this_thread::sleep_for(window); // the measurement's window, not a synchronisation
  auto c1 = cpu_seconds(pid);
  return (c1 - c0) / std::chrono::duration<double>(steady::now() - t0).count();
}

/// A TCP connection to 127.0.0.1:port, or -1 when it was not made within
/// one second (a node that does not accept: its backlog full).
int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (errno != EINPROGRESS || ::poll(&p, 1, 1000) != 1
        || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      ::close(fd);
      return -1;
    }
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  auto n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  BOOST_TEST_REQUIRE(n == static_cast<ssize_t>(bytes.size()), "cannot send to the node");
}

/// Whether the node closed `fd` within `limit`: reads and drops what it
/// sends (its BASP handshake) until the end of the stream or a reset.
bool closed_within(int fd, std::chrono::milliseconds limit) {
  auto deadline = steady::now() + limit;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    if (left.count() <= 0)
      return false;
    pollfd p{fd, POLLIN, 0};
    auto r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return r < 0;
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
      return true;
  }
}

/// How many of the first `n` of `fds` the node closed, each waited for
/// until `deadline`.
std::size_t closed_by(const std::vector<int>& fds, std::size_t n, steady::time_point deadline) {
  std::size_t closed = 0;
  for (std::size_t k = 0; k < n && k < fds.size(); ++k) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    if (closed_within(fds[k], std::max(left, 1ms)))
      ++closed;
  }
  return closed;
}

/// The unauthenticated connections a node holds by default
/// (`node_transport_limits::max_unauthenticated`).
constexpr std::size_t default_max_unauthenticated = 64;

/// A well-formed BASP direct_message header (CAF 0.17: operation 2, a
/// payload length of 0xFFFFFFF0, actors 1 and 1): the broker sizes its read
/// buffer for the ~4 GiB payload it announces.
std::string huge_header() {
  const unsigned char h[32] = {2, 0, 0, 0, 0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 0, 0, 0, 0, 0,
                               0, 0, 0, 0, 0,    0,    0,    1,    0, 0, 0, 0, 0, 0, 0, 1};
  return std::string{reinterpret_cast<const char*>(h), sizeof h};
}

/// A well-formed BASP direct_message header announcing a payload of
/// `len` bytes.
std::string header_announcing(caf::actor_system& sys, uint32_t len) {
  caf::io::basp::header hdr{caf::io::basp::message_type::direct_message, 0, len, 0, 1, 1};
  std::vector<char> bytes;
  caf::binary_serializer sink{sys, bytes};
  BOOST_TEST_REQUIRE(!sink(hdr));
  return std::string{bytes.begin(), bytes.end()};
}

/// A BASP client handshake (CAF 0.17.6 basp::instance::write_client_handshake:
/// the header, then the sender's node id) that claims to come from node
/// `claimed`.
std::string handshake_claiming(caf::actor_system& sys, caf::node_id claimed) {
  std::vector<char> payload;
  caf::binary_serializer ps{sys, payload};
  BOOST_TEST_REQUIRE(!ps(claimed));
  caf::io::basp::header hdr{caf::io::basp::message_type::client_handshake,
                            0,
                            static_cast<uint32_t>(payload.size()),
                            0,
                            caf::invalid_actor_id,
                            caf::invalid_actor_id};
  std::vector<char> bytes;
  caf::binary_serializer sink{sys, bytes};
  BOOST_TEST_REQUIRE(!sink(hdr));
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return std::string{bytes.begin(), bytes.end()};
}

/// Attaches the node at `port` (as a fresh client) and runs a task on its
/// device, all within `bound`; the seconds it took. Throws (the test fails,
/// naming why) when it cannot.
double serve_one_session(bool tls, uint16_t port, std::chrono::milliseconds bound = 20s) {
  auto cfg = client_cfg(tls);
  caf::actor_system sys{*cfg};
  backend b{sys, {.num_devices = 1}};
  auto t0 = steady::now();
  auto ds = attach_node(b, "127.0.0.1", port, bound);
  if (ds.size() != 1u)
    throw std::runtime_error("the node listed " + std::to_string(ds.size()) + " devices, not 1");
  b.alloc_pool(ds[0], 1, 1024, 64);
  b.sync(b.schedule_named(ds[0], {"fill", {buffer_arg{buffer_loc{1, 0}, 1024}, 1.0}}));
  return std::chrono::duration<double>(steady::now() - t0).count();
}

/// `serve_one_session`, its exception caught: {seconds, ""}, or {-1, what}.
std::pair<double, std::string> try_session(bool tls, uint16_t port) {
  try {
    return {serve_one_session(tls, port), {}};
  } catch (const std::exception& e) {
    return {-1, e.what()};
  }
}

/// A TLS client of the node's (with the test's certificate) that completes
/// the TLS handshake and then writes raw bytes: a BASP peer that lies.
struct raw_tls_client {
  explicit raw_tls_client(uint16_t port) {
    const auto& f = *test_certificates();
    ctx = SSL_CTX_new(TLS_client_method());
    BOOST_TEST_REQUIRE(ctx != nullptr);
    BOOST_TEST_REQUIRE(SSL_CTX_use_certificate_chain_file(ctx, f.certificate.c_str()) == 1);
    BOOST_TEST_REQUIRE(SSL_CTX_use_PrivateKey_file(ctx, f.key.c_str(), SSL_FILETYPE_PEM) == 1);
    fd = connect_to(port);
    BOOST_TEST_REQUIRE(fd >= 0, "cannot connect to the TLS node");
    timeval tv{10, 0}; // a handshake the node never answers fails, not hangs
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    BOOST_TEST_REQUIRE(SSL_connect(ssl) == 1, "the TLS handshake with the node failed");
  }
  ~raw_tls_client() {
    if (ssl)
      SSL_free(ssl);
    if (fd >= 0)
      ::close(fd);
    if (ctx)
      SSL_CTX_free(ctx);
  }
  raw_tls_client(const raw_tls_client&) = delete;
  raw_tls_client& operator=(const raw_tls_client&) = delete;

  void send(const std::string& bytes) {
    BOOST_TEST_REQUIRE(SSL_write(ssl, bytes.data(), static_cast<int>(bytes.size()))
                       == static_cast<int>(bytes.size()));
  }

  /// Whether the node closed the connection within `limit` (reads and
  /// drops its BASP handshake).
  bool closed_within(std::chrono::milliseconds limit) {
    auto deadline = steady::now() + limit;
    char buf[4096];
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      if (left.count() <= 0)
        return false;
      if (SSL_pending(ssl) == 0) {
        pollfd p{fd, POLLIN, 0};
        auto r = ::poll(&p, 1, static_cast<int>(left.count()));
        if (r < 0 && errno == EINTR)
          continue;
        if (r <= 0)
          return r < 0;
      }
      ERR_clear_error();
      if (SSL_read(ssl, buf, sizeof buf) <= 0)
        return true;
    }
  }

  SSL_CTX* ctx = nullptr;
  SSL* ssl = nullptr;
  int fd = -1;
};

/// The 4 GiB header, sent over `send`, closes the connection (`closed`)
/// without the node's RSS doubling, and the next session is served.
template <class Attack>
void a_4_gib_header_allocates_nothing(bool tls, Attack attack) {
  auto extra = tls ? node_tls_args() : std::vector<std::string>{};
  node_process node{tool(), 1, "g", false, extra};
  // Idle: after one session, as a node that served before it is attacked.
  serve_one_session(tls, node.port());
  auto idle = status_kib(node.pid(), "VmRSS");
  auto idle_peak = status_kib(node.pid(), "VmHWM");
  BOOST_TEST_REQUIRE(idle > 0);
  bool closed = attack(node.port());
  auto after = status_kib(node.pid(), "VmRSS");
  auto peak = status_kib(node.pid(), "VmHWM");
  BOOST_TEST(closed, "the node kept the connection of a 4 GiB header open for 10 s");
  // The peak: over TLS, CAF 0.17 allocates the 4 GiB, then fails to read
  // into it (SSL_read's length is an int) and frees it.
  BOOST_TEST(peak < 2 * idle_peak, "the node's peak RSS went from " << idle_peak << " KiB to "
                                                                    << peak << " KiB");
  auto took = serve_one_session(tls, node.port());
  BOOST_TEST_MESSAGE((tls ? "TLS" : "plain TCP")
                     << ": a 4 GiB BASP header: RSS " << idle << " KiB idle (peak " << idle_peak
                     << "), " << after << " KiB after (peak " << peak
                     << "); the next session served in " << took << " s");
}

/// Raises this process's descriptor limit to `want` (or its hard limit).
void raise_fd_limit(rlim_t want) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = std::min(want, lim.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &lim);
}

} // namespace

BOOST_AUTO_TEST_CASE(node_transport_a_4_gib_basp_header_over_plain_tcp_allocates_nothing) {
  a_4_gib_header_allocates_nothing(false, [](uint16_t port) {
    int fd = connect_to(port);
    BOOST_TEST_REQUIRE(fd >= 0);
    send_all(fd, huge_header());
    bool closed = closed_within(fd, 10s);
    ::close(fd);
    return closed;
  });
}

BOOST_AUTO_TEST_CASE(node_transport_a_4_gib_basp_header_over_tls_allocates_nothing,
                     *boost::unit_test::precondition(have_certificates)) {
  a_4_gib_header_allocates_nothing(true, [](uint16_t port) {
    raw_tls_client c{port};
    c.send(huge_header());
    return c.closed_within(10s);
  });
}

BOOST_AUTO_TEST_CASE(node_transport_idle_and_half_header_connections_are_closed_at_the_timeout) {
  // A handshake timeout of 0.5 s; a session outlives it.
  node_process node{tool(), 1, "t", false, {"--handshake-timeout", "0.5"}};
  int idle = connect_to(node.port());
  int half = connect_to(node.port());
  BOOST_TEST_REQUIRE((idle >= 0 && half >= 0));
  send_all(half, huge_header().substr(0, 16));
  auto t0 = steady::now();
  BOOST_TEST(closed_within(idle, 10s), "an idle connection was still open after 10 s");
  BOOST_TEST(closed_within(half, 10s), "a connection with half a header was still open after 10 s");
  BOOST_TEST_MESSAGE("idle and half-header connections closed after "
                     << std::chrono::duration<double>(steady::now() - t0).count()
                     << " s (timeout 0.5 s)");
  ::close(idle);
  ::close(half);
  // A session's connection is not cut at the timeout: a task of 1.5 s
  // (three timeouts), then another, on one session.
  client_session c{node.port()};
  c.b.sync(c.b.schedule_named(c.ds[0], {"spin_ns", {int64_t{1'500'000'000}}}));
  c.fill_pool();
}

BOOST_AUTO_TEST_CASE(node_transport_1000_idle_connections_at_the_fd_limit_leave_sessions_served) {
  // The node's descriptor limit (256) is below the connections opened:
  // unauthenticated ones are capped (64 by default), the oldest closed.
  raise_fd_limit(4096);
  node_process node{tool(), 1, "m"};
  rlimit lim{256, 256};
  BOOST_TEST_REQUIRE(::prlimit(node.pid(), RLIMIT_NOFILE, &lim, nullptr) == 0);
  std::vector<int> conns;
  int failed = 0;
  for (int k = 0; k < 1000; ++k) {
    int fd = connect_to(node.port());
    fd >= 0 ? conns.push_back(fd) : void(++failed);
  }
  // The node holds the newest 64 and closed the others, oldest first: all
  // accepted and dealt with once the last of those is closed.
  auto expect_closed = conns.size() - std::min(conns.size(), default_max_unauthenticated);
  auto closed = closed_by(conns, expect_closed, steady::now() + 20s);
  BOOST_TEST(closed == expect_closed, "the node closed " << closed << " of the " << expect_closed
                                                         << " oldest of " << conns.size()
                                                         << " idle connections");
  auto share = core_share(node.pid(), 2000ms);
  auto [took, error] = try_session(false, node.port());
  BOOST_TEST_MESSAGE("plain TCP, node limit 256 descriptors: 1000 idle connections ("
                     << failed << " not accepted within 1 s): the node used " << share * 100
                     << "% of a core over 2 s; a session served in " << took << " s");
  BOOST_TEST(error.empty(), "no session with 1000 idle connections open: " << error);
  // A loose bound (the measurement is the figure above): an idle node
  // measures 0%, a spinning one most of a core (25-35% of one on this
  // loaded 2-core machine).
  BOOST_TEST(share < 0.10, "the node used " << share * 100 << "% of a core");
  for (int fd : conns)
    ::close(fd);
}

BOOST_AUTO_TEST_CASE(node_transport_idle_tcp_connections_to_a_tls_node_cost_no_cpu,
                     *boost::unit_test::precondition(have_certificates)) {
  raise_fd_limit(4096);
  node_process node{tool(), 1, "s", false, node_tls_args()};
  std::vector<int> conns;
  for (int k = 0; k < 100; ++k) {
    int fd = connect_to(node.port());
    if (fd >= 0)
      conns.push_back(fd);
  }
  BOOST_TEST_REQUIRE(conns.size() == 100u);
  auto expect_closed = conns.size() - default_max_unauthenticated;
  auto closed = closed_by(conns, expect_closed, steady::now() + 20s);
  BOOST_TEST(closed == expect_closed, "the node closed " << closed << " of the " << expect_closed
                                                         << " oldest of 100 idle connections");
  auto share = core_share(node.pid(), 2000ms);
  auto [took, error] = try_session(true, node.port());
  BOOST_TEST_MESSAGE("TLS: 100 idle TCP connections: the node used "
                     << share * 100 << "% of a core over 2 s; a session served in " << took
                     << " s");
  BOOST_TEST(error.empty(), "no session with 100 idle connections open: " << error);
  BOOST_TEST(share < 0.10, "the node used " << share * 100 << "% of a core");
  for (int fd : conns)
    ::close(fd);
}

/// A precondition: not in a build with AddressSanitizer (the sanitize
/// preset, ASan with UBSan) or ThreadSanitizer.
///
/// Sanitize preset, diagnosed (2026-12-06): the node does not lose the
/// session, it dies. UBSan's vptr check reads the vtable prefix of the
/// object only after `IsAccessibleMemoryRange`, which probes memory by
/// writing it into a `pipe()`; at the descriptor limit `pipe()` fails with
/// EMFILE, the probe says "not accessible", and UBSan reports a valid CAF
/// message as "member call on address ... which does not point to an
/// object of type 'tuple_vals_impl' ... object has invalid vptr <memory
/// cannot be printed>" (caf/detail/tuple_vals.hpp:114). The preset compiles
/// with -fno-sanitize-recover=all, so that report exits the node with
/// status 1 (whatever UBSAN_OPTIONS' halt_on_error says); the client then
/// sees no renewal acknowledged and the session lost. Seen: the node's
/// stderr and its exit status 1 right after the report, in the run with
/// this case forced; and a 20-line program whose valid derived object,
/// called through a base pointer after it used up its descriptors, gets the
/// same report and exits 1 (0 with the checks recoverable: the call is
/// fine). No descriptor the node could keep spare helps: any check in any
/// thread while the node is at its limit fails so. The default build keeps
/// the session in every run.
///
/// ThreadSanitizer: skipped since the case came; not diagnosed there (TSan
/// has no vptr check; not run under TSan for this).
boost::test_tools::assertion_result not_under_a_sanitizer(boost::unit_test::test_unit_id) {
#if defined(__SANITIZE_ADDRESS__)
  boost::test_tools::assertion_result r{false};
  r.message() << "under the sanitize preset UBSan's vptr check probes memory with pipe(), which "
                 "fails at the descriptor limit: it reports a valid CAF message as an invalid "
                 "vptr and, unrecoverable, exits the node (see the comment)";
  return r;
#elif defined(__SANITIZE_THREAD__)
  boost::test_tools::assertion_result r{false};
  r.message() << "not diagnosed under ThreadSanitizer (see the comment)";
  return r;
#else
  return true;
#endif
}

BOOST_AUTO_TEST_CASE(node_transport_at_its_descriptor_limit_a_node_neither_spins_nor_drops_sessions,
                     *boost::unit_test::precondition(not_under_a_sanitizer)) {
  // A session opened first; then the node's descriptor limit is set to what
  // it uses plus 8, and 200 idle connections come: the node runs out of
  // descriptors (its 64 unauthenticated connections do not fit). It must
  // not spin on `accept`, its session goes on, and once the handshake
  // timeout closed the idle ones a new session is served.
  raise_fd_limit(4096);
  node_process node{tool(), 1, "f", false, {"--handshake-timeout", "2"}};
  client_session c{node.port()};
  c.b.alloc_pool(c.ds[0], 1, 1024, 64);
  auto in_use = std::distance(std::filesystem::directory_iterator{"/proc/" + std::to_string(node.pid()) + "/fd"},
                              std::filesystem::directory_iterator{});
  rlimit lim{static_cast<rlim_t>(in_use + 8), static_cast<rlim_t>(in_use + 8)};
  BOOST_TEST_REQUIRE(::prlimit(node.pid(), RLIMIT_NOFILE, &lim, nullptr) == 0);
  std::vector<int> conns;
  for (int k = 0; k < 200; ++k) {
    int fd = connect_to(node.port());
    if (fd >= 0)
      conns.push_back(fd);
  }
  auto share = core_share(node.pid(), 2000ms);
  // The session: served at the limit.
  c.b.sync(c.b.schedule_named(c.ds[0], {"fill", {buffer_arg{buffer_loc{1, 0}, 1024}, 1.0}}));
  // Every idle connection closed: at once at the limit, or at the timeout.
  auto closed = closed_by(conns, conns.size(), steady::now() + 20s);
  auto [took, error] = try_session(false, node.port());
  BOOST_TEST_MESSAGE("plain TCP at the descriptor limit (" << in_use + 8 << "): "
                     << conns.size() << " idle connections: the node used " << share * 100
                     << "% of a core over 2 s; " << closed
                     << " closed within 20 s; a new session served in " << took << " s");
  BOOST_TEST(share < 0.10, "the node used " << share * 100 << "% of a core at its limit");
  BOOST_TEST(closed == conns.size(), closed << " of " << conns.size() << " idle connections closed");
  BOOST_TEST(error.empty(), "no new session after the idle connections went: " << error);
  for (int fd : conns)
    ::close(fd);
}

BOOST_AUTO_TEST_CASE(node_transport_a_flood_of_small_messages_without_a_session_is_cut) {
  // 1000 BASP heartbeats (valid, payload-free headers) at once from a peer
  // with no session: past 64 a second the node closes the connection, well
  // before its handshake timeout (10 s).
  node_process node{tool(), 1, "h"};
  int fd = connect_to(node.port());
  BOOST_TEST_REQUIRE(fd >= 0);
  std::string heartbeat(32, '\0');
  heartbeat[0] = 6;
  std::string flood;
  for (int k = 0; k < 1000; ++k)
    flood += heartbeat;
  send_all(fd, flood);
  auto t0 = steady::now();
  BOOST_TEST(closed_within(fd, 5s), "1000 heartbeats without a session: still open after 5 s");
  BOOST_TEST_MESSAGE("1000 heartbeats without a session: closed after "
                     << std::chrono::duration<double>(steady::now() - t0).count() << " s");
  ::close(fd);
  serve_one_session(false, node.port());
}

BOOST_AUTO_TEST_CASE(node_transport_a_peer_claiming_an_admitted_clients_node_id_stays_capped) {
  // A client opens a session: its node is admitted. A forger (a local user
  // who learned the client's node id: host id + pid in CAF 0.17) connects
  // with a BASP handshake claiming that id, then announces a 256 MiB
  // payload. Admission belongs to the connection that carried the client's
  // handshake, not to the id: the forger's connection is closed at the
  // 64 KiB cap before anything is allocated, and the client goes on.
  node_process node{tool(), 1, "i"};
  client_session c{node.port()};
  c.fill_pool();
  auto& b = c.b;
  auto& ds = c.ds;
  auto& sys = c.sys;
  auto idle = status_kib(node.pid(), "VmRSS");
  auto idle_peak = status_kib(node.pid(), "VmHWM");
  BOOST_TEST_REQUIRE(idle > 0);
  int fd = connect_to(node.port());
  BOOST_TEST_REQUIRE(fd >= 0);
  send_all(fd, handshake_claiming(sys, sys.node()) + header_announcing(sys, 256u << 20));
  auto t0 = steady::now();
  bool closed = closed_within(fd, 10s);
  auto took = std::chrono::duration<double>(steady::now() - t0).count();
  ::close(fd);
  auto after = status_kib(node.pid(), "VmRSS");
  auto peak = status_kib(node.pid(), "VmHWM");
  BOOST_TEST(closed, "the node kept open for 10 s the connection of a peer that claimed the "
                     "client's node id and announced a 256 MiB payload");
  BOOST_TEST(peak < 2 * idle_peak, "the node's peak RSS went from " << idle_peak << " KiB to "
                                                                    << peak << " KiB");
  // Closed by the cap, which the node notes on its stderr.
  auto log = node.errors();
  BOOST_TEST(log.find("announced a payload of 268435456 bytes before a session opened")
               != std::string::npos,
             "the node did not note closing the forger's connection at the cap; its stderr: "
               << log);
  // The real client's session goes on, on its own connection.
  b.sync(b.schedule_named(ds[0], {"fill", {buffer_arg{buffer_loc{1, 0}, 1024}, 2.0}}));
  BOOST_TEST_MESSAGE("a peer claiming an admitted client's node id, 256 MiB announced: RSS "
                     << idle << " KiB idle (peak " << idle_peak << "), " << after
                     << " KiB after (peak " << peak << "); closed after " << took << " s");
}
