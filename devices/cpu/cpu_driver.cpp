#include "devices/driver.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <thread>

namespace multidev::detail {

namespace {

class host_allocation final : public allocation {
public:
  host_allocation(std::size_t size, std::size_t alignment) {
    // aligned_alloc wants a size that is a multiple of the alignment, and
    // may return null for zero bytes: round up, and never ask for zero.
    std::size_t n = size == 0 ? alignment : (size + alignment - 1) / alignment * alignment;
    ptr_ = static_cast<std::byte*>(std::aligned_alloc(alignment, n));
    if (ptr_ == nullptr)
      throw std::bad_alloc{};
  }
  ~host_allocation() override { std::free(ptr_); }
  std::byte* base() const noexcept override { return ptr_; }

private:
  std::byte* ptr_ = nullptr;
};

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos && pos + 2 <= line.size())
        return line.substr(pos + 2);
    }
  return "unknown";
}

class cpu_driver final : public driver {
public:
  explicit cpu_driver(std::optional<int> n) : requested_(n) {}

  const std::string& backend_name() const override { return name_; }

  int device_count() const override {
    if (requested_)
      return *requested_;
    auto n = static_cast<int>(std::thread::hardware_concurrency());
    return n > 0 ? n : 1;
  }

  sexp properties() const override {
    std::call_once(props_once_, [this] {
      auto model = cpu_model_name();
      auto devices = sexp::list({sexp::atom("devices")});
      for (int i = 0; i < device_count(); ++i)
        devices.push_back(sexp::list({sexp::atom("device"),
                                      sexp::field("ordinal", std::to_string(i)),
                                      sexp::field("kind", "cpu"),
                                      sexp::field("model", model),
                                      sexp::field("memory", "host")}));
      props_ = sexp::list({sexp::atom(name_),
                           sexp::field("num_devices", std::to_string(device_count())),
                           sexp::field("hardware_threads",
                                       std::to_string(std::thread::hardware_concurrency())),
                           devices});
    });
    return props_;
  }

  hardware_limits limits() const override { return {}; }

  std::unique_ptr<allocation> allocate(int, std::size_t size, std::size_t alignment,
                                       std::optional<memory_mode>) override {
    return std::make_unique<host_allocation>(size, alignment);
  }

  // memset/memcpy want valid pointers even for zero bytes, and an empty host
  // span (a 0-byte from_host/to_host) has a null data(): nothing to do then.
  void zero(std::byte* p, std::size_t n) override {
    if (n > 0)
      std::memset(p, 0, n);
  }

  void copy(std::byte* dst, const std::byte* src, std::size_t n) override {
    if (n > 0)
      std::memcpy(dst, src, n);
  }

private:
  std::string name_ = "multidev_cpu";
  std::optional<int> requested_;
  mutable std::once_flag props_once_;
  mutable sexp props_;
};

} // namespace

std::shared_ptr<driver> make_cpu_driver(std::optional<int> num_devices) {
  return std::make_shared<cpu_driver>(num_devices);
}

} // namespace multidev::detail
