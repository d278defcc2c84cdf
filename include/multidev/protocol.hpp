#pragma once
/// \file
/// The device actors' typed interface, for user actors that drive devices by
/// message, and `device_actor_of` to get a device's actor. Includes CAF
/// headers; `<multidev/multidev.hpp>` does not.

#include "messages/protocol.hpp"
#include "multidev/backend.hpp"

namespace multidev {

/// The actor that owns `d` (a device of `b`).
device_actor device_actor_of(const backend& b, const device& d);

} // namespace multidev
