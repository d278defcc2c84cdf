#pragma once
/// \file
/// The one public entry header: the Multidev interface on CPU devices, named
/// kernels and transfers. CAF stays out; see `multidev/protocol.hpp` for the
/// actor protocol.

#include "multidev/backend.hpp"
#include "multidev/context.hpp"
#include "multidev/cuda.hpp"
#include "multidev/device.hpp"
#include "multidev/event.hpp"
#include "multidev/fwd.hpp"
#include "multidev/kernels.hpp"
#include "multidev/round.hpp"
#include "multidev/sexp.hpp"
#include "multidev/task.hpp"
#include "multidev/trace.hpp"
#include "multidev/types.hpp"
