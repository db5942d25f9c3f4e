/*
 * Unit tests of the host engine's pieces that run without RDMA (its rings
 * are check_shm_ring's): attaching to an engine started on demand, which on
 * this machine has no device and must say why to every rank, then exit and
 * leave no socket behind.
 */
#include "tb_config.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tb_clock.h"
#include "tb_cm.h"
#include "tb_crc32c.h"
#include "tb_eclient.h"
#include "tb_engine.h"
#include "tb_engine_int.h"
#include "tb_log.h"
#include "tb_jobdir.h"
#include "tb_shm_ring.h"
#include "tb_shm_segment.h"
#include "tb_sha256.h"
#include "tb_usock.h"
#include "tb_x25519.h"

static char tmpdir[256];

/* Every rank these tests attach runs in this process: the pid the job
 * would publish for each. */
static uint32_t my_pid(void)
{
    return (uint32_t) getpid();
}

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tbchk.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void params(tb_eclient_params_t *p, const char *job, uint32_t vpid, char **args)
{
    memset(p, 0, sizeof(*p));
    p->tmpdir = tmpdir;
    p->job = job;
    p->host = "unit";
    p->vpid = vpid;
    p->ring_size = TB_ENGINE_MIN_RING;
    p->engine_path = TB_ENGINE_BUILD_PATH;
    p->engine_args = args;
    p->timeout_ns = 10000000000ull;
}

/* Rank vpid of job, attached to its engine (which must take it). */
static tb_eclient_t *attach_ok(const char *job, uint32_t vpid)
{
    tb_eclient_params_t p;
    tb_eclient_t *c = NULL;
    char err[512];

    params(&p, job, vpid, NULL);
    ck_assert_msg(TB_ECLIENT_OK == tb_eclient_attach(&p, &c, err, sizeof(err)), "rank %u: %s",
                  (unsigned) vpid, err);
    return c;
}

/* Without a device the engine starts, tells every rank why, and goes,
 * removing the job's directory. */
/* A job's directory holding names, last changed age seconds ago. */
static void make_job_dir(const char *dir, const char *const *names, int age)
{
    struct timespec old[2] = {{.tv_sec = time(NULL) - age}, {.tv_sec = time(NULL) - age}};
    char f[600];

    ck_assert_int_eq(mkdir(dir, 0700), 0);
    for (; *names; ++names) {
        snprintf(f, sizeof(f), "%s/%s", dir, *names);
        fclose(fopen(f, "w"));
        ck_assert_int_eq(utimensat(AT_FDCWD, f, old, 0), 0);
    }
    ck_assert_int_eq(utimensat(AT_FDCWD, dir, old, 0), 0);
}

START_TEST(attach_no_device)
{
    static char *args[] = {"--verbs-library", "/nonexistent/libibverbs.so", NULL};
    tb_eclient_params_t p;
    tb_eclient_t *c = NULL;
    static const char *const killed[] = {TB_ENGINE_KEY, TB_ENGINE_LOCK, TB_ENGINE_SOCKET, NULL};
    static const char *const faulted[] = {TB_ENGINE_LOCK, "engine.log", NULL};
    char err[512], sock[512], stale[512], kept[600], fresh[600];
    struct stat st;
    int rc;

    make_tmpdir();
    snprintf(stale, sizeof(stale), "%s/tbrdma-%u", tmpdir, (unsigned) getuid());
    ck_assert_int_eq(mkdir(stale, 0700), 0);
    snprintf(kept, sizeof(kept), "%s/faulted@unit", stale);
    snprintf(fresh, sizeof(fresh), "%s/new@unit", stale);
    strcat(stale, "/old@unit");
    /* Swept away: an earlier job's directory whose engine was killed, and
     * one whose engine kept its log after a fault.  Kept: one touched in the
     * last minute (a job being set up). */
    make_job_dir(stale, killed, 120);
    make_job_dir(kept, faulted, 120);
    make_job_dir(fresh, killed, 0);
    for (uint32_t vpid = 0; vpid < 3; ++vpid) {
        params(&p, "job1", vpid, args);
        rc = tb_eclient_attach(&p, &c, err, sizeof(err));
        ck_assert_msg(TB_ECLIENT_NODEV == rc, "rank %u: %d: %s", (unsigned) vpid, rc, err);
        ck_assert_msg(NULL != strstr(err, "/nonexistent/libibverbs.so"), "why: %s", err);
    }
    /* Every rank left: the engine exits and leaves nothing behind. */
    snprintf(sock, sizeof(sock), "%s/tbrdma-%u/job1@unit", tmpdir, (unsigned) getuid());
    for (int i = 0; i < 500 && 0 == stat(sock, &st); ++i) {
        usleep(10000);
    }
    ck_assert_msg(0 != stat(sock, &st), "%s still exists", sock);
    ck_assert_msg(0 != stat(stale, &st), "the stale %s still exists", stale);
    ck_assert_msg(0 != stat(kept, &st), "the log kept in %s was not swept", kept);
    ck_assert_msg(0 == stat(fresh, &st), "%s, new, was swept", fresh);
}
END_TEST

/* A directory others can enter is refused, and so is a missing engine. */
START_TEST(attach_refusals)
{
    tb_eclient_params_t p;
    tb_eclient_t *c = NULL;
    char err[512], dir[300];

    make_tmpdir();
    snprintf(dir, sizeof(dir), "%s/tbrdma-%u", tmpdir, (unsigned) getuid());
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    params(&p, "job2", 0, NULL);
    ck_assert_int_eq(tb_eclient_attach(&p, &c, err, sizeof(err)), TB_ECLIENT_ERROR);
    ck_assert_msg(NULL != strstr(err, "not a private directory"), "why: %s", err);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    params(&p, "job2", 0, NULL);
    p.engine_path = "/nonexistent/tbrdma-engine";
    ck_assert_int_eq(tb_eclient_attach(&p, &c, err, sizeof(err)), TB_ECLIENT_ERROR);
    ck_assert_msg(NULL != strstr(err, "/nonexistent/tbrdma-engine"), "why: %s", err);
    params(&p, "job2", 0, NULL);
    p.ring_size = TB_ENGINE_MIN_RING + 1;
    ck_assert_int_eq(tb_eclient_attach(&p, &c, err, sizeof(err)), TB_ECLIENT_ERROR);
    ck_assert_msg(NULL != strstr(err, "power of two"), "why: %s", err);
}
END_TEST

