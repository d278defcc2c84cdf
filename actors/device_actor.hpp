#pragma once
/// \file
/// Spawning the actor that owns a device core (its runner, events, pools).

#include <memory>

#include "actors/device_core.hpp"
#include "messages/protocol.hpp"

namespace caf {
class actor_system;
}

namespace multidev::detail {

/// Spawns the device actor of `core`. The actor answers the protocol of
/// `device_actor`; it does not stop the core when it exits (the backend does).
device_actor spawn_device_actor(caf::actor_system& sys, std::shared_ptr<device_core> core);

} // namespace multidev::detail
