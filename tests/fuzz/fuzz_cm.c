/*
 * Fuzz target: the connection manager's messages (tb_cm.h, tb_wire.h).
 *
 * A real tb_cm listens on 127.0.0.1 as "node-b"; the harness plays the
 * other end over loopback TCP in up to three sessions per input, sharing
 * the cm (so that a finished exchange, a pending request and the session
 * limits carry from one session to the next):
 *  - requester: connect, send a fuzzed HELLO, read the CHALLENGE, send a
 *    fuzzed REQUEST, read the REPLY.  Flags seal the messages (headers,
 *    identities, blob crc) and compute the mac with the claimed identity's
 *    secret and both nonces, so that the logic behind the mac (accept,
 *    refuse, collision with a pending request of the cm) is reached; a
 *    REPLY to a sealed request must carry a mac the harness can verify.
 *  - responder: listen, have the cm connect (tb_cm_connect), read its HELLO,
 *    send a fuzzed CHALLENGE, read its REQUEST (whose mac must verify), send
 *    a fuzzed REPLY, sealed likewise.
 *  - idle callers, which hold sessions open and make the cm evict.
 * Every done callback must come exactly once per request (owner tokens are
 * heap blocks freed there: a second call is a double free, a missing one a
 * leak), every blob handed over must be intact, and no descriptor may be
 * left open after tb_cm_destroy.  Time is a fake clock, 1 ms per step.
 *
 * Input: cfg byte, session count byte, then per session an op byte (bits
 * 0-1: 0 requester, 1 responder, 2 or 3 idle callers, of which bits 6-7
 * give the number less one and bit 5 lets 600 ms pass), a flags byte, an
 * identity byte and the messages (HELLO then REQUEST, 24 and 240 bytes, or
 * CHALLENGE then REPLY, 24 and 112; zero-filled if short).
 */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "tb_cm.h"
#include "tb_sha256.h"

enum {
    CFG_REFUSE = 0x01, /* the accept callback refuses */
};

enum {
    S_SEAL_FIRST = 0x01,  /* valid HELLO / CHALLENGE header */
    S_SEAL_SECOND = 0x02, /* REQUEST / REPLY: header, reserved, lengths, identities, blob */
    S_MAC = 0x04,         /* the right mac */
    S_SPLIT = 0x08,       /* send each message in two writes, progress between */
    S_CLOSE_EARLY = 0x10, /* close after the first message */
    S_LATE = 0x20,        /* 2 s pass before the second message (deadlines) */
    S_PENDING = 0x40,     /* requester: the cm first requests the claimed identity */
    S_TRUNCATE = 0x80,    /* send only part of the second message, then close */
};

#define STEPS 12
#define NIDS 5

/* Identities: the cm's own, peers it knows (shorter, smaller and larger
 * than its own), and one that is not of the job. */
static const struct {
    const char *id;
    int known;
} ids[NIDS] = {
    {"node-b", 1}, {"n", 1}, {"node-a", 1}, {"node-c", 1}, {"stranger", 0},
};
#define CM_ID 0

static uint8_t secrets[NIDS][TB_WIRE_SECRET_SIZE];

typedef struct state {
    int refuse;
    unsigned owed; /* tokens handed to the cm whose done has not come */
} state_t;

static uint64_t now_ns;

static int index_of(const void *id, size_t len)
{
    for (int i = 0; i < NIDS; i++) {
        if (strlen(ids[i].id) == len && memcmp(ids[i].id, id, len) == 0) {
            return i;
        }
    }
    return -1;
}

static int blob_ok(const tb_wire_addr_t *a)
{
    return tb_wire_le32(a->magic) == TB_WIRE_ADDR_MAGIC
           && tb_crc32c(0, a, TB_WIRE_ADDR_SIZE - 4) == tb_wire_le32(a->crc);
}

static void make_blob(tb_wire_addr_t *a, uint64_t epoch)
{
    memset(a, 0, sizeof(*a));
    a->magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
    a->version = TB_WIRE_VERSION;
    a->nlanes = 2;
    a->epoch = tb_wire_le64(epoch);
    fuzz_addr_seal(a);
}

static int cb_peer_secret(void *ctx, const void *peer_id, size_t id_len, uint8_t *secret)
{
    int i = index_of(peer_id, id_len);
    (void) ctx;
    if (i < 0 || !ids[i].known) {
        return -1;
    }
    memcpy(secret, secrets[i], TB_WIRE_SECRET_SIZE);
    return 0;
}

