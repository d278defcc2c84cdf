#pragma once
// Data-parallel gradient merge across devices, shared by the example, its
// test and `multidev bench`: each device computes a partial gradient; the
// partials travel through device 0's merge buffer and are summed there.
//
//   device 1: [iota+scale] ──copy──> merge buffer ─┐
//   device 2: [iota+scale] ──copy──> merge buffer ─┤  (one at a time)
//   device 0: [iota+scale] ───────── [add_from_merge] x (N-1) ──> [checksum] ──> host
//
#include <multidev/multidev.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace gradient_merge {

/// Element `j` of device `i`'s partial: (i + j) * (i + 1).
inline float partial(int i, std::size_t j) {
  return static_cast<float>((static_cast<double>(i) + static_cast<double>(j)) * (i + 1));
}

/// The merged gradient computed on the host alone.
inline std::vector<float> host_sum(int devices, std::size_t n) {
  std::vector<float> sum(n, 0.0f);
  for (int i = 0; i < devices; ++i)
    for (std::size_t j = 0; j < n; ++j)
      sum[j] += partial(i, j);
  return sum;
}

/// The linked pipeline: contexts holding `grad` on every device.
struct pipeline {
  multidev::tnode grad;
  std::vector<multidev::context> ctx;
};

/// Allocates `grad` (`n` floats) on devices 0..devices-1 of `b`.
inline pipeline setup(multidev::backend& b, int devices, std::size_t n) {
  pipeline p{multidev::tnode{1, "grad", n * sizeof(float), multidev::memory_mode::on_device}, {}};
  for (int i = 0; i < devices; ++i)
    p.ctx.push_back(b.alloc_node(b.make_context(b.get_device(i)), p.grad));
  return p;
}

/// Runs one step: partials, merges into device 0, a checksum (result "grad")
/// unless `checksum` is false; copies the merged gradient to `out` (n floats).
/// Returns when `out` is filled.
inline void step(multidev::backend& b, pipeline& p, std::vector<float>& out,
                 bool checksum = true) {
  int devices = static_cast<int>(p.ctx.size());
  for (int i = 0; i < devices; ++i) {
    b.run(b.link(p.ctx[i], "iota", {p.grad, static_cast<double>(i)}));
    b.run(b.link(p.ctx[i], "scale", {p.grad, static_cast<double>(i + 1)}));
  }
  for (int i = 1; i < devices; ++i) {
    auto copy = b.device_to_device(p.grad, multidev::merge_buffer_use::copy, p.ctx[0], p.ctx[i]);
    b.run(b.link(copy->context, "add_from_merge", {p.grad, p.grad}));
  }
  if (checksum)
    b.run(b.link(p.ctx[0], "checksum", {p.grad, std::string{"grad"}}));
  out.resize(p.grad.size_in_bytes / sizeof(float));
  b.to_host(p.ctx[0], p.grad, std::as_writable_bytes(std::span{out}));
  b.sync(b.all_work(p.ctx[0].device));
}

} // namespace gradient_merge
