// ThreadSanitizer annotations for the hand-offs it cannot see.
//
// CAF 0.17 comes from Debian, built without -fsanitize=thread: its mailboxes
// and scheduler hand a message, or a freshly spawned actor, from one thread
// to another through atomics ThreadSanitizer never sees. Where this project
// writes data on one thread and reads it on another only through such a
// hand-off, the writer calls `tsan_release(key)` after its last write and
// the reader `tsan_acquire(key)` before its first read, `key` being an
// address both sides know. Without ThreadSanitizer both compile to nothing.
#pragma once

#include <string>
#include <utility>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace multidev::detail {

inline void tsan_release([[maybe_unused]] const void* key) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(key));
#endif
}

inline void tsan_acquire([[maybe_unused]] const void* key) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(const_cast<void*>(key));
#endif
}

/// One turn of an actor whose handlers share state: CAF runs them one at a
/// time, but a turn may run on another worker than the one before it. Made
/// first in each handler (and the init function) that touches that state,
/// with the actor as `key`: acquires now, releases when the handler returns.
class tsan_turn {
public:
  explicit tsan_turn(const void* key) noexcept : key_(key) { tsan_acquire(key_); }
  tsan_turn(const tsan_turn&) = delete;
  tsan_turn& operator=(const tsan_turn&) = delete;
  ~tsan_turn() { tsan_release(key_); }

private:
  const void* key_;
};

/// Text a handler returns to a requester that reads it on another thread
/// through CAF's mailbox (a local `request`): released at its characters,
/// which a move keeps in place; the reader calls `tsan_acquire(t.data())`
/// before reading or destroying it. A short string lives inside the
/// message, which CAF moves: TSan sees that side as CAF's.
inline std::string handed_off_text(std::string s) noexcept {
  tsan_release(s.data());
  return s;
}

#if defined(__SANITIZE_THREAD__)

/// See `handed_off`.
template <class Sig, class F>
class handed_off_fn;

template <class R, class... Args, class F>
class handed_off_fn<R(Args...), F> {
public:
  explicit handed_off_fn(F f) : f_(std::move(f)) { tsan_release(this); }
  // A copy may be made on another thread than the original: it acquires at
  // the original's address before reading it.
  handed_off_fn(const handed_off_fn& x) : f_((tsan_acquire(&x), x.f_)) { tsan_release(this); }
  handed_off_fn(handed_off_fn&& x) noexcept : f_((tsan_acquire(&x), std::move(x.f_))) {
    tsan_release(this);
  }
  handed_off_fn& operator=(const handed_off_fn&) = delete;
  ~handed_off_fn() { tsan_acquire(this); } // before the members go
  R operator()(Args... xs) {
    tsan_acquire(this);
    return f_(std::forward<Args>(xs)...);
  }

private:
  F f_;
};

/// `f`, of signature `Sig`, for a handler CAF stores on one thread and calls
/// on another (a response handler given to `then`: the actor may handle the
/// response on another worker). Each copy releases at its own address and
/// the call (or a copy) acquires there first, so what the stored copy
/// captured reaches the call. Without ThreadSanitizer: `f` itself.
template <class Sig, class F>
handed_off_fn<Sig, F> handed_off(F f) {
  return handed_off_fn<Sig, F>{std::move(f)};
}

#else

template <class Sig, class F>
F handed_off(F f) {
  return f;
}

#endif

} // namespace multidev::detail
