#!/bin/sh
# Regenerates the test key pairs for tests/auth.rs (openssl only). The keys are test
# fixtures, never used outside the tests. Writes, per key: <name>.pem (PKCS#8 private key),
# <name>.pub.pem (public key) and <name>.jwk.json (public JWK without kid/alg; tests add them).
set -eu
cd "$(dirname "$0")"

b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
# The last $1 bytes of stdin.
tail_bytes() { tail -c "$1"; }

rsa() {
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1.pem" 2>/dev/null
    openssl pkey -in "$1.pem" -pubout -out "$1.pub.pem"
    n=$(openssl rsa -in "$1.pem" -noout -modulus | sed 's/^Modulus=//' | xxd -r -p | b64url)
    printf '{"kty":"RSA","n":"%s","e":"AQAB"}\n' "$n" >"$1.jwk.json"
}

ec() { # name curve crv coordinate-bytes
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:"$2" -out "$1.pem"
    openssl pkey -in "$1.pem" -pubout -out "$1.pub.pem"
    point=$(openssl pkey -in "$1.pem" -pubout -outform DER | tail_bytes $(($4 * 2)) | xxd -p | tr -d '\n')
    x=$(printf '%s' "$point" | cut -c1-$(($4 * 2)) | xxd -r -p | b64url)
    y=$(printf '%s' "$point" | cut -c$(($4 * 2 + 1))- | xxd -r -p | b64url)
    printf '{"kty":"EC","crv":"%s","x":"%s","y":"%s"}\n' "$3" "$x" "$y" >"$1.jwk.json"
}

ed() {
    openssl genpkey -algorithm ED25519 -out "$1.pem"
    openssl pkey -in "$1.pem" -pubout -out "$1.pub.pem"
    x=$(openssl pkey -in "$1.pem" -pubout -outform DER | tail_bytes 32 | b64url)
    printf '{"kty":"OKP","crv":"Ed25519","x":"%s"}\n' "$x" >"$1.jwk.json"
}

rsa rsa_a
rsa rsa_b
ec ec_p256 P-256 P-256 32
ec ec_p384 P-384 P-384 48
ed ed25519
