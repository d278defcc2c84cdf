// What a peer's message may carry (message_checks.hpp).
#include "actors/remote/message_checks.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <variant>

#include "multidev/types.hpp"

namespace multidev::detail {

namespace {

/// Refuses `text`, field `field` of message `kind`, when longer than `limit`.
void check_length(const char* kind, const char* field, const std::string& text,
                  std::size_t limit) {
  if (text.size() > limit)
    throw std::invalid_argument(fmt::format("{}: {} of {} bytes exceeds the limit of {} bytes",
                                            kind, field, text.size(), limit));
}

} // namespace

void check_schedule(const task_spec& spec) {
  check_length("schedule", "kernel name", spec.kernel, wire_limits::name_bytes);
  if (spec.args.size() > wire_limits::kernel_args)
    throw std::invalid_argument(
      fmt::format("schedule: kernel '{}': argument count {} exceeds the limit of {}", spec.kernel,
                  spec.args.size(), wire_limits::kernel_args));
  for (std::size_t i = 0; i < spec.args.size(); ++i)
    if (const auto* text = std::get_if<std::string>(&spec.args[i]); text != nullptr
        && text->size() > wire_limits::text_bytes)
      throw std::invalid_argument(fmt::format(
        "schedule: kernel '{}' argument {}: text of {} bytes exceeds the limit of {} bytes",
        spec.kernel, i, text->size(), wire_limits::text_bytes));
}

void check_schedule(const std::vector<task_spec>& specs) {
  if (specs.size() > wire_limits::batch_tasks)
    throw std::invalid_argument(
      fmt::format("schedule: batch of {} tasks exceeds the limit of {} tasks", specs.size(),
                  wire_limits::batch_tasks));
  for (const auto& spec : specs)
    check_schedule(spec);
}

void check_depend(const std::string& owner_name, const std::string& host) {
  check_length("depend", "owner name", owner_name, wire_limits::name_bytes);
  check_length("depend", "host", host, wire_limits::host_bytes);
}

void check_lost(const std::string& why) {
  check_length("lost", "reason", why, wire_limits::text_bytes);
}

void check_copy_from(const std::string& source_name, const std::string& host) {
  check_length("copy_from", "source name", source_name, wire_limits::name_bytes);
  check_length("copy_from", "host", host, wire_limits::host_bytes);
}

void check_alloc(int32_t id, uint64_t alignment, int32_t mode) {
  constexpr auto last = static_cast<int32_t>(memory_mode::materialized);
  if (mode < -1 || mode > last)
    throw std::invalid_argument(fmt::format(
      "alloc: pool {}: mode {} is not a memory mode (-1 for none, 0 to {})", id, mode, last));
  if (alignment > wire_limits::alignment)
    throw std::invalid_argument(
      fmt::format("alloc: pool {}: alignment {} exceeds the limit of {}", id, alignment,
                  wire_limits::alignment));
}

void check_result(const std::string& name) {
  check_length("result", "name", name, wire_limits::name_bytes);
}

void check_open(const std::string& client) {
  check_length("open", "client name", client, wire_limits::name_bytes);
}

void check_trust(const caf::node_id& peer) {
  if (!peer)
    throw std::invalid_argument("trust: node is the invalid node id");
}

std::shared_ptr<void> wait_budget::take(const std::string& who, uint64_t seq) const {
  auto held = held_->load(std::memory_order_relaxed);
  do {
    if (held >= wire_limits::session_waits)
      throw std::invalid_argument(fmt::format(
        "wait: {} holds {} waits for their requesters already (at most {} at once): the wait "
        "for seq {} is refused",
        who, held, wire_limits::session_waits, seq));
  } while (!held_->compare_exchange_weak(held, held + 1, std::memory_order_relaxed));
  return std::shared_ptr<void>{nullptr, [counter = held_](void*) {
                                 counter->fetch_sub(1, std::memory_order_relaxed);
                               }};
}

} // namespace multidev::detail
