// The kernel registry and the built-in kernels (float32 buffers).
#include "multidev/kernels.hpp"

#include "devices/builtins.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>

namespace multidev {

std::string to_string(arg_kind k) {
  switch (k) {
    case arg_kind::integer: return "int";
    case arg_kind::real: return "float";
    case arg_kind::string: return "string";
    case arg_kind::buffer: return "buffer";
  }
  return "?";
}

std::span<float> kernel_call::floats(int i) const {
  auto b = buffer(i);
  if (b.size() % sizeof(float) != 0)
    throw std::invalid_argument(
      fmt::format("buffer argument {} has {} bytes, not a multiple of 4", i, b.size()));
  return {reinterpret_cast<float*>(b.data()), b.size() / sizeof(float)};
}

const kernel_arg& kernel_args::arg(int i) const {
  if (i < 0 || static_cast<std::size_t>(i) >= spec_->args.size())
    throw std::invalid_argument(fmt::format("kernel '{}' has no argument {} (it has {})",
                                            spec_->kernel, i, spec_->args.size()));
  return spec_->args[static_cast<std::size_t>(i)];
}

namespace {

[[noreturn]] void wrong_kind(const task_spec& spec, int i, arg_kind want) {
  throw std::invalid_argument(
    fmt::format("kernel '{}' argument {} is {}, not {}", spec.kernel, i,
                kind_name(spec.args[static_cast<std::size_t>(i)]), to_string(want)));
}

} // namespace

int64_t kernel_args::integer(int i) const {
  if (auto* p = std::get_if<int64_t>(&arg(i)))
    return *p;
  wrong_kind(*spec_, i, arg_kind::integer);
}

double kernel_args::real(int i) const {
  const auto& a = arg(i);
  if (auto* p = std::get_if<double>(&a))
    return *p;
  if (auto* p = std::get_if<int64_t>(&a))
    return static_cast<double>(*p);
  wrong_kind(*spec_, i, arg_kind::real);
}

const std::string& kernel_args::string(int i) const {
  if (auto* p = std::get_if<std::string>(&arg(i)))
    return *p;
  wrong_kind(*spec_, i, arg_kind::string);
}

std::size_t kernel_args::buffer_size(int i) const {
  if (auto* p = std::get_if<buffer_arg>(&arg(i)))
    return p->size_in_bytes;
  wrong_kind(*spec_, i, arg_kind::buffer);
}

namespace detail {

void checksum_state::add(std::span<const std::byte> bytes) noexcept {
  uint64_t h = hash_;
  for (auto b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 1099511628211ull;
  }
  hash_ = h;
  auto n = bytes.size() / sizeof(float);
  const auto* xs = reinterpret_cast<const float*>(bytes.data());
  double sum = sum_;
  for (std::size_t i = 0; i < n; ++i)
    sum += xs[i];
  sum_ = sum;
  count_ += n;
}

kernel_result checksum_of(std::span<const std::byte> bytes) {
  checksum_state s;
  s.add(bytes);
  return s.result();
}

void check_add_from_merge(const kernel_call& c) {
  auto dst = c.floats(0);
  auto mb = c.merge_buffer();
  if (c.buffer(1).size() != dst.size_bytes() || mb.size() < dst.size_bytes())
    throw std::invalid_argument(fmt::format(
      "add_from_merge: DST has {} bytes, the merge node {} and the merge buffer {}",
      dst.size_bytes(), c.buffer(1).size(), mb.size()));
}

} // namespace detail

namespace {

std::map<std::string, std::shared_ptr<const kernel_def>> builtins() {
  using k = arg_kind;
  std::map<std::string, std::shared_ptr<const kernel_def>> r;
  auto add = [&r](std::string name, kernel_def d) {
    r.emplace(std::move(name), std::make_shared<const kernel_def>(std::move(d)));
  };
  add("fill", {.params = {k::buffer, k::real},
               .writes = {0},
               .body =
                 [](kernel_call& c) {
                   auto v = static_cast<float>(c.real(1));
                   for (auto& x : c.floats(0))
                     x = v;
                 },
               .doc = "fill DST VALUE: every element of DST becomes VALUE"});
  add("iota", {.params = {k::buffer, k::real},
               .writes = {0},
               .body =
                 [](kernel_call& c) {
                   auto start = c.real(1);
                   auto xs = c.floats(0);
                   for (std::size_t i = 0; i < xs.size(); ++i)
                     xs[i] = static_cast<float>(start + static_cast<double>(i));
                 },
               .doc = "iota DST START: DST[i] = START + i"});
  add("scale", {.params = {k::buffer, k::real},
                .reads = {0},
                .writes = {0},
                .body =
                  [](kernel_call& c) {
                    auto f = static_cast<float>(c.real(1));
                    for (auto& x : c.floats(0))
                      x *= f;
                  },
                .doc = "scale DST FACTOR: DST[i] *= FACTOR"});
  add("axpy", {.params = {k::buffer, k::real, k::buffer},
               .reads = {0, 2},
               .writes = {0},
               .body =
                 [](kernel_call& c) {
                   auto y = c.floats(0);
                   auto x = c.floats(2);
                   if (x.size() != y.size()) // refused by `check`; defensive
                     throw std::invalid_argument(fmt::format(
                       "axpy: Y has {} elements but X has {}", y.size(), x.size()));
                   auto a = static_cast<float>(c.real(1));
                   for (std::size_t i = 0; i < y.size(); ++i)
                     y[i] += a * x[i];
                 },
               .doc = "axpy Y A X: Y[i] += A * X[i]",
               .check =
                 [](const kernel_args& a) {
                   if (a.buffer_size(0) != a.buffer_size(2))
                     throw std::invalid_argument(fmt::format(
                       "Y (argument 0) has {} bytes but X (argument 2) has {}; "
                       "expected the same size",
                       a.buffer_size(0), a.buffer_size(2)));
                 }});
  add("add_from_merge",
      {.params = {k::buffer, k::buffer},
       .reads = {0, 1},
       .writes = {0},
       .merge_buffer_param = 1,
       .body =
         [](kernel_call& c) {
           detail::check_add_from_merge(c); // refused before scheduling (see `check`); defensive
           auto dst = c.floats(0);
           auto mb = c.merge_buffer();
           auto* m = reinterpret_cast<const float*>(mb.data());
           for (std::size_t i = 0; i < dst.size(); ++i)
             dst[i] += m[i];
         },
       .doc = "add_from_merge DST NODE: DST[i] += merge buffer[i], where the merge buffer "
              "holds NODE",
       .check =
         [](const kernel_args& a) {
           if (a.buffer_size(0) != a.buffer_size(1))
             throw std::invalid_argument(fmt::format(
               "DST (argument 0) has {} bytes but NODE (argument 1) has {}; expected "
               "the same size",
               a.buffer_size(0), a.buffer_size(1)));
         }});
  add("checksum", {.params = {k::buffer, k::string},
                   .reads = {0},
                   .body =
                     [](kernel_call& c) {
                       (void)c.floats(0); // a whole number of floats
                       auto r = detail::checksum_of(c.buffer(0));
                       c.publish(c.string(1), r.sum, r.hash, r.count);
                     },
                   .doc = "checksum SRC NAME: publishes the sum and FNV-1a hash of SRC as "
                          "result NAME"});
  add("spin_ns", {.params = {k::integer},
                  .body =
                    [](kernel_call& c) {
                      auto until = std::chrono::steady_clock::now()
                                   + std::chrono::nanoseconds(c.integer(0));
                      while (std::chrono::steady_clock::now() < until) {
                      }
                    },
                  .doc = "spin_ns NS: busy work for NS nanoseconds",
                  .check =
                    [](const kernel_args& a) {
                      // Bounded: `now + NS` must not overflow the clock's
                      // nanoseconds (INT64_MAX did: undefined behaviour).
                      constexpr int64_t most = 3'600'000'000'000; // an hour
                      if (a.integer(0) < 0 || a.integer(0) > most)
                        throw std::invalid_argument(fmt::format(
                          "NS (argument 0) is {}; must be >= 0 and at most {} (an hour)",
                          a.integer(0), most));
                    }});
  add("fail", {.params = {k::string},
               .body = [](kernel_call& c) -> void { throw std::runtime_error(c.string(0)); },
               .doc = "fail MESSAGE: throws MESSAGE (fails the device)"});
  return r;
}

struct registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const kernel_def>> kernels = builtins();
  /// The built-in definitions, even once replaced (`is_builtin`).
  const std::map<std::string, std::shared_ptr<const kernel_def>> originals = kernels;
};

registry& the_registry() {
  static registry r;
  return r;
}

} // namespace

