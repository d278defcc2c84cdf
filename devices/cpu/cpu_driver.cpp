#include "devices/driver.hpp"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <memory>
#include <new>
#include <thread>

namespace multidev::detail {

namespace {

/// Freed small blocks, kept for the next allocation of the same size and
/// alignment, as CUDA's stream-ordered pools keep theirs. A pool is
/// allocated on the host thread and freed on its device's runner, in its
/// turn: with glibc, each such free contends with the host's next allocation
/// for the arena lock, and a 4 KiB `aligned_alloc` then consolidates the
/// small chunks the runner freed (`perf` of `bench --only pool_calls`: the
/// allocator took almost all of the multidev side). At most `max_blocks`
/// blocks of at most `max_block_bytes` each are kept (2 MiB), and all are
/// freed with the last allocation or the driver, whichever goes last.
class block_cache {
public:
  static constexpr std::size_t max_blocks = 32;
  static constexpr std::size_t max_block_bytes = 64 * 1024;

  block_cache() = default;
  block_cache(const block_cache&) = delete;
  block_cache& operator=(const block_cache&) = delete;
  ~block_cache() {
    for (std::size_t i = 0; i < count_; ++i)
      std::free(blocks_[i].ptr);
  }

  /// A kept block of `n` bytes aligned to `alignment`, or null.
  std::byte* take(std::size_t n, std::size_t alignment) noexcept {
    if (n > max_block_bytes)
      return nullptr;
    std::lock_guard guard{mu_};
    for (std::size_t i = count_; i-- > 0;) {
      if (blocks_[i].bytes == n && blocks_[i].alignment == alignment) {
        auto* p = blocks_[i].ptr;
        blocks_[i] = blocks_[--count_];
        return p;
      }
    }
    return nullptr;
  }

  /// Keeps `p` when there is room and it is small; frees it otherwise.
  void give(std::byte* p, std::size_t n, std::size_t alignment) noexcept {
    if (n <= max_block_bytes) {
      std::lock_guard guard{mu_};
      if (count_ < max_blocks) {
        blocks_[count_++] = {p, n, alignment};
        return;
      }
    }
    std::free(p);
  }

private:
  struct block {
    std::byte* ptr = nullptr;
    std::size_t bytes = 0;
    std::size_t alignment = 0;
  };
  std::mutex mu_;
  std::size_t count_ = 0;
  std::array<block, max_blocks> blocks_{};
};

class host_allocation final : public allocation {
public:
  host_allocation(std::size_t size, std::size_t alignment, std::shared_ptr<block_cache> cache)
    : cache_(std::move(cache)), alignment_(alignment) {
    // aligned_alloc wants a size that is a multiple of the alignment, and
    // may return null for zero bytes: round up, and never ask for zero. No
    // object may exceed PTRDIFF_MAX bytes: a size that rounds past it (or
    // whose rounding would wrap around to a few bytes) is out of memory.
    constexpr std::size_t most = PTRDIFF_MAX;
    if (alignment > most || size > most - (alignment - 1))
      throw std::bad_alloc{};
    bytes_ = size == 0 ? alignment : (size + alignment - 1) / alignment * alignment;
    ptr_ = cache_->take(bytes_, alignment_);
    if (ptr_ == nullptr)
      ptr_ = static_cast<std::byte*>(std::aligned_alloc(alignment, bytes_));
    if (ptr_ == nullptr)
      throw std::bad_alloc{};
  }
  ~host_allocation() override { cache_->give(ptr_, bytes_, alignment_); }
  std::byte* base() const noexcept override { return ptr_; }

private:
  std::shared_ptr<block_cache> cache_;
  std::byte* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t alignment_ = 0;
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
    return std::make_unique<host_allocation>(size, alignment, cache_);
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
  std::shared_ptr<block_cache> cache_ = std::make_shared<block_cache>();
  mutable std::once_flag props_once_;
  mutable sexp props_;
};

} // namespace

std::shared_ptr<driver> make_cpu_driver(std::optional<int> num_devices) {
  return std::make_shared<cpu_driver>(num_devices);
}

} // namespace multidev::detail
