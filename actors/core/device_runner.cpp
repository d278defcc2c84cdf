// The runner thread (device_runner.hpp): takes batches off the queue, runs
// them in order (or, on an asynchronous driver, submits them to the
// device's stream and resolves them in order as they complete) and parks on
// gates. Beside it, in this file so that the item loop and the hand-over
// inline each other: the hand-over protocol (hand_over.hpp: claim, defer,
// help, serve, hand back), and the core's resolving side, which completes
// items and fails the device when a task throws (`complete`, `drop`,
// `poison`).
#include "actors/core/device_core.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "actors/core/backstop.hpp"
#include "actors/core/stream_runner.hpp"
#include "actors/core/trace.hpp"

namespace multidev::detail {

namespace {
/// When fewer items than this are waiting, the runner pauses up to
/// `coalesce_pauses` times (about a microsecond) to take them in one batch.
constexpr uint64_t coalesce_items = 32;
constexpr int coalesce_pauses = 64;

} // namespace

void device_runner::start(bool hand_over, bool pin) {
  handover_.enabled_ = hand_over;
  pin_runner_ = pin;
  thread_ = std::thread([this] { run(); });
}

void device_runner::run() {
  current_runner = &core_;
  home_runner = &core_;
  runner_awake counted; // in awake_runners while this thread runs
  if (pin_runner_)
    cpu_.store(pin_to_next_cpu(), std::memory_order_relaxed);
  if (core_.window_.async()) {
    stream_runner{*this}.run();
    return;
  }
  auto pending = [&] { return core_.queue_.untaken(); };
  for (;;) {
    if (batch_.has_next()) {
      // Parked at a wait: back with the token once it ended, or once a
      // device that ran items here handed the token back.
      park();
      run_batch(false);
      continue;
    }
    batch_.clear();
    if (pending() == 0 && !spin_until([&] { return pending() != 0; }, 16)) {
      core_.extras_.let_go_of_spent_pools(); // an idle device holds no pool
      core_.extras_.trim_spare_extras();
      if (!core_.queue_.sleep_until_work())
        return;
    } else if (pending() < coalesce_items) {
      // A producer in a burst is appending right now: taking the lock for
      // each item would move its cache line back and forth on every push.
      // Reading the queue's scheduled count pulls the producer's cache line, so look rarely.
      for (int i = 0; i < coalesce_pauses && pending() < coalesce_items; i += 16)
        for (int j = 0; j < 16; ++j)
          cpu_relax();
    }
    if (!take_batch(batch_.items())) {
      if (core_.life_.stopping())
        return;
      continue;
    }
    run_batch(true);
  }
}

void device_runner::run_batch(bool first) {
  while (batch_.has_next()) {
    if (!batch_.has_extras() && !handover_.claimed()) {
      if (!core_.trace_)
        run_bare_items();
      else
        run_bare_items_traced(first);
      first = false;
      continue;
    }
    if (handover_.claimed()) [[unlikely]] {
      // The last item opened the wait of a device that this one waits for
      // next: run that device's items here rather than wake its runner and
      // sleep (see hand_over.hpp).
      handover_.serve_claimed();
      first = false;
      continue;
    }
    if (auto* g = pending_gate_at_pos()) {
      if (!handover_.try_help(*g)) {
        // Parking: a wake-up of the awaited device that some runner
        // deferred is not this runner's to take up any more.
        if (handover_.enabled() && !g->remote)
          if (auto o = g->owner.lock())
            o->runner_.handover_.ring_deferred();
        return; // park
      }
      first = false;
      continue;
    }
    batch_.prefetch_ahead();
    run_item(first);
    first = false;
    if (batch_.has_set_aside()) [[unlikely]]
      batch_.clear_set_aside(); // `try_claim` took the next batch early
  }
}

void device_runner::run_bare_items() {
  // A batch without orders and waits holds bare closures and described
  // tasks only: no gate to look for, no extra to fetch ahead, no trace.
  // Until the batch changes (`try_claim` may take the next one early) or a
  // firing claims another device.
  while (batch_.has_next() && !batch_.has_extras() && !handover_.claimed()) {
    batch_.prefetch_ahead(); // the entries only: the batch has no extras
    execute_bare(batch_.take_next());
    if (batch_.has_set_aside()) [[unlikely]]
      batch_.clear_set_aside(); // `try_claim` took the next batch early
  }
}

template <bool bare>
[[gnu::always_inline]] inline void device_runner::execute_traced(item& it, bool first_in_batch,
                                                              int64_t start_ns) {
  auto& ring = *core_.trace_;
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
    trace_done(executed_, core_.life_.failed());
}

void device_runner::run_bare_items_traced(bool first) {
  // The same with the trace on: each item's record, without the general
  // path's look for a gate or an order.
  while (batch_.has_next() && !batch_.has_extras() && !handover_.claimed()) {
    batch_.prefetch_ahead();
    execute_traced<true>(batch_.take_next(), first);
    first = false;
    if (batch_.has_set_aside()) [[unlikely]]
      batch_.clear_set_aside(); // `try_claim` took the next batch early
  }
}

void device_runner::run_item(bool first_in_batch) {
  auto& it = batch_.take_next();
  if (core_.trace_) [[unlikely]] {
    auto start = it.as_gate() ? std::exchange(handover_.token_.parked_ns(), 0) : 0;
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
    core_.extras_.recycle(it);
}

bool device_runner::gate_ended(const gate& g, uint64_t seq) const noexcept {
  auto st = g.state.load(std::memory_order_seq_cst);
  return st == gate::open || st == gate::failed ||
         seq <= core_.outcomes_.dropped_upto(std::memory_order_seq_cst);
}

gate* device_runner::pending_gate_at_pos() const noexcept {
  if (!batch_.has_next())
    return nullptr;
  auto* g = batch_.next().as_gate();
  return g && !gate_ended(*g, executed_ + 1) ? g : nullptr;
}

void device_runner::park() {
  for (;;) {
    auto* g = pending_gate_at_pos();
    if (!g)
      return;
    auto seq = executed_ + 1;
    handover_.mark_parked(g);
    if (handover_.enabled())
      handover_.wait_lendable(*g, seq);
    else
      wait_at_gate(*g, seq);
  }
}

void device_runner::wait_at_gate(const gate& g, uint64_t seq) {
  // A cancel or kill while parked ends the wait too (it rings the bell).
  auto ended = [&] { return gate_ended(g, seq); };
  if (!spin_on_gate(ended))
    core_.queue_.sleep_on_gate_until(ended);
}

bool device_runner::take_batch(std::vector<item>& batch) {
  auto t = core_.queue_.take(batch, batch_.text());
  if (!t.took)
    return false;
  batch_.taken(t.flagged);
  core_.extras_.hand_back_if_due();
  if (t.wants_room)
    core_.queue_.call_room_callback();
  return true;
}

[[gnu::always_inline]] inline bool device_runner::call_work(item& it, uint64_t seq) {
  if (!it.work)
    return true;
  try {
    it.work();
  } catch (...) {
    auto r = core_.resolving();
    r.poison(seq, [&] { return r.task_failure(it, seq, std::current_exception()); });
    return false;
  }
  return true;
}

[[gnu::always_inline]] inline void device_runner::execute_bare(item& it) {
  core_.life_.check_lease(); // a session's: nothing starts once its lease is over
  auto seq = ++executed_; // runner-only count of items resolved
  // Cancelled, killed, or behind a failure: resolved without running.
  if (seq <= core_.outcomes_.dropped_upto(std::memory_order_acquire)) [[unlikely]] {
    core_.resolving().drop(it, seq);
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
  core_.resolving().complete(seq);
}

void device_runner::complete_described(item& it, uint64_t seq) {
  // Its captures and what it held go before its event is done (task.hpp).
  it.work = nullptr;
  if (auto* n = it.extra.named_holding())
    n->keep_alive.reset();
  core_.resolving().complete(seq); // records it in the trace, its description read there
}

void device_runner::note_running_text(const item& it, uint64_t seq) noexcept {
  if (it.extra.is_text()) {
    core_.trace_->note_running(seq, text_of(it));
  } else if (auto* n = it.extra.named()) {
    core_.trace_->note_running(seq, n->description());
  } else {
    try {
      core_.trace_->note_running(seq, core_.resolving().description_of(it)); // an order's, built now
    } catch (...) {
      // Out of memory: the chain says its seq only.
    }
  }
}

void device_runner::execute(item& it) {
  if (!it.extra.order_or_wait()) {
    execute_bare(it);
    return;
  }
  core_.life_.check_lease();
  auto seq = ++executed_;
  if (seq <= core_.outcomes_.dropped_upto(std::memory_order_acquire)) [[unlikely]] {
    if (it.as_gate())
      handover_.mark_parked(nullptr); // it may be freed with the item (core_.extras_.recycle)
    core_.resolving().drop(it, seq);
    return;
  }
  if (auto* gp = it.as_gate()) {
    // Ended: the runner parked until it did (`park`).
    auto& g = *gp;
    handover_.mark_parked(nullptr);
    if (g.state.load() != gate::open && seq <= core_.outcomes_.dropped_upto(std::memory_order_seq_cst)) {
      core_.resolving().drop(it, seq); // counts the gate off
      return;
    }
    core_.gates_.count_passed();
    if (g.state.load() == gate::failed) {
      auto r = core_.resolving();
      r.poison(seq, [&] { return r.gate_failure(g); });
      return;
    }
  } else if (!call_work(it, seq)) {
    return;
  }
  // Release what an order held (a freed pool's memory) before its event is
  // done, so whoever syncs on it sees the memory gone.
  it.work = nullptr;
  core_.extras_.release_hold(*it.extra.order_or_wait());
  core_.resolving().complete(seq);
}

// -- The hand-over (hand_over.hpp) ---------------------------------------------------
// Here, not in a file of its own: `serve` runs the served device's items
// through its runner's `run_item`, and the runner's loop calls
// `mark_parked`, `try_help` and `serve_claimed`; one translation unit
// inlines them into each other as before the split.

namespace {
/// Set while this runner thread runs another device's items (`serve`): it
/// claims nothing more until it is back on its own device.
thread_local bool serving_other = false;
/// How many items ahead `try_defer` looks for this runner's own wait on the
/// device whose wake-up it would defer.
constexpr std::size_t defer_look_ahead = 16;
} // namespace

void hand_over::mark_parked(const gate* g) noexcept {
  if (core_.gates_.parked_on(std::memory_order_relaxed) == g)
    return;
  if (g && core_.trace_) [[unlikely]]
    token_.parked_ns() = core_.trace_->clock().now();
  core_.gates_.set_parked_on(g);
}

void hand_over::wait_lendable(gate& g, uint64_t seq) {
  auto& r = runner();
  // Kept alive while this thread waits without the token: whoever holds
  // it may take a new batch and free this one.
  auto keep = r.batch_.next().extra.order_or_wait()->g;
  token_.set_spinning(true); // before the token is lendable
  auto mine = release_parked(g);
  auto ready = [&] {
    return token_.may_take_back(mine, [&] { return r.gate_ended(*keep, seq); });
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
      core_.queue_.sleep_on_gate_until(ready);
      token_.wait_if_held_after_wake();
    }
    spin = false;
    if (token_.try_take_back())
      return; // holding the token again: the runner looks at where the device is now
  }
}

uint32_t hand_over::release_parked(gate& g) noexcept {
  auto seq = runner().executed_ + 1;
  auto n = token_.park_at(&g);
  lend_at(g, seq);
  return n;
}

void hand_over::lend_at(const gate& g, uint64_t seq) noexcept {
  token_.lend();
  // Against an opener that found the token held or lent and fell back to
  // ringing (Dekker: it stores the gate's state, then tries the token): a
  // runner that slept through that ring must see the wait ended.
  if (runner().gate_ended(g, seq))
    core_.queue_.ring();
}

bool hand_over::try_claim(const gate_waiter& w) noexcept {
  // Only this device's own runner, running its own items: it holds its
  // token, and batch_.next() is its next item.
  if (!enabled_ || current_runner != &core_ || serving_other || claimed_)
    return false;
  auto& r = runner();
  if (!r.batch_.has_next() && !r.batch_.has_set_aside() && core_.queue_.has_untaken()) {
    // The next item is queued, not yet taken: take it now. The item running
    // (in this batch) stays where it is until `run_batch` frees the batch.
    r.batch_.set_aside();
    r.take_batch(r.batch_.items());
  }
  auto* next = r.pending_gate_at_pos();
  // Its next item waits for w's device (owner equality without touching
  // the counts); a wait on any other device could open while this runner
  // is busy with w's items, and this device would wait for nothing.
  if (!next || next->remote || next->owner.owner_before(w.waiter) ||
      w.waiter.owner_before(next->owner))
    return false;
  auto other = w.waiter.lock();
  if (!other)
    return false;
  auto& o = other->runner_.handover_;
  if (!o.enabled_ || !o.token_.try_borrow())
    return false;
  o.token_.take_up_deferral();
  // Holding its token: it stays where it is.
  // Opened without ringing its runner.
  int expected = gate::pending;
  if (o.token_.parked_gate() != w.g.get() ||
      !w.g->state.compare_exchange_strong(expected, gate::open)) {
    o.hand_back();
    return false;
  }
  claimed_ = std::move(other);
  return true;
}

void hand_over::serve_claimed() {
  auto& r = runner();
  auto other = std::move(claimed_);
  if (auto* g = r.pending_gate_at_pos()) {
    mark_parked(g);
    other->runner_.handover_.serve(r, *g, r.executed_ + 1);
  } else {
    other->runner_.handover_.hand_back();
  }
}

void hand_over::set_defer_threshold_for_tests(int n) noexcept {
  defer_min_runners.store(n > 0 ? n : process_cpus() + 1, std::memory_order_relaxed);
}

bool hand_over::try_defer(const gate_waiter& w) noexcept {
  // The caller asked `runners_may_defer`. Only this device's own runner,
  // running its own items (as try_claim).
  if (!enabled_ || current_runner != &core_ || serving_other || claimed_)
    return false;
  // This runner waits for w's device soon: it will run that device's items
  // at its own wait (`try_help`), so they do not wait on it long. Its own
  // entries only: no lock, no reference count yet.
  bool waits_for_it = false;
  const auto& batch = runner().batch_;
  const auto& items = batch.items();
  auto first = batch.has_extras() ? batch.pos() : items.size();
  auto end = std::min(items.size(), batch.pos() + defer_look_ahead);
  // The entries' extras and their gates were written by the host: read one
  // entry after the other, each cost two cache misses in a row (try_defer
  // took 29% of device 0's runner in prebuilt rounds of the 8-device fan
  // DAG). Fetched in two passes first, the misses of each level overlap.
  for (auto i = first; i < end; ++i)
    if (auto* x = items[i].extra.order_or_wait())
      __builtin_prefetch(x);
  for (auto i = first; i < end; ++i)
    if (auto* g = items[i].as_gate())
      __builtin_prefetch(g);
  for (auto i = first; i < end; ++i) {
    auto* g = items[i].as_gate();
    // The owner first: on the gate's first line, where `remote` is not.
    if (g && !g->owner.owner_before(w.waiter) && !w.waiter.owner_before(g->owner) && !g->remote) {
      waits_for_it = true;
      break;
    }
  }
  if (!waits_for_it)
    return false;
  auto other = w.waiter.lock();
  if (!other)
    return false;
  auto& o = other->runner_.handover_;
  if (!o.enabled_)
    return false;
  // Asleep, parked at exactly this gate, the token left there: only a ring
  // or a helper gets its items run. Awake (spinning, or rung already), it
  // takes them up itself.
  if (other->queue_.sleeping(std::memory_order_seq_cst) != device_core::work_queue_t::on_gate ||
      o.token_.state(std::memory_order_relaxed) != exec_token::lendable ||
      other->gates_.parked_on(std::memory_order_acquire) != w.g.get())
    return false;
  auto stamp = wake_backstop::next_stamp();
  o.token_.defer(stamp);
  int expected = gate::pending;
  if (!w.g->state.compare_exchange_strong(expected, gate::open)) {
    // Resolved meanwhile (a cancel): whoever did rang it.
    o.ring_if_deferred(stamp);
    return true;
  }
  o.token_.count_deferred_wake();
  if (!wake_backstop::instance().deferred(other.get(), stamp))
    o.ring_if_deferred(stamp); // no backstop: rung now, as without deferral
  return true;
}

bool hand_over::ring_if_deferred(uint64_t stamp) noexcept {
  if (!token_.clear_deferral(stamp))
    return false;
  core_.queue_.ring();
  return true;
}

bool hand_over::try_help(const gate& g) {
  // Only this device's own runner, running its own items (as try_claim).
  if (!enabled_ || current_runner != &core_ || serving_other || g.remote)
    return false;
  auto other = g.owner.lock();
  if (!other || other.get() == &core_ || !other->runner_.handover_.enabled_)
    return false;
  auto& o = other->runner_.handover_;
  // Lendable means parked at a wait: its runner left the token there. Not
  // while that runner spins there (see try_borrow_unless_spinning). Asleep,
  // rung or not, it may be a context switch away (a hint: a runner that
  // starts spinning now finds the token lent and sleeps, as for any lent
  // token).
  if (!o.token_.try_borrow_unless_spinning())
    return false;
  if (other->runner_.pending_gate_at_pos() || other->runner_.executed_ >= g.owner_seq) {
    o.relend(); // still held there, or past what g waits for: left as it was
    return false;
  }
  // Its wait has ended, and its runner (rung, or its wake-up deferred) has
  // not taken the token back yet: the items it would run are those this
  // runner waits for.
  o.token_.take_up_deferral();
  mark_parked(&g);
  auto& r = runner();
  o.serve(r, g, r.executed_ + 1);
  return true;
}

void hand_over::relend() noexcept {
  auto& r = runner();
  // The gate is kept alive across the release: once the token is lendable,
  // its runner may take it, run past the gate and free it.
  auto keep = r.batch_.next().extra.order_or_wait()->g;
  lend_at(*keep, r.executed_ + 1);
}

void hand_over::serve(const device_runner& lender, const gate& until, uint64_t until_seq) {
  auto& r = runner();
  current_runner = &core_;
  serving_other = true;
  bool first = false;
  uint64_t ran = 0;
  // Up to the item the lender waits for, never past it: its gate may open
  // later than that item (a wait whose registration the host has not yet
  // finished opens on the host), and an item past it is one the lender
  // does not wait for, which could even wait for the lender's later work.
  while (r.executed_ < until.owner_seq) {
    if (!r.batch_.has_next()) {
      r.batch_.clear();
      if (!r.take_batch(r.batch_.items()))
        break;
      first = true;
    }
    if (r.pending_gate_at_pos())
      break;
    r.batch_.prefetch_ahead();
    r.run_item(first);
    first = false;
    ++ran;
    if (lender.gate_ended(until, until_seq))
      break;
  }
  token_.count_run_by_others(ran);
  serving_other = false;
  current_runner = &lender.core_;
  hand_back();
}

void hand_over::hand_back() noexcept {
  auto& r = runner();
  if (!r.batch_.has_next() && core_.queue_.has_untaken()) {
    // Where the device stands is in the items queued since: most often the
    // next wait of a chain, where it parks lendable again.
    r.batch_.clear();
    r.take_batch(r.batch_.items());
  }
  if (auto* g = r.pending_gate_at_pos()) {
    // Kept alive across the release, as in relend.
    auto keep = r.batch_.next().extra.order_or_wait()->g;
    mark_parked(g);
    release_parked(*g);
    return;
  }
  if (!r.batch_.has_next()) {
    r.batch_.clear(); // what the items held goes now, not when the runner wakes
    // Nothing to run: a producer rings the runner as for any idle device.
    if (core_.queue_.settle_idle_runner([&] { token_.give_back(); }))
      return;
  } else {
    token_.give_back();
  }
  core_.queue_.ring();
}

// -- The core's resolving side (item_resolver.hpp) ---------------------------------

item_resolver::failure_ptr item_resolver::task_failure(const item& it, uint64_t seq,
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
    failure{failure::kind::failed, core_.name_, core_.runner_.task_name(it, seq), seq, std::move(what), {}});
}

item_resolver::failure_ptr item_resolver::gate_failure(const gate& g) const {
  auto f = std::make_shared<failure>();
  if (g.cause)
    *f = *g.cause;
  else
    f->message = "failed (its cause could not be recorded)";
  f->path.insert(f->path.begin(), failure_hop{core_.name_, g.owner_label(), g.owner_seq});
  return f;
}

std::string item_resolver::description_of(const item& it) const {
  if (it.extra.is_text())
    return std::string{core_.runner_.text_of(it)};
  if (auto* n = it.extra.named())
    return std::string{n->description()};
  auto* x = it.extra.order_or_wait();
  if (!x || x->g)
    return {};
  const auto& o = x->op;
  switch (o.naming) {
  case work_order::pool_span:
    return fmt::format("{} pool {} [{}, {})", o.what, o.id, o.offset, o.offset + o.bytes);
  case work_order::pool:
    return fmt::format("{} {}", o.what, o.id);
  case work_order::node:
    break;
  }
  return x->node_label.empty() ? fmt::format("{} #{}", o.what, o.id)
                               : fmt::format("{} '{}' (#{})", o.what, x->node_label, o.id);
}

std::string device_runner::task_name(const item& it, uint64_t seq) const {
  if (auto* g = it.as_gate())
    return "wait for " + g->what();
  auto d = core_.resolving().description_of(it);
  return d.empty() ? nameless_task_name(seq) : d;
}

void item_resolver::drop(item& it, uint64_t seq) noexcept {
  if (it.as_gate())
    core_.gates_.count_passed();
  if (core_.trace_) [[unlikely]]
    core_.runner_.trace_dropped(it, seq);
  it.work = nullptr;
  core_.extras_.release_hold(it);
  core_.outcomes_.record_dropped(seq); // with the cause of the drop that covers it
  complete(seq);
}

void item_resolver::resolve_bad(uint64_t seq, failure_ptr cause) noexcept {
  core_.outcomes_.record_bad(seq, std::move(cause));
  complete(seq);
}

void item_resolver::complete(uint64_t seq) {
  if (core_.trace_) [[unlikely]]
    core_.runner_.trace_done(seq, false); // before the event is done, so whoever syncs sees it
  // Store-then-load against a registration's store-then-load of the
  // waiters' minimum and the progress (Dekker, `outcome_board::publish`):
  // both sides need StoreLoad order, or a waiter that registers at this very
  // moment and this check could both miss each other, and the event would
  // stay unresolved -- forever if the next task waits for whoever is waiting
  // on this event.
  if (core_.outcomes_.publish(seq))
    core_.events_.fire(seq, nullptr);
}

void device_core::resolve_flight(stream_window::flight& f, stream_window::verdict v) noexcept {
  resolving().resolve_flight(f, v);
}

void item_resolver::resolve_flight(stream_window::flight& f, stream_window::verdict v) noexcept {
  auto seq = f.seq;
  // The record goes out as the item resolves (complete, poison, drop); a
  // settled item the stream did not report (a gate) ends now.
  if (core_.trace_) [[unlikely]]
    core_.trace_->begin(&f.it, f.start_ns, f.end_ns);
  auto* g = f.it.as_gate();
  switch (v) {
  case stream_window::verdict::dropped:
    drop(f.it, seq); // counts a gate off
    return;
  case stream_window::verdict::failed:
    if (g) {
      core_.gates_.count_passed();
      poison(seq, [&] { return gate_failure(*g); });
    } else {
      poison(seq, [&] { return task_failure(f.it, seq, f.error); });
    }
    return;
  case stream_window::verdict::done:
    if (g) {
      core_.gates_.count_passed();
    } else {
      if (core_.trace_) [[unlikely]]
        core_.runner_.trace_done(seq, false); // while its description is still there
      f.it = item{}; // what the task held goes before its event is done
    }
    complete(seq);
    return;
  }
}

template <class MakeCause>
void item_resolver::poison(uint64_t seq, MakeCause make) noexcept {
  // Runs on the runner, outside any handler: nothing here may throw. A cause
  // that cannot be made (out of memory) becomes a preallocated one.
  if (core_.trace_) [[unlikely]]
    core_.runner_.trace_done(seq, true);
  failure_ptr cause;
  try {
    cause = make();
  } catch (...) {
    cause = core_.outcomes_.fallback_cause();
  }
  {
    std::lock_guard guard{core_.queue_.mutex()};
    core_.life_.fail_locked(cause); // wakes the producers waiting for room
    // What is queued behind the failure fails with it, in order (with a
    // generic cause, should there be no memory to record this one).
    core_.life_.drop_locked(cause);
  }
  resolve_bad(seq, std::move(cause));
  core_.queue_.call_room_callback();
}

} // namespace multidev::detail
