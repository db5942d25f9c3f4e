/*
 * Unit tests of the connection manager over loopback TCP: plain exchange,
 * simultaneous connect in both orders, refusal, unreachable and silent
 * peers; and what a hostile caller can do: malformed, forged, replayed and
 * byte-by-byte requests, probes for the listener's identity, and floods of
 * idle connections.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tb_cable_probe.h"
#include "tb_cm.h"
#include "tb_crc32c.h"
#include "tb_log.h"
#include "tb_sha256.h"
#include "tb_wire.h"

#define MS 1000000ull

typedef struct side {
    tb_cm_t *cm;
    const char *id;
    int refuse;
    unsigned accepts;
    unsigned dones;
    unsigned secret_lookups;
    int done_status;
    void *done_user;
    tb_wire_addr_t done_peer;
    tb_wire_addr_t accept_blob; /* what accept hands out */
    tb_wire_addr_t accept_peer;
    char why[256];
} side_t;

static char logged[8192]; /* what the connection manager warned about */
static const char *bind_netdev; /* the interface sides bind to, if any */

static void log_capture(tb_log_level_t level, const char *msg, void *ctx)
{
    size_t n = strlen(logged);
    (void) level;
    (void) ctx;
    snprintf(logged + n, sizeof(logged) - n, "%s\n", msg);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

/* Every identity of the test's "job" has the secret SHA-256(identity);
 * identities starting with "stranger" are not in the job. */
static void secret_of(const char *id, size_t len, uint8_t *secret)
{
    tb_sha256_t h;
    tb_sha256_init(&h);
    tb_sha256_update(&h, id, len);
    tb_sha256_final(&h, secret);
}

static void blob(tb_wire_addr_t *a, uint64_t epoch)
{
    memset(a, 0, sizeof(*a));
    a->magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
    a->version = TB_WIRE_VERSION;
    a->nlanes = 2;
    a->epoch = tb_wire_le64(epoch);
    a->crc = tb_wire_le32(tb_crc32c(0, a, TB_WIRE_ADDR_SIZE - 4));
}

static int cb_peer_secret(void *ctx, const void *peer_id, size_t id_len, uint8_t *secret)
{
    side_t *s = ctx;
    s->secret_lookups++;
    if (id_len >= 8 && memcmp(peer_id, "stranger", 8) == 0) {
        return -1;
    }
    secret_of(peer_id, id_len, secret);
    return 0;
}

static int cb_accept(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                     tb_wire_addr_t *local, void **user)
{
    side_t *s = ctx;
    (void) peer_id;
    (void) id_len;
    s->accepts++;
    s->accept_peer = *peer;
    if (s->refuse) {
        return -1;
    }
    *local = s->accept_blob;
    *user = &s->accept_blob;
    return 0;
}

static void cb_done(void *ctx, void *user, int status, const tb_wire_addr_t *peer,
                    const char *why)
{
    side_t *s = ctx;
    s->dones++;
    s->done_status = status;
    s->done_user = user;
    if (peer) {
        s->done_peer = *peer;
    }
    snprintf(s->why, sizeof(s->why), "%s", why ? why : "");
}

static void side_init_full(side_t *s, const char *id, uint64_t accept_epoch, uint64_t timeout_ms,
                           uint64_t handshake_ms)
{
    uint8_t secret[TB_WIRE_SECRET_SIZE];
    tb_cm_params_t p = {
        .bind_ip = "127.0.0.1",
        .bind_netdev = bind_netdev,
        .id = id,
        .id_len = strlen(id),
        .secret = secret,
        .timeout_ns = timeout_ms * MS,
        .handshake_ns = handshake_ms * MS,
        .max_sessions = 16,
        .max_per_source = 8,
    };
    tb_cm_callbacks_t cb = {
        .ctx = s, .peer_secret = cb_peer_secret, .accept = cb_accept, .done = cb_done};

    memset(s, 0, sizeof(*s));
    s->id = id;
    secret_of(id, strlen(id), secret);
    blob(&s->accept_blob, accept_epoch);
    ck_assert_int_eq(tb_cm_create(&p, &cb, &s->cm), TB_CM_OK);
    ck_assert_uint_ne(tb_cm_port(s->cm), 0);
}

static void side_init(side_t *s, const char *id, uint64_t accept_epoch, uint64_t timeout_ms)
{
    side_init_full(s, id, accept_epoch, timeout_ms, 0);
}

/* a asks b ("rank-1") for a connection, offering a blob of epoch in *la. */
static void request(side_t *a, side_t *b, tb_wire_addr_t *la, uint64_t epoch)
{
    blob(la, epoch);
    ck_assert_int_eq(tb_cm_connect(a->cm, "127.0.0.1", tb_cm_port(b->cm), "rank-1", 6, la, a,
                                   now_ns()),
                     TB_CM_OK);
}

/* Progress both until each has its expected number of done callbacks or
 * the wall-clock limit passes. */
static void run(side_t *a, side_t *b, unsigned want_a, unsigned want_b, uint64_t limit_ms)
{
    uint64_t end = now_ns() + limit_ms * MS;
    while ((a->dones < want_a || (b && b->dones < want_b)) && now_ns() < end) {
        tb_cm_progress(a->cm, now_ns());
        if (b) {
            tb_cm_progress(b->cm, now_ns());
        }
        usleep(200);
    }
}

static void spin(side_t *s, unsigned ms)
{
    for (unsigned i = 0; i < ms; i++) {
        tb_cm_progress(s->cm, now_ns());
        usleep(1000);
    }
}

static int raw_connect(uint16_t port)
{
    struct sockaddr_in sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *) &sin, sizeof(sin)), 0);
    return fd;
}

