// The `multidev` command's terminal manners (tools/terminal.hpp) and its
// --bind check (tools/bind_check.hpp): the
// indented s-expressions `multidev devices` prints on a terminal, and the
// closest valid name suggested for a mistyped option or command. The tool
// itself is tested through CTest (tests/CMakeLists.txt, label cli).
#define BOOST_TEST_MODULE cli
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <deque>
#include <sstream>
#include <string>
#include <vector>

#include <multidev/multidev.hpp>
#include <multidev/protocol.hpp>

#include "bind_check.hpp"
#include "terminal.hpp"

using namespace multidev;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in{text};
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

const std::vector<std::string> commands{"devices", "kernels", "run", "node", "bench"};

} // namespace

BOOST_AUTO_TEST_CASE(test_pretty_sexp_prints_the_devices_one_a_line) {
  backend b{backend_options{.num_devices = 3}};
  auto props = b.static_properties();
  auto text = tools::pretty_sexp(props, 80);
  BOOST_TEST_MESSAGE(text);
  auto lines = lines_of(text);
  BOOST_TEST_REQUIRE(lines.size() > 3u);
  BOOST_TEST(lines.front() == "(multidev_cpu");
  int devices = 0;
  for (const auto& line : lines) {
    if (line.rfind("    (device ", 0) == 0) {
      // The whole device, and only it, on its line.
      BOOST_TEST(line.find("(ordinal " + std::to_string(devices) + ")") != std::string::npos,
                 line);
      BOOST_TEST(line.find("(device ", 5) == std::string::npos, line);
      ++devices;
    } else {
      BOOST_TEST(line.size() <= 80u, line);
    }
  }
  BOOST_TEST(devices == 3);
  // The same s-expression as the one-line form scripts read.
  BOOST_TEST(parse_sexp(text).to_string() == props.to_string());
}

BOOST_AUTO_TEST_CASE(test_pretty_sexp_keeps_what_fits_on_one_line) {
  auto small = parse_sexp("(a (b 1) (c \"two words\"))");
  BOOST_TEST(tools::pretty_sexp(small, 80) == small.to_string());
  BOOST_TEST(tools::pretty_sexp(sexp::atom("x y"), 1) == "\"x y\"");
  // Too wide: the head stays, each item gets a line two columns in; a
  // nested record (c ...) stays whole even past the width.
  auto wide = parse_sexp("(a (b 1) (c (d 2) (e 3)))");
  BOOST_TEST(tools::pretty_sexp(wide, 10) == "(a\n  (b 1)\n  (c (d 2) (e 3)))");
  auto deep = parse_sexp("(a (b (c (d 1))))");
  BOOST_TEST(tools::pretty_sexp(deep, 8) == "(a\n  (b\n    (c (d 1))))");
  BOOST_TEST(parse_sexp(tools::pretty_sexp(deep, 8)).to_string() == deep.to_string());
  // A top-level record that does not fit breaks too.
  auto record = parse_sexp("(limits (x none) (y none))");
  BOOST_TEST(tools::pretty_sexp(record, 20) == "(limits\n  (x none)\n  (y none))");
}

BOOST_AUTO_TEST_CASE(test_edit_distance_counts_one_edit_per_typo) {
  BOOST_TEST(tools::edit_distance("trace", "trace") == 0u);
  BOOST_TEST(tools::edit_distance("tarce", "trace") == 1u); // a transposition
  BOOST_TEST(tools::edit_distance("trac", "trace") == 1u);
  BOOST_TEST(tools::edit_distance("tracex", "trace") == 1u);
  BOOST_TEST(tools::edit_distance("trade", "trace") == 1u);
  BOOST_TEST(tools::edit_distance("kitten", "sitting") == 3u);
  BOOST_TEST(tools::edit_distance("", "abc") == 3u);
  BOOST_TEST(tools::edit_distance("abc", "") == 3u);
}

BOOST_AUTO_TEST_CASE(test_closest_name_suggests_only_likely_typos) {
  std::vector<std::string> run_options{"--help", "--trace", "--report", "--timeline", "--seed"};
  BOOST_TEST(tools::closest_name("--tarce", run_options).value_or("") == "--trace");
  BOOST_TEST(tools::closest_name("-trace", run_options).value_or("") == "--trace");
  BOOST_TEST(tools::closest_name("--seeds", run_options).value_or("") == "--seed");
  BOOST_TEST(!tools::closest_name("--verbose", run_options).has_value());
  BOOST_TEST(!tools::closest_name("--", run_options).has_value());
  BOOST_TEST(tools::closest_name("devics", commands).value_or("") == "devices");
  BOOST_TEST(tools::closest_name("rn", commands).value_or("") == "run");
  BOOST_TEST(!tools::closest_name("bogus", commands).has_value());
  BOOST_TEST(tools::closest_name("--scheduler.max-thread",
                                 {"--scheduler.policy", "--scheduler.max-threads"})
               .value_or("")
             == "--scheduler.max-threads");
}

// -- `node --bind`: loopback is what the name resolves to (issue 38 point 5) --

