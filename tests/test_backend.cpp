// One test (at least) per value of the Multidev signature, on CPU devices:
// names, pools, devices and contexts, events, properties and debug info, work,
// and the printers of every handle type.
#define BOOST_TEST_MODULE backend
#include <boost/test/unit_test.hpp>

#include <multidev/multidev.hpp>

#include "actors/core/device_core.hpp" // white box: the base of pools other than 0
#include "test_support.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using multidev::backend;
using multidev::backend_options;
using multidev::sexp;
using test_support::block_runner;
using test_support::bounded;
using test_support::latch_gate;

namespace {

/// `(key value)` in `s`, the value as an atom.
std::string field(const sexp& s, const std::string& key) {
  auto* f = s.find(key);
  BOOST_REQUIRE_MESSAGE(f != nullptr, "no field " << key << " in " << s.to_string());
  BOOST_REQUIRE(f->items().size() >= 2u);
  return f->items()[1].as_atom();
}

std::size_t num_field(const sexp& s, const std::string& key) {
  return std::stoull(field(s, key));
}

std::byte* pool_base(const multidev::device& d, int pool_id) {
  auto p = d.get_runner().core()->pools().find(pool_id);
  BOOST_TEST_REQUIRE(p != nullptr, "pool " << pool_id << " is not allocated");
  return p->base();
}

} // namespace

// -- name ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_name_is_multidev_cpu) {
  backend b{backend_options{.num_devices = 1}};
  BOOST_TEST(b.name() == "multidev_cpu");
  BOOST_CHECK_THROW(backend(backend_options{.driver = "opencl"}), std::invalid_argument);
  BOOST_CHECK_THROW(backend(backend_options{.num_devices = -1}), std::invalid_argument);
}

// -- construction ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_construction_spawns_no_device) {
  backend b{backend_options{.num_devices = 3}};
  auto info = b.get_global_debug_info();
  BOOST_TEST(info.items().at(0).as_atom() == "multidev_cpu");
  BOOST_TEST(field(info, "devices_in_use") == "0");
  BOOST_TEST(field(info, "num_devices") == "3");
  BOOST_TEST_REQUIRE(info.find("devices") != nullptr);
  BOOST_TEST(info.find("devices")->items().size() == 1u); // just the head
  auto d = b.get_device(1);
  info = b.get_global_debug_info();
  BOOST_TEST(field(info, "devices_in_use") == "1");
  auto& devs = info.find("devices")->items();
  BOOST_TEST_REQUIRE(devs.size() == 2u);
  BOOST_TEST(field(devs[1], "name") == d.name());
}

// -- num_devices / get_device ------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_num_devices_option_and_default) {
  backend b3{backend_options{.num_devices = 3}};
  BOOST_TEST(b3.num_devices() == 3);
  backend b0{backend_options{.num_devices = 0}};
  BOOST_TEST(b0.num_devices() == 0);
  BOOST_CHECK_THROW(b0.get_device(0), std::invalid_argument);
  backend bd;
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  BOOST_TEST(bd.num_devices() == (hw > 0 ? hw : 1));
}

BOOST_AUTO_TEST_CASE(test_backend_get_device_memoizes_and_ids_are_unique) {
  backend a{backend_options{.num_devices = 2}};
  backend b{backend_options{.num_devices = 2}};
  auto a0 = a.get_device(0);
  BOOST_TEST((a.get_device(0) == a0));
  BOOST_TEST(a.get_device(0).device_id() == a0.device_id());
  BOOST_TEST((a.get_device(0).get_runner() == a0.get_runner()));
  auto a1 = a.get_device(1);
  auto b0 = b.get_device(0), b1 = b.get_device(1);
  BOOST_TEST(!(a1 == a0));
  std::set<int> ids{a0.device_id(), a1.device_id(), b0.device_id(), b1.device_id()};
  BOOST_TEST(ids.size() == 4u);
  BOOST_TEST(a0.ordinal() == 0);
  BOOST_TEST(b1.ordinal() == 1);
  BOOST_TEST((a0.dev() == multidev::dev{"cpu", 0}));
  // Concurrent first calls agree on one handle.
  backend c{backend_options{.num_devices = 1}};
  std::vector<std::future<multidev::device>> fs;
  for (int i = 0; i < 4; ++i)
    fs.push_back(std::async(std::launch::async, [&c] { return c.get_device(0); }));
  auto first = fs[0].get();
  for (int i = 1; i < 4; ++i)
    BOOST_TEST((fs[static_cast<std::size_t>(i)].get() == first));
}