/* Progress s while reading n bytes on fd: n, or -1 if the socket closed
 * first, or what arrived when limit_ms passed. */
static ssize_t raw_read(side_t *s, int fd, void *buf, size_t n, uint64_t limit_ms)
{
    size_t got = 0;
    uint64_t end = now_ns() + limit_ms * MS;

    while (got < n && now_ns() < end) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        tb_cm_progress(s->cm, now_ns());
        if (poll(&pfd, 1, 1) == 1) {
            ssize_t r = recv(fd, (uint8_t *) buf + got, n - got, 0);
            if (r <= 0) {
                return -1;
            }
            got += (size_t) r;
        }
    }
    return (ssize_t) got;
}

/* A hand-made requester: it speaks the protocol of tb_wire.h itself, so the
 * tests can make it lie. */
typedef struct raw {
    int fd;
    uint8_t nonce_r[TB_WIRE_CM_NONCE];
    uint8_t nonce_s[TB_WIRE_CM_NONCE];
    uint8_t key[TB_CM_KEY_SIZE];
    tb_wire_cm_request_t req;
} raw_t;

static void raw_hdr(tb_wire_cm_hdr_t *h, uint8_t type)
{
    h->magic = tb_wire_le32(TB_WIRE_CM_MAGIC);
    h->version = TB_WIRE_CM_VERSION;
    h->type = type;
    h->reserved = 0;
}

static void raw_mac(const raw_t *r, const char *label, const void *extra, size_t extra_len,
                    const void *msg, size_t len, uint8_t *mac)
{
    tb_hmac_t h;
    tb_hmac_init(&h, r->key, sizeof(r->key));
    tb_hmac_update(&h, label, strlen(label) + 1);
    tb_hmac_update(&h, r->nonce_r, sizeof(r->nonce_r));
    tb_hmac_update(&h, r->nonce_s, sizeof(r->nonce_s));
    tb_hmac_update(&h, extra, extra_len);
    tb_hmac_update(&h, msg, len);
    tb_hmac_final(&h, mac);
}

/* Connect to s, send HELLO, read the CHALLENGE into r.  0, or -1. */
static int raw_hello(side_t *s, raw_t *r)
{
    tb_wire_cm_nonce_msg_t m;

    memset(r, 0, sizeof(*r));
    r->fd = raw_connect(tb_cm_port(s->cm));
    memset(&m, 0, sizeof(m));
    raw_hdr(&m.hdr, TB_CM_MSG_HELLO);
    for (unsigned i = 0; i < sizeof(m.nonce); i++) {
        m.nonce[i] = r->nonce_r[i] = (uint8_t) (rand() & 0xff);
    }
    ck_assert_int_eq(send(r->fd, &m, sizeof(m), 0), (ssize_t) sizeof(m));
    if (raw_read(s, r->fd, &m, sizeof(m), 2000) != (ssize_t) sizeof(m)) {
        return -1;
    }
    ck_assert_int_eq(m.hdr.type, TB_CM_MSG_CHALLENGE);
    memcpy(r->nonce_s, m.nonce, sizeof(r->nonce_s));
    return 0;
}

/* Build a REQUEST from identity id to target with blob epoch, keyed as if id
 * had the secret claimed_secret (NULL: id's real one). */
