// The cookie a node and its clients share (issue 38 point 1): a file of
// random hex text, made on first use with mode 0600, as Erlang's
// distribution cookie is.
#include <multidev/protocol.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace multidev {

namespace {

std::string system_error(const std::string& what, const std::string& path) {
  return fmt::format("cookie file {}: {}: {}", path, what, std::strerror(errno));
}

/// Makes `dir` and its parents (mode 0700 for the ones made here).
void make_dirs(const std::string& dir) {
  for (std::size_t at = 1; at != std::string::npos;) {
    at = dir.find('/', at + 1);
    auto part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST)
      throw std::invalid_argument(system_error("cannot make the folder " + part, part));
  }
}

/// 32 bytes of /dev/urandom as 64 hex digits.
std::string random_hex() {
  unsigned char bytes[32];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::invalid_argument(system_error("cannot open /dev/urandom", "/dev/urandom"));
  std::size_t got = 0;
  while (got < sizeof bytes) {
    auto n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      ::close(fd);
      throw std::invalid_argument(system_error("cannot read /dev/urandom", "/dev/urandom"));
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  std::string hex;
  for (auto b : bytes)
    hex += fmt::format("{:02x}", b);
  return hex;
}

/// Creates `path` with a fresh cookie unless it exists: written to a file of
/// its own (0600) and linked into place, so a node and a client that start
/// together agree on one cookie (the loser of the link reads the winner's).
void create_if_missing(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0)
    return;
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0)
    make_dirs(path.substr(0, slash));
  auto tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw std::invalid_argument(system_error("cannot create it", path));
  auto text = random_hex() + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    throw std::invalid_argument(system_error("cannot write it", path));
  }
  if (::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    auto err = system_error("cannot create it", path);
    ::unlink(tmp.c_str());
    throw std::invalid_argument(err);
  }
  ::unlink(tmp.c_str());
}

} // namespace

std::string default_cookie_file() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && xdg[0] == '/')
    return fmt::format("{}/multidev/cookie", xdg);
  const char* home = std::getenv("HOME");
  if (home == nullptr || home[0] != '/')
    throw std::invalid_argument(
      "the default cookie file is $XDG_CONFIG_HOME/multidev/cookie or "
      "~/.config/multidev/cookie, but neither XDG_CONFIG_HOME nor HOME is set to an absolute "
      "path: give a cookie file");
  return fmt::format("{}/.config/multidev/cookie", home);
}

std::string load_cookie(const std::string& file) {
  auto path = file.empty() ? default_cookie_file() : file;
  create_if_missing(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    throw std::invalid_argument(system_error("cannot open it", path));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw std::invalid_argument(system_error("cannot stat it", path));
  }
  // As ssh refuses a private key others can read.
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    throw std::invalid_argument(fmt::format(
      "cookie file {}: mode {:04o} lets others read it: it must be readable by its owner only "
      "(chmod 600 {})",
      path, st.st_mode & 07777, path));
  }
  if (!S_ISREG(st.st_mode) || st.st_size > 4096) {
    ::close(fd);
    throw std::invalid_argument(
      fmt::format("cookie file {}: not a regular file of at most 4096 bytes", path));
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    auto n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  if (text.size() < 16)
    throw std::invalid_argument(fmt::format(
      "cookie file {}: holds {} character(s); a cookie has at least 16", path, text.size()));
  return text;
}

bool same_cookie(const std::string& a, const std::string& b) noexcept {
  // Constant time in the contents: every byte of the longer is looked at.
  auto n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    auto x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    auto y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  volatile unsigned sink = diff; // keep the loop whole
  return sink == 0;
}

} // namespace multidev