BOOST_AUTO_TEST_CASE(test_backend_get_device_bad_ordinal_names_ordinal_and_count) {
  backend b{backend_options{.num_devices = 2}};
  for (int bad : {2, -1, 17}) {
    try {
      b.get_device(bad);
      BOOST_FAIL("expected std::invalid_argument for ordinal " << bad);
    } catch (const std::invalid_argument& e) {
      std::string msg = e.what();
      BOOST_TEST(msg.find(std::to_string(bad)) != std::string::npos, msg);
      BOOST_TEST(msg.find("2 devices") != std::string::npos, msg);
    }
  }
}

// -- get_name ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_get_name_is_name_ordinal_device_id) {
  backend b{backend_options{.num_devices = 2}};
  auto d = b.get_device(1);
  auto expected = "multidev_cpu:1:" + std::to_string(d.device_id());
  BOOST_TEST(b.get_name(d) == expected);
  BOOST_TEST(d.name() == expected);
  BOOST_TEST(std::regex_match(b.get_name(b.get_device(0)),
                              std::regex{"multidev_cpu:0:[0-9]+"}));
}

// -- make_device -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_make_device_fresh_id_same_runner) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto m = b.make_device(d.dev(), d.get_runner(), 7);
  BOOST_TEST(m.device_id() != d.device_id());
  BOOST_TEST(m.ordinal() == 7);
  BOOST_TEST((m.dev() == d.dev()));
  BOOST_TEST((m.get_runner() == d.get_runner()));
  BOOST_TEST(!(m == d));
  BOOST_TEST(b.get_name(m) == "multidev_cpu:7:" + std::to_string(m.device_id()));
  BOOST_TEST(m.next_pool_id() == 1);
  BOOST_TEST(!m.merge_buffer());
  auto m2 = b.make_device(d.dev(), d.get_runner(), 7);
  BOOST_TEST(m2.device_id() != m.device_id());
  // Work on either handle goes through the one runner, in order.
  std::vector<int> order;
  b.schedule_task(d, {"a", [&] { order.push_back(1); }});
  b.schedule_task(m, {"b", [&] { order.push_back(2); }});
  b.schedule_task(d, {"c", [&] { order.push_back(3); }});
  auto ev = b.all_work(m);
  BOOST_TEST(ev.seq() == b.all_work(d).seq());
  bounded([&] { b.await(m); });
  BOOST_TEST(ev.is_done());
  BOOST_TEST((order == std::vector<int>{1, 2, 3}));
  BOOST_CHECK_THROW(b.make_device(d.dev(), multidev::runner{}, 0), std::invalid_argument);
}

