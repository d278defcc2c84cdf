// A test's hold on a device's runner (`hand_over::hold_after_wake`): once
// woken from its sleep at a wait, the runner stays there, without its token,
// until the hold ends. The guard ends it on every way out, so a failing
// check never leaves a runner held.
#pragma once

#include "actors/core/device_core.hpp"

namespace test_support {

struct hold_guard {
  explicit hold_guard(multidev::detail::device_core& c) : c(c) { c.runner().handover().hold_after_wake(true); }
  ~hold_guard() { c.runner().handover().hold_after_wake(false); }
  hold_guard(const hold_guard&) = delete;
  hold_guard& operator=(const hold_guard&) = delete;
  multidev::detail::device_core& c;
};

} // namespace test_support