static void *token(state_t *st)
{
    void *t = malloc(8);
    FUZZ_ASSERT(t, "out of memory");
    st->owed++;
    return t;
}

static int cb_accept(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                     tb_wire_addr_t *local, void **user)
{
    state_t *st = ctx;
    int i = index_of(peer_id, id_len);

    FUZZ_ASSERT(i > 0 && ids[i].known, "accept for an identity that proved nothing");
    FUZZ_ASSERT(blob_ok(peer), "accept with a corrupt blob");
    if (st->refuse) {
        return 1;
    }
    make_blob(local, 0xb0b0 + (uint64_t) i);
    *user = token(st);
    return 0;
}

static void cb_done(void *ctx, void *user, int status, const tb_wire_addr_t *peer,
                    const char *why)
{
    state_t *st = ctx;
    FUZZ_ASSERT(user != NULL, "done without an owner");
    FUZZ_ASSERT(status <= 0 && why != NULL, "done with status %d", status);
    FUZZ_ASSERT(status != TB_CM_OK || (peer && blob_ok(peer)), "done OK without a good blob");
    (void) tb_cm_strerror(status);
    FUZZ_ASSERT(st->owed > 0, "more done callbacks than requests");
    st->owed--;
    free(user); /* a second done for the same owner is a double free */
}

/* mac = HMAC(key, label || nonce_r || nonce_s || extra || msg), tb_cm.c. */
static void mac_of(const uint8_t *key, const char *label, const uint8_t *nonce_r,
                   const uint8_t *nonce_s, const void *extra, size_t extra_len, const void *msg,
                   size_t len, uint8_t *mac)
{
    tb_hmac_t h;
    tb_hmac_init(&h, key, TB_CM_KEY_SIZE);
    tb_hmac_update(&h, label, strlen(label) + 1);
    tb_hmac_update(&h, nonce_r, TB_WIRE_CM_NONCE);
    tb_hmac_update(&h, nonce_s, TB_WIRE_CM_NONCE);
    tb_hmac_update(&h, extra, extra_len);
    tb_hmac_update(&h, msg, len);
    tb_hmac_final(&h, mac);
}

static void pair_key(int who, uint8_t *key)
{
    tb_cm_pair_key(ids[who].id, strlen(ids[who].id), secrets[who], ids[CM_ID].id,
                   strlen(ids[CM_ID].id), secrets[CM_ID], key);
}

static void hdr_seal(tb_wire_cm_hdr_t *h, uint8_t type)
{
    h->magic = tb_wire_le32(TB_WIRE_CM_MAGIC);
    h->version = TB_WIRE_CM_VERSION;
    h->type = type;
    h->reserved = 0;
}

static int hdr_ok(const tb_wire_cm_hdr_t *h, uint8_t type)
{
    return tb_wire_le32(h->magic) == TB_WIRE_CM_MAGIC && h->version == TB_WIRE_CM_VERSION
           && h->type == type && h->reserved == 0;
}

static void step(tb_cm_t *cm)
{
    now_ns += 1000000;
    tb_cm_progress(cm, now_ns);
}