// -- contexts ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_make_context_has_no_parent) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  multidev::tnode t{1, "w", 16, multidev::memory_mode::on_device};
  multidev::ctx_buffers bufs{{t, {1, 0}}};
  multidev::optimize_ctx opt{sexp::list({sexp::atom("unroll")})};
  auto c = b.make_context(d, bufs, opt);
  BOOST_TEST((c.device == d));
  BOOST_TEST(!c.parent);
  BOOST_TEST((c.buffers == bufs));
  BOOST_TEST((c.optimize == opt));
  BOOST_TEST(!c.finalized);
  BOOST_TEST(!c.merge_buffer_node);
  auto e = b.make_context(d);
  BOOST_TEST(e.buffers.empty());
  BOOST_TEST((e.optimize == multidev::optimize_ctx{}));
  BOOST_CHECK_THROW(b.make_context(multidev::device{}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(test_backend_make_child_inherits_and_overrides) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  multidev::tnode t{1, "w", 16, multidev::memory_mode::on_device};
  multidev::tnode u{2, "g", 32, multidev::memory_mode::materialized};
  multidev::ctx_buffers bufs{{t, {1, 0}}};
  multidev::optimize_ctx opt{sexp::list({sexp::atom("unroll")})};
  auto root = b.make_context(d, bufs, opt);

  // Everything omitted: inherited, with the given context as parent.
  auto c1 = b.make_child(root);
  BOOST_TEST((c1.device == d));
  BOOST_TEST_REQUIRE(c1.parent != nullptr);
  BOOST_TEST((c1.parent->buffers == bufs));
  BOOST_TEST(!c1.parent->parent);
  BOOST_TEST((c1.buffers == bufs));
  BOOST_TEST((c1.optimize == opt));
  BOOST_TEST(!c1.merge_buffer_node);

  // Overrides given: used.
  multidev::ctx_buffers bufs2{{t, {1, 0}}, {u, {2, 64}}};
  multidev::optimize_ctx opt2{sexp::list({sexp::atom("inline")})};
  auto c2 = b.make_child(c1, bufs2, opt2, std::optional<multidev::tnode>{u});
  BOOST_TEST((c2.buffers == bufs2));
  BOOST_TEST((c2.optimize == opt2));
  BOOST_TEST_REQUIRE(c2.merge_buffer_node.has_value());
  BOOST_TEST(c2.merge_buffer_node->id == u.id);
  BOOST_TEST_REQUIRE(c2.parent != nullptr);
  BOOST_TEST((c2.parent->buffers == bufs)); // parent is c1
  BOOST_TEST(c2.parent->parent != nullptr);

  // merge_buffer_node omitted: inherited; given as "none": cleared.
  auto c3 = b.make_child(c2);
  BOOST_TEST_REQUIRE(c3.merge_buffer_node.has_value());
  BOOST_TEST(c3.merge_buffer_node->id == u.id);
  BOOST_TEST((c3.buffers == bufs2));
  auto c4 = b.make_child(c2, std::nullopt, std::nullopt,
                         std::optional<std::optional<multidev::tnode>>{std::optional<multidev::tnode>{}});
  BOOST_TEST(!c4.merge_buffer_node);
  BOOST_TEST((c4.buffers == bufs2));
  BOOST_TEST((c4.optimize == opt2));
}

// -- pools -------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_alloc_pool_allocates_aligned_and_lists_it) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  BOOST_TEST(b.get_used_memory(d) == 0u);
  b.alloc_pool(d, 0, 100, 4096, multidev::memory_mode::materialized);
  b.alloc_pool(d, 3, 64, 256);
  BOOST_TEST(b.get_used_memory(d) == 164u);
  BOOST_TEST_REQUIRE(d.merge_buffer().has_value());
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(*d.merge_buffer()) % 4096 == 0u);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(pool_base(d, 3)) % 256 == 0u);
  auto dinfo = b.get_debug_info(d);
  auto pools = dinfo.find("pools");
  BOOST_TEST_REQUIRE(pools != nullptr);
  BOOST_TEST_REQUIRE(pools->items().size() == 3u);
  auto& p0 = pools->items()[1];
  BOOST_TEST(field(p0, "id") == "0");
  BOOST_TEST(field(p0, "size") == "100");
  BOOST_TEST(field(p0, "alignment") == "4096");
  BOOST_TEST(field(p0, "mode") == "materialized");
  auto& p3 = pools->items()[2];
  BOOST_TEST(field(p3, "id") == "3");
  BOOST_TEST(field(p3, "mode") == "none");
  // The memory is usable from a task at once.
  bool wrote = false;
  b.schedule_task(d, {"write", [&, base = pool_base(d, 3)] {
                        std::memset(base, 0x5a, 64);
                        wrote = true;
                      }});
  bounded([&] { b.await(d); });
  BOOST_TEST(wrote);
}

BOOST_AUTO_TEST_CASE(test_backend_alloc_pool_rejects_bad_arguments_unchanged) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  b.alloc_pool(d, 1, 32, 16);
  for (std::size_t bad : {std::size_t{0}, std::size_t{3}, std::size_t{24}}) {
    try {
      b.alloc_pool(d, 1, 64, bad);
      BOOST_FAIL("expected std::invalid_argument for alignment " << bad);
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(std::string(e.what()).find(std::to_string(bad)) != std::string::npos,
                 e.what());
    }
  }
  BOOST_CHECK_THROW(b.alloc_pool(d, -2, 64, 16), std::invalid_argument);
  BOOST_TEST(b.get_used_memory(d) == 32u);
  auto dinfo = b.get_debug_info(d);
  auto pools = dinfo.find("pools");
  BOOST_TEST_REQUIRE(pools->items().size() == 2u);
  BOOST_TEST(field(pools->items()[1], "size") == "32");
  BOOST_TEST(field(b.get_debug_info(d), "error") == "none");
}