static void raw_build(raw_t *r, const char *id, const char *target, uint64_t epoch,
                      const uint8_t *claimed_secret)
{
    uint8_t sa[TB_WIRE_SECRET_SIZE], sb[TB_WIRE_SECRET_SIZE];

    secret_of(id, strlen(id), sa);
    secret_of(target, strlen(target), sb);
    tb_cm_pair_key(id, strlen(id), claimed_secret ? claimed_secret : sa, target, strlen(target),
                   sb, r->key);
    memset(&r->req, 0, sizeof(r->req));
    raw_hdr(&r->req.hdr, TB_CM_MSG_REQUEST);
    r->req.id_len = (uint8_t) strlen(id);
    r->req.peer_id_len = (uint8_t) strlen(target);
    memcpy(r->req.id, id, strlen(id));
    memcpy(r->req.peer_id, target, strlen(target));
    blob(&r->req.addr, epoch);
    raw_mac(r, "TBCM request", NULL, 0, &r->req, offsetof(tb_wire_cm_request_t, mac),
            r->req.mac);
}

/* Send r->req (already built) and read the REPLY: its status, or -1 if the
 * socket closed first.  A reply must carry a mac that proves the target. */
static int raw_send_request(side_t *s, raw_t *r)
{
    tb_wire_cm_reply_t rep;
    uint8_t mac[TB_WIRE_CM_MAC];

    ck_assert_int_eq(send(r->fd, &r->req, sizeof(r->req), 0), (ssize_t) sizeof(r->req));
    if (raw_read(s, r->fd, &rep, sizeof(rep), 2000) != (ssize_t) sizeof(rep)) {
        return -1;
    }
    raw_mac(r, "TBCM reply", r->req.mac, sizeof(r->req.mac), &rep,
            offsetof(tb_wire_cm_reply_t, mac), mac);
    ck_assert_int_eq(memcmp(mac, rep.mac, sizeof(mac)), 0);
    return rep.status;
}

/* The whole exchange as identity id: the reply's status or -1. */
static int raw_exchange(side_t *s, const char *id, uint64_t epoch, const uint8_t *claimed_secret)
{
    raw_t r;
    int st;

    if (raw_hello(s, &r) != 0) {
        close(r.fd);
        return -1;
    }
    raw_build(&r, id, s->id, epoch, claimed_secret);
    st = raw_send_request(s, &r);
    close(r.fd);
    return st;
}

