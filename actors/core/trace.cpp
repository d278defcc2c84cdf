// The ring behind the runner trace.
#include "actors/core/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace multidev::detail {

std::string nameless_task_name(uint64_t seq) {
  return fmt::format("task#{}", seq);
}

namespace {

/// One reading of both clocks, steady_clock's taken as the midpoint of two
/// reads around the counter; the tightest of a few tries.
struct clock_pair {
  int64_t ns;
  uint64_t tsc;
};

#if defined(__x86_64__)
clock_pair read_pair() {
  clock_pair best{};
  int64_t best_width = INT64_MAX;
  for (int i = 0; i < 32; ++i) {
    auto a = std::chrono::steady_clock::now();
    _mm_lfence();
    auto tsc = __rdtsc();
    _mm_lfence();
    auto b = std::chrono::steady_clock::now();
    auto width = std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
    if (width < best_width) {
      best_width = width;
      auto mid = a.time_since_epoch() + (b - a) / 2;
      best = {std::chrono::duration_cast<std::chrono::nanoseconds>(mid).count(), tsc};
    }
  }
  return best;
}

bool invariant_tsc() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8)) != 0;
}
#endif

} // namespace

const trace_clock& trace_clock::get() {
  static const trace_clock clock;
  return clock;
}

int64_t trace_clock::steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

trace_clock::trace_clock() {
#if defined(__x86_64__)
  if (!invariant_tsc())
    return;
  auto p0 = read_pair();
  std::this_thread::sleep_for(std::chrono::milliseconds(4));
  auto p1 = read_pair();
  if (p1.tsc <= p0.tsc || p1.ns <= p0.ns)
    return; // a counter that does not advance: keep steady_clock
  double ns_per_tick = static_cast<double>(p1.ns - p0.ns) / static_cast<double>(p1.tsc - p0.tsc);
  mult_ = std::llround(ns_per_tick * 4294967296.0);
  base_tsc_ = p1.tsc;
  base_ns_ = p1.ns;
  tsc_ = mult_ > 0;
#endif
}

trace_ring::trace_ring(std::size_t capacity)
  : clock_(trace_clock::get()), capacity_(std::max<std::size_t>(capacity, 1)),
    slots_(std::make_unique<slot[]>(capacity_)), host_(capacity_) {}

device_trace trace_ring::snapshot(std::string device) const {
  auto t = read();
  t.device = std::move(device);
  t.host = host_.read();
  return t;
}

sexp trace_ring::info(std::size_t last) const {
  auto t = read(last);
  auto records = sexp::list({sexp::atom("last")});
  for (const auto& r : t.records)
    records.push_back(to_sexp(r));
  return sexp::list({sexp::atom("trace"), sexp::field("capacity", std::to_string(t.capacity)),
                     sexp::field("recorded", std::to_string(written())),
                     sexp::field("dropped", std::to_string(t.dropped)), records});
}

void trace_ring::note_running(uint64_t seq, std::string_view text) noexcept {
  std::lock_guard guard{mu_};
  try {
    running_text_.assign(text);
    running_seq_ = seq;
  } catch (...) {
    running_seq_ = 0; // out of memory: no text for it
  }
}

std::string trace_ring::running_text(uint64_t seq) const {
  std::lock_guard guard{mu_};
  return seq != 0 && running_seq_ == seq ? running_text_ : std::string{};
}

void trace_ring::write(const entry& e, std::string_view description,
                       std::string_view awaited_device) noexcept {
  if (description.empty() && awaited_device.empty()) {
    write(e);
    return;
  }
  std::lock_guard guard{mu_};
  auto& s = slots_[next_];
  open_slot(s, e);
  auto bits = bits_of(e);
  try {
    s.description.assign(description);
    s.awaited_device.assign(awaited_device);
    bits |= text_bit;
  } catch (...) {
    // Out of memory: the record goes without its texts.
  }
  s.bits.store(bits, std::memory_order_relaxed);
  close_slot(s, e);
}

device_trace trace_ring::read(std::size_t last) const {
  device_trace out;
  out.capacity = capacity_;
  auto end = written();
  auto held = std::min<uint64_t>({end, capacity_, last});
  out.records.reserve(held);
  // Newest first: the runner overwrites the oldest slots, so the first slot
  // found overwritten ends the run of records this copy can still return.
  for (uint64_t k = 0; k < held; ++k) {
    auto index = end - 1 - k;
    const auto& s = slots_[index % capacity_];
    trace_record r;
    bool whole;
    {
      std::lock_guard guard{mu_}; // holds the strings still, not the fixed fields
      if (s.index.load(std::memory_order_acquire) != index)
        break; // being overwritten, or overwritten
      r.seq = s.seq.load(std::memory_order_relaxed);
      r.start_ns = s.start_ns.load(std::memory_order_relaxed);
      r.end_ns = s.end_ns.load(std::memory_order_relaxed);
      r.awaited_seq = s.awaited_seq.load(std::memory_order_relaxed);
      auto bits = s.bits.load(std::memory_order_relaxed);
      r.kind = static_cast<trace_kind>(bits & 0xff);
      r.failed = (bits & failed_bit) != 0;
      if (bits & text_bit) {
        r.description = s.description;
        r.awaited_device = s.awaited_device;
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      whole = s.index.load(std::memory_order_relaxed) == index;
    }
    if (!whole)
      break;
    if (r.description.empty())
      r.description = nameless_task_name(r.seq);
    out.records.push_back(std::move(r));
  }
  std::reverse(out.records.begin(), out.records.end());
  // Cut short by the runner: nothing older is left. Otherwise the ring still
  // holds what `last` left out, and dropped only what it overwrote.
  out.dropped = out.records.size() < held ? end - out.records.size()
                                          : end - std::min<uint64_t>(end, capacity_);
  return out;
}

void host_span_log::add(host_span s) noexcept {
  try {
    std::lock_guard guard{mu_};
    if (spans_.size() == capacity_)
      spans_.pop_front();
    spans_.push_back(std::move(s));
  } catch (...) {
    // Out of memory: the span is left out.
  }
}

std::vector<host_span> host_span_log::read() const {
  std::lock_guard guard{mu_};
  return {spans_.begin(), spans_.end()};
}

uint64_t host_thread_number() noexcept {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine;
}

host_wait_scope::~host_wait_scope() {
  if (!log_)
    return;
  host_span s;
  s.kind = host_span_kind::wait;
  s.thread = host_thread_number();
  s.seq = seq_;
  s.start_ns = start_ns_;
  s.end_ns = trace_clock::get().now();
  s.failed = std::uncaught_exceptions() > exceptions_;
  try {
    s.description = fmt::format("{} {} seq {}", what_, device_, seq_);
  } catch (...) {
    // Out of memory: the span goes without its text.
  }
  log_->add(std::move(s));
}

} // namespace multidev::detail

namespace multidev {

int64_t trace_clock_ns() noexcept {
  return detail::trace_clock::get().now();
}

} // namespace multidev
