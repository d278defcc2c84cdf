#include "actors/binding.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace multidev::detail {

namespace {

class bound_call final : public kernel_call {
public:
  bound_call(std::shared_ptr<device_core> core, task_spec spec,
             std::vector<std::span<std::byte>> spans, std::shared_ptr<pool> merge)
    : core_(std::move(core)),
      spec_(std::move(spec)),
      spans_(std::move(spans)),
      merge_(std::move(merge)) {}

  int64_t integer(int i) const override { return std::get<int64_t>(arg(i)); }

  double real(int i) const override {
    const auto& a = arg(i);
    if (auto* p = std::get_if<int64_t>(&a))
      return static_cast<double>(*p);
    return std::get<double>(a);
  }

  const std::string& string(int i) const override {
    return std::get<std::string>(arg(i));
  }

  std::span<std::byte> buffer(int i) const override {
    return spans_.at(static_cast<std::size_t>(i));
  }

  std::span<std::byte> merge_buffer() const override {
    if (!merge_)
      throw std::invalid_argument(fmt::format(
        "kernel '{}' reads the merge buffer, but {} has none", spec_.kernel,
        core_->name()));
    return merge_->bytes();
  }

  void publish(const std::string& name, double sum, uint64_t hash,
               std::size_t count) const override {
    core_->results().publish(name, kernel_result{sum, hash, count});
  }

  const std::string& device_name() const override { return core_->name(); }

private:
  const kernel_arg& arg(int i) const { return spec_.args.at(static_cast<std::size_t>(i)); }

  std::shared_ptr<device_core> core_;
  task_spec spec_;
  std::vector<std::span<std::byte>> spans_;
  std::shared_ptr<pool> merge_; // pool 0 as bound, for merge-buffer kernels
};

} // namespace

bound_task bind_spec(const std::shared_ptr<device_core>& core, const task_spec& spec) {
  auto def = check_task_spec(spec);
  // Pool 0 as of now: a merge-buffer kernel reads this one even if pool 0 is
  // freed or replaced before it runs (pool changes are ordered like
  // cudaFreeAsync).
  auto merge = def->merge_buffer_param >= 0 ? core->try_pool(0) : nullptr;
  bound_task result;
  std::vector<std::span<std::byte>> spans(spec.args.size());
  for (std::size_t i = 0; i < spec.args.size(); ++i) {
    auto* b = std::get_if<buffer_arg>(&spec.args[i]);
    if (!b)
      continue;
    if (static_cast<int>(i) == def->merge_buffer_param) {
      // The node's bytes at the start of the merge buffer.
      spans[i] = {merge ? merge->base() : nullptr, b->size_in_bytes};
      continue;
    }
    auto p = core->try_pool(b->loc.pool_id);
    if (!p)
      throw std::invalid_argument(fmt::format(
        "kernel '{}' argument {}: pool {} is not allocated on {} (never "
        "allocated, or freed)",
        spec.kernel, i, b->loc.pool_id, core->name()));
    if (b->loc.offset > p->size || b->size_in_bytes > p->size - b->loc.offset)
      throw std::invalid_argument(fmt::format(
        "kernel '{}' argument {}: bytes [{}, {}) are outside pool {} of {} ({} "
        "bytes)",
        spec.kernel, i, b->loc.offset, b->loc.offset + b->size_in_bytes,
        b->loc.pool_id, core->name(), p->size));
    spans[i] = {p->base() + b->loc.offset, b->size_in_bytes};
    result.pools.emplace_back(b->loc.pool_id, p);
  }
  if (merge)
    result.pools.emplace_back(0, merge);
  auto call = std::make_shared<bound_call>(core, spec, std::move(spans), merge);
  std::vector<std::shared_ptr<pool>> held;
  for (auto& [id, p] : result.pools)
    held.push_back(p);
  auto keep = std::make_shared<std::vector<std::shared_ptr<pool>>>(std::move(held));
  result.work = task{to_sexp(spec).to_string(),
                     [def, call] { def->body(*call); },
                     std::move(keep)};
  return result;
}

} // namespace multidev::detail
