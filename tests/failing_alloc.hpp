#pragma once
/// \file
/// Replaces the global operator new of the test binary that includes it (in
/// one source only): an armed countdown on one thread makes the k-th
/// allocation from now on that thread throw `std::bad_alloc`. The includer
/// silences GCC's -Wmismatched-new-delete before its first include: the
/// replacements use malloc and free, which GCC cannot see through when it
/// inlines them into the standard allocators.

#include <cstdlib>
#include <new>

namespace test_support {
/// 0: off. k > 0: the k-th allocation from now on this thread fails.
inline thread_local int alloc_countdown = 0;
} // namespace test_support

void* operator new(std::size_t n) {
  if (test_support::alloc_countdown > 0 && --test_support::alloc_countdown == 0)
    throw std::bad_alloc{};
  if (void* p = std::malloc(n == 0 ? 1 : n))
    return p;
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