START_TEST(test_exchange)
{
    side_t a, b;
    tb_wire_addr_t la;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    request(&a, &b, &la, 0xa1);
    run(&a, &b, 1, 1, 3000);
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_int_eq(a.done_status, TB_CM_OK);
    ck_assert_ptr_eq(a.done_user, &a);
    ck_assert_int_eq(memcmp(&a.done_peer, &b.accept_blob, sizeof(la)), 0);
    ck_assert_uint_eq(b.accepts, 1);
    ck_assert_uint_eq(b.dones, 1);
    ck_assert_int_eq(b.done_status, TB_CM_OK);
    ck_assert_ptr_eq(b.done_user, &b.accept_blob);
    ck_assert_int_eq(memcmp(&b.done_peer, &la, sizeof(la)), 0);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

/* Owners that sleep between passes (the host engine) wake for every step of
 * an exchange on the sockets tb_cm_poll_fds names: the exchange completes
 * without one sleep running out. */
START_TEST(test_sleeping_owners)
{
    side_t a, b;
    tb_wire_addr_t la;
    unsigned timeouts = 0, wakes = 0;
    uint64_t end = now_ns() + 5000 * MS;

    side_init(&a, "rank-0", 0xa0, 4000);
    side_init(&b, "rank-1", 0xb0, 4000);
    request(&a, &b, &la, 0xa1);
    while ((a.dones < 1 || b.dones < 1) && now_ns() < end) {
        struct pollfd fds[32];
        uint64_t wake = UINT64_MAX, now;
        unsigned n = tb_cm_poll_fds(a.cm, fds, 16, &wake);
        int ms = 1000;
        n += tb_cm_poll_fds(b.cm, fds + n, 16, &wake);
        ck_assert_uint_ge(n, 2); /* both listeners */
        now = now_ns();
        if (wake != UINT64_MAX) {
            ck_assert_uint_le(wake, now + 4000 * MS); /* no later than the deadline */
        }
        if (0 == poll(fds, n, ms)) {
            timeouts++;
        }
        wakes++;
        /* The idle throttle (1 ms between passes without exchanges). */
        usleep(1100);
        tb_cm_progress(a.cm, now_ns());
        tb_cm_progress(b.cm, now_ns());
    }
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_int_eq(a.done_status, TB_CM_OK);
    ck_assert_uint_eq(b.dones, 1);
    ck_assert_uint_eq(timeouts, 0);
    ck_assert_uint_gt(wakes, 1);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

/* After a collision the loser's own request can reach the winner once the
 * winner's exchange is complete: a request from the same identity with the
 * blob the winner already holds is that leftover, refused without
 * reaching the owner; one with a new blob is a new connection. */
START_TEST(test_collision_leftover)
{
    side_t a, b;
    tb_wire_addr_t la;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    request(&a, &b, &la, 0xa1);
    run(&a, &b, 1, 1, 3000);
    ck_assert_int_eq(a.done_status, TB_CM_OK);
    ck_assert_int_eq(raw_exchange(&a, "rank-1", 0xb0, NULL), TB_CM_R_COLLISION);
    ck_assert_uint_eq(a.accepts, 0);
    ck_assert_int_eq(raw_exchange(&a, "rank-1", 0xb2, NULL), TB_CM_R_ACCEPT);
    ck_assert_uint_eq(a.accepts, 1);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

/* A and B request each other at once; first_a chooses who progresses
 * first.  Each must finish its own request once, with the blob of the
 * other's request, and nobody's accept callback runs. */
static void simultaneous(int first_a, int a_small)
{
    side_t a, b;
    tb_wire_addr_t la, lb;
    uint64_t end = now_ns() + 3000 * MS;

    side_init(&a, a_small ? "A" : "Z", 0xa0, 2000);
    side_init(&b, "M", 0xb0, 2000);
    blob(&la, 0xa1);
    blob(&lb, 0xb1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", tb_cm_port(b.cm), "M", 1, &la, &a,
                                   now_ns()),
                     TB_CM_OK);
    ck_assert_int_eq(tb_cm_connect(b.cm, "127.0.0.1", tb_cm_port(a.cm), a.id, 1, &lb, &b,
                                   now_ns()),
                     TB_CM_OK);
    while ((a.dones < 1 || b.dones < 1) && now_ns() < end) {
        side_t *x = first_a ? &a : &b, *y = first_a ? &b : &a;
        tb_cm_progress(x->cm, now_ns());
        tb_cm_progress(x->cm, now_ns());
        usleep(500);
        tb_cm_progress(y->cm, now_ns());
        usleep(500);
    }
    /* Let late leftovers arrive: they must not produce callbacks. */
    for (int i = 0; i < 50; i++) {
        tb_cm_progress(a.cm, now_ns());
        tb_cm_progress(b.cm, now_ns());
        usleep(1000);
    }
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_uint_eq(b.dones, 1);
    ck_assert_msg(a.done_status == TB_CM_OK, "A: %s", a.why);
    ck_assert_msg(b.done_status == TB_CM_OK, "B: %s", b.why);
    ck_assert_ptr_eq(a.done_user, &a);
    ck_assert_ptr_eq(b.done_user, &b);
    ck_assert_int_eq(memcmp(&a.done_peer, &lb, sizeof(lb)), 0);
    ck_assert_int_eq(memcmp(&b.done_peer, &la, sizeof(la)), 0);
    ck_assert_uint_eq(a.accepts, 0);
    ck_assert_uint_eq(b.accepts, 0);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}

START_TEST(test_simultaneous_a_first_a_wins)
{
    simultaneous(1, 1);
}
END_TEST

START_TEST(test_simultaneous_b_first_a_wins)
{
    simultaneous(0, 1);
}
END_TEST

START_TEST(test_simultaneous_a_first_b_wins)
{
    simultaneous(1, 0);
}
END_TEST

START_TEST(test_simultaneous_b_first_b_wins)
{
    simultaneous(0, 0);
}
END_TEST

START_TEST(test_refused)
{
    side_t a, b;
    tb_wire_addr_t la;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    b.refuse = 1;
    request(&a, &b, &la, 0xa1);
    run(&a, &b, 1, 0, 3000);
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_int_eq(a.done_status, TB_CM_EREFUSED);
    ck_assert_uint_eq(b.accepts, 1);
    ck_assert_uint_eq(b.dones, 0);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

/* The process at the address is not the one asked for (a stale address,
 * another job): it cannot prove the identity, so it is refused, not trusted. */
START_TEST(test_wrong_peer)
{
    side_t a, b;
    tb_wire_addr_t la;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-7", 0xb0, 2000);
    request(&a, &b, &la, 0xa1);
    run(&a, &b, 1, 0, 3000);
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_msg(a.done_status == TB_CM_ECLOSED, "status %d: %s", a.done_status, a.why);
    ck_assert_uint_eq(b.accepts, 0);
    ck_assert_uint_ge(tb_cm_counters(b.cm)->refused_unauth, 1);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

/* A responder that answers with a reply it cannot authenticate (it has not
 * the key of the identity asked for) is not believed. */
START_TEST(test_impostor_responder)
{
    side_t a;
    tb_wire_addr_t la;
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    int lfd = socket(AF_INET, SOCK_STREAM, 0), fd;
    tb_wire_cm_nonce_msg_t m;
    tb_wire_cm_request_t req;
    tb_wire_cm_reply_t rep;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *) &sin, sizeof(sin)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *) &sin, &slen), 0);
    side_init(&a, "rank-0", 0xa0, 2000);
    blob(&la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", ntohs(sin.sin_port), "rank-1", 6, &la, &a,
                                   now_ns()),
                     TB_CM_OK);
    spin(&a, 20);
    fd = accept(lfd, NULL, NULL);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(raw_read(&a, fd, &m, sizeof(m), 2000), (ssize_t) sizeof(m));
    raw_hdr(&m.hdr, TB_CM_MSG_CHALLENGE);
    ck_assert_int_eq(send(fd, &m, sizeof(m), 0), (ssize_t) sizeof(m));
    ck_assert_int_eq(raw_read(&a, fd, &req, sizeof(req), 2000), (ssize_t) sizeof(req));
    memset(&rep, 0, sizeof(rep));
    raw_hdr(&rep.hdr, TB_CM_MSG_REPLY);
    blob(&rep.addr, 0x66);
    memset(rep.mac, 0x42, sizeof(rep.mac));
    ck_assert_int_eq(send(fd, &rep, sizeof(rep), 0), (ssize_t) sizeof(rep));
    run(&a, NULL, 1, 0, 2000);
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_int_eq(a.done_status, TB_CM_EWRONGPEER);
    close(fd);
    close(lfd);
    tb_cm_destroy(a.cm);
}
END_TEST

