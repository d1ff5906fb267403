#!/usr/bin/env bash
# Certificates for the TLS tests and bench/tls_cost.sh, made with Debian's openssl (EC P-256,
# valid for 2 days). Writes into DIR (created if missing), each as NAME.pem + NAME.key:
#   ca              the test CA
#   server          server certificate for 127.0.0.1 (IP SAN) and localhost, signed by ca
#   client-alice    client certificate, SAN DNS:alice (principal "alice"), signed by ca
#   client-bob      client certificate, CN bob and no SAN (principal "bob"), signed by ca
#   client-expired  client certificate signed by ca that has expired
#   other-ca        another CA
#   other-server    server certificate for 127.0.0.1 signed by other-ca (rotation tests)
#   client-other    client certificate signed by other-ca
#   tools/make_test_certs.sh DIR
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

ca() { # NAME CN
  key "$1"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -subj "/CN=$2" -days 2 \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}

leaf() { # NAME CN ISSUER DAYS USAGE [SAN]
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "extendedKeyUsage=$5"
    [[ -n ${6:-} ]] && echo "subjectAltName=$6"
  } >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days "$4" \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca "hgemm test CA"
ca other-ca "another CA"
leaf server 127.0.0.1 ca 2 serverAuth "IP:127.0.0.1,DNS:localhost"
leaf other-server 127.0.0.1 other-ca 2 serverAuth "IP:127.0.0.1,DNS:localhost"
leaf client-alice alice ca 2 clientAuth "DNS:alice"
leaf client-bob bob ca 2 clientAuth
leaf client-expired expired ca -1 clientAuth "DNS:expired"
leaf client-other mallory other-ca 2 clientAuth "DNS:mallory"
rm -f ./*.srl
