#pragma once
/// \file
/// What a device's queue holds: an entry (`item`, 40 bytes for a bare
/// closure) and what an entry may carry besides its work (`extra_ptr`: an
/// order's or a wait's `item_extra`, a `named_extra`, or a place in the
/// batch's text), and the pool work a host copy, a zeroing or a release
/// queues (`work_order`). Plain types: who may touch an entry is the queue's
/// and the runner's business (work_queue.hpp, device_core.hpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "actors/core/gate.hpp"
#include "multidev/trace.hpp"

namespace multidev::detail {

/// Work on one of this device's pools that is named only when something
/// asks for its name (a trace, an error): a host copy of a small node, and
/// a pool's zeroing and release. These are the hot items of a small node's
/// life, where formatting a description, allocating a closure and freeing
/// both on the runner took more than half of their cost.
struct work_order {
  /// How `what`, `id` and `offset` make the description.
  enum naming_t : uint8_t {
    node,      ///< `"<what> '<label>' (#<id>)"`, `"<what> #<id>"` without a label
    pool_span, ///< `"<what> pool <id> [<offset>, <offset + bytes>)"`
    pool,      ///< `"<what> <id>"`
  };
  /// A copy's destination, the start of a zeroed span; unused otherwise.
  std::byte* dst = nullptr;
  const std::byte* src = nullptr; // a copy's source
  std::size_t bytes = 0;
  /// `"from_host"`, `"memset_zero"`, `"free_pool"`...: a literal, which
  /// outlives the item.
  const char* what = "";
  int id = 0; // the node's or the pool's
  naming_t naming = node;
  std::size_t offset = 0; // a span's, for its name
};

/// What an order or a wait carries besides its work. An order's
/// description is built from `op` when asked (`description_of`).
/// The runner reads and writes only the first cache line (the pool held,
/// the gate, the order's pointers and size) unless a trace or an error asks
/// for names: these extras are reused (`extra_cache`), and the lines a
/// producer fills are then still in its cache.
/// A push writes the first two lines (the second: the order's id and
/// offset, the kind, the node label), which `extra_cache::take` fetches ahead.
struct alignas(64) item_extra {
  /// The pool an order holds; see `extra_cache::release_hold` for when it
  /// lets go.
  std::shared_ptr<const void> keep_alive;
  std::shared_ptr<gate> g;
  work_order op;
  trace_kind kind = trace_kind::task;
  std::string node_label; // an order's; assigned, so its room is reused
  bool is_order() const noexcept { return op.what[0] != '\0'; }
};
/// What a task that holds a `keep_alive` (or has a description too long
/// for the queue's text, see `extra_ptr::max_text`) carries besides its
/// work: its description inline, in one plain allocation sized to it, made
/// by the producer and freed with the runner's batch.
class named_extra {
public:
  /// Copies `description`. Throws `std::bad_alloc`, and
  /// `std::length_error` for a description of 4 GiB or more.
  static named_extra* make(std::string_view description, std::shared_ptr<const void> keep_alive,
                           trace_kind kind);
  static void destroy(named_extra* x) noexcept;
  std::string_view description() const noexcept {
    return {reinterpret_cast<const char*>(this + 1), size_};
  }
  trace_kind kind() const noexcept { return kind_; }
  /// What the task holds; released before its event is done.
  std::shared_ptr<const void> keep_alive;

private:
  named_extra(std::shared_ptr<const void> k, trace_kind t, uint32_t n) noexcept
    : keep_alive(std::move(k)), size_(n), kind_(t) {}
  ~named_extra() = default;
  uint32_t size_; // of the text, which follows the object
  trace_kind kind_;
};
/// An entry's extra: none (a bare closure), an `item_extra` (an order or
/// a wait, owned), a `named_extra` (owned), or a described task's text:
/// where its description is in the text of the entry's batch (the queue's text,
/// as it was pushed, `item_batch::text` as it runs), and its kind. One word,
/// so that an entry stays 40 bytes: the low bits say which (the two kinds
/// of allocation are at least 8-aligned), the rest is the pointer or the
/// text's place.
///
/// A task with a description used to take an `item_extra` (192 bytes
/// aligned to 64, which glibc serves from neither its thread cache nor
/// its fast bins) made by the producer and freed by the runner: ~300 bytes
/// of heap a task, and a burst of them 5-7 times slower than bare closures
/// (issue 36, point 4). Its text now goes where its entry goes, appended
/// to a buffer that is swapped with the batch and keeps its room, as the
/// queue's vector does: nothing is allocated or freed per task, and the
/// runner does not read the text unless a trace or an error names it.
class extra_ptr {
public:
  /// The longest description kept in the queue's text.
  static constexpr std::size_t max_text = 0xffff;
  /// The end of the queue's text it can address (1 TiB).
  static constexpr std::size_t max_text_end = std::size_t{1} << 40;

