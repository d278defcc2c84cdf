// The pool table of a device, through its own interface (white box, issue
// 40): ids to pools, replacement and removal handing the old pool back, the
// span check, the memory accounted while any pool lives, and the errors that
// name the device and the pool -- without a device or a driver.
#define BOOST_TEST_MODULE pool_table
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/core/pool_table.hpp"

using multidev::memory_mode;
using multidev::detail::allocation;
using multidev::detail::pool_table;

namespace {

/// Host memory standing in for a device's.
class host_block : public allocation {
public:
  explicit host_block(std::size_t size) : bytes_(size == 0 ? 1 : size) {}
  std::byte* base() const noexcept override { return const_cast<std::byte*>(bytes_.data()); }

private:
  std::vector<std::byte> bytes_;
};

std::unique_ptr<allocation> block(std::size_t size) {
  return std::make_unique<host_block>(size);
}

/// The message `f` throws as `std::invalid_argument`; empty when it does not.
template <class F>
std::string invalid_argument_of(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_CASE(test_pool_table_install_find_and_remove) {
  pool_table t{"cpu:0:1"};
  BOOST_TEST(!t.find(3));
  BOOST_TEST(!t.install(3, 64, 16, memory_mode::local, block(64))); // nothing replaced
  auto p = t.find(3);
  BOOST_TEST_REQUIRE(p);
  BOOST_TEST(p->id == 3);
  BOOST_TEST(p->size == 64u);
  BOOST_TEST(p->alignment == 16u);
  BOOST_TEST((p->mode == memory_mode::local));
  BOOST_TEST(t.remove(3, "free_pool") == p);
  BOOST_TEST(!t.find(3));
  auto msg = invalid_argument_of([&] { t.remove(3, "free_pool"); });
  BOOST_TEST(contains(msg, "free_pool: pool 3 is not allocated on cpu:0:1"), msg);
}

BOOST_AUTO_TEST_CASE(test_pool_table_replacing_hands_the_old_pool_back) {
  pool_table t{"cpu:0:1"};
  t.install(1, 32, 8, std::nullopt, block(32));
  auto first = t.find(1);
  auto old = t.install(1, 128, 8, std::nullopt, block(128));
  BOOST_TEST(old == first); // for the caller to release in its turn
  BOOST_TEST(t.find(1)->size == 128u);
}

// A refused replay's undo (recorded rounds' pool calls): the pool before
// it goes back only where the table still holds what the replay left, so
// another thread's call made since stays.
BOOST_AUTO_TEST_CASE(test_pool_table_put_back_keeps_a_change_made_since) {
  pool_table t{"cpu:0:1"};
  t.install(1, 32, 8, std::nullopt, block(32));
  auto before = t.find(1);
  std::shared_ptr<multidev::detail::pool> made;
  auto old = t.install(1, 64, 8, std::nullopt, block(64), &made);
  BOOST_TEST(old == before);
  BOOST_TEST(t.find(1) == made);
  BOOST_TEST(t.put_back(1, old, made) == made); // undone: the one made comes out
  BOOST_TEST(t.find(1) == before);
  // A free undone: absent, then back.
  auto taken = t.remove(1, "free_pool");
  BOOST_TEST(!t.put_back(1, taken, nullptr));
  BOOST_TEST(t.find(1) == before);
  // Changed since: another call allocated id 1 again after the free.
  taken = t.remove(1, "free_pool");
  t.install(1, 16, 8, std::nullopt, block(16));
  auto theirs = t.find(1);
  BOOST_TEST(t.put_back(1, taken, nullptr) == taken); // handed back, table left alone
  BOOST_TEST(t.find(1) == theirs);
  // And an alloc undone after another call freed the pool it made.
  old = t.install(1, 8, 8, std::nullopt, block(8), &made);
  t.remove(1, "free_pool");
  BOOST_TEST(t.put_back(1, old, made) == old);
  BOOST_TEST(!t.find(1));
}

BOOST_AUTO_TEST_CASE(test_pool_table_used_memory_counts_every_pool_alive) {
  pool_table t{"cpu:0:1"};
  BOOST_TEST(t.used_memory() == 0u);
  t.install(1, 100, 8, std::nullopt, block(100));
  t.install(2, 20, 8, std::nullopt, block(20));
  BOOST_TEST(t.used_memory() == 120u);
  // Replaced, but still held (by work that uses it): still counted.
  auto held = t.install(1, 50, 8, std::nullopt, block(50));
  BOOST_TEST(t.used_memory() == 170u);
  held.reset();
  BOOST_TEST(t.used_memory() == 70u);
  auto in_use = t.find(2);
  t.clear();
  BOOST_TEST(!t.find(1));
  BOOST_TEST(!t.find(2));
  BOOST_TEST(t.used_memory() == 20u); // pool 2 lives on in what holds it
  in_use.reset();
  BOOST_TEST(t.used_memory() == 0u);
}

BOOST_AUTO_TEST_CASE(test_pool_table_span_checks_the_bytes_asked_for) {
  pool_table t{"cpu:0:1"};
  t.install(4, 64, 8, std::nullopt, block(64));
  BOOST_TEST(t.span(4, 0, 64, "read") == t.find(4));
  BOOST_TEST(t.span(4, 64, 0, "read") == t.find(4)); // empty, at the end
  auto past = invalid_argument_of([&] { t.span(4, 60, 5, "copy_to"); });
  BOOST_TEST(contains(past, "copy_to: bytes [60, 65) are outside pool 4 of cpu:0:1 (64 bytes)"),
             past);
  // A sum that would wrap around is still outside.
  auto wrap = invalid_argument_of([&] { t.span(4, 8, SIZE_MAX, "write"); });
  BOOST_TEST(contains(wrap, "are outside pool 4 of cpu:0:1"), wrap);
  auto none = invalid_argument_of([&] { t.span(5, 0, 1, "read"); });
  BOOST_TEST(contains(none, "read: pool 5 is not allocated on cpu:0:1"), none);
}

BOOST_AUTO_TEST_CASE(test_pool_table_bad_requests_name_the_device_and_the_pool) {
  pool_table t{"cpu:0:1"};
  BOOST_CHECK_NO_THROW(t.check_request(0, 1024, 64, "alloc_pool"));
  auto align = invalid_argument_of([&] { t.check_request(2, 64, 3, "alloc_pool"); });
  BOOST_TEST(contains(align, "alloc_pool on cpu:0:1: pool 2: alignment 3 is not a power of two"),
             align);
  auto zero = invalid_argument_of([&] { t.check_request(2, 64, 0, "alloc_pool"); });
  BOOST_TEST(contains(zero, "alignment 0 is not a power of two"), zero);
  auto negative = invalid_argument_of([&] { t.check_request(-1, 64, 8, "alloc_pool"); });
  BOOST_TEST(contains(negative, "alloc_pool on cpu:0:1: pool id -1 is negative"), negative);
  auto huge = invalid_argument_of([&] { t.check_request(2, SIZE_MAX - 2, 8, "alloc_pool"); });
  BOOST_TEST(contains(huge, "is more than any device can address"), huge);
}

BOOST_AUTO_TEST_CASE(test_pool_table_info_lists_the_pools) {
  pool_table t{"cpu:0:1"};
  t.install(7, 256, 32, memory_mode::device_only, block(256));
  auto s = t.info().to_string();
  BOOST_TEST(contains(s, "(pools (pool (id 7) (size 256) (alignment 32) (mode device_only)))"), s);
}
