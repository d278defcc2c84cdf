#pragma once
/// \file
/// A node's port, with a bound on what a peer that has not authenticated
/// costs (issue 38 point 3; docs/design.md, "Unauthenticated connections").
///
/// CAF 0.17's BASP broker sizes its read buffer from the header's payload
/// length before reading the payload (basp_broker.cpp, `new_data_msg`:
/// `configure_read(exactly(payload_len))`; stream.cpp `prepare_next_read`
/// resizes the buffer to it): one 32-byte header claiming ~4 GiB makes the
/// node allocate and zero 4 GiB. It has no handshake timeout; its acceptor
/// spins when `accept` fails for want of descriptors (the pending connection
/// keeps the listening socket readable); and an accepted TLS connection
/// whose peer sends nothing spins the multiplexer (below).
///
/// `publish_guarded` listens with a doorman of ours in place of CAF's, whose
/// connections wrap CAF's stream (plain TCP) or CAF's TLS session (as
/// tls_middleman.cpp does) and read each BASP header before the broker does.
/// Until the peer is *admitted* (`admit_peer`: its node opened a session
/// with the cookie, or a client that did vouched for it, and this is the
/// connection that carried its node's handshake first), a connection:
/// - is closed, before anything is allocated for it, at a header whose
///   payload exceeds `max_unauthenticated_payload`, or when it sends more
///   than `max_unauthenticated_messages` headers a second (a burst of as
///   many);
/// - is closed once `handshake_timeout` passed since it was accepted;
/// - counts against `max_unauthenticated`: a new connection past it closes
///   the oldest such one.
/// The peer's node id is read from its BASP handshake (client or server:
/// both payloads start with it). An admitted connection is never looked at
/// again: its reads cost one flag test more than CAF's.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/node_id.hpp>

#include <cstdint>
#include <set>
#include <string>

#include <multidev/protocol.hpp>

namespace multidev::detail {

/// Records that node `n` may use the port of `sys`'s node without the
/// limits above, over the one connection that carried `n`'s BASP handshake
/// first and is still open (CAF's route to `n`; thread safe; called by the
/// node actor). A second connection claiming `n`'s id stays held to the
/// limits: admission is a connection's, not a node id's. `n` is forgotten
/// when that connection closes.
void admit_peer(const caf::actor_system& sys, const caf::node_id& n);

/// Undoes `admit_peer(sys, n)` (no session of `n`'s is left): a connection
/// admitted already stays so until it closes.
void forget_peer(const caf::actor_system& sys, const caf::node_id& n);

/// Publishes `whom` (whose interface is `sigs`) on `address:port` through
/// the guarded doorman, over TLS when `whom`'s system has the OpenSSL
/// manager. Returns the port.
caf::expected<uint16_t> publish_guarded(const caf::actor& whom, std::set<std::string> sigs,
                                        uint16_t port, const std::string& address,
                                        const node_transport_limits& limits);

} // namespace multidev::detail