BOOST_AUTO_TEST_CASE(test_backend_alloc_pool_replaces_existing_pool_after_earlier_work) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  b.alloc_pool(d, 0, 64, 64);
  auto old_base = *d.merge_buffer();
  auto release = block_runner(b, d);
  b.alloc_pool(d, 0, 256, 64); // the merge buffer grows this way
  BOOST_TEST(*d.merge_buffer() != old_base);
  // The old pool still waits for the blocked task: counted (upper bound).
  BOOST_TEST(b.get_used_memory(d) == 64u + 256u);
  BOOST_TEST(field(b.get_debug_info(d).find("pools")->items()[1], "size") == "256");
  release->open();
  bounded([&] { b.await(d); });
  BOOST_TEST(b.get_used_memory(d) == 256u);
}

BOOST_AUTO_TEST_CASE(test_backend_free_pool_is_ordered_and_rejects_double_free) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  BOOST_TEST(b.has_free_pool());
  b.alloc_pool(d, 1, 128, 64);
  b.alloc_pool(d, 2, 32, 64);
  auto base = pool_base(d, 1);
  auto release = block_runner(b, d);
  std::atomic<int> sum{-1};
  // Scheduled before the free: must still see valid memory when it runs.
  b.schedule_task(d, {"use", [&, base] {
                        std::memset(base, 1, 128);
                        int s = 0;
                        for (int i = 0; i < 128; ++i)
                          s += static_cast<int>(base[i]);
                        sum = s;
                      }});
  b.free_pool(d, 1);
  BOOST_TEST(b.get_debug_info(d).find("pools")->items().size() == 2u); // pool 2 only
  BOOST_TEST(b.get_used_memory(d) == 160u); // release waits for earlier work
  BOOST_CHECK_THROW(b.free_pool(d, 1), std::invalid_argument); // double free
  BOOST_CHECK_THROW(b.free_pool(d, 9), std::invalid_argument); // never allocated
  BOOST_CHECK_THROW(b.memset_zero(d, 1, 0, 8), std::invalid_argument);
  release->open();
  bounded([&] { b.await(d); });
  BOOST_TEST(sum.load() == 128);
  BOOST_TEST(b.get_used_memory(d) == 32u);
  BOOST_TEST(field(b.get_debug_info(d), "error") == "none");
}

BOOST_AUTO_TEST_CASE(test_backend_memset_zero_is_ordered_with_tasks) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  b.alloc_pool(d, 0, 64, 64);
  auto base = *d.merge_buffer();
  auto release = std::make_shared<latch_gate>();
  // Blocked writer scheduled before the memset: if the memset ran at once, the
  // writer would overwrite the zeroes.
  b.schedule_task(d, {"fill", [=] {
                        release->wait();
                        std::memset(base, 0xab, 64);
                      }});
  b.memset_zero(d, 0, 8, 16);
  std::vector<unsigned char> seen(64);
  b.schedule_task(d, {"read", [&, base] { std::memcpy(seen.data(), base, 64); }});
  release->open();
  bounded([&] { b.await(d); });
  for (std::size_t i = 0; i < 64; ++i) {
    unsigned char expected = (i >= 8 && i < 24) ? 0 : 0xab;
    BOOST_TEST(seen[i] == expected, "byte " << i);
  }
  // Whole pool, and the edges of the valid range.
  b.memset_zero(d, 0, 0, 64);
  b.memset_zero(d, 0, 64, 0);
  b.schedule_task(d, {"read", [&, base] { std::memcpy(seen.data(), base, 64); }});
  bounded([&] { b.await(d); });
  for (std::size_t i = 0; i < 64; ++i)
    BOOST_TEST(seen[i] == 0, "byte " << i);
  BOOST_CHECK_THROW(b.memset_zero(d, 0, 60, 8), std::invalid_argument);
  BOOST_CHECK_THROW(b.memset_zero(d, 0, 65, 0), std::invalid_argument);
  BOOST_CHECK_THROW(b.memset_zero(d, 4, 0, 1), std::invalid_argument);
  BOOST_TEST(field(b.get_debug_info(d), "error") == "none");
}