bool detail::is_builtin(const std::string& name, const kernel_def* def) {
  auto& reg = the_registry();
  auto i = reg.originals.find(name); // never written after construction
  return i != reg.originals.end() && i->second.get() == def;
}

void register_kernel(const std::string& name, kernel_def def) {
  if (name.empty())
    throw std::invalid_argument("register_kernel: empty kernel name");
  if (!def.body)
    throw std::invalid_argument(
      fmt::format("register_kernel: kernel '{}' has no body", name));
  auto check_index = [&](int i, const char* what) {
    if (i < 0 || i >= static_cast<int>(def.params.size())
        || def.params[static_cast<std::size_t>(i)] != arg_kind::buffer)
      throw std::invalid_argument(fmt::format(
        "register_kernel: kernel '{}': {} index {} is not a buffer parameter", name,
        what, i));
  };
  for (int i : def.reads)
    check_index(i, "reads");
  for (int i : def.writes)
    check_index(i, "writes");
  if (def.merge_buffer_param != -1)
    check_index(def.merge_buffer_param, "merge_buffer_param");
  if (def.element_size == 0)
    throw std::invalid_argument(
      fmt::format("register_kernel: kernel '{}': element_size is 0", name));
  auto& reg = the_registry();
  std::lock_guard guard{reg.mu};
  reg.kernels[name] = std::make_shared<const kernel_def>(std::move(def));
}