static void *engine_thread(void *arg)
{
    (void) tb_engine_run(arg);
    return NULL;
}

/* An engine for job, on verbs_library, run in a thread (none if th is
 * NULL): the job's private directory and key made first, as the job's first
 * rank would. */
static tb_engine_t *start_engine(const char *job, uint8_t key0, const char *verbs_library,
                                 char *dir, size_t dirlen, pthread_t *th)
{
    tb_engine_params_t ep;
    tb_engine_t *e = NULL;
    uint8_t key[TB_WIRE_SECRET_SIZE] = {key0};
    char err[512], path[500];
    int fd;

    make_tmpdir();
    snprintf(dir, dirlen, "%s/tbrdma-%u", tmpdir, (unsigned) getuid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(dir + strlen(dir), dirlen - strlen(dir), "/%s@unit", job);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(path, sizeof(path), "%s/%s", dir, TB_ENGINE_KEY);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_eq(write(fd, key, sizeof(key)), (ssize_t) sizeof(key));
    close(fd);
    tb_engine_params_default(&ep);
    ep.dir = dir;
    ep.tunables.verbs_library = verbs_library;
    ck_assert_msg(0 == tb_engine_create(&ep, &e, err, sizeof(err)), "%s", err);
    if (th) {
        ck_assert_int_eq(pthread_create(th, NULL, engine_thread, e), 0);
    }
    return e;
}

/* The same on a stand-in device that opens but makes no queue pair: this
 * host's ranks reach each other through it, ring to ring. */
static tb_engine_t *start_fake_engine(const char *job, uint8_t key0, char *dir, size_t dirlen,
                                      pthread_t *th)
{
    setenv("TB_FAKE_VERBS", "rdma_en0:open:127.0.0.1", 1);
    return start_engine(job, key0, TB_FAKE_VERBS_PATH, dir, dirlen, th);
}

/* Processes that connect to the engine and say nothing neither hold up the
 * ranks that attach after them nor pile up: the engine never waits for a
 * request (it once waited 2 s for each, so 20 silent connections kept a
 * rank out for 40 s, and the links unpolled as long). */
START_TEST(attach_silent_connections)
{
    tb_eclient_params_t p;
    tb_eclient_t *c = NULL;
    tb_engine_t *e;
    pthread_t th;
    char err[512], dir[400], path[500];
    int silent[20], rc;
    uint64_t t0;

    e = start_engine("job3", 7, "/nonexistent/libibverbs.so", dir, sizeof(dir), &th);
    snprintf(path, sizeof(path), "%s/%s", dir, TB_ENGINE_SOCKET);
    for (int i = 0; i < 20; ++i) {
        silent[i] = tb_usock_connect(path);
        ck_assert_int_ge(silent[i], 0);
    }
    params(&p, "job3", 0, NULL);
    t0 = tb_now_ns();
    rc = tb_eclient_attach(&p, &c, err, sizeof(err));
    ck_assert_msg(TB_ECLIENT_NODEV == rc, "attach: %d: %s", rc, err);
    ck_assert_msg(tb_now_ns() - t0 < 1000000000ull, "the attach took %llu ms",
                  (unsigned long long) ((tb_now_ns() - t0) / 1000000u));
    /* The rank left: the engine ends its loop. */
    pthread_join(th, NULL);
    for (int i = 0; i < 20; ++i) {
        close(silent[i]);
    }
    tb_engine_destroy(e);
}
END_TEST

/* The engine never blocks on a rank's socket, whatever the system makes of
 * an accepted socket's mode: Linux gives a blocking one, macOS one that
 * inherits the listener's O_NONBLOCK. */
START_TEST(accepted_socket_nonblocking)
{
    tb_engine_t *e;
    char dir[400], path[500];
    int client, fd = -1;

    e = start_engine("job_nonblock", 9, "/nonexistent/libibverbs.so", dir, sizeof(dir), NULL);
    snprintf(path, sizeof(path), "%s/%s", dir, TB_ENGINE_SOCKET);
    client = tb_usock_connect(path);
    ck_assert_int_ge(client, 0);
    tb_eng_accept(e, tb_now_ns());
    for (unsigned i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] >= 0) {
            fd = e->pending_fd[i];
        }
    }
    ck_assert_int_ge(fd, 0);
    ck_assert(fcntl(fd, F_GETFL) & O_NONBLOCK);
    close(client);
    tb_engine_destroy(e);
}
END_TEST

/* What one rank's handlers saw. */
struct seen {
    int nrecv;
    uint16_t link[4];
    uint8_t tag[4];
    uint32_t src_pid;
    int ngone;
    uint32_t gone_vpid;
    uint32_t gone_pid;
    char gone_why[256];
    bool lost;
};

static void seen_recv(void *ctx, uint16_t link, uint32_t src, uint32_t src_pid, uint8_t tag,
                      const void *data, size_t len)
{
    struct seen *s = ctx;

    (void) src;
    s->src_pid = src_pid;
    (void) data;
    (void) len;
    if (s->nrecv < 4) {
        s->link[s->nrecv] = link;
        s->tag[s->nrecv] = tag;
    }
    s->nrecv++;
}

static void seen_peer(void *ctx, uint16_t link, const tb_wire_epeer_t *info)
{
    (void) ctx;
    (void) link;
    (void) info;
}

static void seen_gone(void *ctx, uint16_t link, uint32_t vpid, uint32_t pid, const char *why)
{
    struct seen *s = ctx;

    (void) link;
    s->ngone++;
    s->gone_vpid = vpid;
    s->gone_pid = pid;
    snprintf(s->gone_why, sizeof(s->gone_why), "%s", why);
}