/* Connection managers bound to an interface (the loopback one here) talk as
 * before; a probe through that interface finds the listener, a port nobody
 * listens on refuses, an interface that does not exist cannot be tried; and
 * the listener's owner hears nothing of a probe (no refusal logged). */
START_TEST(test_bound_to_interface)
{
    side_t a, b;
    tb_wire_addr_t la;
    tb_cable_probe_t pr[3];
    uint16_t closed;
    int fd;
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);

    bind_netdev = "lo";
    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    bind_netdev = NULL;
    /* A port that was free a moment ago: nobody listens there. */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *) &sin, sizeof(sin)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *) &sin, &len), 0);
    closed = ntohs(sin.sin_port);
    close(fd);
    for (int i = 0; i < 3; ++i) {
        pr[i] = (tb_cable_probe_t){.netdev = "lo",
                                   .src_ipv4 = htonl(INADDR_LOOPBACK),
                                   .dst_ipv4 = htonl(INADDR_LOOPBACK),
                                   .dst_port = tb_cm_port(b.cm)};
    }
    pr[1].dst_port = closed;
    pr[2].netdev = "tbnosuch0";
    logged[0] = '\0';
    tb_cable_probe_run(pr, 3, 2000 * MS);
    ck_assert_int_eq(pr[0].result, TB_PROBE_REACHED);
    ck_assert_int_eq(pr[1].result, TB_PROBE_NO);
    ck_assert_int_eq(pr[1].err, ECONNREFUSED);
    ck_assert_int_eq(pr[2].result, TB_PROBE_UNKNOWN);
    ck_assert_int_ne(pr[2].err, 0);
    spin(&b, 20);
    ck_assert_uint_eq(tb_cm_counters(b.cm)->refused_unauth, 0);
    ck_assert_msg(logged[0] == '\0', "logged: %s", logged);

    request(&a, &b, &la, 0xa1);
    run(&a, &b, 1, 1, 3000);
    ck_assert_int_eq(a.done_status, TB_CM_OK);
    ck_assert_int_eq(b.done_status, TB_CM_OK);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

/* A connection manager for an interface that is not there does not start
 * (unbound, it could take a connection from another cable) and says why. */