static void linger0(int fd)
{
    /* Close with a reset: no TIME_WAIT left behind by a million sessions. */
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* Send len bytes (in two parts with progress between if split); 0, or -1
 * once the cm closed. */
static int send_all(tb_cm_t *cm, int fd, const void *buf, size_t len, int split)
{
    size_t off = 0, part = split ? len / 2 : len;

    while (off < len) {
        ssize_t n = send(fd, (const uint8_t *) buf + off, (off == 0 ? part : len) - off,
                         MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            step(cm);
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        off += (size_t) n;
        if (split && off == part) {
            step(cm);
        }
    }
    return 0;
}

/* Read exactly len bytes within a few progress steps: 1, 0 if they did not
 * all come, -1 at end of stream or on error. */
static int recv_all(tb_cm_t *cm, int fd, void *buf, size_t len)
{
    size_t off = 0;

    for (unsigned i = 0; i < STEPS && off < len; i++) {
        step(cm);
        for (;;) {
            ssize_t n = recv(fd, (uint8_t *) buf + off, len - off, MSG_DONTWAIT);
            if (n > 0) {
                off += (size_t) n;
                if (off == len) {
                    break;
                }
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                return -1;
            }
            break;
        }
    }
    return off == len ? 1 : 0;
}

static int connect_to(uint16_t port)
{
    struct sockaddr_in sin;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    FUZZ_ASSERT(fd >= 0, "socket: %s", strerror(errno));
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    linger0(fd);
    /* Non-blocking: libFuzzer's timer signals would interrupt a blocking
     * connect.  Over loopback it completes at once or within the poll. */
    FUZZ_ASSERT(fcntl(fd, F_SETFL, O_NONBLOCK) == 0, "fcntl: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *) &sin, sizeof(sin)) != 0) {
        struct pollfd pfd = {fd, POLLOUT, 0};
        int err = 0, n;
        socklen_t elen = sizeof(err);
        FUZZ_ASSERT(errno == EINPROGRESS || errno == EINTR, "connect: %s", strerror(errno));
        do {
            n = poll(&pfd, 1, 5000);
        } while (n < 0 && errno == EINTR);
        FUZZ_ASSERT(n == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0,
                    "connect over loopback did not complete: %s", strerror(err ? err : errno));
    }
    return fd;
}

static int listen_on(uint16_t *port)
{
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    FUZZ_ASSERT(fd >= 0, "socket: %s", strerror(errno));
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    FUZZ_ASSERT(bind(fd, (struct sockaddr *) &sin, sizeof(sin)) == 0 && listen(fd, 8) == 0
                    && getsockname(fd, (struct sockaddr *) &sin, &slen) == 0,
                "listen: %s", strerror(errno));
    *port = ntohs(sin.sin_port);
    return fd;
}

/* The harness requests a connection from the cm. */
static void as_requester(tb_cm_t *cm, state_t *st, fuzz_in_t *in, int *open_fds,
                         unsigned *nopen)
{
    uint8_t flags = fuzz_u8(in);
    int who = fuzz_u8(in) % NIDS;
    tb_wire_cm_nonce_msg_t hello, chal;
    tb_wire_cm_request_t req;
    tb_wire_cm_reply_t rep;
    int fd, pend_fd = -1, got_chal, got_rep;
    uint16_t pend_port;
    size_t id_len = strlen(ids[who].id);

    fuzz_bytes(in, &hello, sizeof(hello));
    fuzz_bytes(in, &req, sizeof(req));
    if ((flags & S_PENDING) && who != CM_ID && ids[who].known) {
        /* The cm asks the same peer at once: a listener that never answers. */
        tb_wire_addr_t local;
        pend_fd = listen_on(&pend_port);
        open_fds[(*nopen)++] = pend_fd;
        make_blob(&local, 0xb0b);
        void *user = token(st);
        if (tb_cm_connect(cm, "127.0.0.1", pend_port, ids[who].id, id_len, &local, user,
                          now_ns) != TB_CM_OK) {
            st->owed--;
            free(user);
        }
        step(cm);
    }
    fd = connect_to(tb_cm_port(cm));
    if (flags & S_SEAL_FIRST) {
        hdr_seal(&hello.hdr, TB_CM_MSG_HELLO);
    }
    if (send_all(cm, fd, &hello, sizeof(hello), flags & S_SPLIT) != 0) {
        goto out;
    }
    got_chal = recv_all(cm, fd, &chal, sizeof(chal));
    if (got_chal < 0 || (flags & S_CLOSE_EARLY)) {
        goto out;
    }
    if (got_chal) {
        FUZZ_ASSERT(hdr_ok(&chal.hdr, TB_CM_MSG_CHALLENGE), "the cm sent a bad CHALLENGE");
    } else {
        memset(&chal, 0, sizeof(chal));
    }
    if (flags & S_SEAL_SECOND) {
        const char *peer = ids[CM_ID].id;
        hdr_seal(&req.hdr, TB_CM_MSG_REQUEST);
        memset(req.reserved, 0, sizeof(req.reserved));
        req.id_len = (uint8_t) id_len;
        memset(req.id, 0, sizeof(req.id));
        memcpy(req.id, ids[who].id, id_len);
        if (!(req.peer_id_len & 0x80)) { /* else another peer asked for, as sent */
            req.peer_id_len = (uint8_t) strlen(peer);
            memset(req.peer_id, 0, sizeof(req.peer_id));
            memcpy(req.peer_id, peer, strlen(peer));
        }
        req.addr.magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
        fuzz_addr_seal(&req.addr);
    }
    if ((flags & S_MAC) && ids[who].known) {
        uint8_t key[TB_CM_KEY_SIZE];
        pair_key(who, key);
        mac_of(key, "TBCM request", hello.nonce, chal.nonce, NULL, 0, &req,
               offsetof(tb_wire_cm_request_t, mac), req.mac);
    }
    if (flags & S_LATE) {
        now_ns += 2000000000ull;
    }
    if (send_all(cm, fd, &req, (flags & S_TRUNCATE) ? sizeof(req) / 3 : sizeof(req),
                 flags & S_SPLIT)
            != 0
        || (flags & S_TRUNCATE)) {
        goto out;
    }
    got_rep = recv_all(cm, fd, &rep, sizeof(rep));
    if (got_rep > 0) {
        /* Only a request the cm could verify gets an answer, with a mac over
         * what the harness sent. */
        uint8_t key[TB_CM_KEY_SIZE], mac[TB_WIRE_CM_MAC];
        FUZZ_ASSERT(got_chal && hdr_ok(&rep.hdr, TB_CM_MSG_REPLY) && ids[who].known
                        && who != CM_ID && rep.status <= TB_CM_R_COLLISION,
                    "the cm answered a request it cannot have verified (status %u)",
                    rep.status);
        pair_key(who, key);
        mac_of(key, "TBCM reply", hello.nonce, chal.nonce, req.mac, sizeof(req.mac), &rep,
               offsetof(tb_wire_cm_reply_t, mac), mac);
        FUZZ_ASSERT(memcmp(mac, rep.mac, sizeof(mac)) == 0,
                    "the REPLY's mac does not verify (or this harness's mac differs from "
                    "tb_cm.c's)");
        FUZZ_ASSERT(rep.status != TB_CM_R_ACCEPT || blob_ok(&rep.addr),
                    "an ACCEPT with a corrupt blob");
    }
out:
    close_fd(&fd);
    step(cm);
}

/* The cm requests a connection from the harness. */
static void as_responder(tb_cm_t *cm, state_t *st, fuzz_in_t *in, int *open_fds,
                         unsigned *nopen)
{
    uint8_t flags = fuzz_u8(in);
    int who = 1 + fuzz_u8(in) % (NIDS - 1);
    tb_wire_cm_nonce_msg_t hello, chal;
    tb_wire_cm_request_t req;
    tb_wire_cm_reply_t rep;
    tb_wire_addr_t local;
    uint16_t port;
    int lfd, fd = -1, got;
    void *user;
    uint8_t key[TB_CM_KEY_SIZE], mac[TB_WIRE_CM_MAC];

    fuzz_bytes(in, &chal, sizeof(chal));
    fuzz_bytes(in, &rep, sizeof(rep));
    lfd = listen_on(&port);
    open_fds[(*nopen)++] = lfd;
    make_blob(&local, 0xb0b + (uint64_t) who);
    user = token(st);
    if (tb_cm_connect(cm, "127.0.0.1", port, ids[who].id, strlen(ids[who].id), &local, user,
                      now_ns) != TB_CM_OK) {
        FUZZ_ASSERT(!ids[who].known, "tb_cm_connect refused a known peer");
        st->owed--;
        free(user);
        return;
    }
    FUZZ_ASSERT(ids[who].known, "tb_cm_connect took an unknown peer");
    for (unsigned i = 0; i < STEPS && fd < 0; i++) {
        step(cm);
        fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    }
    FUZZ_ASSERT(fd >= 0, "the cm never connected over loopback");
    linger0(fd);
    got = recv_all(cm, fd, &hello, sizeof(hello));
    FUZZ_ASSERT(got > 0 && hdr_ok(&hello.hdr, TB_CM_MSG_HELLO), "the cm sent no good HELLO");
    if (flags & S_CLOSE_EARLY) {
        goto out;
    }
    if (flags & S_SEAL_FIRST) {
        hdr_seal(&chal.hdr, TB_CM_MSG_CHALLENGE);
    }
    if (send_all(cm, fd, &chal, sizeof(chal), flags & S_SPLIT) != 0) {
        goto out;
    }
    got = recv_all(cm, fd, &req, sizeof(req));
    if (got <= 0) {
        FUZZ_ASSERT(!hdr_ok(&chal.hdr, TB_CM_MSG_CHALLENGE) || got == 0,
                    "the cm dropped a good CHALLENGE");
        goto out;
    }
    FUZZ_ASSERT(hdr_ok(&chal.hdr, TB_CM_MSG_CHALLENGE), "the cm answered a bad CHALLENGE");
    pair_key(who, key);
    mac_of(key, "TBCM request", hello.nonce, chal.nonce, NULL, 0, &req,
           offsetof(tb_wire_cm_request_t, mac), mac);
    FUZZ_ASSERT(hdr_ok(&req.hdr, TB_CM_MSG_REQUEST) && memcmp(mac, req.mac, sizeof(mac)) == 0,
                "the cm's REQUEST does not verify (or this harness's mac differs from "
                "tb_cm.c's)");
    FUZZ_ASSERT(memcmp(&req.addr, &local, sizeof(local)) == 0, "the cm sent another blob");
    if (flags & S_SEAL_SECOND) {
        hdr_seal(&rep.hdr, TB_CM_MSG_REPLY);
        memset(rep.reserved, 0, sizeof(rep.reserved));
        rep.status %= 3;
        if (rep.status == TB_CM_R_ACCEPT && !(rep.addr.version & 0x80)) {
            rep.addr.magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
            fuzz_addr_seal(&rep.addr);
        }
    }
    if (flags & S_MAC) {
        mac_of(key, "TBCM reply", hello.nonce, chal.nonce, req.mac, sizeof(req.mac), &rep,
               offsetof(tb_wire_cm_reply_t, mac), rep.mac);
    }
    if (flags & S_LATE) {
        now_ns += 2000000000ull;
    }
    if (send_all(cm, fd, &rep, (flags & S_TRUNCATE) ? sizeof(rep) / 2 : sizeof(rep),
                 flags & S_SPLIT)
        != 0) {
        goto out;
    }
    step(cm);
    step(cm);
out:
    close_fd(&fd);
    step(cm);
}

static unsigned first_free_fd(void)
{
    int fd = dup(0);
    FUZZ_ASSERT(fd >= 0, "dup: %s", strerror(errno));
    close(fd);
    return (unsigned) fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    unsigned fd_base;
    tb_cm_params_t p;
    tb_cm_callbacks_t cb;
    tb_cm_t *cm;
    state_t st;
    fuzz_in_t in;
    int open_fds[16];
    unsigned nopen = 0, nsess;
    uint8_t cfg;

    if (!init) {
        fuzz_quiet();
        for (int i = 0; i < NIDS; i++) {
            memset(secrets[i], 0x51 + i, sizeof(secrets[i]));
        }
        init = 1;
    }
    fd_base = first_free_fd();
    fuzz_in_init(&in, data, size);
    cfg = fuzz_u8(&in);
    nsess = 1 + fuzz_u8(&in) % 3;
    memset(&st, 0, sizeof(st));
    st.refuse = cfg & CFG_REFUSE;

    memset(&p, 0, sizeof(p));
    p.bind_ip = "127.0.0.1";
    p.id = ids[CM_ID].id;
    p.id_len = strlen(ids[CM_ID].id);
    p.secret = secrets[CM_ID];
    p.timeout_ns = 1000000000ull;
    p.handshake_ns = 500000000ull;
    p.max_sessions = 3;
    p.max_per_source = 2;
    memset(&cb, 0, sizeof(cb));
    cb.ctx = &st;
    cb.peer_secret = cb_peer_secret;
    cb.accept = cb_accept;
    cb.done = cb_done;
    now_ns = 1000000000ull;
    FUZZ_ASSERT(tb_cm_create(&p, &cb, &cm) == TB_CM_OK, "tb_cm_create failed");

    for (unsigned s = 0; s < nsess; s++) {
        uint8_t op = fuzz_u8(&in);
        switch (op & 3) {
        case 0:
            as_requester(cm, &st, &in, open_fds, &nopen);
            break;
        case 1:
            as_responder(cm, &st, &in, open_fds, &nopen);
            break;
        default:
            /* Idle callers: they hold sessions until evicted or timed out. */
            for (unsigned i = 0; i < 1 + (op >> 6) && nopen < 12; i++) {
                open_fds[nopen++] = connect_to(tb_cm_port(cm));
                step(cm);
            }
            if (op & 0x20) {
                now_ns += 600000000ull;
                step(cm);
            }
            break;
        }
    }
    for (unsigned i = 0; i < 3; i++) {
        step(cm);
    }
    (void) tb_cm_counters(cm);
    for (unsigned i = 0; i < nopen; i++) {
        close_fd(&open_fds[i]);
    }
    step(cm);
    tb_cm_destroy(cm);
    FUZZ_ASSERT(st.owed == 0, "%u requests never got their done callback", st.owed);
    FUZZ_ASSERT(first_free_fd() == fd_base, "a descriptor was left open (first free %u, was %u)",
                first_free_fd(), fd_base);
    return 0;
}