static void seen_down(void *ctx, uint16_t link, bool closed, const char *why)
{
    (void) ctx;
    (void) link;
    (void) closed;
    (void) why;
}

static void seen_lost(void *ctx, const char *why)
{
    (void) why;
    ((struct seen *) ctx)->lost = true;
}

static const tb_eclient_handlers_t seen_handlers = {
    .recv = seen_recv, .peer = seen_peer, .gone = seen_gone, .down = seen_down,
    .engine_lost = seen_lost};

/* Progress c until done(s) or 5 s. */
static void progress_until(tb_eclient_t *c, struct seen *s, bool (*done)(const struct seen *))
{
    for (int i = 0; i < 5000 && !done(s); ++i) {
        (void) tb_eclient_progress(c, &seen_handlers, s, tb_now_ns(), 64);
        usleep(1000);
    }
}

static bool two_received(const struct seen *s)
{
    return s->nrecv >= 2;
}

static bool heard_gone(const struct seen *s)
{
    return s->ngone > 0;
}

static bool heard_lost(const struct seen *s)
{
    return s->lost;
}

/* Between this host's ranks, on a device that opens but makes no queue
 * pair: a message sent over a route flagged for the host module arrives on
 * the local link with TB_ELINK_HOST, one over a cable's route without it
 * (the receiving rank picks the module by it).  A route with a flag the
 * engine does not know is a malformed record: the rank is dropped and the
 * others hear it gone. */
