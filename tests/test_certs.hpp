#pragma once
// Test certificates for the TLS tests of test_nodes and test_node_transport
// (scripts/make-test-certs.sh), made once per process in a temporary folder
// removed at exit; none when the openssl command cannot make them (the TLS
// tests are then skipped, shown as skipped).
#include <multidev/protocol.hpp>

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace test_support {

inline const std::optional<multidev::tls_files>& test_certificates() {
  static const std::optional<multidev::tls_files> files =
    []() -> std::optional<multidev::tls_files> {
    static const std::filesystem::path dir = [] {
      auto d = std::filesystem::temp_directory_path()
               / ("multidev-certs-" + std::to_string(::getpid()));
      std::filesystem::create_directories(d);
      return d;
    }();
    static const struct remove_at_exit {
      ~remove_at_exit() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    } cleanup;
    auto cmd = std::string{MULTIDEV_SOURCE_DIR} + "/scripts/make-test-certs.sh '" + dir.string()
               + "' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0)
      return std::nullopt;
    return multidev::tls_files{.certificate = (dir / "node.pem").string(),
                               .key = (dir / "node.key").string(),
                               .ca_file = (dir / "ca.pem").string()};
  }();
  return files;
}

/// A precondition: skips the test (shown as skipped) without certificates.
inline boost::test_tools::assertion_result have_certificates(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r{test_certificates().has_value()};
  r.message() << "the openssl command could not make test certificates";
  return r;
}

/// The arguments that give a node the test certificates.
inline std::vector<std::string> node_tls_args() {
  const auto& f = *test_certificates();
  return {"--tls-cert", f.certificate, "--tls-key", f.key, "--tls-ca", f.ca_file};
}

} // namespace test_support