START_TEST(test_bound_to_missing_interface)
{
    uint8_t secret[TB_WIRE_SECRET_SIZE] = {1};
    tb_cm_params_t p = {.bind_ip = "127.0.0.1",
                        .bind_netdev = "tbnosuch0",
                        .id = "rank-0",
                        .id_len = 6,
                        .secret = secret,
                        .timeout_ns = 1000 * MS,
                        .max_sessions = 4};
    tb_cm_callbacks_t cb = {.peer_secret = cb_peer_secret, .accept = cb_accept, .done = cb_done};
    tb_cm_t *cm = NULL;

    logged[0] = '\0';
    ck_assert_int_eq(tb_cm_create(&p, &cb, &cm), TB_CM_ESYS);
    ck_assert_ptr_null(cm);
    ck_assert_msg(strstr(logged, "tbnosuch0") != NULL, "logged: %s", logged);
}
END_TEST

START_TEST(test_unreachable)
{
    side_t a, b;
    tb_wire_addr_t la;
    uint16_t port;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    port = tb_cm_port(b.cm);
    tb_cm_destroy(b.cm); /* nobody listens there any more */
    blob(&la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", port, "rank-1", 6, &la, &a, now_ns()),
                     TB_CM_OK);
    run(&a, NULL, 1, 0, 3000);
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_msg(a.done_status == TB_CM_EUNREACH, "status %d: %s", a.done_status, a.why);
    ck_assert_ptr_nonnull(strstr(a.why, "127.0.0.1"));
    tb_cm_destroy(a.cm);
}
END_TEST

/* A listener that accepts the TCP connection and never answers. */
START_TEST(test_silent_peer_times_out)
{
    side_t a;
    tb_wire_addr_t la;
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    uint64_t start;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *) &sin, sizeof(sin)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *) &sin, &slen), 0);
    side_init(&a, "rank-0", 0xa0, 300);
    blob(&la, 0xa1);
    start = now_ns();
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", ntohs(sin.sin_port), "rank-1", 6, &la, &a,
                                   start),
                     TB_CM_OK);
    run(&a, NULL, 1, 0, 3000);
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_int_eq(a.done_status, TB_CM_ETIMEDOUT);
    ck_assert_uint_ge(now_ns() - start, 300 * MS);
    ck_assert_uint_lt(now_ns() - start, 1500 * MS);
    tb_cm_destroy(a.cm);
    close(lfd);
}
END_TEST

/* Garbage of every kind is refused (the socket closed, nothing said) and
 * never reaches the owner; a valid request afterwards still works. */
