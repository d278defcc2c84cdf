// The public handles (`runner`, `event`, `device`): thin views of a device
// core and a device record.
#include "multidev/backend.hpp"

#include <mutex>
#include <stdexcept>

#include "actors/backend_impl.hpp"

namespace multidev {

using detail::record_of;

runner::runner(std::shared_ptr<detail::device_core> core) : core_(std::move(core)) {
}

std::size_t runner::queue_length() const {
  return core_ ? core_->scheduled() - core_->finished() : 0;
}

event::event(std::shared_ptr<detail::device_core> core, uint64_t seq)
  : core_(std::move(core)), seq_(seq) {
}

bool event::is_done() const {
  return !core_ || core_->is_done(seq_);
}

bool event::is_failed() const {
  return core_ && core_->is_failed(seq_);
}

void event::sync() const {
  if (core_)
    core_->sync(seq_);
}

std::string event::device_name() const {
  return core_ ? core_->name() : std::string{};
}

device::device(std::shared_ptr<detail::device_record> rec) : rec_(std::move(rec)) {
}

const dev& device::dev() const { return record_of(*this).dv; }
int device::ordinal() const { return record_of(*this).ordinal; }
int device::device_id() const { return record_of(*this).device_id; }
const runner& device::get_runner() const { return record_of(*this).r; }
const std::string& device::name() const { return record_of(*this).name; }

std::optional<buffer_ptr> device::merge_buffer() const {
  auto p = record_of(*this).core().try_pool(0);
  if (!p)
    return std::nullopt;
  return p->base();
}

std::size_t device::merge_buffer_capacity() const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  return rec.merge_buffer_capacity;
}

std::optional<event> device::updating_for(const tnode& t) const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  if (auto i = rec.updating_for.find(t); i != rec.updating_for.end())
    return i->second;
  return std::nullopt;
}

std::optional<std::pair<tnode, event>> device::updating_for_merge_buffer() const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  return rec.updating_for_merge_buffer;
}

std::optional<buffer_loc> device::constant_buffer(const tnode& t) const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  if (auto i = rec.constant_buffer_cache.find(t); i != rec.constant_buffer_cache.end())
    return i->second;
  return std::nullopt;
}

int device::next_pool_id() const {
  auto& rec = record_of(*this);
  std::lock_guard guard{rec.mu};
  return rec.next_pool_id;
}

} // namespace multidev
