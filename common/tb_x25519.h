/*
 * tbrdma common layer: X25519 Diffie-Hellman (RFC 7748).
 *
 * Lets a process prove it is one particular party, not only a member of the
 * job: its public key is its identity, and a key two parties share comes
 * from one's private key and the other's public key.  Written from the RFC,
 * like tb_sha256, so the transport needs no crypto library on either
 * platform; constant time in the private key.  Not on the data path.
 */
#ifndef TB_X25519_H
#define TB_X25519_H

#include <stdint.h>

#define TB_X25519_SIZE 32u

/* out = X25519(scalar, point); the scalar is clamped as the RFC says. */
void tb_x25519(uint8_t out[TB_X25519_SIZE], const uint8_t scalar[TB_X25519_SIZE],
               const uint8_t point[TB_X25519_SIZE]);

/* A new key pair from the system's random source: 0, or -1 with errno. */
int tb_x25519_keypair(uint8_t pub[TB_X25519_SIZE], uint8_t priv[TB_X25519_SIZE]);

/* The secret mine shares with the owner of theirs: 0, or -1 when theirs is
 * a point of small order (the result would be known to anyone). */
int tb_x25519_shared(uint8_t out[TB_X25519_SIZE], const uint8_t mine[TB_X25519_SIZE],
                     const uint8_t theirs[TB_X25519_SIZE]);

#endif /* TB_X25519_H */
