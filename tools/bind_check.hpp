#pragma once
// `multidev node --bind NAME`: loopback means the addresses NAME resolves to,
// not its text (issue 38 point 5).

#include <optional>
#include <string>

struct addrinfo;

namespace multidev::tools {

/// The numeric text of the first address in `list` (getaddrinfo's results)
/// that is not loopback (127.0.0.0/8, ::1, or ::ffff:127.0.0.0/104), or
/// nullopt when every one is loopback.
std::optional<std::string> first_non_loopback(const addrinfo* list);

/// Why `--bind bind` would listen where other machines reach it, or nullopt
/// when every address `bind` resolves to (getaddrinfo, passive, TCP) is
/// loopback. A name that does not resolve is refused too, naming it.
std::optional<std::string> non_loopback_bind(const std::string& bind);

} // namespace multidev::tools