START_TEST(test_malformed)
{
    side_t b;
    uint8_t junk[240], buf[64];
    raw_t r;
    int fd;

    logged[0] = 0;
    side_init_full(&b, "rank-1", 0xb0, 2000, 300);

    /* a version-1 request (the format before authentication) */
    memset(junk, 0, sizeof(junk));
    junk[0] = 'T', junk[1] = 'B', junk[2] = 'C', junk[3] = 'M', junk[4] = 1, junk[5] = 1;
    junk[7] = 6;
    memcpy(junk + 8, "rank-0", 6);
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, junk, 136, 0), 136);
    ck_assert_int_eq(raw_read(&b, fd, buf, sizeof(buf), 2000), -1);
    close(fd);
    ck_assert_ptr_nonnull(strstr(logged, "another tbrdma version"));
    ck_assert_ptr_nonnull(strstr(logged, "refused an unauthenticated connection request from "
                                         "127.0.0.1"));

    /* bytes that are no HELLO */
    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t) (i * 37 + 11);
    }
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, junk, sizeof(junk), 0), (ssize_t) sizeof(junk));
    ck_assert_int_eq(raw_read(&b, fd, buf, sizeof(buf), 2000), -1);
    close(fd);

    /* identity length beyond the limit */
    ck_assert_int_eq(raw_hello(&b, &r), 0);
    raw_build(&r, "rank-9", "rank-1", 0x91, NULL);
    r.req.id_len = 200;
    ck_assert_int_eq(raw_send_request(&b, &r), -1);
    close(r.fd);

    /* corrupt address blob (CRC), mac recomputed */
    ck_assert_int_eq(raw_hello(&b, &r), 0);
    raw_build(&r, "rank-9", "rank-1", 0x91, NULL);
    r.req.addr.gid[3] ^= 1;
    raw_mac(&r, "TBCM request", NULL, 0, &r.req, offsetof(tb_wire_cm_request_t, mac), r.req.mac);
    ck_assert_int_eq(raw_send_request(&b, &r), -1);
    close(r.fd);

    /* a HELLO where the request belongs */
    ck_assert_int_eq(raw_hello(&b, &r), 0);
    raw_build(&r, "rank-9", "rank-1", 0x91, NULL);
    r.req.hdr.type = TB_CM_MSG_HELLO;
    ck_assert_int_eq(raw_send_request(&b, &r), -1);
    close(r.fd);

    /* half a request, then the requester vanishes */
    ck_assert_int_eq(raw_hello(&b, &r), 0);
    raw_build(&r, "rank-9", "rank-1", 0x91, NULL);
    ck_assert_int_eq(send(r.fd, &r.req, 50, 0), 50);
    spin(&b, 20);
    close(r.fd);
    /* half a request and silence: dropped at the handshake deadline */
    ck_assert_int_eq(raw_hello(&b, &r), 0);
    ck_assert_int_eq(send(r.fd, &r.req, 50, 0), 50);
    ck_assert_int_eq(raw_read(&b, r.fd, buf, sizeof(buf), 2000), -1);
    close(r.fd);
    spin(&b, 20);
    ck_assert_uint_eq(b.accepts, 0);
    ck_assert_uint_eq(b.dones, 0);
    ck_assert_uint_ge(tb_cm_counters(b.cm)->refused_unauth, 6);

    /* a valid request, one byte at a time */
    ck_assert_int_eq(raw_hello(&b, &r), 0);
    raw_build(&r, "rank-9", "rank-1", 0x91, NULL);
    for (size_t i = 0; i < sizeof(r.req); i++) {
        ck_assert_int_eq(send(r.fd, (uint8_t *) &r.req + i, 1, 0), 1);
        tb_cm_progress(b.cm, now_ns());
    }
    {
        tb_wire_cm_reply_t rep;
        ck_assert_int_eq(raw_read(&b, r.fd, &rep, sizeof(rep), 2000), (ssize_t) sizeof(rep));
        ck_assert_int_eq(rep.status, TB_CM_R_ACCEPT);
    }
    close(r.fd);
    ck_assert_uint_eq(b.accepts, 1);
    ck_assert_uint_eq(tb_wire_le64(b.accept_peer.epoch), 0x91);
    for (int i = 0; i < 20 && b.dones == 0; i++) {
        tb_cm_progress(b.cm, now_ns());
        usleep(1000);
    }
    ck_assert_uint_eq(b.dones, 1);
    ck_assert_int_eq(b.done_status, TB_CM_OK);
    tb_cm_destroy(b.cm);
}
END_TEST

/* Regression (hijack): a caller that claims a rank of the job without its
 * secret is refused and logged, the listener's identity is not revealed to
 * it, and the real rank still connects afterwards. */
