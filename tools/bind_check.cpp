#include "bind_check.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

namespace multidev::tools {

namespace {

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    auto addr = ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr);
    return (addr >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a))
      return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false; // another family: not loopback
}

std::string numeric(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
    return "an address of family " + std::to_string(sa->sa_family);
  return host;
}

} // namespace

std::optional<std::string> first_non_loopback(const addrinfo* list) {
  for (auto* p = list; p != nullptr; p = p->ai_next)
    if (p->ai_addr == nullptr || !is_loopback(p->ai_addr))
      return p->ai_addr ? numeric(p->ai_addr, p->ai_addrlen) : std::string{"no address"};
  return std::nullopt;
}

std::optional<std::string> non_loopback_bind(const std::string& bind) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* list = nullptr;
  // An empty name is every interface (what CAF listens on for "").
  int rc = ::getaddrinfo(bind.empty() ? nullptr : bind.c_str(), "0", &hints, &list);
  if (rc != 0)
    return "--bind " + bind + " does not resolve (" + ::gai_strerror(rc)
           + "), so it cannot be checked to be loopback";
  auto bad = first_non_loopback(list);
  ::freeaddrinfo(list);
  if (!bad)
    return std::nullopt;
  return "--bind " + (bind.empty() ? std::string{"''"} : bind) + " resolves to " + *bad
         + ", which is not a loopback address: other machines could drive this node's devices; "
           "say --allow-remote to mean it";
}

} // namespace multidev::tools
