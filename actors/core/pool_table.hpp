#pragma once
/// \file
/// The pool table of one device: which pool id names which block of device
/// memory, as of the end of the device's queue, and how much memory the
/// device's pools hold.

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "actors/core/pool.hpp"
#include "actors/core/spin.hpp"
#include "multidev/sexp.hpp"
#include "multidev/types.hpp"

namespace multidev::detail {

/// Host threads (the device actor, a binding, a transfer) name device memory
/// by pool id and look the pool up on every copy, while the device's work
/// still uses pools that the table has since replaced or freed. The table
/// maps ids to shared `pool`s: a lookup hands out a reference, and a pool
/// replaced or freed lives on in the work that holds it (the device orders
/// its release behind that work, see `device_memory::release_later`).
///
/// Invariants:
/// - At most one pool per id; ids are not negative.
/// - `used_memory()` is the size of every pool alive, in the table or still
///   held by work: a pool adds its size when made and takes it away when
///   freed (`pool`'s constructor and destructor).
/// - A pool handed out by `span` holds the bytes asked for.
///
/// Threads: every function is safe from any thread. The lock is a spin lock
/// whose sections are a map lookup or update; it never calls out while
/// holding it (pools replaced or freed are returned, their memory released
/// by the caller).
class pool_table {
public:
  /// `device`: the name errors give.
  explicit pool_table(std::string device);

  pool_table(const pool_table&) = delete;
  pool_table& operator=(const pool_table&) = delete;

  /// Throws `std::invalid_argument` naming the device and the pool when a
  /// pool of `size` bytes aligned to `alignment` cannot be asked for (an
  /// alignment that is not a power of two, a negative id, a size no device
  /// can address). `who` starts the message.
  void check_request(int id, std::size_t size, std::size_t alignment, std::string_view who) const;
  /// Makes a pool of `mem` and puts it in the table as `id`; returns the
  /// pool it replaces there (null when none), which the caller releases in
  /// its turn. `made`: where to put the pool made (when not null).
  std::shared_ptr<pool> install(int id, std::size_t size, std::size_t alignment,
                                std::optional<memory_mode> mode, std::unique_ptr<allocation> mem,
                                std::shared_ptr<pool>* made = nullptr);
  /// Takes pool `id` out of the table and returns it; throws
  /// `std::invalid_argument` starting with `who` when there is none.
  std::shared_ptr<pool> remove(int id, std::string_view who);
  /// Puts `old` back in the table as `id` (takes `id` out when `old` is
  /// null) if `id` is still `installed` (null: absent): undoes an `install`
  /// or a `remove` whose work was not queued, unless another call changed
  /// `id` since (then the table is left as it is). Returns the pool it
  /// takes out, or `old` when it left the table alone (null when none), for
  /// the caller to drop outside the lock. Throws only `std::bad_alloc`.
  std::shared_ptr<pool> put_back(int id, std::shared_ptr<pool> old,
                                 const std::shared_ptr<pool>& installed);
  /// The pool now in the table as `id`, or null.
  std::shared_ptr<pool> find(int id) const;
  /// The pool now in the table that holds bytes `[offset, offset + size)`.
  /// The one check of a pool span: throws `std::invalid_argument` starting
  /// with `who` when the pool is not allocated or the span is outside it.
  std::shared_ptr<pool> span(int id, std::size_t offset, std::size_t size,
                             std::string_view who) const;
  /// Drops every pool from the table (the device shut down); those still
  /// held by work live on until it lets go.
  void clear() noexcept;
  /// Bytes held by this device's pools alive.
  std::size_t used_memory() const noexcept { return used_->load(); }
  /// `(pools (pool (id ..) (size ..) (alignment ..) (mode ..)) ...)`, for
  /// debug info.
  sexp info() const;

private:
  std::string device_;
  // A spin lock: every host copy looks its pool up here, the sections are a
  // map lookup or update, and a pthread mutex's lock and unlock were ~60
  // instructions a copy. On a line of its own: beside what the runner reads,
  // a sixth of try_pool's samples in a stream of host copies were on taking
  // it (perf).
  alignas(64) mutable spin_mutex mu_;
  std::map<int, std::shared_ptr<pool>> pools_; // guarded by mu_
  // Shared with every pool made here, which outlives the table in the work
  // that holds it.
  std::shared_ptr<std::atomic<std::size_t>> used_;
};

} // namespace multidev::detail
