/*
 * Unit tests of the connection manager over loopback TCP: plain exchange,
 * simultaneous connect in both orders, refusal, unreachable and silent
 * peers, malformed and byte-by-byte requests.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tb_cm.h"
#include "tb_crc32c.h"
#include "tb_log.h"
#include "tb_wire.h"

#define MS 1000000ull
#define CM_MSG_SIZE (8 + TB_CM_ID_MAX + TB_WIRE_ADDR_SIZE)

typedef struct side {
    tb_cm_t *cm;
    const char *id;
    int refuse;
    unsigned accepts;
    unsigned dones;
    int done_status;
    void *done_user;
    tb_wire_addr_t done_peer;
    tb_wire_addr_t accept_blob; /* what accept hands out */
    tb_wire_addr_t accept_peer;
    char why[256];
} side_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
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

static void side_init(side_t *s, const char *id, uint64_t accept_epoch, uint64_t timeout_ms)
{
    tb_cm_params_t p = {
        .bind_ip = "127.0.0.1",
        .id = id,
        .id_len = strlen(id),
        .timeout_ns = timeout_ms * MS,
        .max_sessions = 16,
    };
    tb_cm_callbacks_t cb = { .ctx = s, .accept = cb_accept, .done = cb_done };

    memset(s, 0, sizeof(*s));
    s->id = id;
    blob(&s->accept_blob, accept_epoch);
    ck_assert_int_eq(tb_cm_create(&p, &cb, &s->cm), TB_CM_OK);
    ck_assert_uint_ne(tb_cm_port(s->cm), 0);
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

/* A well-formed request from identity id with blob epoch. */
static void raw_request(uint8_t *msg, const char *id, uint64_t epoch)
{
    tb_wire_addr_t a;
    uint32_t magic = tb_wire_le32(0x4d434254u);
    memset(msg, 0, CM_MSG_SIZE);
    memcpy(msg, &magic, 4);
    msg[4] = TB_CM_VERSION;
    msg[5] = 1; /* request */
    msg[7] = (uint8_t) strlen(id);
    memcpy(msg + 8, id, strlen(id));
    blob(&a, epoch);
    memcpy(msg + 8 + TB_CM_ID_MAX, &a, sizeof(a));
}

/* Progress s while reading the reply on fd: returns the reply's status byte,
 * or -1 if the socket closed first. */
static int raw_reply(side_t *s, int fd)
{
    uint8_t msg[CM_MSG_SIZE];
    size_t got = 0;
    uint64_t end = now_ns() + 2000 * MS;

    while (got < sizeof(msg) && now_ns() < end) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        tb_cm_progress(s->cm, now_ns());
        if (poll(&pfd, 1, 1) == 1) {
            ssize_t n = recv(fd, msg + got, sizeof(msg) - got, 0);
            if (n <= 0) {
                return -1;
            }
            got += (size_t) n;
        }
    }
    ck_assert_uint_eq(got, sizeof(msg));
    return msg[6];
}

START_TEST(test_exchange)
{
    side_t a, b;
    tb_wire_addr_t la;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    blob(&la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", tb_cm_port(b.cm), "rank-1", 6, &la, &a,
                                   now_ns()),
                     TB_CM_OK);
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

/* After a collision the loser's own request can reach the winner once the
 * winner's exchange is complete: a request from the same identity with the
 * blob the winner already holds is that leftover, refused without
 * reaching the owner; one with a new blob is a new connection. */
START_TEST(test_collision_leftover)
{
    side_t a, b;
    tb_wire_addr_t la;
    uint8_t msg[CM_MSG_SIZE];
    int fd;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    blob(&la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", tb_cm_port(b.cm), "rank-1", 6, &la, &a,
                                   now_ns()),
                     TB_CM_OK);
    run(&a, &b, 1, 1, 3000);
    ck_assert_int_eq(a.done_status, TB_CM_OK);
    raw_request(msg, "rank-1", 0xb0);
    fd = raw_connect(tb_cm_port(a.cm));
    ck_assert_int_eq(send(fd, msg, sizeof(msg), 0), (ssize_t) sizeof(msg));
    ck_assert_int_eq(raw_reply(&a, fd), 2);
    close(fd);
    ck_assert_uint_eq(a.accepts, 0);
    raw_request(msg, "rank-1", 0xb2);
    fd = raw_connect(tb_cm_port(a.cm));
    ck_assert_int_eq(send(fd, msg, sizeof(msg), 0), (ssize_t) sizeof(msg));
    ck_assert_int_eq(raw_reply(&a, fd), 0);
    close(fd);
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
    blob(&la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", tb_cm_port(b.cm), "rank-1", 6, &la, &a,
                                   now_ns()),
                     TB_CM_OK);
    run(&a, &b, 1, 0, 3000);
    ck_assert_uint_eq(a.dones, 1);
    ck_assert_int_eq(a.done_status, TB_CM_EREFUSED);
    ck_assert_uint_eq(b.accepts, 1);
    ck_assert_uint_eq(b.dones, 0);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
}
END_TEST