START_TEST(test_forged_identity)
{
    side_t a, b;
    tb_wire_addr_t la;
    uint8_t wrong[TB_WIRE_SECRET_SIZE];
    raw_t r;

    logged[0] = 0;
    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    memset(wrong, 0x77, sizeof(wrong));
    /* The challenge is all a stranger learns: a header and a nonce. */
    ck_assert_int_eq(raw_hello(&b, &r), 0);
    close(r.fd);
    ck_assert_int_eq(raw_exchange(&b, "rank-0", 0x66, wrong), -1);
    ck_assert_int_eq(raw_exchange(&b, "stranger-5", 0x67, NULL), -1);
    ck_assert_uint_eq(b.accepts, 0);
    ck_assert_uint_eq(tb_cm_counters(b.cm)->refused_unauth, 2);
    ck_assert_ptr_nonnull(strstr(logged, "refused an unauthenticated connection request"));
    request(&a, &b, &la, 0xa1);
    run(&a, &b, 1, 1, 3000);
    ck_assert_int_eq(a.done_status, TB_CM_OK);
    ck_assert_int_eq(memcmp(&b.done_peer, &la, sizeof(la)), 0);
    ck_assert_uint_eq(b.accepts, 1);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

/* A recorded request is worthless on another connection: the responder's
 * nonce differs, so its mac no longer proves anything. */
START_TEST(test_replay)
{
    side_t b;
    raw_t r1, r2;

    side_init(&b, "rank-1", 0xb0, 2000);
    ck_assert_int_eq(raw_hello(&b, &r1), 0);
    raw_build(&r1, "rank-0", "rank-1", 0x91, NULL);
    ck_assert_int_eq(raw_send_request(&b, &r1), TB_CM_R_ACCEPT);
    close(r1.fd);
    ck_assert_int_eq(raw_hello(&b, &r2), 0);
    r2.req = r1.req;
    ck_assert_int_eq(send(r2.fd, &r2.req, sizeof(r2.req), 0), (ssize_t) sizeof(r2.req));
    {
        uint8_t buf[16];
        ck_assert_int_eq(raw_read(&b, r2.fd, buf, sizeof(buf), 2000), -1);
    }
    close(r2.fd);
    ck_assert_uint_eq(b.accepts, 1);
    ck_assert_uint_eq(tb_cm_counters(b.cm)->refused_unauth, 1);
    tb_cm_destroy(b.cm);
}
END_TEST

/* Regression (starvation): idle callers filling every session slot used to
 * hold them until their deadline while real peers were closed unanswered.
 * Now the oldest unproven callers make way, and the real peer connects. */
START_TEST(test_idle_flood)
{
    side_t a, b;
    tb_wire_addr_t la;
    int fds[40];

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    for (unsigned i = 0; i < 40; i++) {
        fds[i] = raw_connect(tb_cm_port(b.cm));
        spin(&b, 1);
    }
    request(&a, &b, &la, 0xa1);
    run(&a, &b, 1, 1, 3000);
    ck_assert_msg(a.done_status == TB_CM_OK, "status %d: %s", a.done_status, a.why);
    ck_assert_uint_eq(b.accepts, 1);
    ck_assert_uint_ge(tb_cm_counters(b.cm)->evicted, 1);
    for (unsigned i = 0; i < 40; i++) {
        close(fds[i]);
    }
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

START_TEST(test_cancel_and_destroy)
{
    side_t a, b;
    tb_wire_addr_t la;
    int other = 0;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    request(&a, &b, &la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", tb_cm_port(b.cm), "rank-1", 6, &la,
                                   &other, now_ns()),
                     TB_CM_OK);
    tb_cm_cancel(a.cm, &a);
    tb_cm_progress(a.cm, now_ns());
    ck_assert_uint_eq(a.dones, 0);
    tb_cm_destroy(a.cm); /* the pending one completes as canceled */
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_int_eq(a.done_status, TB_CM_ECANCELED);
    ck_assert_ptr_eq(a.done_user, &other);
    tb_cm_destroy(b.cm);
}
END_TEST

START_TEST(test_bad_arguments)
{
    side_t a;
    tb_wire_addr_t la, junk;

    side_init(&a, "rank-0", 0xa0, 2000);
    blob(&la, 0xa1);
    memset(&junk, 0x5a, sizeof(junk));
    ck_assert_int_eq(tb_cm_connect(a.cm, "not-an-ip", 1234, "x", 1, &la, &a, now_ns()),
                     TB_CM_EINVAL);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", 1234, "x", 1, &junk, &a, now_ns()),
                     TB_CM_EINVAL);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", 1234, "x", 65, &la, &a, now_ns()),
                     TB_CM_EINVAL);
    /* an identity the job does not know: nothing is dialed */
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", 1234, "stranger-1", 10, &la, &a, now_ns()),
                     TB_CM_EINVAL);
    tb_cm_destroy(a.cm);
}
END_TEST

static Suite *cm_suite(void)
{
    Suite *s = suite_create("cm");
    TCase *tc = tcase_create("loopback");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_exchange);
    tcase_add_test(tc, test_sleeping_owners);
    tcase_add_test(tc, test_collision_leftover);
    tcase_add_test(tc, test_simultaneous_a_first_a_wins);
    tcase_add_test(tc, test_simultaneous_b_first_a_wins);
    tcase_add_test(tc, test_simultaneous_a_first_b_wins);
    tcase_add_test(tc, test_simultaneous_b_first_b_wins);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_wrong_peer);
    tcase_add_test(tc, test_bound_to_interface);
    tcase_add_test(tc, test_bound_to_missing_interface);
    tcase_add_test(tc, test_unreachable);
    tcase_add_test(tc, test_silent_peer_times_out);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_impostor_responder);
    tcase_add_test(tc, test_forged_identity);
    tcase_add_test(tc, test_replay);
    tcase_add_test(tc, test_idle_flood);
    tcase_add_test(tc, test_cancel_and_destroy);
    tcase_add_test(tc, test_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(cm_suite());
    int failed;

    tb_log_set_sink(log_capture, NULL, TB_LOG_WARN);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
