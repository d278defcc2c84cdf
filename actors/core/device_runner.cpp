// The runner thread: takes batches off the queue, runs them in order (or,
// on an asynchronous driver, submits them to the device's stream and
// resolves them in order as they complete), parks on gates, completes items
// and fails the device when a task throws.
#include "actors/core/device_core.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "actors/core/backstop.hpp"
#include "actors/core/trace.hpp"

namespace multidev::detail {

namespace {
/// When fewer items than this are waiting, the runner pauses up to
/// `coalesce_pauses` times (about a microsecond) to take them in one batch.
constexpr uint64_t coalesce_items = 32;
constexpr int coalesce_pauses = 64;

} // namespace

namespace {
/// Set while this runner thread runs another device's items (`serve`): it
/// claims nothing more until it is back on its own device.
thread_local bool serving_other = false;
} // namespace

void device_core::run() {
  current_runner = this;
  home_runner = this;
  runner_awake counted; // in awake_runners while this thread runs
  if (pin_runner_)
    cpu_.store(pin_to_next_cpu(), std::memory_order_relaxed);
  if (window_.async()) {
    run_async();
    return;
  }
  auto pending = [&] { return queue_.untaken(); };
  for (;;) {
    if (pos_ < batch_.size()) {
      // Parked at a wait: back with the token once it ended, or once a
      // device that ran items here handed the token back.
      park();
      run_batch(false);
      continue;
    }
    batch_.clear();
    pos_ = 0;
    if (pending() == 0 && !spin_until([&] { return pending() != 0; }, 16)) {
      extras_.let_go_of_spent_pools(); // an idle device holds no pool
      extras_.trim_spare_extras();
      if (!queue_.sleep_until_work())
        return;
    } else if (pending() < coalesce_items) {
      // A producer in a burst is appending right now: taking the lock for
      // each item would move its cache line back and forth on every push.
      // Reading the queue's scheduled count pulls the producer's cache line, so look rarely.
      for (int i = 0; i < coalesce_pauses && pending() < coalesce_items; i += 16)
        for (int j = 0; j < 16; ++j)
          cpu_relax();
    }
    if (!take_batch(batch_, batch_text_)) {
      if (life_.stopping())
        return;
      continue;
    }
    run_batch(true);
  }
}

void device_core::run_batch(bool first) {
  while (pos_ < batch_.size()) {
    if (!batch_has_extras_ && !claimed_) {
      if (!trace_)
        run_bare_items();
      else
        run_bare_items_traced(first);
      first = false;
      continue;
    }
    if (claimed_) [[unlikely]] {
      // The last item opened the wait of a device that this one waits for
      // next: run that device's items here rather than wake its runner and
      // sleep (see exec_token).
      auto other = std::move(claimed_);
      if (auto* g = pending_gate_at_pos()) {
        mark_parked(g);
        other->serve(*this, *g, executed_ + 1);
      } else {
        other->hand_back();
      }
      first = false;
      continue;
    }
    if (auto* g = pending_gate_at_pos()) {
      if (!try_help(*g)) {
        // Parking: a wake-up of the awaited device that some runner
        // deferred is not this runner's to take up any more.
        if (hand_over_ && !g->remote)
          if (auto o = g->owner.lock())
            o->ring_deferred();
        return; // park
      }
      first = false;
      continue;
    }
    prefetch_ahead();
    run_item(first);
    first = false;
    if (!spent_batch_.empty()) [[unlikely]]
      clear_spent_batch(); // `try_claim` took the next batch early
  }
}

void device_core::run_bare_items() {
  // A batch without orders and waits holds bare closures and described
  // tasks only: no gate to look for, no extra to fetch ahead, no trace.
  // Until the batch changes (`try_claim` may take the next one early) or a
  // firing claims another device.
  while (pos_ < batch_.size() && !batch_has_extras_ && !claimed_) {
    prefetch_ahead(); // the entries only: the batch has no extras
    execute_bare(batch_[pos_++]);
    if (!spent_batch_.empty()) [[unlikely]]
      clear_spent_batch(); // `try_claim` took the next batch early
  }
}

template <bool bare>
[[gnu::always_inline]] inline void device_core::execute_traced(item& it, bool first_in_batch,
                                                              int64_t start_ns) {
  auto& ring = *trace_;
  // Items of one batch run back to back: the previous end is this start.
  if (start_ns == 0)
    start_ns = first_in_batch ? ring.clock().now() : ring.last_end_ns();
  ring.begin(&it, start_ns);
  // A described task's text, for a deadline's chain ("is running ..."):
  // read while it runs, so noted before (the seq `execute` gives it). A
  // bare closure's entry (the bench's traced loop) checks one word.
  if (it.extra && !it.as_gate()) [[unlikely]]
    note_running_text(it, executed_ + 1);
  if constexpr (bare)
    execute_bare(it);
  else
    execute(it);
  // An item that neither completed nor failed (none does today) still
  // leaves its record.
  if (ring.running()) [[unlikely]]
    trace_done(executed_, life_.failed());
}

void device_core::run_bare_items_traced(bool first) {
  // The same with the trace on: each item's record, without the general
  // path's look for a gate or an order.
  while (pos_ < batch_.size() && !batch_has_extras_ && !claimed_) {
    prefetch_ahead();
    execute_traced<true>(batch_[pos_++], first);
    first = false;
    if (!spent_batch_.empty()) [[unlikely]]
      clear_spent_batch(); // `try_claim` took the next batch early
  }
}

[[gnu::always_inline]] inline void device_core::prefetch_ahead() const noexcept {
  // The entries, and what a wait's entry points to, were just written on
  // the producer's core: fetch them ahead, each level once the one before
  // it has had time to arrive.
  auto n = batch_.size();
  if (pos_ + prefetch_items < n)
    __builtin_prefetch(&batch_[pos_ + prefetch_items], 0, 3);
  // Looking at an entry's extra reads the entry: not for a batch of bare
  // closures, whose entries are read only when they run. The extra and the
  // gate are fetched for writing: recycling the extra drops its pool or its
  // gate, whose reference count shares the gate's line, and a line fetched
  // shared waited for the producer's core a second time then (a dependency
  // hop: 331 against 221 ns, 6 rounds alternating).
  if (!batch_has_extras_)
    return;
  if (pos_ + prefetch_extras < n)
    if (auto* x = batch_[pos_ + prefetch_extras].extra.address())
      prefetch_for_write(x);
  if (pos_ + 2 < n)
    if (auto* g = batch_[pos_ + 2].as_gate())
      prefetch_for_write(g);
  if (pos_ + 1 < n)
    if (auto* x = batch_[pos_ + 1].extra.order_or_wait(); x && x->g) {
      prefetch_for_write(x->g.get());
      // Its last line too, which the gate's destruction reads first (its
      // `cause`) as the runner lets go of it: 18% of device 0's runner in
      // prebuilt rounds of the 8-device fan DAG, nearly all on that load.
      __builtin_prefetch(&x->g->cause);
    }
}

void device_core::run_item(bool first_in_batch) {
  auto& it = batch_[pos_++];
  if (trace_) [[unlikely]] {
    auto start = it.as_gate() ? std::exchange(token_.parked_ns(), 0) : 0;
    execute_traced(it, first_in_batch, start);
  } else {
    execute(it);
  }
  // Orders' and waits' extras are kept for reuse (see extra_cache). A wait's
  // extra freed here, on another thread than the host that allocated it,
  // took glibc's arena lock against that host's next allocation: with a
  // host scheduling a chain while it runs, futex waits and wakes on both
  // sides, 10% of the samples. Reused, a scheduled chain's hop took
  // 1,950-2,150 ns against 2,600-3,100, and a prebuilt one 250-300 against
  // 450-640 (tools chain, this machine).
  if (it.extra.order_or_wait())
    extras_.recycle(it);
}

bool device_core::gate_ended(const gate& g, uint64_t seq) const noexcept {
  auto st = g.state.load(std::memory_order_seq_cst);
  return st == gate::open || st == gate::failed ||
         seq <= outcomes_.dropped_upto(std::memory_order_seq_cst);
}

gate* device_core::pending_gate_at_pos() const noexcept {
  if (pos_ >= batch_.size())
    return nullptr;
  auto* g = batch_[pos_].as_gate();
  return g && !gate_ended(*g, executed_ + 1) ? g : nullptr;
}

void device_core::mark_parked(const gate* g) noexcept {
  if (gates_.parked_on(std::memory_order_relaxed) == g)
    return;
  if (g && trace_) [[unlikely]]
    token_.parked_ns() = trace_->clock().now();
  gates_.set_parked_on(g);
}

void device_core::park() {
  for (;;) {
    auto* g = pending_gate_at_pos();
    if (!g)
      return;
    auto seq = executed_ + 1;
    mark_parked(g);
    if (!hand_over_) {
      wait_at_gate(*g, seq);
      continue;
    }
    // Kept alive while this thread waits without the token: whoever holds
    // it may take a new batch and free this one.
    auto keep = batch_[pos_].extra.order_or_wait()->g;
    token_.set_spinning(true); // before the token is lendable
    auto mine = release_parked(*g);
    auto ready = [&] {
      return token_.may_take_back(mine, [&] { return gate_ended(*keep, seq); });
    };
    // Spins only while the wait is this runner's own: once the token is
    // lent, whoever holds it rings this runner when it must act.
    auto lent_or_ready = [&] { return token_.lent_now() || ready(); };
    bool spin = true;
    for (;;) {
      if (spin) {
        spin = spin_on_gate(lent_or_ready) && ready();
        token_.set_spinning(false);
      }
      if (!spin) {
        queue_.sleep_on_gate_until(ready);
        token_.wait_if_held_after_wake();
      }
      spin = false;
      if (token_.try_take_back())
        break; // holding the token again: look at where the device is now
    }
  }
}

void device_core::wait_at_gate(const gate& g, uint64_t seq) {
  // A cancel or kill while parked ends the wait too (it rings the bell).
  auto ended = [&] { return gate_ended(g, seq); };
  if (!spin_on_gate(ended))
    queue_.sleep_on_gate_until(ended);
}

uint32_t device_core::release_parked(gate& g) noexcept {
  auto seq = executed_ + 1;
  auto n = token_.park_at(&g);
  lend_at(g, seq);
  return n;
}

void device_core::lend_at(const gate& g, uint64_t seq) noexcept {
  token_.lend();
  // Against an opener that found the token held or lent and fell back to
  // ringing (Dekker: it stores the gate's state, then tries the token): a
  // runner that slept through that ring must see the wait ended.
  if (gate_ended(g, seq))
    ring();
}

bool device_core::try_claim(const gate_waiter& w) noexcept {
  // Only this device's own runner, running its own items: it holds its
  // token, and batch_[pos_] is its next item.
  if (!hand_over_ || current_runner != this || serving_other || claimed_)
    return false;
  if (pos_ == batch_.size() && spent_batch_.empty() && queue_.has_untaken()) {
    // The next item is queued, not yet taken: take it now. The item running
    // (in this batch) stays where it is until `run_batch` frees the batch.
    batch_.swap(spent_batch_);
    batch_text_.swap(spent_batch_text_); // the running item's description with it
    pos_ = 0;
    take_batch(batch_, batch_text_);
  }
  auto* next = pending_gate_at_pos();
  // Its next item waits for w's device (owner equality without touching
  // the counts); a wait on any other device could open while this runner
  // is busy with w's items, and this device would wait for nothing.
  if (!next || next->remote || next->owner.owner_before(w.waiter) ||
      w.waiter.owner_before(next->owner))
    return false;
  auto other = w.waiter.lock();
  if (!other || !other->hand_over_)
    return false;
  if (!other->token_.try_borrow())
    return false;
  other->token_.take_up_deferral();
  // Holding its token: it stays where it is.
  // Opened without ringing its runner.
  int expected = gate::pending;
  if (other->token_.parked_gate() != w.g.get() ||
      !w.g->state.compare_exchange_strong(expected, gate::open)) {
    other->hand_back();
    return false;
  }
  claimed_ = std::move(other);
  return true;
}

namespace {
/// How many items ahead `try_defer` looks for this runner's own wait on the
/// device whose wake-up it would defer.
constexpr std::size_t defer_look_ahead = 16;
} // namespace

void device_core::set_defer_threshold_for_tests(int n) noexcept {
  defer_min_runners.store(n > 0 ? n : process_cpus() + 1, std::memory_order_relaxed);
}

bool device_core::try_defer(const gate_waiter& w) noexcept {
  // The caller asked `runners_may_defer`. Only this device's own runner,
  // running its own items (as try_claim).
  if (!hand_over_ || current_runner != this || serving_other || claimed_)
    return false;
  // This runner waits for w's device soon: it will run that device's items
  // at its own wait (`try_help`), so they do not wait on it long. Its own
  // entries only: no lock, no reference count yet.
  bool waits_for_it = false;
  auto first = batch_has_extras_ ? pos_ : batch_.size();
  auto end = std::min(batch_.size(), pos_ + defer_look_ahead);
  // The entries' extras and their gates were written by the host: read one
  // entry after the other, each cost two cache misses in a row (try_defer
  // took 29% of device 0's runner in prebuilt rounds of the 8-device fan
  // DAG). Fetched in two passes first, the misses of each level overlap.
  for (auto i = first; i < end; ++i)
    if (auto* x = batch_[i].extra.order_or_wait())
      __builtin_prefetch(x);
  for (auto i = first; i < end; ++i)
    if (auto* g = batch_[i].as_gate())
      __builtin_prefetch(g);
  for (auto i = first; i < end; ++i) {
    auto* g = batch_[i].as_gate();
    // The owner first: on the gate's first line, where `remote` is not.
    if (g && !g->owner.owner_before(w.waiter) && !w.waiter.owner_before(g->owner) && !g->remote) {
      waits_for_it = true;
      break;
    }
  }
  if (!waits_for_it)
    return false;
  auto other = w.waiter.lock();
  if (!other || !other->hand_over_)
    return false;
  // Asleep, parked at exactly this gate, the token left there: only a ring
  // or a helper gets its items run. Awake (spinning, or rung already), it
  // takes them up itself.
  if (other->queue_.sleeping(std::memory_order_seq_cst) != work_queue_t::on_gate ||
      other->token_.state(std::memory_order_relaxed) != exec_token::lendable ||
      other->gates_.parked_on(std::memory_order_acquire) != w.g.get())
    return false;
  auto stamp = wake_backstop::next_stamp();
  other->token_.defer(stamp);
  int expected = gate::pending;
  if (!w.g->state.compare_exchange_strong(expected, gate::open)) {
    // Resolved meanwhile (a cancel): whoever did rang it.
    other->ring_if_deferred(stamp);
    return true;
  }
  other->token_.count_deferred_wake();
  if (!wake_backstop::instance().deferred(other.get(), stamp))
    other->ring_if_deferred(stamp); // no backstop: rung now, as without deferral
  return true;
}

bool device_core::ring_if_deferred(uint64_t stamp) noexcept {
  if (!token_.clear_deferral(stamp))
    return false;
  ring();
  return true;
}

void device_core::hold_after_wake(bool on) noexcept {
  token_.hold_after_wake(on);
}

bool device_core::try_help(const gate& g) {
  // Only this device's own runner, running its own items (as try_claim).
  if (!hand_over_ || current_runner != this || serving_other || g.remote)
    return false;
  auto other = g.owner.lock();
  if (!other || other.get() == this || !other->hand_over_)
    return false;
  // Lendable means parked at a wait: its runner left the token there. Not
  // while that runner spins there (see try_borrow_unless_spinning). Asleep,
  // rung or not, it may be a context switch away (a hint: a runner that
  // starts spinning now finds the token lent and sleeps, as for any lent
  // token).
  if (!other->token_.try_borrow_unless_spinning())
    return false;
  if (other->pending_gate_at_pos() || other->executed_ >= g.owner_seq) {
    other->relend(); // still held there, or past what g waits for: left as it was
    return false;
  }
  // Its wait has ended, and its runner (rung, or its wake-up deferred) has
  // not taken the token back yet: the items it would run are those this
  // runner waits for.
  other->token_.take_up_deferral();
  mark_parked(&g);
  other->serve(*this, g, executed_ + 1);
  return true;
}

void device_core::relend() noexcept {
  // The gate is kept alive across the release: once the token is lendable,
  // its runner may take it, run past the gate and free it.
  auto keep = batch_[pos_].extra.order_or_wait()->g;
  lend_at(*keep, executed_ + 1);
}

void device_core::serve(const device_core& lender, const gate& until, uint64_t until_seq) {
  current_runner = this;
  serving_other = true;
  bool first = false;
  uint64_t ran = 0;
  // Up to the item the lender waits for, never past it: its gate may open
  // later than that item (a wait whose registration the host has not yet
  // finished opens on the host), and an item past it is one the lender
  // does not wait for, which could even wait for the lender's later work.
  while (executed_ < until.owner_seq) {
    if (pos_ == batch_.size()) {
      batch_.clear();
      pos_ = 0;
      if (!take_batch(batch_, batch_text_))
        break;
      first = true;
    }
    if (pending_gate_at_pos())
      break;
    prefetch_ahead();
    run_item(first);
    first = false;
    ++ran;
    if (lender.gate_ended(until, until_seq))
      break;
  }
  token_.count_run_by_others(ran);
  serving_other = false;
  current_runner = &lender;
  hand_back();
}

void device_core::hand_back() noexcept {
  if (pos_ == batch_.size() && queue_.has_untaken()) {
    // Where the device stands is in the items queued since: most often the
    // next wait of a chain, where it parks lendable again.
    batch_.clear();
    pos_ = 0;
    take_batch(batch_, batch_text_);
  }
  if (auto* g = pending_gate_at_pos()) {
    // Kept alive across the release, as in relend.
    auto keep = batch_[pos_].extra.order_or_wait()->g;
    mark_parked(g);
    release_parked(*g);
    return;
  }
  if (pos_ == batch_.size()) {
    batch_.clear(); // what the items held goes now, not when the runner wakes
    pos_ = 0;
    // Nothing to run: a producer rings the runner as for any idle device.
    if (queue_.settle_idle_runner([&] { token_.give_back(); }))
      return;
  } else {
    token_.give_back();
  }
  ring();
}

bool device_core::take_batch(std::vector<item>& batch, std::string& text) {
  auto t = queue_.take(batch, text);
  if (!t.took)
    return false;
  batch_has_extras_ = t.flagged;
  extras_.hand_back_if_due();
  if (t.wants_room)
    queue_.call_room_callback();
  return true;
}

[[gnu::always_inline]] inline bool device_core::call_work(item& it, uint64_t seq) {
  if (!it.work)
    return true;
  try {
    it.work();
  } catch (...) {
    poison(seq, [&] { return task_failure(it, seq, std::current_exception()); });
    return false;
  }
  return true;
}

[[gnu::always_inline]] inline void device_core::execute_bare(item& it) {
  life_.check_lease(); // a session's: nothing starts once its lease is over
  auto seq = ++executed_; // runner-only count of items resolved
  // Cancelled, killed, or behind a failure: resolved without running.
  if (seq <= outcomes_.dropped_upto(std::memory_order_acquire)) [[unlikely]] {
    drop(it, seq);
    return;
  }
  // The closure is left for batch.clear(): writing to the entry here would
  // pull its cache line back from the producer on every item.
  if (!call_work(it, seq))
    return;
  if (it.extra) [[unlikely]] {
    complete_described(it, seq);
    return;
  }
  complete(seq);
}

void device_core::complete_described(item& it, uint64_t seq) {
  // Its captures and what it held go before its event is done (task.hpp).
  it.work = nullptr;
  if (auto* n = it.extra.named_holding())
    n->keep_alive.reset();
  complete(seq); // records it in the trace, its description read there
}

void device_core::note_running_text(const item& it, uint64_t seq) noexcept {
  if (it.extra.is_text()) {
    trace_->note_running(seq, text_of(it));
  } else if (auto* n = it.extra.named()) {
    trace_->note_running(seq, n->description());
  } else {
    try {
      trace_->note_running(seq, description_of(it)); // an order's, built now
    } catch (...) {
      // Out of memory: the chain says its seq only.
    }
  }
}

void device_core::execute(item& it) {
  if (!it.extra.order_or_wait()) {
    execute_bare(it);
    return;
  }
  life_.check_lease();
  auto seq = ++executed_;
  if (seq <= outcomes_.dropped_upto(std::memory_order_acquire)) [[unlikely]] {
    if (it.as_gate())
      mark_parked(nullptr); // it may be freed with the item (extras_.recycle)
    drop(it, seq);
    return;
  }
  if (auto* gp = it.as_gate()) {
    // Ended: the runner parked until it did (`park`).
    auto& g = *gp;
    mark_parked(nullptr);
    if (g.state.load() != gate::open && seq <= outcomes_.dropped_upto(std::memory_order_seq_cst)) {
      drop(it, seq); // counts the gate off
      return;
    }
    gates_.count_passed();
    if (g.state.load() == gate::failed) {
      poison(seq, [&] { return gate_failure(g); });
      return;
    }
  } else if (!call_work(it, seq)) {
    return;
  }
  // Release what an order held (a freed pool's memory) before its event is
  // done, so whoever syncs on it sees the memory gone.
  it.work = nullptr;
  extras_.release_hold(*it.extra.order_or_wait());
  complete(seq);
}

device_core::failure_ptr device_core::task_failure(const item& it, uint64_t seq,
                                                   std::exception_ptr e) const {
  std::string what = "unknown exception";
  try {
    if (e)
      std::rethrow_exception(e);
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
  }
  return std::make_shared<failure>(
    failure{failure::kind::failed, name_, task_name(it, seq), seq, std::move(what), {}});
}

device_core::failure_ptr device_core::gate_failure(const gate& g) const {
  auto f = std::make_shared<failure>();
  if (g.cause)
    *f = *g.cause;
  else
    f->message = "failed (its cause could not be recorded)";
  f->path.insert(f->path.begin(), failure_hop{name_, g.owner_label(), g.owner_seq});
  return f;
}

std::string device_core::description_of(const item& it) const {
  if (it.extra.is_text())
    return std::string{text_of(it)};
  if (auto* n = it.extra.named())
    return std::string{n->description()};
  auto* x = it.extra.order_or_wait();
  if (!x || x->g)
    return {};
  const auto& o = x->op;
  switch (o.naming) {
  case order::pool_span:
    return fmt::format("{} pool {} [{}, {})", o.what, o.id, o.offset, o.offset + o.bytes);
  case order::pool:
    return fmt::format("{} {}", o.what, o.id);
  case order::node:
    break;
  }
  return x->node_label.empty() ? fmt::format("{} #{}", o.what, o.id)
                               : fmt::format("{} '{}' (#{})", o.what, x->node_label, o.id);
}

std::string device_core::task_name(const item& it, uint64_t seq) const {
  if (auto* g = it.as_gate())
    return "wait for " + g->what();
  auto d = description_of(it);
  return d.empty() ? nameless_task_name(seq) : d;
}

void device_core::drop(item& it, uint64_t seq) noexcept {
  if (it.as_gate())
    gates_.count_passed();
  if (trace_) [[unlikely]]
    trace_dropped(it, seq);
  it.work = nullptr;
  extras_.release_hold(it);
  outcomes_.record_dropped(seq); // with the cause of the drop that covers it
  complete(seq);
}

void device_core::resolve_bad(uint64_t seq, failure_ptr cause) noexcept {
  outcomes_.record_bad(seq, std::move(cause));
  complete(seq);
}

void device_core::complete(uint64_t seq) {
  if (trace_) [[unlikely]]
    trace_done(seq, false); // before the event is done, so whoever syncs sees it
  // Store-then-load against a registration's store-then-load of the
  // waiters' minimum and the progress (Dekker, `outcome_board::publish`):
  // both sides need StoreLoad order, or a waiter that registers at this very
  // moment and this check could both miss each other, and the event would
  // stay unresolved -- forever if the next task waits for whoever is waiting
  // on this event.
  if (outcomes_.publish(seq))
    events_.fire(seq, nullptr);
}

// -- Asynchronous drivers -----------------------------------------------------
//
// The runner submits items to the device's stream and moves on; the stream
// reports each one later, from its own thread, in any order. The window
// (`window_`, stream_window.hpp) holds them between start and resolution and
// resolves them strictly in seq order, calling back `resolve_flight`. The
// runner starts an item only when the window has room, and otherwise sleeps
// until a completion rings. Waits on other devices (gates) stay on the
// runner: it starts nothing behind a gate until the gate opens (or the
// driver ordered it on the device), while the items before it keep
// completing. Pool releases, memsets and copies are queue items like any
// other, so they go through the stream in order.

void device_core::run_async() {
  std::vector<item> batch;
  std::size_t next = 0; // batch[next]: the next item to start
  uint64_t barrier = 0; // a failed wait: nothing behind it starts before it resolves
  const gate* parked = nullptr;
  int64_t parked_ns = 0; // when the runner began waiting on `parked` (trace)
  // A wait ends when the awaited event resolves, or when it is dropped.
  auto ended = [&](const gate& g) {
    auto st = g.state.load(std::memory_order_seq_cst);
    return st == gate::open || st == gate::failed ||
           window_.started() + 1 <= outcomes_.dropped_upto(std::memory_order_seq_cst);
  };
  // A gate the driver ordered on the device (asked when the runner reaches
  // it, and again whenever the producer submitted more: take_reask).
  const gate* on_device = nullptr;
  const gate* asked = nullptr;
  auto startable = [&] {
    if (!window_.has_room(barrier))
      return false;
    if (next < batch.size()) {
      auto* g = batch[next].as_gate();
      if (!g || ended(*g) || g == on_device)
        return true;
      if (g != asked || window_.take_reask()) {
        asked = g;
        if (order_on_device(*g))
          on_device = g;
      }
      return g == on_device;
    }
    return queue_.has_untaken();
  };
  // Nothing in flight, nothing taken (the stream may have resolved the
  // last items while the runner looked elsewhere).
  auto idle = [&] { return window_.idle() && next == batch.size(); };
  auto park = [&](const gate* g) {
    if (parked == g)
      return;
    if (g && trace_) [[unlikely]]
      parked_ns = trace_->clock().now();
    gates_.set_parked_on(parked = g);
  };
  for (;;) {
    window_.settle_gated();
    if (window_.retirable())
      window_.retire_ready();
    if (startable()) {
      if (next == batch.size()) {
        batch.clear();
        next = 0;
        take_batch(batch, batch_text_);
        continue;
      }
      auto& it = batch[next++];
      int64_t waited_since = 0;
      bool gate_on_device = false;
      if (auto* g = it.as_gate()) {
        waited_since = parked == g ? parked_ns : 0;
        park(nullptr);
        gate_on_device = g == on_device && !ended(*g);
        on_device = asked = nullptr; // a later gate may reuse the address
        if (g->state.load() == gate::failed)
          barrier = window_.started() + 1;
      }
      if (it.extra.is_text()) [[unlikely]] {
        // The item outlives its batch in the window: its description leaves
        // the batch's text with it. Out of memory, it goes nameless.
        try {
          it.extra = extra_ptr{named_extra::make(text_of(it), nullptr, it.extra.text_kind())};
        } catch (...) {
          it.extra = extra_ptr{};
        }
      }
      life_.check_lease();
      window_.start(std::move(it), waited_since, gate_on_device);
      continue;
    }
    if (idle()) {
      // Wait for work like the synchronous runner.
      auto queued = [&] { return queue_.has_untaken(); };
      if (!spin_until(queued, 16) && !queue_.sleep_until_work())
        return;
      continue;
    }
    if (next < batch.size())
      if (auto* g = batch[next].as_gate(); g && !ended(*g))
        park(g);
    auto ready = [&] {
      return window_.settle_gated() || window_.retirable() || startable() || idle();
    };
    if (spin_until(ready, 16))
      continue;
    // Sleep until a completion, a gate or a cancel rings, or a producer
    // (which tests the runner's mark under the queue's lock) brings work. A
    // stop rings too, and is seen once idle. Polled, as in sleep_until_work.
    queue_.sleep_for_work_unless(ready, [](const auto& bell, uint32_t seen) {
      bell_sleep_polled(bell, seen);
    });
  }
}

bool device_core::serve_started_until(const std::atomic<uint32_t>& flag,
                                      std::chrono::steady_clock::time_point deadline) noexcept {
  for (;;) {
    window_.resolve_settled();
    if (flag.load(std::memory_order_seq_cst) != 0)
      return true;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return false;
    // As run_async sleeps: whoever ends a gate, reports an item or resolves
    // the awaited seq (the sync's resolver) rings once the runner is marked
    // asleep.
    queue_.sleep_for_work_unless(
      [&] { return flag.load(std::memory_order_seq_cst) != 0 || window_.resolve_settled(); },
      [&](const auto& bell, uint32_t seen) {
        if (deadline == std::chrono::steady_clock::time_point::max())
          bell_sleep(bell, seen);
        else
          bell_sleep_for(bell, seen, deadline - now);
      });
  }
}

bool device_core::order_on_device(const gate& g) {
  if (g.remote)
    return false;
  auto owner = g.owner.lock();
  // Streams of one driver instance only (one backend's devices).
  if (!owner || owner.get() == this || &owner->drv() != driver_.get())
    return false;
  return driver_->order_after(ordinal_, owner->ordinal(), g.owner_seq, [this] {
    window_.ask_again();
    ring();
  });
}

void device_core::resolve_flight(stream_window::flight& f, stream_window::verdict v) noexcept {
  auto seq = f.seq;
  // The record goes out as the item resolves (complete, poison, drop); a
  // settled item the stream did not report (a gate) ends now.
  if (trace_) [[unlikely]]
    trace_->begin(&f.it, f.start_ns, f.end_ns);
  auto* g = f.it.as_gate();
  switch (v) {
  case stream_window::verdict::dropped:
    drop(f.it, seq); // counts a gate off
    return;
  case stream_window::verdict::failed:
    if (g) {
      gates_.count_passed();
      poison(seq, [&] { return gate_failure(*g); });
    } else {
      poison(seq, [&] { return task_failure(f.it, seq, f.error); });
    }
    return;
  case stream_window::verdict::done:
    if (g) {
      gates_.count_passed();
    } else {
      if (trace_) [[unlikely]]
        trace_done(seq, false); // while its description is still there
      f.it = item{}; // what the task held goes before its event is done
    }
    complete(seq);
    return;
  }
}

template <class MakeCause>
void device_core::poison(uint64_t seq, MakeCause make) noexcept {
  // Runs on the runner, outside any handler: nothing here may throw. A cause
  // that cannot be made (out of memory) becomes a preallocated one.
  if (trace_) [[unlikely]]
    trace_done(seq, true);
  failure_ptr cause;
  try {
    cause = make();
  } catch (...) {
    cause = outcomes_.fallback_cause();
  }
  {
    std::lock_guard guard{queue_.mutex()};
    life_.fail_locked(cause); // wakes the producers waiting for room
    // What is queued behind the failure fails with it, in order (with a
    // generic cause, should there be no memory to record this one).
    life_.drop_locked(cause);
  }
  resolve_bad(seq, std::move(cause));
  queue_.call_room_callback();
}

} // namespace multidev::detail