namespace {

/// A getaddrinfo-like list of the numeric addresses `texts`, for
/// first_non_loopback without a resolver.
struct address_list {
  explicit address_list(std::vector<std::string> texts) {
    for (const auto& t : texts) {
      auto& e = entries.emplace_back();
      if (inet_pton(AF_INET, t.c_str(), &e.v4.sin_addr) == 1) {
        e.v4.sin_family = AF_INET;
        e.ai.ai_family = AF_INET;
        e.ai.ai_addr = reinterpret_cast<sockaddr*>(&e.v4);
        e.ai.ai_addrlen = sizeof e.v4;
      } else {
        BOOST_TEST_REQUIRE(inet_pton(AF_INET6, t.c_str(), &e.v6.sin6_addr) == 1, t);
        e.v6.sin6_family = AF_INET6;
        e.ai.ai_family = AF_INET6;
        e.ai.ai_addr = reinterpret_cast<sockaddr*>(&e.v6);
        e.ai.ai_addrlen = sizeof e.v6;
      }
    }
    for (std::size_t i = 0; i + 1 < entries.size(); ++i)
      entries[i].ai.ai_next = &entries[i + 1].ai;
  }
  const addrinfo* head() const { return entries.empty() ? nullptr : &entries.front().ai; }
  struct entry {
    addrinfo ai{};
    sockaddr_in v4{};
    sockaddr_in6 v6{};
  };
  std::deque<entry> entries; // stable addresses
};

} // namespace

BOOST_AUTO_TEST_CASE(test_bind_check_refuses_a_list_with_any_non_loopback_address) {
  BOOST_TEST(!tools::first_non_loopback(address_list{{"127.0.0.1"}}.head()).has_value());
  BOOST_TEST(!tools::first_non_loopback(address_list{{"127.1.2.3", "::1"}}.head()).has_value());
  BOOST_TEST(!tools::first_non_loopback(address_list{{"::ffff:127.0.0.1"}}.head()).has_value());
  // One address elsewhere is enough to refuse, wherever it is in the list.
  BOOST_TEST(tools::first_non_loopback(address_list{{"127.0.0.1", "10.1.2.3"}}.head())
               .value_or("") == "10.1.2.3");
  BOOST_TEST(tools::first_non_loopback(address_list{{"0.0.0.0"}}.head()).value_or("")
             == "0.0.0.0");
  BOOST_TEST(tools::first_non_loopback(address_list{{"::1", "::"}}.head()).value_or("") == "::");
  BOOST_TEST(tools::first_non_loopback(address_list{{"::ffff:10.0.0.1"}}.head()).value_or("")
             == "::ffff:10.0.0.1");
  BOOST_TEST(tools::first_non_loopback(address_list{{"128.0.0.1"}}.head()).value_or("")
             == "128.0.0.1");
}

BOOST_AUTO_TEST_CASE(test_bind_check_resolves_the_name) {
  // Numeric addresses and localhost resolve without a network.
  BOOST_TEST(!tools::non_loopback_bind("127.0.0.1").has_value());
  BOOST_TEST(!tools::non_loopback_bind("localhost").has_value());
  BOOST_TEST(!tools::non_loopback_bind("::1").has_value());
  // 127.1 is 127.0.0.1 to the resolver.
  BOOST_TEST(!tools::non_loopback_bind("127.1").has_value());
  auto any = tools::non_loopback_bind("0.0.0.0");
  BOOST_TEST_REQUIRE(any.has_value());
  BOOST_TEST(any->find("--bind 0.0.0.0 resolves to 0.0.0.0, which is not a loopback address")
               != std::string::npos,
             *any);
  // The empty name listens on every interface.
  BOOST_TEST(tools::non_loopback_bind("").has_value());
  // 0x7f000001 is 127.0.0.1 to inet_aton: loopback, whatever the text says.
  BOOST_TEST(!tools::non_loopback_bind("0x7f000001").has_value());
  // A name that does not resolve cannot be checked: refused, named.
  auto none = tools::non_loopback_bind("no-such-host.invalid");
  BOOST_TEST_REQUIRE(none.has_value());
  BOOST_TEST(none->find("--bind no-such-host.invalid does not resolve") != std::string::npos,
             *none);
}

// -- the cookie file (issue 38 point 1) ------------------------------------------

BOOST_AUTO_TEST_CASE(test_cookie_file_is_made_on_first_use_owner_only_and_refused_when_readable) {
  char tmpl[] = "/tmp/multidev-cookie.XXXXXX";
  BOOST_TEST_REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  std::string old_xdg = std::getenv("XDG_CONFIG_HOME") ? std::getenv("XDG_CONFIG_HOME") : "";
  ::setenv("XDG_CONFIG_HOME", dir.c_str(), 1);
  auto path = dir + "/multidev/cookie";
  BOOST_TEST(default_cookie_file() == path);
  auto cookie = load_cookie(); // made now
  struct stat st{};
  BOOST_TEST_REQUIRE(::stat(path.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  BOOST_TEST(cookie.size() == 64u);
  BOOST_TEST(cookie.find_first_not_of("0123456789abcdef") == std::string::npos, cookie);
  BOOST_TEST(load_cookie() == cookie); // read, not made again
  BOOST_TEST(load_cookie(path) == cookie);
  BOOST_TEST(same_cookie(cookie, load_cookie()));
  BOOST_TEST(!same_cookie(cookie, cookie.substr(1)));
  BOOST_TEST_REQUIRE(::chmod(path.c_str(), 0640) == 0);
  try {
    load_cookie();
    BOOST_ERROR("a cookie file of mode 0640 was read");
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    BOOST_TEST(what.find(path + ": mode 0640 lets others read it") != std::string::npos, what);
    BOOST_TEST(what.find(cookie) == std::string::npos, what);
  }
  if (old_xdg.empty())
    ::unsetenv("XDG_CONFIG_HOME");
  else
    ::setenv("XDG_CONFIG_HOME", old_xdg.c_str(), 1);
  ::unlink(path.c_str());
  ::rmdir((dir + "/multidev").c_str());
  ::rmdir(dir.c_str());
}
