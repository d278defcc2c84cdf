#pragma once
/// \file
/// A device's pool operations, ordered with its work: allocate, replace,
/// free, zero, and copies in and out. The table itself (ids to memory, as
/// of the end of the queue) is `pool_table`; these put the work that uses
/// or releases a pool into the device's queue, so a pool freed or replaced
/// lives until the work scheduled before is done (like `cudaFreeAsync`).
///
/// Invariants:
/// - A pool leaves the table at once (`free_pool`, a replacing
///   `alloc_pool`), and its memory goes only when the device reaches the
///   release in its queue, or at once when the device is failed (it runs
///   nothing more).
/// - Every operation checks its pool, offset and size against the table
///   first and names the pool in its error; nothing is queued then.
///
/// Threads: any thread (the device actor, tests). A view, made by
/// `device_core::memory()`; it holds no state of its own and must not
/// outlive the core.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "multidev/types.hpp"

namespace multidev::detail {

class device_core;
class pool_table;
struct pool;

class device_memory {
public:
  device_memory(device_core& core, pool_table& table) noexcept : core_(core), table_(table) {}

  /// Allocates pool `id` (replacing one of that id, released once the work
  /// before is done). Throws `std::invalid_argument` for a bad request or
  /// when the driver has no memory for it, `device_error` when the device
  /// failed or stops.
  void alloc_pool(int id, std::size_t size, std::size_t alignment,
                  std::optional<memory_mode> mode);
  /// Removes pool `id` now; its memory goes once the work before is done.
  void free_pool(int id);
  /// `alloc_pool`'s change of the table without its release: returns the
  /// pool it replaced (null when none), whose release the caller orders
  /// (a replay pushed at once, `round.cpp`). `made`: where to put the pool
  /// made (when not null). Throws as `alloc_pool`.
  std::shared_ptr<pool> replace_pool(int id, std::size_t size, std::size_t alignment,
                                     std::optional<memory_mode> mode,
                                     std::shared_ptr<pool>* made = nullptr);
  /// `free_pool`'s change of the table without its release: returns the
  /// pool taken out. Throws `std::invalid_argument` when there is none.
  std::shared_ptr<pool> take_pool(int id);
  /// Undoes `replace_pool` or `take_pool` (their work was not queued):
  /// pool `id` is `old` again (none when null), unless the table no longer
  /// holds `installed` there (the pool the call made; null for a
  /// `take_pool`): another call changed it since, and that change stays.
  /// Throws only `std::bad_alloc`.
  void put_back(int id, std::shared_ptr<pool> old, const std::shared_ptr<pool>& installed);
  /// Zeroes `size` bytes of pool `id` at `offset`, ordered with the work;
  /// returns its seq. Never waits for room.
  uint64_t memset_zero(int id, std::size_t offset, std::size_t size);
  /// Copies `bytes` into pool `id` at `offset`, ordered with the work (a
  /// transfer from another process); returns its seq. Never waits for room.
  uint64_t write_bytes(int id, std::size_t offset, std::shared_ptr<const std::string> bytes);
  /// Copies `out->size()` bytes of pool `id` at `offset` into `*out`,
  /// ordered with the work; returns its seq (`*out` is filled once it is
  /// done). Never waits for room.
  uint64_t read_bytes(int id, std::size_t offset, std::shared_ptr<std::string> out);

private:
  /// Queues the release of `old` (a pool the table let go of) behind the
  /// work scheduled so far; at once on a failed or stopping device.
  void release_later(std::shared_ptr<pool> old, const char* what);

  device_core& core_;
  pool_table& table_;
};

} // namespace multidev::detail
