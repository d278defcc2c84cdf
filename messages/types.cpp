#include "multidev/types.hpp"

#include <array>

#include <fmt/format.h>

namespace multidev {

namespace {
constexpr std::array<const char*, 7> memory_mode_names = {
  "effectively_constant", "virtual", "never_virtual", "local",
  "device_only", "on_device", "materialized"};
} // namespace

std::string to_string(memory_mode m) {
  return memory_mode_names[static_cast<size_t>(m)];
}

std::optional<memory_mode> memory_mode_from_string(const std::string& s) {
  for (size_t i = 0; i < memory_mode_names.size(); ++i)
    if (s == memory_mode_names[i])
      return static_cast<memory_mode>(i);
  return std::nullopt;
}

sexp to_sexp(memory_mode m) {
  return sexp::atom(to_string(m));
}

sexp to_sexp(const tnode& t) {
  return sexp::list({sexp::atom("tnode"),
                     sexp::field("id", std::to_string(t.id)),
                     sexp::field("label", t.label),
                     sexp::field("size", std::to_string(t.size_in_bytes)),
                     sexp::field("mode", to_sexp(t.mode))});
}

sexp to_sexp(const buffer_loc& b) {
  return sexp::list({sexp::atom("buffer_loc"),
                     sexp::field("pool_id", std::to_string(b.pool_id)),
                     sexp::field("offset", std::to_string(b.offset))});
}

sexp to_sexp(const ctx_buffers& b) {
  auto result = sexp::list({sexp::atom("ctx_buffers")});
  for (const auto& [node, loc] : b)
    result.push_back(sexp::list({to_sexp(node), to_sexp(loc)}));
  return result;
}

sexp to_sexp(const optimize_ctx& o) {
  return sexp::field("optimize_ctx", o.computations);
}

sexp to_sexp(const hardware_limits& h) {
  auto opt = [](const char* key, const std::optional<int>& v) {
    return sexp::field(key, v ? std::to_string(*v) : std::string{"none"});
  };
  return sexp::list({sexp::atom("hardware_limits"),
                     opt("max_threads_per_block", h.max_threads_per_block),
                     opt("max_block_dim_x", h.max_block_dim_x),
                     opt("max_grid_dim_x", h.max_grid_dim_x),
                     opt("shared_memory_per_block", h.shared_memory_per_block)});
}

namespace {
std::string origin_text(const failure& f) {
  if (f.task.empty())
    return f.message;
  // Described tasks are quoted; nameless ones read task#<seq>.
  auto task = f.task.starts_with("task#") ? f.task : "'" + f.task + "'";
  if (f.origin_kind == failure::kind::cancelled)
    return f.message.empty() ? fmt::format("task {} was cancelled", task)
                             : fmt::format("task {} was cancelled: {}", task, f.message);
  return fmt::format("task {} failed: {}", task, f.message);
}
} // namespace

std::string failure::describe_reason() const {
  if (path.empty())
    return origin_text(*this);
  std::string out = fmt::format("waited for {} seq {}", path[0].device, path[0].seq);
  for (std::size_t i = 1; i < path.size(); ++i)
    out += fmt::format(", which waited for {} seq {}", path[i].device, path[i].seq);
  if (origin_kind == kind::cancelled && task.empty() && message.empty())
    return out + ", which was cancelled";
  return out + ": " + origin_text(*this);
}

std::string failure::describe() const {
  auto reason = describe_reason();
  const auto& who = about();
  if (who.empty())
    return reason;
  return fmt::format("{}{}{}", who, path.empty() ? ": " : " ", reason);
}

std::string to_string(event_state s) {
  switch (s) {
    case event_state::pending:
      return "pending";
    case event_state::done:
      return "done";
    case event_state::failed:
      return "failed";
    case event_state::cancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace {
std::shared_ptr<const failure> plain_failure(std::string device, std::string message) {
  auto f = std::make_shared<failure>();
  f->device = std::move(device);
  f->message = std::move(message);
  return f;
}
} // namespace

device_error::device_error(std::string device_name, std::string message)
  : device_error(plain_failure(std::move(device_name), std::move(message))) {
}

device_error::device_error(std::shared_ptr<const failure> cause)
  : std::runtime_error(cause->describe()), cause_(std::move(cause)),
    message_(cause_->describe_reason()) {
}

void throw_failure(std::shared_ptr<const failure> f) {
  if (f->is_cancellation())
    throw cancelled_error(std::move(f));
  throw device_error(std::move(f));
}

} // namespace multidev
