#include "multidev/protocol.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/message.hpp>

#include <chrono>

#include <memory>
#include <optional>
#include <utility>

#include "messages/tsan.hpp"

namespace multidev {

namespace {

/// A multidev error's context is immutable once made (copies of the error
/// share it), and reaches the threads that read it (`parts_of`,
/// `failure_of`) in CAF messages, through atomics ThreadSanitizer does not
/// see (actors/tsan.hpp): its address is the hand-off's key.
const void* context_key(const caf::message& ctx) noexcept {
  return ctx.cvals().get();
}

caf::error with_context(errc code, caf::message ctx) {
  detail::tsan_release(context_key(ctx));
  return caf::error{static_cast<uint8_t>(code), error_category, std::move(ctx)};
}

} // namespace

caf::error make_error(errc code, std::string device, std::string message) {
  return with_context(code, caf::make_message(std::move(device), std::move(message)));
}

caf::error make_error(const failure& f) {
  auto code = f.is_cancellation() ? errc::cancelled : errc::device_failed;
  return with_context(code, caf::make_message(f.about(), f.describe_reason(), f));
}

namespace {

/// The (device, message) a multidev error carries, if it is one.
std::optional<std::pair<std::string, std::string>> parts_of(const caf::error& err) {
  const auto& ctx = err.context();
  detail::tsan_acquire(context_key(ctx));
  if (err.category() != error_category || ctx.size() < 2
      || !ctx.match_element<std::string>(0) || !ctx.match_element<std::string>(1))
    return std::nullopt;
  return std::pair{ctx.get_as<std::string>(0), ctx.get_as<std::string>(1)};
}

} // namespace

std::optional<failure> failure_of(const caf::error& err) {
  const auto& ctx = err.context();
  detail::tsan_acquire(context_key(ctx));
  if (err.category() != error_category || ctx.size() < 3 || !ctx.match_element<failure>(2))
    return std::nullopt;
  return ctx.get_as<failure>(2);
}

void throw_error(const caf::error& err, const std::string& device) {
  if (err.category() != error_category)
    throw device_error(device, caf::to_string(err));
  if (auto f = failure_of(err))
    throw_failure(std::make_shared<const failure>(std::move(*f)));
  auto parts = parts_of(err);
  auto dev = parts && !parts->first.empty() ? parts->first : device;
  auto msg = parts ? parts->second : std::string{"unknown error"};
  if (err.code() == static_cast<uint8_t>(errc::invalid_argument))
    throw std::invalid_argument(msg);
  if (err.code() == static_cast<uint8_t>(errc::cancelled))
    throw cancelled_error(dev, msg);
  throw device_error(dev, msg);
}

std::string describe_error(caf::actor_system& sys, const caf::error& err) {
  return parts_of(err) ? describe_error(err) : sys.render(err);
}

std::string describe_error(const caf::error& err) {
  if (auto parts = parts_of(err))
    return parts->first.empty() ? parts->second : parts->first + ": " + parts->second;
  return caf::to_string(err);
}

void register_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<task_spec>("multidev::task_spec");
  cfg.add_message_type<wire_arg>("multidev::wire_arg");
  cfg.add_message_type<buffer_arg>("multidev::buffer_arg");
  cfg.add_message_type<buffer_loc>("multidev::buffer_loc");
  cfg.add_message_type<kernel_result>("multidev::kernel_result");
  cfg.add_message_type<failure_hop>("multidev::failure_hop");
  cfg.add_message_type<failure>("multidev::failure");
  cfg.add_message_type<trace_record>("multidev::trace_record");
  cfg.add_message_type<device_trace>("multidev::device_trace");
  cfg.add_message_type<device_key>("multidev::device_key");
  cfg.add_message_type<event>("multidev::event");
  cfg.add_message_type<std::vector<caf::actor>>("std::vector<caf::actor>");
  cfg.add_message_type<std::vector<task_spec>>("std::vector<multidev::task_spec>");
  cfg.add_message_type<std::vector<uint64_t>>("std::vector<uint64_t>");
  cfg.add_message_type<round_step>("multidev::round_step");
  cfg.add_message_type<round_peer>("multidev::round_peer");
  cfg.add_message_type<round_notice>("multidev::round_notice");
  cfg.add_message_type<std::vector<round_notice>>("std::vector<multidev::round_notice>");
  cfg.add_message_type<round_part>("multidev::round_part");
  cfg.add_message_type<std::vector<wire_arg>>("std::vector<multidev::wire_arg>");
  cfg.add_message_type<std::vector<uint32_t>>("std::vector<uint32_t>");
  cfg.add_message_type<std::vector<round_step>>("std::vector<multidev::round_step>");
  cfg.add_message_type<std::vector<round_peer>>("std::vector<multidev::round_peer>");
}

void configure_system(caf::actor_system_config& cfg) {
  register_types(cfg);
  cfg.load<caf::io::middleman>();
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::seconds{1}});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds{5}});
  cfg.set("middleman.workers", size_t{0});
  cfg.set("scheduler.policy", caf::atom("sharing"));
}

wire_arg to_wire(const kernel_arg& x) {
  wire_arg w;
  w.kind = static_cast<uint8_t>(x.index());
  switch (x.index()) {
    case 1: w.integer = std::get<int64_t>(x); break;
    case 2: w.real = std::get<double>(x); break;
    case 3: w.text = std::get<std::string>(x); break;
    case 4: w.buffer = std::get<buffer_arg>(x); break;
    default: break;
  }
  return w;
}

kernel_arg from_wire(const wire_arg& w) {
  switch (w.kind) {
    case 1: return w.integer;
    case 2: return w.real;
    case 3: return w.text;
    case 4: return w.buffer;
    default: return std::monostate{};
  }
}

} // namespace multidev
