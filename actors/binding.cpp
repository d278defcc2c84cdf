#include "actors/binding.hpp"

#include "devices/builtins.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

namespace multidev::detail {

namespace {

class bound_call final : public kernel_call {
public:
  bound_call(std::shared_ptr<device_core> core, task_spec spec,
             std::vector<std::span<std::byte>> spans, std::shared_ptr<pool> merge)
    : core_(std::move(core)),
      spec_(std::move(spec)),
      args_(spec_, merge ? std::optional{merge->size} : std::nullopt),
      spans_(std::move(spans)),
      merge_(std::move(merge)) {}
  bound_call(const bound_call&) = delete; // args_ views spec_
  bound_call& operator=(const bound_call&) = delete;

  int64_t integer(int i) const override { return args_.integer(i); }

  double real(int i) const override { return args_.real(i); }

  const std::string& string(int i) const override { return args_.string(i); }

  std::span<std::byte> buffer(int i) const override {
    return spans_.at(static_cast<std::size_t>(i));
  }

  std::span<std::byte> merge_buffer() const override {
    if (!merge_)
      throw std::logic_error(fmt::format(
        "kernel '{}' reads the merge buffer but declares no merge_buffer_param",
        spec_.kernel));
    return merge_->bytes();
  }

  void publish(const std::string& name, double sum, uint64_t hash,
               std::size_t count) const override {
    core_->results().publish(name, kernel_result{sum, hash, count});
  }

  const std::string& device_name() const override { return core_->name(); }

  const std::string& kernel() const { return spec_.kernel; }

private:
  std::shared_ptr<device_core> core_;
  task_spec spec_;
  kernel_args args_; // views spec_
  std::vector<std::span<std::byte>> spans_;
  std::shared_ptr<pool> merge_; // pool 0 as bound, for merge-buffer kernels
};

} // namespace

bound_task bind_spec(const std::shared_ptr<device_core>& core, const task_spec& spec) {
  auto def = check_task_spec(spec);
  // Pool 0 as of now: a merge-buffer kernel reads this one even if pool 0 is
  // freed or replaced before it runs (pool changes are ordered like
  // cudaFreeAsync).
  auto merge = def->merge_buffer_param >= 0 || def->check ? core->pools().find(0) : nullptr;
  check_preconditions(*def, kernel_args{spec, merge ? std::optional{merge->size}
                                                    : std::nullopt});
  if (def->merge_buffer_param < 0)
    merge.reset();
  if (!core->drv().host_kernels() &&
      !(core->drv().has_kernel(spec.kernel) && is_builtin(spec.kernel, def.get())))
    throw std::invalid_argument(fmt::format(
      "kernel '{}' has no {} implementation (its memory is not the host's; built-in "
      "kernels only, see docs/kernels.md)",
      spec.kernel, core->drv().backend_name()));
  bound_task result;
  std::vector<std::span<std::byte>> spans(spec.args.size());
  for (std::size_t i = 0; i < spec.args.size(); ++i) {
    auto* b = std::get_if<buffer_arg>(&spec.args[i]);
    if (!b)
      continue;
    if (static_cast<int>(i) == def->merge_buffer_param) {
      // The node's bytes at the start of the merge buffer (checked above).
      spans[i] = {merge->base(), b->size_in_bytes};
      continue;
    }
    auto p = core->pools().span(b->loc.pool_id, b->loc.offset, b->size_in_bytes,
                             fmt::format("kernel '{}' argument {}", spec.kernel, i));
    // A device kernel reads whole elements: one at an address that is not
    // a multiple of the element size faults on a GPU (for CUDA the sticky
    // cudaErrorMisalignedAddress, which ends the process's CUDA context).
    auto at = reinterpret_cast<std::uintptr_t>(p->base() + b->loc.offset);
    if (!core->drv().host_kernels() && def->element_size > 1 && at % def->element_size != 0)
      throw std::invalid_argument(fmt::format(
        "kernel '{}' argument {}: the buffer at offset {} of pool {} on {} is not aligned "
        "to its {}-byte elements (the device would fault on it); use an offset that is a "
        "multiple of {}",
        spec.kernel, i, b->loc.offset, b->loc.pool_id, core->name(), def->element_size,
        def->element_size));
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
  auto& drv = core->drv();
  if (drv.host_kernels())
    result.work = task{to_sexp(spec).to_string(), [def, call] { def->body(*call); },
                       std::move(keep)};
  else
    result.work = task{to_sexp(spec).to_string(),
                       [d = &drv, call] { d->run_kernel(call->kernel(), *call); },
                       std::move(keep)};
  return result;
}

std::vector<uint64_t> push_batch(const std::shared_ptr<device_core>& core,
                                 std::span<const task_spec> specs, bool may_wait) {
  std::vector<bound_task> bound;
  bound.reserve(specs.size());
  for (const auto& spec : specs)
    bound.push_back(bind_spec(core, spec));
  std::vector<uint64_t> seqs;
  seqs.reserve(bound.size());
  for (auto& b : bound)
    seqs.push_back(core->push(std::move(b.work), may_wait));
  return seqs;
}

} // namespace multidev::detail
