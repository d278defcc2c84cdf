// The public handles (`node_ref`, `runner`, `event`, `device`): thin views of
// an endpoint (a device core, or a device actor of another process) and a
// device record.
#include "multidev/backend.hpp"

#include <fmt/format.h>

#include <mutex>
#include <ostream>
#include <stdexcept>
#include <unordered_set>

#include "actors/backend_impl.hpp"
#include "actors/endpoint.hpp"

namespace multidev {

using detail::record_of;

// -- node_ref ------------------------------------------------------------------

namespace {

struct node_table {
  std::mutex mu;
  std::unordered_set<std::string> names; // nodes are stable: pointers stay valid

  static node_table& get() {
    static auto* t = new node_table; // never destroyed: names outlive main
    return *t;
  }
};

const std::string& no_text() {
  static const std::string empty;
  return empty;
}

const std::shared_ptr<detail::device_core>& no_core() {
  static const std::shared_ptr<detail::device_core> none;
  return none;
}

} // namespace

node_ref::node_ref(std::string_view text) {
  if (text.empty())
    return;
  auto& t = node_table::get();
  std::lock_guard guard{t.mu};
  text_ = &*t.names.emplace(text).first;
}

const std::string& node_ref::str() const noexcept {
  return text_ ? *text_ : no_text();
}

std::strong_ordering operator<=>(node_ref x, node_ref y) noexcept {
  if (x.text_ == y.text_)
    return std::strong_ordering::equal;
  auto c = x.str().compare(y.str());
  return c < 0 ? std::strong_ordering::less : std::strong_ordering::greater;
}

// -- runner ---------------------------------------------------------------------

runner::runner(std::shared_ptr<detail::endpoint> ep)
  : ep_(std::move(ep)), core_(ep_ ? ep_->core().get() : nullptr) {
}

std::size_t runner::queue_length() const {
  if (core_)
    return core_->queue().scheduled() - core_->outcomes().finished();
  return ep_ ? ep_->queue_length() : 0;
}

const device_key& runner::key() const noexcept {
  static const device_key none;
  return ep_ ? ep_->key() : none;
}

const std::shared_ptr<detail::device_core>& runner::core() const noexcept {
  return ep_ ? ep_->core() : no_core();
}

// -- event ----------------------------------------------------------------------

event::event(std::shared_ptr<detail::endpoint> ep, uint64_t seq)
  : key_(ep ? ep->key() : device_key{}), seq_(seq), ep_(std::move(ep)) {
}

event::event(const runner& r, uint64_t seq) : event(r.endpoint(), seq) {
}

event::event(const device_key& key, uint64_t seq)
  : key_(key), seq_(seq), ep_(key == device_key{} ? nullptr : detail::find_endpoint(key)) {
}

std::shared_ptr<detail::endpoint> event::endpoint() const {
  if (ep_ || key_ == device_key{})
    return ep_;
  return detail::find_endpoint(key_); // attached since this event was made?
}

namespace {

/// `e`'s endpoint; null for the default event; throws for an event whose
/// device this process does not know.
std::shared_ptr<detail::endpoint> reach(const event& e, const char* what) {
  auto ep = e.endpoint();
  if (!ep && !(e.key() == device_key{}))
    throw std::invalid_argument(fmt::format(
      "{}: event seq {} of device {} on node {}: no device of this process has that key "
      "(attach its device first)",
      what, e.seq(), e.key().device_id, e.key().node.str()));
  return ep;
}

} // namespace

bool event::is_done() const {
  if (ep_) {
    if (auto* c = ep_->core().get())
      return c->outcomes().is_done(seq_);
    return ep_->is_done(seq_);
  }
  auto ep = reach(*this, "is_done");
  return !ep || ep->is_done(seq_);
}

bool event::is_failed() const {
  auto ep = ep_ ? ep_ : reach(*this, "is_failed");
  return ep && ep->is_failed(seq_);
}

void event::sync(std::chrono::steady_clock::time_point deadline) const {
  auto ep = ep_ ? ep_ : reach(*this, "sync");
  if (ep)
    ep->sync_until(seq_, deadline);
}

void event::sync() const {
  if (ep_) {
    if (auto* c = ep_->core().get())
      c->events().sync(seq_);
    else
      ep_->sync(seq_);
    return;
  }
  if (auto ep = reach(*this, "sync"))
    ep->sync(seq_);
}

std::string event::device_name() const {
  if (auto ep = endpoint())
    return ep->name();
  if (key_ == device_key{})
    return {};
  return fmt::format("device {} of node {}", key_.device_id, key_.node.str());
}

bool event::is_local() const noexcept {
  return ep_ && ep_->core();
}

const std::shared_ptr<detail::device_core>& event::core() const noexcept {
  return ep_ ? ep_->core() : no_core();
}

// -- device ---------------------------------------------------------------------

device::device(std::shared_ptr<detail::device_record> rec) : rec_(std::move(rec)) {
}

const dev& device::dev() const { return record_of(*this).dv; }
int device::ordinal() const { return record_of(*this).ordinal; }
int device::device_id() const { return record_of(*this).device_id; }
const device_key& device::key() const { return record_of(*this).r.key(); }
bool device::is_local() const { return record_of(*this).r.is_local(); }
const runner& device::get_runner() const { return record_of(*this).r; }
const std::string& device::name() const { return record_of(*this).name; }

std::optional<buffer_ptr> device::merge_buffer() const {
  auto* c = record_of(*this).r.local_core();
  auto p = c ? c->pools().find(0) : nullptr;
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
