#!/usr/bin/env bash
# Make a private CA and certificates for a Dask cluster with TLS (openssl required).
#   ./make-tls-certs.sh DIR [HOSTNAME...]
# Writes DIR/ca.pem, DIR/ca-key.pem and for scheduler, worker and client: NAME.pem,
# NAME-key.pem, signed by the CA, valid 365 days, with the hostnames as subjectAltName.
# The client certificate goes to bigrate through the environment of `bigrate run`:
#   DASK_DISTRIBUTED__COMM__TLS__CA_FILE=DIR/ca.pem
#   DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=DIR/client.pem
#   DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=DIR/client-key.pem
set -euo pipefail
DIR="${1:?usage: make-tls-certs.sh DIR [HOSTNAME...]}"; shift || true
mkdir -p "$DIR"
SAN="DNS:localhost,IP:127.0.0.1"
for h in "$@"; do SAN="$SAN,DNS:$h"; done
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=bigrate-dask-ca" \
  -keyout "$DIR/ca-key.pem" -out "$DIR/ca.pem" 2>/dev/null
for name in scheduler worker client; do
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" \
    -keyout "$DIR/$name-key.pem" -out "$DIR/$name.csr" 2>/dev/null
  printf "subjectAltName=%s\n" "$SAN" > "$DIR/$name.ext"
  openssl x509 -req -in "$DIR/$name.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca-key.pem" \
    -CAcreateserial -days 365 -extfile "$DIR/$name.ext" -out "$DIR/$name.pem" 2>/dev/null
  rm -f "$DIR/$name.csr" "$DIR/$name.ext"
done
chmod 600 "$DIR"/*-key.pem
echo "certificates in $DIR"