BOOST_AUTO_TEST_CASE(test_backend_get_used_memory_is_exact_after_await) {
  // Repeated: the release of freed/replaced pools must be visible once the
  // device is idle, not some time later.
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  for (int round = 0; round < 300; ++round) {
    b.alloc_pool(d, 1, 1000, 64);
    b.alloc_pool(d, 2, 24, 8);
    b.memset_zero(d, 1, 0, 1000);
    b.alloc_pool(d, 1, 500, 64); // replaces 1000
    b.free_pool(d, 2);
    bounded([&] { b.await(d); });
    BOOST_TEST_REQUIRE(b.get_used_memory(d) == 500u, "round " << round);
    b.free_pool(d, 1);
    bounded([&] { b.await(d); });
    BOOST_TEST_REQUIRE(b.get_used_memory(d) == 0u, "round " << round);
  }
}

// -- events ------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_sync_blocks_until_done) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  BOOST_TEST(b.is_done(multidev::event{}));
  b.sync(multidev::event{}); // the default event is done
  auto release = block_runner(b, d);
  std::atomic<bool> ran{false};
  b.schedule_task(d, {"after", [&] { ran = true; }});
  auto ev = b.all_work(d);
  auto fut = std::async(std::launch::async, [&] { b.sync(ev); return ran.load(); });
  BOOST_TEST((fut.wait_for(100ms) == std::future_status::timeout)); // still blocked
  BOOST_TEST(!ran.load());
  release->open();
  BOOST_REQUIRE(fut.wait_for(30s) == std::future_status::ready);
  BOOST_TEST(fut.get()); // the work was finished when sync returned
}

BOOST_AUTO_TEST_CASE(test_backend_is_done_never_blocks) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  auto ev = b.all_work(d);
  BOOST_TEST(!b.is_done(ev));
  BOOST_TEST(!ev.is_failed());
  release->open();
  bounded([&] { b.sync(ev); });
  BOOST_TEST(b.is_done(ev));
  BOOST_TEST(ev.device_name() == d.name());
}

BOOST_AUTO_TEST_CASE(test_backend_will_wait_for_orders_across_devices) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  auto release = block_runner(b, d0);
  std::atomic<bool> produced{false};
  b.schedule_task(d0, {"produce", [&] { produced = true; }});
  auto ev = b.all_work(d0);
  // Scheduled on d1 before the wait: free to run at once.
  auto before = std::make_shared<latch_gate>();
  b.schedule_task(d1, {"before", [before] { before->open(); }});
  b.will_wait_for(b.make_context(d1), ev); // returns at once
  std::atomic<int> consumed{-1};
  b.schedule_task(d1, {"consume", [&] { consumed = produced ? 1 : 0; }});
  BOOST_TEST(before->wait());
  BOOST_TEST(num_field(b.get_debug_info(d1), "pending_waits") == 1u);
  std::this_thread::sleep_for(50ms);
  BOOST_TEST(consumed.load() == -1); // held back by the wait
  BOOST_TEST(!b.is_idle(d1));
  release->open();
  bounded([&] { b.await(d1); });
  BOOST_TEST(consumed.load() == 1);
  BOOST_TEST(num_field(b.get_debug_info(d1), "pending_waits") == 0u);
}

BOOST_AUTO_TEST_CASE(test_backend_will_wait_for_same_device_or_done_is_noop) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  b.schedule_task(d1, {"x", [] {}});
  bounded([&] { b.await(d1); });
  auto done = b.all_work(d1);
  BOOST_TEST_REQUIRE(b.is_done(done));

  auto release = block_runner(b, d0);
  auto pending_same = b.all_work(d0);
  auto sched = num_field(b.get_debug_info(d0), "scheduled");
  // Same device, still pending: no gate (FIFO already orders it), no hang.
  b.will_wait_for(b.make_context(d0), pending_same);
  // Other device, already done: nothing to wait for.
  b.will_wait_for(b.make_context(d0), done);
  // The default event is done.
  b.will_wait_for(b.make_context(d0), multidev::event{});
  auto info = b.get_debug_info(d0);
  BOOST_TEST(num_field(info, "scheduled") == sched);
  BOOST_TEST(num_field(info, "pending_waits") == 0u);
  std::atomic<bool> ran{false};
  b.schedule_task(d0, {"after", [&] { ran = true; }});
  release->open();
  bounded([&] { b.await(d0); });
  BOOST_TEST(ran.load());
  BOOST_TEST(field(b.get_debug_info(d0), "error") == "none");
}

