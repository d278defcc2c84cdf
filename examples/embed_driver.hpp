#pragma once
// The user actor of examples/embed.cpp, in a header so that the tests drive
// it too (tests/test_protocol.cpp). Every step of its message chain handles
// both outcomes, so a failure anywhere reaches whoever asked, as an error,
// instead of leaving their `receive` waiting forever.

#include <caf/event_based_actor.hpp>

#include <multidev/protocol.hpp>

#include <string>

namespace embed {

/// On `schedule_atom`: fills pool 1 of `dev` (`n` floats) with `kernel`
/// (`"fill"` in the example), sums it into result "embed", waits for that
/// seq, and replies with it -- or with the first error on the way.
inline caf::behavior driver(caf::event_based_actor* self, multidev::device_actor dev,
                            uint64_t n, std::string kernel = "fill") {
  using namespace multidev;
  return {[=](atoms::schedule_atom) {
    auto rp = self->make_response_promise();
    auto fail = [rp](caf::error& e) mutable { rp.deliver(std::move(e)); };
    buffer_arg buf{buffer_loc{1, 0}, n * sizeof(float)};
    self->request(dev, caf::infinite, atoms::schedule_atom::value,
                  task_spec{kernel, {buf, 7.0}})
      .then(
        [=](uint64_t) {
          self->request(dev, caf::infinite, atoms::schedule_atom::value,
                        task_spec{"checksum", {buf, std::string{"embed"}}})
            .then(
              [=](uint64_t seq) {
                self->request(dev, caf::infinite, atoms::wait_atom::value, seq)
                  .then([=](uint64_t done) mutable { rp.deliver(done); }, fail);
              },
              fail);
        },
        fail);
    return rp;
  }};
}

} // namespace embed
