#pragma once
/// \file
/// Plain value types of the interface: tensor nodes, buffer locations,
/// context buffers, hardware limits, and the public error types. No CAF.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "multidev/sexp.hpp"

namespace multidev {

/// How a tensor node's memory is used (OCANNL's `Tnode.memory_mode`).
enum class memory_mode : uint8_t {
  effectively_constant, ///< Read-only after initialization; cacheable per device.
  virtual_,             ///< Computed inline, never stored.
  never_virtual,        ///< Must be stored, placement undecided.
  local,                ///< Lives inside one routine.
  device_only,          ///< Stored on devices, never on the host.
  on_device,            ///< Stored on devices, host copy on demand.
  materialized,         ///< Stored on devices and on the host.
};

/// The name as printed in sexps and scenarios (e.g. `"on_device"`).
std::string to_string(memory_mode m);

/// Parses a name printed by `to_string`; `std::nullopt` when unknown.
std::optional<memory_mode> memory_mode_from_string(const std::string& s);

sexp to_sexp(memory_mode m);

/// A tensor node's identity: the unit that contexts map to buffers and that
/// transfers move. Nodes compare by `id` alone.
struct tnode {
  int id = 0;
  std::string label;
  std::size_t size_in_bytes = 0;
  memory_mode mode = memory_mode::on_device;

  friend bool operator==(const tnode& x, const tnode& y) { return x.id == y.id; }
  friend auto operator<=>(const tnode& x, const tnode& y) { return x.id <=> y.id; }
};

sexp to_sexp(const tnode& t);

/// A position inside one device's pool table: `base(pool_id) + offset`.
struct buffer_loc {
  int pool_id = 0;
  std::size_t offset = 0;
  friend bool operator==(const buffer_loc&, const buffer_loc&) = default;
};

sexp to_sexp(const buffer_loc& b);

/// Which tensor nodes a context holds, and where.
using ctx_buffers = std::map<tnode, buffer_loc>;

sexp to_sexp(const ctx_buffers& b);

/// Optimization settings a context was compiled with (OCANNL's
/// `Low_level.optimize_ctx`); carried along, opaque to the scheduler.
struct optimize_ctx {
  sexp computations = sexp::list();
  friend bool operator==(const optimize_ctx&, const optimize_ctx&) = default;
};

sexp to_sexp(const optimize_ctx& o);

/// Conservative per-workgroup limits: the minimum across a backend's devices;
/// all empty for backends that do not bind hardware axes (CPU).
struct hardware_limits {
  std::optional<int> max_threads_per_block;
  std::optional<int> max_block_dim_x;
  std::optional<int> max_grid_dim_x;
  std::optional<int> shared_memory_per_block;
  friend bool operator==(const hardware_limits&, const hardware_limits&) = default;
};

sexp to_sexp(const hardware_limits& h);

/// A device failed (a task threw, a device it waited on failed, it was shut
/// down). `what()` names the device and gives the original message.
class device_error : public std::runtime_error {
public:
  device_error(std::string device_name, std::string message);
  /// `"<name>:<ordinal>:<device_id>"` of the failed device.
  const std::string& device_name() const noexcept { return device_; }
  /// The original message, without the device name.
  const std::string& message() const noexcept { return message_; }

private:
  std::string device_;
  std::string message_;
};

/// A task called `sync` on an event of its own device that is still ahead of
/// it: waiting would deadlock, so it gets this error instead.
class deadlock_error : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

} // namespace multidev