// -- properties and debug info -------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_static_properties_lists_devices) {
  backend b{backend_options{.num_devices = 3}};
  auto p = b.static_properties();
  BOOST_TEST_REQUIRE(p.is_list());
  BOOST_TEST(p.items().at(0).as_atom() == "multidev_cpu");
  BOOST_TEST(field(p, "num_devices") == "3");
  auto* devs = p.find("devices");
  BOOST_TEST_REQUIRE(devs != nullptr);
  BOOST_TEST_REQUIRE(devs->items().size() == 4u);
  for (int i = 0; i < 3; ++i) {
    auto& dv = devs->items()[static_cast<std::size_t>(i) + 1];
    BOOST_TEST(dv.items().at(0).as_atom() == "device");
    BOOST_TEST(field(dv, "ordinal") == std::to_string(i));
    BOOST_TEST(field(dv, "kind") == "cpu");
  }
  BOOST_TEST((b.static_properties() == p)); // stable
  // Enumerating devices does not bring them to life.
  BOOST_TEST(field(b.get_global_debug_info(), "devices_in_use") == "0");
  // Round-trips through the printer.
  BOOST_TEST((multidev::parse_sexp(p.to_string()) == p));
}

BOOST_AUTO_TEST_CASE(test_backend_hardware_limits_all_empty_for_cpu) {
  backend b{backend_options{.num_devices = 2}};
  auto h = b.hardware_limits();
  BOOST_TEST(!h.max_threads_per_block);
  BOOST_TEST(!h.max_block_dim_x);
  BOOST_TEST(!h.max_grid_dim_x);
  BOOST_TEST(!h.shared_memory_per_block);
  BOOST_TEST((h == multidev::hardware_limits{}));
  BOOST_TEST(field(to_sexp(h), "max_grid_dim_x") == "none");
}

BOOST_AUTO_TEST_CASE(test_backend_get_debug_info_reports_queue_progress_and_pools) {
  backend b{backend_options{.num_devices = 2}};
  auto d0 = b.get_device(0), d1 = b.get_device(1);
  b.alloc_pool(d1, 1, 48, 16, multidev::memory_mode::device_only);
  auto fresh = b.get_debug_info(d1);
  BOOST_TEST(fresh.items().at(0).as_atom() == "device");
  BOOST_TEST(field(fresh, "name") == d1.name());
  BOOST_TEST(field(fresh, "queue_length") == "0");
  BOOST_TEST(field(fresh, "scheduled") == "0");
  BOOST_TEST(field(fresh, "finished") == "0");
  BOOST_TEST(field(fresh, "pending_waits") == "0");
  BOOST_TEST(field(fresh, "error") == "none");
  BOOST_TEST(field(fresh, "device_id") == std::to_string(d1.device_id()));
  auto* pools = fresh.find("pools");
  BOOST_TEST_REQUIRE(pools != nullptr);
  BOOST_TEST_REQUIRE(pools->items().size() == 2u);
  BOOST_TEST(field(pools->items()[1], "mode") == "device_only");

  auto release = block_runner(b, d0);
  b.will_wait_for(b.make_context(d1), b.all_work(d0));
  b.schedule_task(d1, {"t1", [] {}});
  b.schedule_task(d1, {"t2", [] {}});
  auto busy = b.get_debug_info(d1);
  BOOST_TEST(num_field(busy, "scheduled") == 3u); // the wait plus two tasks
  BOOST_TEST(num_field(busy, "finished") == 0u);
  BOOST_TEST(num_field(busy, "queue_length") == 3u);
  BOOST_TEST(num_field(busy, "pending_waits") == 1u);
  BOOST_TEST(d1.get_runner().queue_length() == 3u);
  auto busy0 = b.get_debug_info(d0);
  BOOST_TEST(num_field(busy0, "queue_length") == 1u);
  release->open();
  bounded([&] { b.await(d1); });
  auto after = b.get_debug_info(d1);
  BOOST_TEST(num_field(after, "finished") == 3u);
  BOOST_TEST(num_field(after, "queue_length") == 0u);
  BOOST_TEST(num_field(after, "pending_waits") == 0u);
  BOOST_TEST(field(after, "error") == "none");
}