START_TEST(local_routes_host_flag)
{
    tb_eclient_t *c0 = NULL, *c1 = NULL;
    tb_engine_t *e;
    tb_wire_eroute_t rt;
    struct seen s0 = {0}, s1 = {0};
    struct iovec iov = {.iov_base = "x", .iov_len = 1};
    pthread_t th;
    char dir[400];

    e = start_fake_engine("job4", 9, dir, sizeof(dir), &th);
    c0 = attach_ok("job4", 0);
    c1 = attach_ok("job4", 1);

    memset(&rt, 0, sizeof(rt));
    memcpy(rt.engine_id, tb_eclient_info(c0)->engine_id, sizeof(rt.engine_id));
    ck_assert_int_eq(tb_eclient_route(c0, 0, &rt), 0);
    rt.flags = TB_EROUTE_F_HOST;
    ck_assert_int_eq(tb_eclient_route(c0, 1, &rt), 0);
    ck_assert_int_eq(tb_eclient_sendv(c0, 0, 1, my_pid(), 5, &iov, 1), 0);
    ck_assert_int_eq(tb_eclient_sendv(c0, 1, 1, my_pid(), 6, &iov, 1), 0);
    progress_until(c1, &s1, two_received);
    ck_assert_int_eq(s1.nrecv, 2);
    ck_assert_int_eq(s1.tag[0], 5);
    ck_assert_uint_eq(s1.link[0], TB_ELINK_LOCAL);
    ck_assert_int_eq(s1.tag[1], 6);
    ck_assert_uint_eq(s1.link[1], TB_ELINK_LOCAL | TB_ELINK_HOST);

    rt.flags = 0x80;
    ck_assert_int_eq(tb_eclient_route(c0, 2, &rt), 0);
    progress_until(c0, &s0, heard_lost);
    ck_assert_msg(s0.lost, "the engine kept a rank that sent a route with an unknown flag");
    progress_until(c1, &s1, heard_gone);
    ck_assert_int_eq(s1.ngone, 1);
    ck_assert_uint_eq(s1.gone_vpid, 0);

    tb_eclient_detach(c0);
    tb_eclient_detach(c1);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

/* Two attaches as one vpid: the second is refused while the first lives
 * (it would read the first's messages, send in its name, and announce its
 * death on leaving). */
START_TEST(attach_vpid_once)
{
    tb_eclient_params_t p;
    tb_eclient_t *c0 = NULL, *c1 = NULL, *c2 = NULL;
    tb_engine_t *e;
    pthread_t th;
    char err[512], dir[400];

    e = start_fake_engine("job5", 11, dir, sizeof(dir), &th);
    c0 = attach_ok("job5", 3);
    params(&p, "job5", 3, NULL);
    ck_assert_int_eq(tb_eclient_attach(&p, &c1, err, sizeof(err)), TB_ECLIENT_ERROR);
    ck_assert_msg(NULL != strstr(err, "rank 3 is attached already"), "why: %s", err);
    c2 = attach_ok("job5", 4);
    tb_eclient_detach(c0);
    tb_eclient_detach(c2);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

/* A caller of an engine's connection manager, claiming an engine's identity:
 * with pair set it holds the identity's private key and derives the pair's
 * secret as an engine does; without, it knows only the job's key, as any
 * member of the job does. */
struct caller {
    uint8_t id[TB_WIRE_ENGINE_ID_SIZE];
    uint8_t priv[TB_WIRE_ENGINE_ID_SIZE];
    uint8_t job_key[TB_WIRE_SECRET_SIZE];
    bool pair;
    bool done;
    int status;
};

static int caller_secret(void *ctx, const void *peer_id, size_t id_len, uint8_t *secret)
{
    static const char label[] = "tbrdma engine pair key";
    struct caller *k = ctx;
    uint8_t z[TB_X25519_SIZE];
    tb_hmac_t h;

    ck_assert_uint_eq(id_len, TB_WIRE_ENGINE_ID_SIZE);
    if (!k->pair) {
        memcpy(secret, k->job_key, TB_WIRE_SECRET_SIZE);
        return 0;
    }
    ck_assert_int_eq(tb_x25519_shared(z, k->priv, peer_id), 0);
    tb_hmac_init(&h, k->job_key, sizeof(k->job_key));
    tb_hmac_update(&h, label, sizeof(label));
    tb_hmac_update(&h, z, sizeof(z));
    tb_hmac_final(&h, secret);
    return 0;
}

static int caller_accept(void *ctx, const void *peer_id, size_t id_len, const tb_wire_addr_t *peer,
                         tb_wire_addr_t *local, void **user)
{
    (void) ctx, (void) peer_id, (void) id_len, (void) peer, (void) local, (void) user;
    return -1;
}

static void caller_done(void *ctx, void *user, int status, const tb_wire_addr_t *peer,
                        const char *why)
{
    struct caller *k = ctx;

    (void) user, (void) peer, (void) why;
    k->done = true;
    k->status = status;
}

/* How the engine at 127.0.0.1:port, identity engine_id, answers k. */
static int call_engine(struct caller *k, const uint8_t *engine_id, uint16_t port)
{
    tb_cm_callbacks_t cb = {
        .ctx = k, .peer_secret = caller_secret, .accept = caller_accept, .done = caller_done};
    tb_cm_params_t cp;
    tb_wire_addr_t local;
    tb_cm_t *cm = NULL;
    uint64_t t0 = tb_now_ns();

    memset(&cp, 0, sizeof(cp));
    cp.bind_ip = "127.0.0.1";
    cp.id = k->id;
    cp.id_len = sizeof(k->id);
    cp.secret = k->job_key;
    cp.pairwise = k->pair;
    cp.timeout_ns = 3000000000ull;
    cp.max_sessions = 4;
    ck_assert_int_eq(tb_cm_create(&cp, &cb, &cm), TB_CM_OK);
    memset(&local, 0, sizeof(local));
    local.magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
    local.version = TB_WIRE_VERSION;
    local.nlanes = 2;
    local.crc = tb_wire_le32(tb_crc32c(0, &local, TB_WIRE_ADDR_SIZE - 4));
    k->done = false;
    ck_assert_int_eq(tb_cm_connect(cm, "127.0.0.1", port, engine_id, TB_WIRE_ENGINE_ID_SIZE,
                                   &local, k, tb_now_ns()),
                     TB_CM_OK);
    while (!k->done && tb_now_ns() - t0 < 10000000000ull) {
        tb_cm_progress(cm, tb_now_ns());
        usleep(1000);
    }
    tb_cm_destroy(cm);
    ck_assert_msg(k->done, "the engine's connection manager never answered");
    return k->status;
}

/* A member of the job poses as another engine: the engines' setup proves
 * which engine calls, not only that it knows the job's key (it once did
 * not, so any member could).  The engine's device makes no queue pair, so
 * a caller that proves itself is refused by the engine itself
 * (TB_CM_EREFUSED), one that does not is refused unheard. */
START_TEST(engine_identity_proven)
{
    tb_eclient_t *c = NULL;
    tb_engine_t *e;
    struct caller genuine = {.pair = true}, impostor = {.pair = false};
    uint8_t engine_id[TB_WIRE_ENGINE_ID_SIZE], job_key[TB_WIRE_SECRET_SIZE];
    uint16_t port;
    pthread_t th;
    char dir[400];
    int rc;

    e = start_fake_engine("job9", 13, dir, sizeof(dir), &th);
    c = attach_ok("job9", 0);
    memset(job_key, 0x5a, sizeof(job_key));
    ck_assert_int_eq(tb_eclient_jobkey(c, job_key), 0);
    memcpy(engine_id, tb_eclient_info(c)->engine_id, sizeof(engine_id));
    port = tb_wire_le16(tb_eclient_info(c)->devices[0].cm_port);

    ck_assert_int_eq(tb_x25519_keypair(genuine.id, genuine.priv), 0);
    memcpy(genuine.job_key, job_key, sizeof(job_key));
    impostor = genuine;
    impostor.pair = false;
    /* Until the engine has read the job's key nobody is proven. */
    for (int i = 0; (rc = call_engine(&genuine, engine_id, port)) != TB_CM_EREFUSED && i < 50;
         ++i) {
        usleep(20000);
    }
    ck_assert_msg(TB_CM_EREFUSED == rc, "an engine holding its key was not heard: %s",
                  tb_cm_strerror(rc));
    rc = call_engine(&impostor, engine_id, port);
    ck_assert_msg(TB_CM_EREFUSED != rc && TB_CM_OK != rc,
                  "a caller with the job's key alone was taken for an engine");
    genuine.id[0] ^= 1; /* a key pair that is not the identity claimed */
    rc = call_engine(&genuine, engine_id, port);
    ck_assert_msg(TB_CM_EREFUSED != rc && TB_CM_OK != rc,
                  "a caller without the identity's private key was taken for that engine");

    tb_eclient_detach(c);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

static bool heard_forgery_and_refusal(const struct seen *s)
{
    return s->nrecv >= 1 && s->ngone >= 1;
}

static bool heard_two_gone(const struct seen *s)
{
    return s->ngone >= 2;
}

/* A process that attaches under a vpid the job published for another
 * process (here the job says rank 1 is this process; a child claims rank 1
 * first, as a process of the user holding the job's key could) reads none
 * of rank 1's messages, does not pass for rank 1, and dies as itself: the
 * engine delivers a message only to the pid its sender named, and stamps
 * every record with the pid it saw attach (it once delivered by vpid
 * alone, so the child read rank 1's messages). */
START_TEST(impostor_gets_nothing)
{
    tb_eclient_t *c0 = NULL;
    tb_engine_t *e;
    tb_wire_eroute_t rt;
    struct seen s0 = {0};
    struct iovec iov = {.iov_base = "for rank 1", .iov_len = 10};
    int ready[2], result[2], got = -1, status;
    pthread_t th;
    pid_t child;
    char dir[400], c;

    e = start_fake_engine("job10", 15, dir, sizeof(dir), &th);
    c0 = attach_ok("job10", 0);
    memset(&rt, 0, sizeof(rt));
    memcpy(rt.engine_id, tb_eclient_info(c0)->engine_id, sizeof(rt.engine_id));
    ck_assert_int_eq(tb_eclient_route(c0, 0, &rt), 0);
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(result), 0);
    child = fork();
    ck_assert_int_ge(child, 0);
    if (0 == child) {
        struct seen s1 = {0};
        struct iovec forged = {.iov_base = "from rank 1?", .iov_len = 12};
        tb_eclient_t *c1 = attach_ok("job10", 1);
        uint64_t end = tb_now_ns() + 1500000000ull;
        (void) tb_eclient_route(c1, 0, &rt);
        (void) tb_eclient_sendv(c1, 0, 0, tb_wire_le32(tb_eclient_info(c0)->rank_pid), 9,
                               &forged, 1);
        (void) write(ready[1], "r", 1);
        while (tb_now_ns() < end) {
            (void) tb_eclient_progress(c1, &seen_handlers, &s1, tb_now_ns(), 64);
            usleep(1000);
        }
        (void) write(result[1], &s1.nrecv, sizeof(s1.nrecv));
        _exit(0); /* no BYE: a death */
    }
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    ck_assert_int_eq(tb_eclient_sendv(c0, 0, 1, my_pid(), 5, &iov, 1), 0);
    progress_until(c0, &s0, heard_forgery_and_refusal);
    ck_assert_int_eq(s0.nrecv, 1);
    ck_assert_uint_eq(s0.src_pid, (uint32_t) child);
    ck_assert_int_eq(s0.ngone, 1);
    ck_assert_uint_eq(s0.gone_vpid, 1);
    ck_assert_uint_eq(s0.gone_pid, my_pid());
    ck_assert_msg(NULL != strstr(s0.gone_why, "another process attached in its name"), "why: %s",
                  s0.gone_why);
    ck_assert_int_eq(read(result[0], &got, sizeof(got)), (ssize_t) sizeof(got));
    ck_assert_msg(0 == got, "the process that claimed rank 1 read %d of its messages", got);
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    progress_until(c0, &s0, heard_two_gone);
    ck_assert_int_eq(s0.ngone, 2);
    ck_assert_uint_eq(s0.gone_pid, (uint32_t) child);

    tb_eclient_detach(c0);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

/* The engine reaches its directory's files through the descriptor it
 * opened at start: when the directory is renamed away and another put in
 * its place (as a process of the same user could), the engine's cleanup at
 * its end empties its own directory and leaves the newcomer's files alone
 * (it once worked by path: it read the newcomer's pid file, found no
 * engine of its own there and left its own files behind, and where it did
 * clean up it removed whatever the path named). */
START_TEST(dir_replaced_under_engine)
{
    tb_eclient_t *c = NULL;
    tb_engine_t *e;
    pthread_t th;
    char dir[400], moved[450], path[500], buf[16] = {0};
    struct stat st;
    int fd;

    e = start_fake_engine("job11", 17, dir, sizeof(dir), &th);
    c = attach_ok("job11", 0);
    snprintf(moved, sizeof(moved), "%s.moved", dir);
    ck_assert_int_eq(rename(dir, moved), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(path, sizeof(path), "%s/%s", dir, TB_ENGINE_KEY);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_eq(write(fd, "newcomer", 8), 8);
    close(fd);
    tb_eclient_detach(c);
    pthread_join(th, NULL);
    tb_engine_destroy(e);

    fd = open(path, O_RDONLY);
    ck_assert_msg(fd >= 0, "the engine removed %s, which is not its own", path);
    ck_assert_int_eq(read(fd, buf, sizeof(buf)), 8);
    close(fd);
    ck_assert_str_eq(buf, "newcomer");
    snprintf(path, sizeof(path), "%s/%s", moved, TB_ENGINE_KEY);
    ck_assert_msg(0 != stat(path, &st), "the engine left its own %s behind", path);
    snprintf(path, sizeof(path), "%s/%s", moved, TB_ENGINE_PIDFILE);
    ck_assert_msg(0 != stat(path, &st), "the engine left its own %s behind", path);
}
END_TEST

/* A rank that sends a rank of its host that does not read nothing but empty
 * messages: what the engine holds for the reader is bounded by what the
 * messages cost, headers included (it once counted payload bytes only, and
 * held empty messages without end).  The sender is held back instead. */
START_TEST(hostile_empty_sends)
{
    tb_eclient_t *c0 = NULL, *c1 = NULL;
    tb_engine_t *e;
    tb_wire_eroute_t rt;
    struct seen s0 = {0};
    pthread_t th;
    char dir[400];
    uint64_t sent = 0, t0, blocked_since = 0;
    /* The sender's ring and the reader's, full of empty records, and what
     * the engine may hold beyond them (held_max, default 8 MiB, at the cost
     * of an empty message). */
    const uint64_t ring_records = TB_ENGINE_MIN_RING / sizeof(tb_wire_erec_t);
    const uint64_t bound = 2 * ring_records + (8u << 20) / ENG_MSG_COST(0) + 1000;

    e = start_fake_engine("job6", 12, dir, sizeof(dir), &th);
    c0 = attach_ok("job6", 0);
    c1 = attach_ok("job6", 1);
    memset(&rt, 0, sizeof(rt));
    memcpy(rt.engine_id, tb_eclient_info(c0)->engine_id, sizeof(rt.engine_id));
    ck_assert_int_eq(tb_eclient_route(c0, 0, &rt), 0);
    t0 = tb_now_ns();
    while (tb_now_ns() - t0 < 8000000000ull) {
        int rc = tb_eclient_sendv(c0, 0, 1, my_pid(), 7, NULL, 0);
        if (0 == rc) {
            sent++;
            blocked_since = 0;
            continue;
        }
        ck_assert_int_eq(rc, -EAGAIN);
        if (0 == blocked_since) {
            blocked_since = tb_now_ns();
        } else if (tb_now_ns() - blocked_since > 500000000ull) {
            break;
        }
        (void) tb_eclient_progress(c0, &seen_handlers, &s0, tb_now_ns(), 64);
        usleep(1000);
    }
    ck_assert_msg(0 != blocked_since, "the engine took %llu empty messages for a rank that reads "
                  "nothing, and still takes more", (unsigned long long) sent);
    ck_assert_msg(sent <= bound, "the engine took %llu empty messages for a rank that reads "
                  "nothing (at most %llu expected)", (unsigned long long) sent,
                  (unsigned long long) bound);
    ck_assert(!s0.lost);
    tb_eclient_detach(c0);
    tb_eclient_detach(c1);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

/* A route to an engine that does not exist (id n): the engine holds what is
 * sent over it until the job's key lets it dial, which these tests never
 * give it. */
static void bogus_route(tb_eclient_t *c, uint16_t route, uint32_t n)
{
    tb_wire_eroute_t rt;

    memset(&rt, 0, sizeof(rt));
    rt.ipv4 = htonl(0x7f000001);
    rt.cm_port = tb_wire_le16(9);
    memcpy(rt.engine_id, "bogus", 5);
    memcpy(rt.engine_id + 8, &n, sizeof(n));
    ck_assert_int_eq(tb_eclient_route(c, route, &rt), 0);
}

/* Ranks behind one engine: a rank naming more destinations over a route
 * than one engine serves is dropped, and the engine's table for that peer
 * never grows with the vpids named (it was sized by the largest vpid: 48
 * MiB for a vpid near 4M, per peer a rank made up). */
START_TEST(hostile_destinations)
{
    tb_eclient_t *c0 = NULL, *c1 = NULL;
    tb_engine_t *e;
    struct seen s0 = {0}, s1 = {0};
    struct iovec iov = {.iov_base = "x", .iov_len = 1};
    pthread_t th;
    char dir[400];

    e = start_fake_engine("job9", 15, dir, sizeof(dir), &th);
    c0 = attach_ok("job9", 0);
    c1 = attach_ok("job9", 1);
    bogus_route(c0, 0, 1);
    for (uint32_t v = 0; v < ENG_MAX_RANKS; ++v) {
        ck_assert_int_eq(
            tb_eclient_sendv(c0, 0, (1u << 22) - 1 - v * 4099, my_pid(), 1, &iov, 1), 0);
    }
    progress_until(c0, &s0, heard_lost);
    ck_assert_msg(!s0.lost, "dropped for sending to as many ranks as one engine serves");
    ck_assert_int_eq(tb_eclient_sendv(c0, 0, 12345, my_pid(), 1, &iov, 1), 0);
    progress_until(c0, &s0, heard_lost);
    ck_assert_msg(s0.lost, "kept a rank that sends to more ranks behind one engine than it serves");
    /* Its made-up destinations, with messages waiting for them, do not keep
     * another rank from sending to a real one behind the same engine. */
    bogus_route(c1, 0, 1);
    ck_assert_int_eq(tb_eclient_sendv(c1, 0, 5, my_pid(), 1, &iov, 1), 0);
    progress_until(c1, &s1, heard_lost);
    ck_assert_msg(!s1.lost, "a rank was dropped because another named many destinations");
    tb_eclient_detach(c1);
    tb_eclient_detach(c0);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

/* A rank that names many engines that do not exist takes no more than its
 * share of the engine's peer table: it is dropped, and a rank that names a
 * real one later is served (it was once refused, and dropped, once a rank
 * had named 256). */
START_TEST(hostile_engine_names)
{
    tb_eclient_t *c0 = NULL, *c1 = NULL;
    tb_engine_t *e;
    struct seen s0 = {0}, s1 = {0};
    struct iovec iov = {.iov_base = "x", .iov_len = 1};
    pthread_t th;
    char dir[400];

    e = start_fake_engine("job10", 16, dir, sizeof(dir), &th);
    c0 = attach_ok("job10", 0);
    c1 = attach_ok("job10", 1);
    for (uint32_t n = 0; n < ENG_MAX_PEERS; ++n) {
        bogus_route(c0, (uint16_t) n, n);
    }
    progress_until(c0, &s0, heard_lost);
    ck_assert_msg(s0.lost, "kept a rank that named %d engines", ENG_MAX_PEERS);
    bogus_route(c1, 0, 100000);
    ck_assert_int_eq(tb_eclient_sendv(c1, 0, 7, my_pid(), 1, &iov, 1), 0);
    progress_until(c1, &s1, heard_lost);
    ck_assert_msg(!s1.lost, "a rank naming one engine was dropped after another named many");
    tb_eclient_detach(c0);
    tb_eclient_detach(c1);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

/* A rank hands its job's key and rings only to an engine of its own user:
 * a socket in the job's directory that another user listens on is refused
 * (it once connected to whoever listened there).  Needs root, to listen as
 * another user. */
START_TEST(attach_foreign_listener)
{
    tb_eclient_params_t p;
    tb_eclient_t *c = NULL;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char err[512], dir[400];
    int ready[2], status;
    pid_t child;

    if (0 != getuid()) {
        fprintf(stderr, "attach_foreign_listener: skipped (needs root to listen as another "
                        "user)\n");
        return;
    }
    make_tmpdir();
    snprintf(dir, sizeof(dir), "%s/tbrdma-%u", tmpdir, (unsigned) getuid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/job11@unit");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, TB_ENGINE_SOCKET);
    ck_assert_int_eq(pipe(ready), 0);
    child = fork();
    ck_assert_int_ge(child, 0);
    if (0 == child) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        char one = 1;
        if (fd < 0 || 0 != bind(fd, (struct sockaddr *) &sa, sizeof(sa)) || 0 != setgid(65534)
            || 0 != setuid(65534) || 0 != listen(fd, 4) || 1 != write(ready[1], &one, 1)) {
            _exit(1);
        }
        sleep(10);
        _exit(0);
    }
    close(ready[1]);
    {
        char one;
        ck_assert_int_eq(read(ready[0], &one, 1), 1);
    }
    params(&p, "job11", 0, NULL);
    ck_assert_int_eq(tb_eclient_attach(&p, &c, err, sizeof(err)), TB_ECLIENT_ERROR);
    ck_assert_msg(NULL != strstr(err, "not this user's (uid 65534)"), "why: %s", err);
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    close(ready[0]);
}
END_TEST

/* A listener of this user at the engine's socket that is not the engine
 * the directory's pid file names (a process that put a socket there, or
 * the socket reached by name somewhere else) gets neither the job's key nor
 * rings: the rank checks the listener's pid too. */
START_TEST(attach_unnamed_listener)
{
    tb_eclient_params_t p;
    tb_eclient_t *c = NULL;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char err[512], dir[400], path[500], pid[32];
    int fd, lfd;

    make_tmpdir();
    snprintf(dir, sizeof(dir), "%s/tbrdma-%u", tmpdir, (unsigned) getuid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/job13@unit");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    /* The directory names a live process that is not the listener. */
    snprintf(path, sizeof(path), "%s/%s", dir, TB_ENGINE_PIDFILE);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    snprintf(pid, sizeof(pid), "%d\n", (int) getppid());
    ck_assert_int_eq(write(fd, pid, strlen(pid)), (ssize_t) strlen(pid));
    close(fd);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, TB_ENGINE_SOCKET);
    lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *) &sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    params(&p, "job13", 0, NULL);
    p.timeout_ns = 1000000000ull;
    ck_assert_int_eq(tb_eclient_attach(&p, &c, err, sizeof(err)), TB_ECLIENT_ERROR);
    ck_assert_msg(NULL != strstr(err, "is not the engine its directory names"), "why: %s", err);
    close(lfd);
}
END_TEST

/* An engine given a descriptor that is not open (997) says so, and starts
 * nothing (it said the directory was not private). */
START_TEST(engine_bad_dir_fd)
{
    char cmd[1200], out[1024] = "";
    size_t n;
    FILE *f;

    make_tmpdir();
    snprintf(cmd, sizeof(cmd), "%s --dir %s --dir-fd 997 2>&1", TB_ENGINE_BUILD_PATH,
             tmpdir);
    f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = 0;
    ck_assert_int_ne(pclose(f), 0);
    ck_assert_msg(NULL != strstr(out, "--dir-fd 997 is no open descriptor"), "said: %s", out);
}
END_TEST

struct pidfile_fix {
    char path[500];
    pid_t pid;
};

static void *pidfile_fix_later(void *arg)
{
    struct pidfile_fix *f = arg;
    char text[32], tmp[520];
    int fd, n;

    /* Replaced whole, as the engine writes it: a rank that read it empty
     * would start an engine of its own, and the one under test would wait
     * its 60 s for a rank. */
    usleep(300000);
    snprintf(tmp, sizeof(tmp), "%s.tmp", f->path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    n = snprintf(text, sizeof(text), "%d\n", (int) f->pid);
    if (fd < 0 || n != write(fd, text, (size_t) n) || 0 != rename(tmp, f->path)) {
        abort();
    }
    close(fd);
    return NULL;
}

/* A pid file that names the listener only a moment later (being written, or
 * an engine taking over) delays the rank, not fails it: it asks again until
 * its deadline (it once failed at the first look). */
START_TEST(attach_pidfile_late)
{
    struct pidfile_fix fix;
    tb_eclient_params_t p;
    tb_eclient_t *c = NULL;
    tb_engine_t *e;
    pthread_t th, fixer;
    char err[512], dir[400], text[32];
    int fd, n, rc;

    e = start_engine("job15", 7, "/nonexistent/libibverbs.so", dir, sizeof(dir), &th);
    snprintf(fix.path, sizeof(fix.path), "%s/%s", dir, TB_ENGINE_PIDFILE);
    fix.pid = getpid();
    fd = open(fix.path, O_WRONLY | O_TRUNC);
    n = snprintf(text, sizeof(text), "%d\n", (int) getppid());
    ck_assert_int_eq(write(fd, text, (size_t) n), n);
    close(fd);
    ck_assert_int_eq(pthread_create(&fixer, NULL, pidfile_fix_later, &fix), 0);
    params(&p, "job15", 0, NULL);
    rc = tb_eclient_attach(&p, &c, err, sizeof(err));
    ck_assert_msg(TB_ECLIENT_NODEV == rc, "attach: %d: %s", rc, err);
    pthread_join(fixer, NULL);
    pthread_join(th, NULL);
    tb_engine_destroy(e);
}
END_TEST

/* A rank attached by hand, as a hostile process would: its socket. */
static int raw_attach(const char *dir, uint32_t vpid, uint8_t key0)
{
    size_t seg_len = tb_shm_ring_segment_size(TB_ENGINE_MIN_RING);
    tb_wire_eattach_t req;
    tb_wire_eattach_reply_t rep;
    tb_shm_ring_t tx, rx;
    char err[256], path[500];
    int shm = tb_shm_segment_create(seg_len, err, sizeof(err)), fd;
    void *seg;

    ck_assert_msg(shm >= 0, "%s", err);
    seg = mmap(NULL, seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    ck_assert(MAP_FAILED != seg);
    tb_shm_ring_attach(&tx, seg, TB_ENGINE_MIN_RING, 0, true);
    tb_shm_ring_attach(&rx, seg, TB_ENGINE_MIN_RING, 1, true);
    snprintf(path, sizeof(path), "%s/%s", dir, TB_ENGINE_SOCKET);
    fd = tb_usock_connect(path);
    ck_assert_int_ge(fd, 0);
    memset(&req, 0, sizeof(req));
    req.magic = tb_wire_le32(TB_WIRE_ENGINE_MAGIC);
    req.version = TB_WIRE_ENGINE_VERSION;
    req.vpid = tb_wire_le32(vpid);
    req.pid = tb_wire_le32((uint32_t) getpid());
    req.ring_size = tb_wire_le64(TB_ENGINE_MIN_RING);
    req.key[0] = key0;
    ck_assert_int_eq(tb_usock_send(fd, &req, sizeof(req), shm), 0);
    ck_assert_int_eq(tb_usock_recv(fd, &rep, sizeof(rep), NULL, 5000), 0);
    ck_assert_int_eq(rep.status, TB_EATTACH_OK);
    close(shm);
    return fd;
}

static atomic_bool flooding;

static void *flood_doorbells(void *arg)
{
    char bytes[65536]; /* each writer its own: they run at once */
    int fd = *(int *) arg;

    memset(bytes, TB_EDOORBELL, sizeof(bytes));
    while (atomic_load(&flooding)) {
        if (send(fd, bytes, sizeof(bytes), MSG_NOSIGNAL) < 0) {
            break;
        }
    }
    return NULL;
}

/* A rank whose threads write doorbell bytes as fast as they can: the engine
 * takes a share of its socket per pass and keeps polling its devices (it
 * once read while reads filled its buffer, and went seconds without a poll,
 * past the engines' peer timeout). */
START_TEST(hostile_doorbells)
{
    tb_engine_t *e;
    pthread_t th, writers[8];
    int sndbuf = 8 << 20;
    char dir[400];
    int fd;

    e = start_fake_engine("job7", 13, dir, sizeof(dir), &th);
    fd = raw_attach(dir, 0, 13);
    (void) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    atomic_store(&flooding, true);
    for (int i = 0; i < 8; ++i) {
        ck_assert_int_eq(pthread_create(&writers[i], NULL, flood_doorbells, &fd), 0);
    }
    usleep(4000000);
    atomic_store(&flooding, false);
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 8; ++i) {
        pthread_join(writers[i], NULL);
    }
    close(fd);
    pthread_join(th, NULL);
    /* Before, the gap was the whole flood; now a pass, or an idle sleep. */
    ck_assert_msg(e->max_ns[ENG_PH_GAP] < 1000000000ull,
                  "the engine polled no device for %llu ms while a rank flooded its socket",
                  (unsigned long long) (e->max_ns[ENG_PH_GAP] / 1000000u));
    tb_engine_destroy(e);
}
END_TEST

static atomic_uint warnings;

static void count_warnings(tb_log_level_t level, const char *msg, void *ctx)
{
    (void) ctx;
    if (level <= TB_LOG_WARN && NULL != strstr(msg, "job key")) {
        atomic_fetch_add(&warnings, 1);
    }
}

/* A rank that sends another job key than the first again and again: the
 * engine says so once a second, with a count, not once per record. */
START_TEST(hostile_jobkeys)
{
    tb_eclient_t *c0 = NULL;
    tb_engine_t *e;
    pthread_t th;
    char dir[400];
    uint8_t first[TB_WIRE_SECRET_SIZE] = {1}, other[TB_WIRE_SECRET_SIZE] = {2};
    unsigned sent = 0;
    uint64_t t0;

    e = start_fake_engine("job8", 14, dir, sizeof(dir), &th);
    c0 = attach_ok("job8", 0);
    tb_log_set_sink(count_warnings, NULL, TB_LOG_WARN);
    ck_assert_int_eq(tb_eclient_jobkey(c0, first), 0);
    t0 = tb_now_ns();
    while (sent < 200000 && tb_now_ns() - t0 < 5000000000ull) {
        if (0 == tb_eclient_jobkey(c0, other)) {
            sent++;
        } else {
            usleep(100);
        }
    }
    usleep(200000);
    tb_eclient_detach(c0);
    pthread_join(th, NULL);
    tb_log_set_sink(NULL, NULL, TB_LOG_INFO);
    ck_assert_uint_gt(sent, 10000);
    ck_assert_msg(atomic_load(&warnings) <= 2 + (tb_now_ns() - t0) / 1000000000u,
                  "%u warnings for %u records", atomic_load(&warnings), sent);
    tb_engine_destroy(e);
}
END_TEST

/* The segment a rank hands its engine cannot be shrunk under the engine's
 * mapping (its accesses would fault), and the engine refuses one that could. */
START_TEST(segment_sealed)
{
    size_t len = tb_shm_ring_segment_size(TB_SHM_RING_MIN);
    char err[256];
    int fd = tb_shm_segment_create(len, err, sizeof(err));

    ck_assert_msg(fd >= 0, "%s", err);
    ck_assert_ptr_null(tb_shm_segment_check(fd, len));
    ck_assert_ptr_nonnull(tb_shm_segment_check(fd, len + 1));
    ck_assert_ptr_nonnull(tb_shm_segment_check(-1, len));
#ifdef HAVE_MEMFD_CREATE
    ck_assert_int_ne(ftruncate(fd, (off_t) len / 2), 0);
    ck_assert_int_ne(ftruncate(fd, (off_t) len * 2), 0);
    close(fd);
    /* Unsealed: refused, though big enough. */
    fd = memfd_create("unsealed", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t) len), 0);
    ck_assert_msg(NULL != tb_shm_segment_check(fd, len), "an unsealed segment was accepted");
#endif
    close(fd);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, attach_no_device);
    tcase_add_test(tc, accepted_socket_nonblocking);
    tcase_add_test(tc, attach_refusals);
    tcase_add_test(tc, segment_sealed);
    tcase_add_test(tc, attach_silent_connections);
    tcase_add_test(tc, local_routes_host_flag);
    tcase_add_test(tc, attach_vpid_once);
    tcase_add_test(tc, hostile_empty_sends);
    tcase_add_test(tc, hostile_doorbells);
    tcase_add_test(tc, hostile_jobkeys);
    tcase_add_test(tc, hostile_destinations);
    tcase_add_test(tc, hostile_engine_names);
    tcase_add_test(tc, attach_foreign_listener);
    tcase_add_test(tc, attach_unnamed_listener);
    tcase_add_test(tc, attach_pidfile_late);
    tcase_add_test(tc, engine_bad_dir_fd);
    tcase_add_test(tc, engine_identity_proven);
    tcase_add_test(tc, impostor_gets_nothing);
    tcase_add_test(tc, dir_replaced_under_engine);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
