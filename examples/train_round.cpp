// A toy model's training step recorded once as a round and replayed
// (docs/api.md, "Recorded rounds"): a linear model y = a x + b fitted by
// gradient descent on 4 devices, each holding a shard of the data.
//
//   device d: g_d = its shard's gradient of the mean squared error, and its
//             shard's loss (published as "loss d")
//   device 0: g = g_0 + g_1 + g_2 + g_3 (copied into its merge buffer, added)
//             w -= lr g                  (lr: a slot, changed between replays)
//   device d: w copied back from device 0
//
// The round is recorded once; each replay is one call. The loss printed per
// step must go down at every step and the fit must find a = 3, b = 1.
#include <multidev/multidev.hpp>

#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr int devices = 4;
constexpr std::size_t per_device = 256; // samples per shard
constexpr std::size_t samples = devices * per_device;

/// The data: y = 3 x + 1 plus a little deterministic noise, x in [-1, 1].
float x_of(std::size_t i) { return -1.0f + 2.0f * static_cast<float>(i) / (samples - 1); }
float y_of(std::size_t i) {
  return 3.0f * x_of(i) + 1.0f + 0.01f * static_cast<float>(static_cast<int>(i % 7) - 3);
}

/// `linear_grad W X Y G NAME N`: G = the gradient of the mean squared error
/// of w = (a, b) over the samples (X, Y), divided by the N samples of all
/// shards; publishes the shard's summed squared error as result NAME.
void register_linear_grad() {
  multidev::kernel_def def;
  using multidev::arg_kind;
  def.params = {arg_kind::buffer, arg_kind::buffer, arg_kind::buffer, arg_kind::buffer,
                arg_kind::string, arg_kind::integer};
  def.reads = {0, 1, 2};
  def.writes = {3};
  def.doc = "G = d/dw of sum (a x + b - y)^2 / N over the shard; publishes its squared error";
  def.check = [](const multidev::kernel_args& a) {
    if (a.buffer_size(0) != 2 * sizeof(float) || a.buffer_size(3) != 2 * sizeof(float))
      throw std::invalid_argument("W and G hold 2 floats (a, b)");
    if (a.buffer_size(1) != a.buffer_size(2))
      throw std::invalid_argument("X and Y hold as many samples");
  };
  def.body = [](multidev::kernel_call& c) {
    auto w = c.floats(0);
    auto x = c.floats(1);
    auto y = c.floats(2);
    auto g = c.floats(3);
    double n = static_cast<double>(c.integer(5));
    double ga = 0, gb = 0, loss = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      double r = w[0] * x[i] + w[1] - y[i];
      ga += 2 * r * x[i] / n;
      gb += 2 * r / n;
      loss += r * r;
    }
    g[0] = static_cast<float>(ga);
    g[1] = static_cast<float>(gb);
    c.publish(c.string(4), loss, 0, x.size());
  };
  multidev::register_kernel("linear_grad", std::move(def));
}

multidev::buffer_arg arg(const multidev::context& c, const multidev::tnode& t) {
  return multidev::buffer_arg{c.buffers.at(t), t.size_in_bytes};
}

} // namespace

int main() {
  register_linear_grad();
  multidev::backend b{multidev::backend_options{.num_devices = devices}};
  const multidev::tnode w{1, "w", 2 * sizeof(float), multidev::memory_mode::on_device};
  const multidev::tnode g{2, "g", 2 * sizeof(float), multidev::memory_mode::on_device};
  const multidev::tnode x{3, "x", per_device * sizeof(float), multidev::memory_mode::on_device};
  const multidev::tnode y{4, "y", per_device * sizeof(float), multidev::memory_mode::on_device};

  // Each device's shard and its copy of w = (0, 0), before recording.
  std::vector<multidev::context> ctx;
  const std::vector<float> w0{0.0f, 0.0f};
  for (int d = 0; d < devices; ++d) {
    std::vector<float> xs(per_device), ys(per_device);
    for (std::size_t i = 0; i < per_device; ++i) {
      xs[i] = x_of(d * per_device + i);
      ys[i] = y_of(d * per_device + i);
    }
    auto c = b.make_context(b.get_device(d));
    c = b.init_from_host(c, w, std::as_bytes(std::span{w0}));
    c = b.init_from_host(c, x, std::as_bytes(std::span{xs}));
    c = b.init_from_host(c, y, std::as_bytes(std::span{ys}));
    c = b.alloc_node(c, g);
    ctx.push_back(c);
    b.sync(b.all_work(c.device)); // the copies read xs and ys until done
  }

  // The step, recorded: nothing runs here.
  std::vector<multidev::event> grad(devices);
  multidev::event update;
  auto step = b.record("step", [&] {
    for (int d = 0; d < devices; ++d)
      grad[d] = b.schedule_named(ctx[d].device,
                                 {"linear_grad", {arg(ctx[d], w), arg(ctx[d], x), arg(ctx[d], y),
                                                  arg(ctx[d], g), "loss " + std::to_string(d),
                                                  static_cast<int64_t>(samples)}});
    for (int d = 1; d < devices; ++d) {
      b.will_wait_for(ctx[0], grad[d]); // named tasks order by events, not by nodes
      b.device_to_device(g, multidev::merge_buffer_use::copy, ctx[0], ctx[d]);
      b.schedule_named(ctx[0].device, {"add_from_merge", {arg(ctx[0], g), arg(ctx[0], g)}});
    }
    update = b.schedule_named(ctx[0].device, {"axpy", {arg(ctx[0], w), -0.5, arg(ctx[0], g)}});
    for (int d = 1; d < devices; ++d) {
      b.will_wait_for(ctx[d], update);
      b.device_to_device(w, multidev::merge_buffer_use::no, ctx[d], ctx[0]);
    }
  });
  for (int d = 0; d < devices; ++d)
    step.name_item(grad[d], "grad " + std::to_string(d));
  step.name_item(update, "update");
  auto lr = step.slot(update, 1); // axpy's A: -lr

  constexpr int steps = 10;
  auto rate = [](int t) { return 0.9 / (1.0 + 0.05 * t); };
  double last = INFINITY;
  bool down = true;
  for (int t = 0; t < steps; ++t) {
    step.arg(lr) = -rate(t); // read by this replay
    auto ev = b.replay(step);
    for (const auto& [d, e] : ev.all_work())
      b.sync(e);
    double loss = 0;
    for (int d = 0; d < devices; ++d)
      loss += b.result(ctx[d].device, "loss " + std::to_string(d))->sum;
    loss /= samples;
    std::printf("step %2d  lr %.4f  loss %.6f\n", t + 1, rate(t), loss);
    down = down && loss < last;
    last = loss;
  }
  std::vector<float> fit(2);
  b.to_host(ctx[devices - 1], w, std::as_writable_bytes(std::span{fit}));
  b.sync(b.all_work(ctx[devices - 1].device));
  bool found = std::abs(fit[0] - 3.0f) < 0.05f && std::abs(fit[1] - 1.0f) < 0.05f;
  std::printf("%d replays of round '%s' (%zu items): y = %.3f x + %.3f\n", steps,
              step.name().c_str(), step.size(), fit[0], fit[1]);
  if (!down || !found) {
    std::printf("WRONG: %s\n", !down ? "the loss went up" : "the fit is not y = 3 x + 1");
    return 1;
  }
  std::printf("the loss went down at every step\n");
  return 0;
}