BOOST_AUTO_TEST_CASE(test_backend_get_global_debug_info_covers_devices_in_use) {
  backend b{backend_options{.num_devices = 4}};
  auto d2 = b.get_device(2), d0 = b.get_device(0);
  b.schedule_task(d2, {"t", [] {}});
  bounded([&] { b.await(d2); });
  auto info = b.get_global_debug_info();
  BOOST_TEST(field(info, "num_devices") == "4");
  BOOST_TEST(field(info, "devices_in_use") == "2");
  auto& devs = info.find("devices")->items();
  BOOST_TEST_REQUIRE(devs.size() == 3u);
  std::set<std::string> names;
  for (std::size_t i = 1; i < devs.size(); ++i) {
    names.insert(field(devs[i], "name"));
    if (field(devs[i], "name") == d2.name())
      BOOST_TEST(field(devs[i], "finished") == "1");
  }
  BOOST_TEST((names == std::set<std::string>{d0.name(), d2.name()}));
  BOOST_TEST((multidev::parse_sexp(info.to_string()) == info));
}

// -- work --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_schedule_task_returns_without_waiting) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto release = block_runner(b, d);
  std::vector<int> order;
  auto kept = std::make_shared<int>(5);
  // The runner is blocked: these calls can only return if they do not wait.
  bounded([&] {
    for (int i = 0; i < 100; ++i)
      b.schedule_task(d, {"t" + std::to_string(i), [&order, i] { order.push_back(i); }, kept});
  });
  BOOST_TEST(order.empty());
  BOOST_TEST(kept.use_count() > 1); // the queued tasks keep it alive
  release->open();
  bounded([&] { b.await(d); });
  BOOST_TEST_REQUIRE(order.size() == 100u);
  for (int i = 0; i < 100; ++i)
    BOOST_TEST(order[static_cast<std::size_t>(i)] == i);
  // Finished tasks no longer hold their keep-alive value.
  BOOST_TEST(kept.use_count() == 1);
  BOOST_CHECK_THROW(b.schedule_task(multidev::device{}, {"x", [] {}}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(test_backend_await_blocks_until_idle) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  bounded([&] { b.await(d); }); // idle device: returns
  auto release = block_runner(b, d);
  std::atomic<int> n{0};
  for (int i = 0; i < 10; ++i)
    b.schedule_task(d, {"inc", [&] { ++n; }});
  auto fut = std::async(std::launch::async, [&] { b.await(d); return n.load(); });
  BOOST_TEST((fut.wait_for(100ms) == std::future_status::timeout));
  release->open();
  BOOST_REQUIRE(fut.wait_for(30s) == std::future_status::ready);
  BOOST_TEST(fut.get() == 10);
  BOOST_TEST(b.is_idle(d));
  // await from a task of the same device cannot wait for itself.
  std::atomic<int> caught{0};
  b.schedule_task(d, {"self-await", [&] {
                        try {
                          b.await(d);
                        } catch (const multidev::deadlock_error&) {
                          caught = 1;
                        }
                      }});
  bounded([&] { b.await(d); });
  BOOST_TEST(caught.load() == 1);
}

BOOST_AUTO_TEST_CASE(test_backend_all_work_covers_work_scheduled_before_the_call) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  auto idle_ev = b.all_work(d);
  BOOST_TEST(b.is_done(idle_ev)); // nothing scheduled yet
  auto release = block_runner(b, d);
  std::atomic<int> n{0};
  b.schedule_task(d, {"inc", [&] { ++n; }});
  auto ev = b.all_work(d);
  BOOST_TEST(ev.seq() == 2u);
  BOOST_TEST(!b.is_done(ev));
  release->open();
  bounded([&] { b.sync(ev); });
  BOOST_TEST(n.load() == 1);
}

BOOST_AUTO_TEST_CASE(test_backend_is_idle_reflects_runner_state) {
  backend b{backend_options{.num_devices = 1}};
  auto d = b.get_device(0);
  BOOST_TEST(b.is_idle(d));
  auto release = block_runner(b, d);
  BOOST_TEST(!b.is_idle(d));
  release->open();
  bounded([&] { b.await(d); });
  BOOST_TEST(b.is_idle(d));
}