START_TEST(test_wrong_peer)
{
    side_t a, b;
    tb_wire_addr_t la;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-7", 0xb0, 2000);
    blob(&la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", tb_cm_port(b.cm), "rank-1", 6, &la, &a,
                                   now_ns()),
                     TB_CM_OK);
    run(&a, &b, 1, 1, 3000);
    ck_assert_int_eq(a.done_status, TB_CM_EWRONGPEER);
    tb_cm_destroy(a.cm);
    tb_cm_destroy(b.cm);
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

/* Garbage of every kind is refused (R_BAD or closed) and never reaches the
 * owner; a valid request afterwards still works. */
START_TEST(test_malformed)
{
    side_t b;
    uint8_t msg[CM_MSG_SIZE];
    int fd, st;

    side_init(&b, "rank-1", 0xb0, 500);

    /* random bytes */
    for (size_t i = 0; i < sizeof(msg); i++) {
        msg[i] = (uint8_t) (i * 37 + 11);
    }
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, msg, sizeof(msg), 0), (ssize_t) sizeof(msg));
    st = raw_reply(&b, fd);
    ck_assert_int_eq(st, 3);
    close(fd);

    /* identity length beyond the limit */
    raw_request(msg, "rank-9", 0x91);
    msg[7] = 200;
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, msg, sizeof(msg), 0), (ssize_t) sizeof(msg));
    ck_assert_int_eq(raw_reply(&b, fd), 3);
    close(fd);

    /* corrupt address blob (CRC) */
    raw_request(msg, "rank-9", 0x91);
    msg[8 + TB_CM_ID_MAX + 20] ^= 1;
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, msg, sizeof(msg), 0), (ssize_t) sizeof(msg));
    ck_assert_int_eq(raw_reply(&b, fd), 3);
    close(fd);

    /* a reply where a request belongs */
    raw_request(msg, "rank-9", 0x91);
    msg[5] = 2;
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, msg, sizeof(msg), 0), (ssize_t) sizeof(msg));
    ck_assert_int_eq(raw_reply(&b, fd), 3);
    close(fd);

    /* half a request, then the requester vanishes */
    raw_request(msg, "rank-9", 0x91);
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, msg, 50, 0), 50);
    for (int i = 0; i < 20; i++) {
        tb_cm_progress(b.cm, now_ns());
        usleep(1000);
    }
    close(fd);
    /* half a request and silence: the session times out */
    fd = raw_connect(tb_cm_port(b.cm));
    ck_assert_int_eq(send(fd, msg, 50, 0), 50);
    ck_assert_int_eq(raw_reply(&b, fd), -1);
    close(fd);
    for (int i = 0; i < 20; i++) {
        tb_cm_progress(b.cm, now_ns());
        usleep(1000);
    }
    ck_assert_uint_eq(b.accepts, 0);
    ck_assert_uint_eq(b.dones, 0);

    /* a valid request, one byte at a time */
    raw_request(msg, "rank-9", 0x91);
    fd = raw_connect(tb_cm_port(b.cm));
    for (size_t i = 0; i < sizeof(msg); i++) {
        ck_assert_int_eq(send(fd, msg + i, 1, 0), 1);
        tb_cm_progress(b.cm, now_ns());
    }
    ck_assert_int_eq(raw_reply(&b, fd), 0);
    close(fd);
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

START_TEST(test_cancel_and_destroy)
{
    side_t a, b;
    tb_wire_addr_t la;
    int other = 0;

    side_init(&a, "rank-0", 0xa0, 2000);
    side_init(&b, "rank-1", 0xb0, 2000);
    blob(&la, 0xa1);
    ck_assert_int_eq(tb_cm_connect(a.cm, "127.0.0.1", tb_cm_port(b.cm), "rank-1", 6, &la, &a,
                                   now_ns()),
                     TB_CM_OK);
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
    tb_cm_destroy(a.cm);
}
END_TEST

static Suite *cm_suite(void)
{
    Suite *s = suite_create("cm");
    TCase *tc = tcase_create("loopback");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_exchange);
    tcase_add_test(tc, test_collision_leftover);
    tcase_add_test(tc, test_simultaneous_a_first_a_wins);
    tcase_add_test(tc, test_simultaneous_b_first_a_wins);
    tcase_add_test(tc, test_simultaneous_a_first_b_wins);
    tcase_add_test(tc, test_simultaneous_b_first_b_wins);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_wrong_peer);
    tcase_add_test(tc, test_unreachable);
    tcase_add_test(tc, test_silent_peer_times_out);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_cancel_and_destroy);
    tcase_add_test(tc, test_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(cm_suite());
    int failed;

    tb_log_set_sink(NULL, NULL, TB_LOG_ERROR);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
