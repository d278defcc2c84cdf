#!/usr/bin/env bash
# Makes test certificates for TLS between multidev nodes (not for production):
#   OUT/ca.pem, OUT/ca.key        a CA
#   OUT/node.pem, OUT/node.key    a certificate it signed, for 127.0.0.1/localhost
#   OUT/rogue-ca.pem, OUT/rogue.pem, OUT/rogue.key
#                                 a certificate of another CA (must be refused)
# Usage: scripts/make-test-certs.sh OUT
# Then: multidev node --tls-cert OUT/node.pem --tls-key OUT/node.key --tls-ca OUT/ca.pem
#       multidev run S.scn --node b=127.0.0.1:P --tls-cert OUT/node.pem \
#         --tls-key OUT/node.key --tls-ca OUT/ca.pem
set -euo pipefail
out=${1:?usage: make-test-certs.sh OUT}
mkdir -p "$out"
cd "$out"
ca() { # NAME: a self-signed CA
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.pem" 2>/dev/null
}
leaf() { # NAME CA: a certificate for 127.0.0.1 signed by CA
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
    -days 30 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca
leaf node ca
ca rogue-ca
leaf rogue rogue-ca
echo "test certificates in $out: ca.pem, node.pem/node.key, rogue.pem/rogue.key (other CA)"
