#pragma once
/// \file
/// The batch a device's synchronous runner runs (see device_runner.hpp):
/// the entries it took off the queue in one go, the next one to run, their
/// descriptions' text, and the batch `hand_over::try_claim` set aside
/// while its last item still ran.
///
/// Invariants:
/// - `pos() <= size()`. The entries before `pos()` have run (the one at
///   `pos() - 1` may be running: its work is on the stack), those from
///   `pos()` on have not started.
/// - `has_extras()`: whether an entry taken has an order's or a wait's
///   extra (`item::flags`); a batch without holds bare closures and
///   described tasks only, and the runner looks ahead at nothing else.
/// - A described task's text is `text()` at its extra's place
///   (`text_of`), for the entries of this batch; after `set_aside` the
///   running item's text is set aside with it.
/// - The set-aside batch is empty except while the item that set it aside
///   runs: the runner clears it (`clear_set_aside`) once that item is done.
///
/// Threads: the device's token holder only (its runner, or a runner that
/// borrowed its token: exec_token.hpp), whose hand-over publishes the
/// batch. Nothing here is atomic.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "actors/core/item.hpp"
#include "actors/core/spin.hpp"
#include "actors/core/work_queue.hpp"

namespace multidev::detail {

class item_batch {
public:
  /// The entries, for `work_queue::take` (then `taken`) and for a look
  /// ahead (`try_defer`).
  std::vector<item>& items() noexcept { return items_; }
  const std::vector<item>& items() const noexcept { return items_; }
  /// The described tasks' descriptions (the queue's text, taken with it).
  std::string& text() noexcept { return text_; }
  /// A batch was just taken into `items()`: whether any entry has an
  /// order's or a wait's extra (`work_queue::taken::flagged`).
  void taken(bool flagged) noexcept { has_extras_ = flagged; }

  std::size_t size() const noexcept { return items_.size(); }
  std::size_t pos() const noexcept { return pos_; }
  /// Whether an entry is left to run (`pos() < size()`).
  bool has_next() const noexcept { return pos_ < items_.size(); }
  /// The next entry to run; only while `has_next()`.
  item& next() noexcept { return items_[pos_]; }
  const item& next() const noexcept { return items_[pos_]; }
  /// The next entry, moving past it; only while `has_next()`.
  item& take_next() noexcept { return items_[pos_++]; }
  bool has_extras() const noexcept { return has_extras_; }
  /// Lets go of the entries (what they held goes now) and starts over.
  void clear() noexcept {
    items_.clear();
    pos_ = 0;
  }

  /// `try_claim`, with the batch spent while its last item runs: sets the
  /// batch (and its text) aside, so that the next one can be taken now.
  /// The running item stays where it is until `clear_set_aside`.
  void set_aside() noexcept {
    items_.swap(spent_);
    text_.swap(spent_text_); // the running item's description with it
    pos_ = 0;
  }
  /// Whether a batch was set aside and not yet let go of.
  bool has_set_aside() const noexcept { return !spent_.empty(); }
  /// Lets go of the batch `set_aside` kept, once its last item is done.
  void clear_set_aside() noexcept {
    spent_.clear();
    spent_text_.clear();
  }

  /// A described task's description in the batch's text (`it.extra` is a
  /// place there), `it` in this batch or, on an asynchronous driver, just
  /// taken from the runner's batch.
  std::string_view text_of(const item& it) const noexcept {
    return std::string_view{text_}.substr(it.extra.text_offset(), it.extra.text_size());
  }

  /// How many entries ahead the runner prefetches an entry (as a producer
  /// does for writing), and an entry's extra.
  static constexpr std::size_t prefetch_items = queue_prefetch_items;
  static constexpr std::size_t prefetch_extras = 3;
  /// Prefetches the entries after `pos()` (see `prefetch_items`,
  /// `prefetch_extras`). Inlined: the short path of bare closures calls it
  /// for every item.
  [[gnu::always_inline]] void prefetch_ahead() const noexcept {
    // The entries, and what a wait's entry points to, were just written on
    // the producer's core: fetch them ahead, each level once the one before
    // it has had time to arrive.
    auto n = items_.size();
    if (pos_ + prefetch_items < n)
      __builtin_prefetch(&items_[pos_ + prefetch_items], 0, 3);
    // Looking at an entry's extra reads the entry: not for a batch of bare
    // closures, whose entries are read only when they run. The extra and the
    // gate are fetched for writing: recycling the extra drops its pool or its
    // gate, whose reference count shares the gate's line, and a line fetched
    // shared waited for the producer's core a second time then (a dependency
    // hop: 331 against 221 ns, 6 rounds alternating).
    if (!has_extras_)
      return;
    if (pos_ + prefetch_extras < n)
      if (auto* x = items_[pos_ + prefetch_extras].extra.address())
        prefetch_for_write(x);
    if (pos_ + 2 < n)
      if (auto* g = items_[pos_ + 2].as_gate())
        prefetch_for_write(g);
    if (pos_ + 1 < n)
      if (auto* x = items_[pos_ + 1].extra.order_or_wait(); x && x->g) {
        prefetch_for_write(x->g.get());
        // Its last line too, which the gate's destruction reads first (its
        // `cause`) as the runner lets go of it: 18% of device 0's runner in
        // prebuilt rounds of the 8-device fan DAG, nearly all on that load.
        __builtin_prefetch(&x->g->cause);
      }
  }

private:
  // The batch being run and the next item in it, and whether any of its
  // entries has an order's or a wait's extra (bare closures and described
  // tasks need no look ahead at those).
  std::vector<item> items_;
  std::size_t pos_ = 0;
  bool has_extras_ = false;
  std::string text_; // its described tasks' descriptions
  // The batch `set_aside` replaced while its last item ran.
  std::vector<item> spent_;
  std::string spent_text_;
};

} // namespace multidev::detail