std::shared_ptr<const kernel_def> find_kernel(const std::string& name) {
  auto& reg = the_registry();
  std::lock_guard guard{reg.mu};
  auto i = reg.kernels.find(name);
  return i == reg.kernels.end() ? nullptr : i->second;
}

std::vector<std::string> kernel_names() {
  auto& reg = the_registry();
  std::lock_guard guard{reg.mu};
  std::vector<std::string> result;
  for (const auto& [name, def] : reg.kernels)
    result.push_back(name);
  return result;
}

std::shared_ptr<const kernel_def> check_task_spec(const task_spec& spec) {
  auto def = find_kernel(spec.kernel);
  if (!def)
    throw std::invalid_argument(fmt::format("unknown kernel '{}' (known: {})",
                                            spec.kernel,
                                            fmt::join(kernel_names(), ", ")));
  if (spec.args.size() != def->params.size())
    throw std::invalid_argument(
      fmt::format("kernel '{}' takes {} arguments, got {}", spec.kernel,
                  def->params.size(), spec.args.size()));
  for (std::size_t i = 0; i < spec.args.size(); ++i)
    check_kernel_arg(spec.kernel, i, def->params[i], spec.args[i]);
  return def;
}

void check_preconditions(const kernel_def& def, const kernel_args& args) {
  const auto& name = args.kernel();
  for (std::size_t i = 0; i < def.params.size(); ++i) {
    if (def.params[i] != arg_kind::buffer)
      continue;
    auto n = args.buffer_size(static_cast<int>(i));
    if (n % def.element_size != 0)
      throw std::invalid_argument(fmt::format(
        "kernel '{}' argument {}: a buffer of {} bytes is not a whole number of "
        "{}-byte elements",
        name, i, n, def.element_size));
  }
  if (def.merge_buffer_param >= 0) {
    auto need = args.buffer_size(def.merge_buffer_param);
    auto have = args.merge_buffer_size();
    if (!have)
      throw std::invalid_argument(fmt::format(
        "kernel '{}' argument {}: reads {} bytes from the merge buffer, but the device "
        "has none (copy the node in with device_to_device and merge_buffer_use::copy "
        "first)",
        name, def.merge_buffer_param, need));
    if (*have < need)
      throw std::invalid_argument(fmt::format(
        "kernel '{}' argument {}: reads {} bytes from the merge buffer, which holds "
        "only {}",
        name, def.merge_buffer_param, need, *have));
  }
  if (def.check) {
    try {
      def.check(args);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      auto prefix = fmt::format("kernel '{}'", name);
      throw std::invalid_argument(msg.starts_with(prefix) ? msg : prefix + ": " + msg);
    }
  }
}

void check_kernel_arg(const std::string& kernel, std::size_t i, arg_kind want,
                      const kernel_arg& got) {
  auto k = got.index();
  bool ok = (want == arg_kind::integer && k == 1)
            || (want == arg_kind::real && (k == 2 || k == 1))
            || (want == arg_kind::string && k == 3) || (want == arg_kind::buffer && k == 4);
  if (!ok)
    throw std::invalid_argument(fmt::format("kernel '{}' argument {}: expected {}, got {} {}",
                                            kernel, i, to_string(want), kind_name(got),
                                            to_sexp(got).to_string()));
}

} // namespace multidev