// -- printers ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(test_backend_handles_print_as_sexp) {
  backend b{backend_options{.num_devices = 2}};
  auto d = b.get_device(1);

  BOOST_TEST(to_sexp(d.dev()).to_string() == "(dev (driver cpu) (ordinal 1))");

  auto r = to_sexp(d.get_runner());
  BOOST_TEST(r.items().at(0).as_atom() == "runner");
  BOOST_TEST(field(r, "device") == d.name());
  BOOST_TEST(field(r, "queue_length") == "0");
  BOOST_TEST(to_sexp(multidev::runner{}).to_string() == "(runner none)");

  b.schedule_task(d, {"t", [] {}});
  auto ev = b.all_work(d);
  bounded([&] { b.sync(ev); });
  auto e = to_sexp(ev);
  BOOST_TEST(e.items().at(0).as_atom() == "event");
  BOOST_TEST(field(e, "device") == d.name());
  BOOST_TEST(field(e, "seq") == "1");
  BOOST_TEST(field(e, "state") == "done");
  auto release = block_runner(b, d);
  BOOST_TEST(field(to_sexp(b.all_work(d)), "state") == "pending");
  release->open();
  BOOST_TEST(field(to_sexp(multidev::event{}), "device") == "none");
  BOOST_TEST(field(to_sexp(multidev::event{}), "state") == "done");

  auto ds = to_sexp(d);
  BOOST_TEST(ds.items().at(0).as_atom() == "device");
  BOOST_TEST(field(ds, "name") == d.name());
  BOOST_TEST(field(ds, "ordinal") == "1");
  BOOST_TEST(field(ds, "device_id") == std::to_string(d.device_id()));
  BOOST_TEST(field(ds, "next_pool_id") == "1");
  BOOST_TEST(field(ds, "merge_buffer_capacity") == "0");
  BOOST_TEST(ds.find("dev") != nullptr);
  BOOST_TEST(ds.find("runner") != nullptr);
  BOOST_TEST(to_sexp(multidev::device{}).to_string() == "(device none)");

  multidev::tnode t{4, "w", 8, multidev::memory_mode::on_device};
  auto ctx = b.make_context(d, {{t, {1, 0}}});
  auto cs = to_sexp(ctx);
  BOOST_TEST(cs.items().at(0).as_atom() == "context");
  BOOST_TEST(field(cs, "device") == d.name());
  BOOST_TEST(field(cs, "parent") == "none");
  BOOST_TEST(field(cs, "finalized") == "false");
  BOOST_TEST(field(cs, "merge_buffer_node") == "none");
  BOOST_TEST(cs.find("ctx_buffers") != nullptr);
  BOOST_TEST(cs.find("ctx_buffers")->items().size() == 2u);
  auto child = b.make_child(ctx, std::nullopt, std::nullopt, std::optional<multidev::tnode>{t});
  auto chs = to_sexp(child);
  BOOST_TEST(field(chs, "parent") == "some");
  BOOST_TEST(chs.find("merge_buffer_node")->items()[1].find("label") != nullptr);
  // A linked routine: its name, context, and the labels of what it reads and writes.
  auto held = b.alloc_node(b.make_context(d), t);
  auto rs = to_sexp(b.link(held, "scale", {t, 2.0}));
  BOOST_TEST(rs.items().at(0).as_atom() == "routine");
  BOOST_TEST(field(rs, "name") == "scale");
  BOOST_TEST(rs.find("context") != nullptr);
  BOOST_TEST(rs.find("outputs")->to_string() == "(outputs w)");
  BOOST_TEST(field(rs, "merge_buffer_input") == "none");

  b.alloc_pool(d, 0, 16, 64);
  multidev::buffer_ptr p = *d.merge_buffer();
  auto ps = multidev::to_sexp(p);
  BOOST_TEST_REQUIRE(ps.is_atom());
  BOOST_TEST(std::stoull(ps.as_atom(), nullptr, 16) == reinterpret_cast<std::uintptr_t>(p));

  auto ts = to_sexp(multidev::task{"my task", [] {}, std::make_shared<int>(1)});
  BOOST_TEST(field(ts, "description") == "my task");
  BOOST_TEST(field(ts, "keeps_alive") == "true");

  // Everything parses back to what was printed.
  for (const auto& s : {to_sexp(d.dev()), r, e, ds, cs, chs, ps, ts})
    BOOST_TEST((multidev::parse_sexp(s.to_string()) == s));
  bounded([&] { b.await(d); });
}
