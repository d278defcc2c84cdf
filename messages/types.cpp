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

device_error::device_error(std::string device_name, std::string message)
  : std::runtime_error(fmt::format("{}: {}", device_name, message)),
    device_(std::move(device_name)),
    message_(std::move(message)) {
}

} // namespace multidev
