/*
 * tbrdma host engine, client side: a rank's side of the host engine (daemon/tb_engine.h).
 *
 * tb_eclient_attach finds the job's engine on this host through its private
 * directory (<tmpdir>/tbrdma-<uid>/<job>@<host>, mode 0700), starting it
 * when it is not running yet: the ranks of a host take a lock there, the
 * first one creates the job's key and starts the engine, every one then
 * attaches with the key and its shared memory.  The engine's output goes to
 * engine.log in that directory (what matters reaches the ranks as records).
 *
 * Sends are copied into the ring at once (complete on return).  Records from
 * the engine are delivered by tb_eclient_progress, which also notices the
 * engine's death (its socket closes) and reports it once.
 *
 * Not thread safe: the caller serialises all calls.
 */
#ifndef TB_ECLIENT_H
#define TB_ECLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "tb_eproto.h"

typedef struct tb_eclient tb_eclient_t;

typedef struct tb_eclient_params {
    const char *tmpdir;      /* where the private directory goes ("" or NULL: /tmp) */
    const char *job;         /* the job's name: the same for its ranks, unique per job */
    const char *host;        /* this host's name */
    uint32_t vpid;           /* this rank */
    uint64_t ring_size;      /* bytes of each ring (power of two, >= TB_ENGINE_MIN_RING) */
    const char *engine_path; /* the tbrdma-engine program */
    char *const *engine_args; /* options for it (NULL-terminated, may be NULL) */
    uint64_t timeout_ns;     /* for the lock, the engine's start and the attach */
} tb_eclient_params_t;

enum {
    TB_ECLIENT_OK = 0,
    TB_ECLIENT_ERROR = -1, /* err says what failed and what to do */
    TB_ECLIENT_NODEV = -2, /* the engine has no usable device; err says why */
};

int tb_eclient_attach(const tb_eclient_params_t *p, tb_eclient_t **out, char *err, size_t errlen);

/* What the engine said at attach: its identity and devices. */
const tb_wire_eattach_reply_t *tb_eclient_info(const tb_eclient_t *c);

/* The job's directory on this host (for messages). */
const char *tb_eclient_dir(const tb_eclient_t *c);

/* Records to the engine.  0, -EAGAIN (ring full: retry after progress),
 * -EMSGSIZE, or -EPIPE (the engine is gone). */
int tb_eclient_route(tb_eclient_t *c, uint16_t route, const tb_wire_eroute_t *rt);
int tb_eclient_jobkey(tb_eclient_t *c, const uint8_t *key);
/* The job's table of hosts (n entries, as tb_wire_ehost_t says). */
int tb_eclient_hosts(tb_eclient_t *c, const tb_wire_ehost_t *hosts, size_t n);
/* A message for rank dst, which the job published as process dst_pid: the
 * engines deliver it to that process only. */
int tb_eclient_sendv(tb_eclient_t *c, uint16_t route, uint32_t dst, uint32_t dst_pid,
                     uint8_t tag, const struct iovec *iov, int iovcnt);
/* Fast path: room for len bytes of a message in the ring, or NULL (use
 * tb_eclient_sendv to learn why).  Then commit or cancel. */
void *tb_eclient_send_begin(tb_eclient_t *c, uint16_t route, uint32_t dst, uint32_t dst_pid,
                            uint8_t tag, size_t len);
void tb_eclient_send_commit(tb_eclient_t *c);
void tb_eclient_send_cancel(tb_eclient_t *c);

typedef struct tb_eclient_handlers {
    /* A message from rank src through the engine's link peer (announced
     * before by peer, or TB_ELINK_LOCAL + device), with TB_ELINK_HOST when
     * it was sent over a host-wide route (tb_wire.h).  src_pid is the
     * sending process as its engine saw it attach: it is rank src only if
     * the job published that pid for src. */
    void (*recv)(void *ctx, uint16_t peer, uint32_t src, uint32_t src_pid, uint8_t tag,
                 const void *data, size_t len);
    void (*peer)(void *ctx, uint16_t peer, const tb_wire_epeer_t *info);
    /* The process pid, attached as rank vpid behind peer, died (or, with
     * the pid a send named, is not there). */
    void (*gone)(void *ctx, uint16_t peer, uint32_t vpid, uint32_t pid, const char *why);
    /* The link peer ended: closed (its ranks all finalized) or failed. */
    void (*down)(void *ctx, uint16_t peer, bool closed, const char *why);
    /* This host's engine is gone (reported once). */
    void (*engine_lost)(void *ctx, const char *why);
} tb_eclient_handlers_t;

/* Deliver what the engine sent, at most max records.  The number handled. */
int tb_eclient_progress(tb_eclient_t *c, const tb_eclient_handlers_t *h, void *ctx, uint64_t now,
                        int max);

/* true while the engine is there. */
bool tb_eclient_alive(const tb_eclient_t *c);

/* Say BYE (everything sent before it still goes out), close, unmap. */
void tb_eclient_detach(tb_eclient_t *c);

#endif /* TB_ECLIENT_H */