  extra_ptr() noexcept = default;
  explicit extra_ptr(std::unique_ptr<item_extra> x) noexcept
    : bits_(reinterpret_cast<uintptr_t>(x.release())) {}
  explicit extra_ptr(named_extra* x) noexcept {
    if (x)
      bits_ = reinterpret_cast<uintptr_t>(x) | named_bit | (x->keep_alive ? holds_bit : 0);
  }
  /// A description of `size` bytes (at most `max_text`) at `offset` of
  /// the batch's text (`offset + size` at most `max_text_end`).
  static extra_ptr text(std::size_t offset, std::size_t size, trace_kind kind) noexcept {
    extra_ptr e;
    e.bits_ = text_bit | static_cast<uintptr_t>(kind) << kind_shift |
              static_cast<uintptr_t>(size) << size_shift |
              static_cast<uintptr_t>(offset) << offset_shift;
    return e;
  }
  extra_ptr(extra_ptr&& o) noexcept : bits_(std::exchange(o.bits_, 0)) {}
  extra_ptr& operator=(extra_ptr&& o) noexcept {
    if (this != &o) {
      reset();
      bits_ = std::exchange(o.bits_, 0);
    }
    return *this;
  }
  ~extra_ptr() {
    if (owns()) [[unlikely]]
      destroy();
  }
  explicit operator bool() const noexcept { return bits_ != 0; }
  /// The order's or the wait's extra; null for any other.
  item_extra* order_or_wait() const noexcept {
    return bits_ & (named_bit | text_bit) ? nullptr : reinterpret_cast<item_extra*>(bits_);
  }
  /// The named extra; null for any other.
  named_extra* named() const noexcept {
    return bits_ & named_bit ? reinterpret_cast<named_extra*>(bits_ & ~tag_bits) : nullptr;
  }
  /// A named extra that holds a `keep_alive`, which the runner releases;
  /// null otherwise (no look at the allocation).
  named_extra* named_holding() const noexcept {
    return bits_ & holds_bit ? named() : nullptr;
  }
  bool is_text() const noexcept { return bits_ & text_bit; }
  std::size_t text_offset() const noexcept { return bits_ >> offset_shift; }
  std::size_t text_size() const noexcept { return (bits_ >> size_shift) & max_text; }
  trace_kind text_kind() const noexcept {
    return static_cast<trace_kind>((bits_ >> kind_shift) & kind_mask);
  }
  /// The allocation, if any (for prefetching).
  const void* address() const noexcept {
    return bits_ & text_bit ? nullptr : reinterpret_cast<const void*>(bits_ & ~tag_bits);
  }
  /// Hands over an order's or a wait's extra (for reuse), leaving none.
  std::unique_ptr<item_extra> take_order_or_wait() noexcept {
    return std::unique_ptr<item_extra>{
      reinterpret_cast<item_extra*>(std::exchange(bits_, 0))};
  }
  void reset() noexcept {
    if (owns())
      destroy();
    bits_ = 0;
  }

private:
  /// Whether it owns an allocation (else the destructor has nothing to do:
  /// a bare closure's and a described task's entries check one word).
  bool owns() const noexcept { return bits_ != 0 && !(bits_ & text_bit); }
  /// Frees the allocation it owns; out of line (an `item_extra`'s
  /// destructor is long), leaving `bits_` as it is.
  void destroy() noexcept;
  static constexpr uintptr_t named_bit = 1; // a named_extra
  static constexpr uintptr_t text_bit = 2;  // a place in the batch's text
  static constexpr uintptr_t holds_bit = 4; // a named_extra with a keep_alive
  static constexpr uintptr_t tag_bits = 7;
  static constexpr int kind_shift = 3; // then the kind, 5 bits
  static constexpr uintptr_t kind_mask = 31;
  static constexpr int size_shift = 8;    // the size, 16 bits
  static constexpr int offset_shift = 24; // the offset, 40 bits
  static_assert(static_cast<uintptr_t>(trace_kind::cancel) <= kind_mask);
  static_assert(max_text == (uintptr_t{1} << (offset_shift - size_shift)) - 1);
  static_assert(max_text_end == uintptr_t{1} << (64 - offset_shift));
  uintptr_t bits_ = 0;
};
/// One queue entry: 40 bytes for a bare closure, so a burst of pushes
/// moves as few cache lines as possible from producer to runner.
struct item {
  std::function<void()> work;
  extra_ptr extra;
  gate* as_gate() const noexcept {
    auto* x = extra.order_or_wait();
    return x ? x->g.get() : nullptr;
  }
  /// Whether the runner looks at an entry with `e` before it runs it (an
  /// order's or a wait's; not a described task's): see `work_queue`.
  static bool flags(const extra_ptr& e) noexcept { return e.order_or_wait() != nullptr; }
};

} // namespace multidev::detail
