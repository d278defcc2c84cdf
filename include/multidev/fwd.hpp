#pragma once
/// \file
/// Forward declarations of multidev's public types, for headers that only
/// name them. No CAF, no standard containers.

#include <cstddef>
#include <cstdint>

namespace multidev {

// types.hpp
enum class memory_mode : std::uint8_t;
struct tnode;
struct buffer_loc;
struct optimize_ctx;
struct hardware_limits;
class device_error;
class deadlock_error;
// sexp.hpp
class sexp;
// task.hpp
struct task;
struct buffer_arg;
struct task_spec;
// kernels.hpp
struct kernel_def;
class kernel_call;
struct kernel_result;
// device.hpp
struct dev;
class runner;
class device;
using buffer_ptr = std::byte*;
// event.hpp
class node_ref;
struct device_key;
class event;
// context.hpp
struct context;
struct routine;
enum class merge_buffer_use;
// round.hpp
struct round_slot;
class replay_events;
class round;
// backend.hpp
struct backend_options;
class backend;

namespace detail {
class device_core;
class endpoint;
struct device_record;
struct backend_impl;
} // namespace detail

} // namespace multidev
