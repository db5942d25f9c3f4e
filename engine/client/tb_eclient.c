/*
 * tbrdma host engine, client side: a rank's side of the host engine (see tb_eclient.h).
 */
#define _GNU_SOURCE
#include "tb_eclient.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tb_clock.h"
#include "tb_eproto.h"
#include "tb_jobdir.h"
#include "tb_random.h"
#include "tb_shm_ring.h"
#include "tb_shm_segment.h"
#include "tb_usock.h"

struct tb_eclient {
    int fd;
    void *seg;
    size_t seg_len;
    tb_shm_ring_t tx; /* to the engine */
    tb_shm_ring_t rx; /* from the engine */
    tb_wire_eattach_reply_t info;
    char dir[400];  /* the job's directory, for messages */
    int dirfd;      /* and as opened (tb_jobdir.h) */
    bool lost;
    uint64_t last_check_ns;
};

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* The job's key: read it, or create it when this rank is the first. */
static int job_key(int dirfd, const char *dir, uint8_t *key, char *err, size_t errlen)
{
    ssize_t n;
    int fd;

    fd = openat(dirfd, TB_ENGINE_KEY, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, key, TB_WIRE_SECRET_SIZE);
        close(fd);
        if (TB_WIRE_SECRET_SIZE == n) {
            return 0;
        }
        (void) unlinkat(dirfd, TB_ENGINE_KEY, 0);
    }
    if (0 != tb_random_bytes(key, TB_WIRE_SECRET_SIZE)) {
        snprintf(err, errlen, "no random source for the job's key: %s", strerror(errno));
        return -1;
    }
    fd = openat(dirfd, TB_ENGINE_KEY, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || TB_WIRE_SECRET_SIZE != write(fd, key, TB_WIRE_SECRET_SIZE)) {
        snprintf(err, errlen, "cannot write %s/%s: %s", dir, TB_ENGINE_KEY, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    close(fd);
    return 0;
}

/* Start the engine detached from this rank (its own session, not a child),
 * its output in the job's directory.  It gets the directory this rank
 * checked as a descriptor, so a path changed meanwhile cannot send it
 * elsewhere.  Everything the child needs is built before fork(): only
 * async-signal-safe calls follow it. */
static int spawn_engine(const tb_eclient_params_t *p, int dirfd, const char *dir, char *err,
                        size_t errlen)
{
    char *argv[64], dirarg[512], fdarg[16];
    int argc = 0, logfd = -1, nullfd = -1, passfd, status;
    pid_t pid;

    if (0 != access(p->engine_path, X_OK)) {
        snprintf(err, errlen, "cannot run the engine %s: %s (set btl_tbrdma_engine_path, or "
                 "install tbrdma with 'make install')", p->engine_path, strerror(errno));
        return -1;
    }
    /* Above the descriptors the child sets up; kept across the engine's
     * exec alone (a thread of the rank that forks meanwhile gets none). */
    passfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 10);
    if (passfd < 0) {
        snprintf(err, errlen, "cannot start the engine: fcntl: %s", strerror(errno));
        return -1;
    }
    snprintf(dirarg, sizeof(dirarg), "%s", dir);
    snprintf(fdarg, sizeof(fdarg), "%d", passfd);
    argv[argc++] = (char *) p->engine_path;
    argv[argc++] = "--dir";
    argv[argc++] = dirarg;
    argv[argc++] = "--dir-fd";
    argv[argc++] = fdarg;
    for (int i = 0; p->engine_args && p->engine_args[i] && argc < 62; ++i) {
        argv[argc++] = p->engine_args[i];
    }
    argv[argc] = NULL;
    logfd = openat(dirfd, TB_ENGINE_LOG, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC,
                   0600);
    nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (logfd < 0 || nullfd < 0) {
        snprintf(err, errlen, "cannot open %s/%s: %s", dir, TB_ENGINE_LOG, strerror(errno));
        goto fail;
    }
    pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "cannot start the engine: fork: %s", strerror(errno));
        goto fail;
    }
    if (0 == pid) {
        /* Not the rank's child: a second fork, in a session of its own,
         * so it outlives the rank and its signals. */
        (void) setsid();
        if (0 != fork()) {
            _exit(0);
        }
        (void) dup2(nullfd, 0);
        (void) dup2(logfd, 1);
        (void) dup2(logfd, 2);
        for (int fd = 3; fd < 4096; ++fd) {
            if (fd != passfd) {
                (void) close(fd);
            }
        }
        if (0 != fcntl(passfd, F_SETFD, 0)) {
            _exit(127);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    (void) waitpid(pid, &status, 0);
    close(logfd);
    close(nullfd);
    close(passfd);
    return 0;

fail:
    if (logfd >= 0) {
        close(logfd);
    }
    if (nullfd >= 0) {
        close(nullfd);
    }
    close(passfd);
    return -1;
}

/* The engine's last words, for a start that failed. */
static void engine_log_tail(int dirfd, char *buf, size_t len)
{
    FILE *f;
    long size;
    size_t n;
    int fd;

    buf[0] = '\0';
    fd = openat(dirfd, TB_ENGINE_LOG, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (NULL == f) {
        if (fd >= 0) {
            close(fd);
        }
        return;
    }
    (void) fseek(f, 0, SEEK_END);
    size = ftell(f);
    (void) fseek(f, size > (long) len - 1 ? size - (long) len + 1 : 0, SEEK_SET);
    n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    while (n > 0 && '\n' == buf[n - 1]) {
        buf[--n] = '\0';
    }
    fclose(f);
}

/* Our engine runs as pid (a zombie does not: an engine whose parent is an
 * init that does not reap is dead all the same).  A pid we may not signal
 * is another user's process that took a dead engine's number. */
static bool pid_running(pid_t pid)
{
    if (pid <= 0 || 0 != kill(pid, 0)) {
        return false;
    }
#if defined(__linux__)
    {
        char path[64], buf[256], *p;
        FILE *f;
        size_t n;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
        f = fopen(path, "r");
        if (f) {
            n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = '\0';
            p = strrchr(buf, ')');
            if (p && p[1] == ' ' && p[2] == 'Z') {
                return false;
            }
        }
    }
#endif
    return true;
}

/* The engine named in the directory's pid file runs. */
static bool engine_alive(int dirfd)
{
    return pid_running(tb_jobdir_engine_pid(dirfd));
}

/* Connect to the engine, starting it if this rank is the first: under the
 * directory's lock, so one rank starts it and the others wait for it.  The
 * job's directory is name in basefd; c->dirfd holds it opened. */
static int find_engine(const tb_eclient_params_t *p, tb_eclient_t *c, int basefd,
                       const char *name, uint8_t *key, char *err, size_t errlen)
{
    uint64_t deadline = tb_now_ns() + p->timeout_ns;
    char sock[512], tail[300];
    bool spawned = false, unnamed = false;
    int lock = -1, fd = -1;

    for (;;) {
        /* The directory of a job whose engine just left may go away under
         * us: make it again until the lock we hold is in the directory the
         * name gives. */
        if (c->dirfd >= 0) {
            close(c->dirfd);
        }
        c->dirfd = tb_jobdir_open(basefd, name, c->dir, true, err, errlen);
        if (c->dirfd < 0) {
            return -1;
        }
        lock = openat(c->dirfd, TB_ENGINE_LOCK, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (lock < 0 && ENOENT == errno && tb_now_ns() < deadline) {
            continue; /* the directory went away after we opened it */
        }
        if (lock < 0) {
            snprintf(err, errlen, "cannot open %s/%s: %s", c->dir, TB_ENGINE_LOCK,
                     strerror(errno));
            return -1;
        }
        while (0 != flock(lock, LOCK_EX | LOCK_NB)) {
            if (tb_now_ns() > deadline) {
                snprintf(err, errlen, "timed out waiting for another rank to start the engine "
                         "(lock %s/%s)", c->dir, TB_ENGINE_LOCK);
                close(lock);
                return -1;
            }
            sleep_ms(5);
        }
        if (tb_jobdir_names(c->dirfd, TB_ENGINE_LOCK, lock)
            && tb_jobdir_names(basefd, name, c->dirfd)) {
            break;
        }
        close(lock);
    }
    if (0 != job_key(c->dirfd, c->dir, key, err, errlen)
        || 0 != tb_jobdir_sock_path(c->dirfd, c->dir, TB_ENGINE_SOCKET, sock, sizeof(sock))) {
        goto out;
    }
    for (;;) {
        fd = tb_usock_connect(sock);
        if (fd >= 0) {
            uid_t uid = (uid_t) -1;
            pid_t pid, named;
            /* Only an engine of this user gets the job's key and rings, and
             * only the one this directory's pid file names (where the
             * socket is reached by name, it could be another's). */
            if (0 != tb_usock_peer(fd, &uid, &pid)) {
                snprintf(err, errlen, "cannot tell who listens on %s/%s: %s", c->dir,
                         TB_ENGINE_SOCKET, strerror(errno));
                goto refused;
            }
            if (uid != getuid()) {
                snprintf(err, errlen, "the process listening on %s/%s is not this user's (uid "
                         "%d): remove the directory %s", c->dir, TB_ENGINE_SOCKET, (int) uid,
                         c->dir);
                goto refused;
            }
            named = tb_jobdir_engine_pid(c->dirfd);
            if (pid == named) {
                break;
            }
            /* A pid file being written, or an engine being replaced: asked
             * again until the deadline.  One that stays wrong is another
             * process, or an engine in a pid namespace this rank's is not
             * (ranks of a job on one host share one). */
            close(fd);
            fd = -1;
            snprintf(err, errlen, "the process listening on %s/%s (pid %d as this rank sees "
                     "it) is not the engine its directory names (pid %d): remove the directory "
                     "%s, and run the job's ranks on a host in one pid namespace",
                     c->dir, TB_ENGINE_SOCKET, (int) pid, (int) named, c->dir);
            unnamed = true;
        }
        if (!spawned && !engine_alive(c->dirfd)) {
            /* Nobody listens: a dead engine's socket, or none yet.  (A live
             * one may refuse for a moment when many ranks call at once.) */
            (void) unlinkat(c->dirfd, TB_ENGINE_SOCKET, 0);
            if (0 != spawn_engine(p, c->dirfd, c->dir, err, errlen)) {
                goto out;
            }
            spawned = true;
        }
        if (tb_now_ns() > deadline && unnamed) {
            goto out; /* err says who listens */
        }
        if (tb_now_ns() > deadline) {
            engine_log_tail(c->dirfd, tail, sizeof(tail));
            snprintf(err, errlen, "the engine did not start within %llu s%s%s",
                     (unsigned long long) (p->timeout_ns / 1000000000ull),
                     tail[0] ? ": " : " (no output)", tail);
            goto out;
        }
        sleep_ms(5);
    }
    goto out;
refused:
    close(fd);
    fd = -1;
out:
    flock(lock, LOCK_UN);
    close(lock);
    return fd;
}

static int make_segment(tb_eclient_t *c, uint64_t ring_size, char *err, size_t errlen)
{
    int fd;

    c->seg_len = tb_shm_ring_segment_size(ring_size);
    fd = tb_shm_segment_create(c->seg_len, err, errlen);
    if (fd < 0) {
        return -1;
    }
    c->seg = mmap(NULL, c->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (MAP_FAILED == c->seg) {
        c->seg = NULL;
        snprintf(err, errlen, "cannot map shared memory for the engine: %s", strerror(errno));
        close(fd);
        return -1;
    }
    tb_shm_ring_attach(&c->tx, c->seg, ring_size, 0, true);
    tb_shm_ring_attach(&c->rx, c->seg, ring_size, 1, true);
    return fd;
}

/* A job directory unchanged for a minute whose engine does not run. */
static bool looks_stale(int dirfd)
{
    struct stat st;

    return 0 == fstat(dirfd, &st) && time(NULL) - st.st_mtime >= 60 && !engine_alive(dirfd);
}

/* The directories of this user's earlier jobs whose engine is gone (killed,
 * so it could not clean up, or it kept its log after a fault): no live
 * socket, the lock free, nothing created or removed in it for a minute (a
 * job being set up holds its lock, and its files are new). */
static void sweep_stale(int basefd, const char *base, const char *mine)
{
    static const char *const files[] = {TB_ENGINE_SOCKET, TB_ENGINE_KEY, TB_ENGINE_LOG,
                                        TB_ENGINE_PIDFILE, TB_ENGINE_LOCK};
    char shown[600], path[700], err[300];
    struct dirent *de;
    int listfd = openat(basefd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = listfd >= 0 ? fdopendir(listfd) : NULL;

    if (NULL == d) {
        if (listfd >= 0) {
            close(listfd);
        }
        return;
    }
    while (NULL != (de = readdir(d))) {
        int dirfd, lock, fd;
        if ('.' == de->d_name[0] || 0 == strcmp(de->d_name, mine)) {
            continue;
        }
        snprintf(shown, sizeof(shown), "%s/%s", base, de->d_name);
        dirfd = tb_jobdir_open(basefd, de->d_name, shown, false, err, sizeof(err));
        if (dirfd < 0) {
            continue;
        }
        lock = -1;
        if (!looks_stale(dirfd)
            || 0 != tb_jobdir_sock_path(dirfd, shown, TB_ENGINE_SOCKET, path, sizeof(path))) {
            goto next;
        }
        fd = tb_usock_connect(path);
        if (fd >= 0 || EAGAIN == errno) {
            /* Somebody listens (a full backlog too). */
            if (fd >= 0) {
                close(fd);
            }
            goto next;
        }
        lock = openat(dirfd, TB_ENGINE_LOCK, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (lock < 0 || 0 != flock(lock, LOCK_EX | LOCK_NB)) {
            goto next;
        }
        /* Again under the lock: a rank of a new job may have started an
         * engine there between the checks above and the lock (it takes the
         * lock to start one, and its engine writes the pid file). */
        if (!tb_jobdir_names(dirfd, TB_ENGINE_LOCK, lock) || !looks_stale(dirfd)) {
            goto next;
        }
        for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); ++i) {
            (void) unlinkat(dirfd, files[i], 0);
        }
        tb_jobdir_remove(basefd, de->d_name, dirfd);
    next:
        if (lock >= 0) {
            close(lock);
        }
        close(dirfd);
    }
    closedir(d);
}

int tb_eclient_attach(const tb_eclient_params_t *p, tb_eclient_t **out, char *err, size_t errlen)
{
    const char *tmp = (p->tmpdir && p->tmpdir[0]) ? p->tmpdir : "/tmp";
    tb_eclient_t *c = calloc(1, sizeof(*c));
    tb_wire_eattach_t req;
    uint8_t key[TB_WIRE_SECRET_SIZE];
    char base[300], name[120];
    int shm = -1, basefd = -1, rc = TB_ECLIENT_ERROR;

    if (NULL == c) {
        snprintf(err, errlen, "out of memory");
        return TB_ECLIENT_ERROR;
    }
    c->fd = -1;
    c->dirfd = -1;
    if (!tb_shm_ring_size_ok(p->ring_size) || p->ring_size < TB_ENGINE_MIN_RING) {
        snprintf(err, errlen, "btl_tbrdma_engine_ring_size = %llu must be a power of two from "
                 "%u to %u", (unsigned long long) p->ring_size, TB_ENGINE_MIN_RING,
                 TB_SHM_RING_MAX);
        goto fail;
    }
    /* A Unix socket's path is short (104 bytes on macOS): a long TMPDIR
     * gives way to /tmp. */
    snprintf(c->dir, sizeof(c->dir), "%s/tbrdma-%u/%s@%.40s", tmp, (unsigned) getuid(), p->job,
             p->host);
    if (strlen(c->dir) + sizeof("/" TB_ENGINE_SOCKET ".1234567") > 100) {
        tmp = "/tmp";
        snprintf(c->dir, sizeof(c->dir), "/tmp/tbrdma-%u/%s@%.40s", (unsigned) getuid(), p->job,
                 p->host);
    }
    snprintf(base, sizeof(base), "%s/tbrdma-%u", tmp, (unsigned) getuid());
    snprintf(name, sizeof(name), "%s@%.40s", p->job, p->host);
    basefd = tb_jobdir_open(AT_FDCWD, base, base, true, err, errlen);
    if (basefd < 0) {
        goto fail;
    }
    sweep_stale(basefd, base, name);
    /* An engine whose ranks all left exits: a rank that reached it just
     * then finds its socket closed, and starts the next one. */
    for (int attempt = 0;; ++attempt) {
        c->fd = find_engine(p, c, basefd, name, key, err, errlen);
        if (c->fd < 0) {
            goto fail;
        }
        if (shm < 0) {
            shm = make_segment(c, p->ring_size, err, errlen);
            if (shm < 0) {
                goto fail;
            }
        }
        memset(&req, 0, sizeof(req));
        req.magic = tb_wire_le32(TB_WIRE_ENGINE_MAGIC);
        req.version = TB_WIRE_ENGINE_VERSION;
        req.vpid = tb_wire_le32(p->vpid);
        req.pid = tb_wire_le32((uint32_t) getpid());
        req.ring_size = tb_wire_le64(p->ring_size);
        memcpy(req.key, key, sizeof(req.key));
        if (0 == tb_usock_send(c->fd, &req, sizeof(req), shm)
            && 0 == tb_usock_recv(c->fd, &c->info, sizeof(c->info), NULL,
                                  (int) (p->timeout_ns / 1000000u))) {
            break;
        }
        snprintf(err, errlen, "the engine (socket %s/%s) did not answer the attach: %s", c->dir,
                 TB_ENGINE_SOCKET, strerror(errno));
        close(c->fd);
        c->fd = -1;
        if (attempt == 3 || (ECONNRESET != errno && EPIPE != errno)) {
            goto fail;
        }
    }
    close(shm);
    shm = -1;
    close(basefd);
    basefd = -1;
    c->info.why[sizeof(c->info.why) - 1] = '\0';
    if (TB_WIRE_ENGINE_MAGIC != tb_wire_le32(c->info.magic)
        || TB_WIRE_ENGINE_VERSION != c->info.version) {
        snprintf(err, errlen, "the engine at %s is of another tbrdma version", c->dir);
        goto fail;
    }
    if (TB_EATTACH_NODEV == c->info.status) {
        snprintf(err, errlen, "%s", c->info.why);
        rc = TB_ECLIENT_NODEV;
        goto fail;
    }
    if (TB_EATTACH_OK != c->info.status || 0 == c->info.ndevices
        || c->info.ndevices > TB_WIRE_ENGINE_MAX_DEVICES) {
        snprintf(err, errlen, "the engine refused this rank: %s",
                 c->info.why[0] ? c->info.why : "no reason given");
        goto fail;
    }
    for (unsigned i = 0; i < c->info.ndevices; ++i) {
        c->info.devices[i].name[sizeof(c->info.devices[i].name) - 1] = '\0';
        c->info.devices[i].netdev[sizeof(c->info.devices[i].netdev) - 1] = '\0';
    }
    (void) fcntl(c->fd, F_SETFL, O_NONBLOCK);
    *out = c;
    return TB_ECLIENT_OK;

fail:
    if (shm >= 0) {
        close(shm);
    }
    if (basefd >= 0) {
        close(basefd);
    }
    if (c->dirfd >= 0) {
        close(c->dirfd);
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    if (c->seg) {
        munmap(c->seg, c->seg_len);
    }
    free(c);
    return rc;
}

const tb_wire_eattach_reply_t *tb_eclient_info(const tb_eclient_t *c)
{
    return &c->info;
}

const char *tb_eclient_dir(const tb_eclient_t *c)
{
    return c->dir;
}

bool tb_eclient_alive(const tb_eclient_t *c)
{
    return !c->lost;
}

static void ring_doorbell(tb_eclient_t *c, char b)
{
    (void) send(c->fd, &b, 1, MSG_DONTWAIT
#if defined(MSG_NOSIGNAL)
                                  | MSG_NOSIGNAL
#endif
    );
}

static int put_record(tb_eclient_t *c, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                      uint32_t pid, const struct iovec *iov, int iovcnt)
{
    size_t len = 0;
    int rc;

    if (c->lost) {
        return -EPIPE;
    }
    for (int i = 0; i < iovcnt; ++i) {
        len += iov[i].iov_len;
    }
    if (len > TB_ENGINE_MAX_MSG) {
        return -EMSGSIZE;
    }
    rc = tb_shm_ring_put(&c->tx, type, tag, link, vpid, pid, iov, iovcnt);
    if (rc < 0) {
        return c->tx.broken ? -EPIPE : -EAGAIN;
    }
    if (rc > 0) {
        ring_doorbell(c, TB_EDOORBELL);
    }
    return 0;
}

int tb_eclient_route(tb_eclient_t *c, uint16_t route, const tb_wire_eroute_t *rt)
{
    struct iovec iov = {.iov_base = (void *) rt, .iov_len = sizeof(*rt)};

    return put_record(c, TB_EREC_ROUTE, 0, route, 0, 0, &iov, 1);
}

int tb_eclient_jobkey(tb_eclient_t *c, const uint8_t *key)
{
    struct iovec iov = {.iov_base = (void *) key, .iov_len = TB_WIRE_SECRET_SIZE};

    return put_record(c, TB_EREC_JOBKEY, 0, 0, 0, 0, &iov, 1);
}

int tb_eclient_hosts(tb_eclient_t *c, const tb_wire_ehost_t *hosts, size_t n)
{
    struct iovec iov = {.iov_base = (void *) hosts, .iov_len = n * sizeof(*hosts)};

    return put_record(c, TB_EREC_HOSTS, 0, 0, 0, 0, &iov, 1);
}

int tb_eclient_sendv(tb_eclient_t *c, uint16_t route, uint32_t dst, uint32_t dst_pid,
                     uint8_t tag, const struct iovec *iov, int iovcnt)
{
    return put_record(c, TB_EREC_SEND, tag, route, dst, dst_pid, iov, iovcnt);
}

void *tb_eclient_send_begin(tb_eclient_t *c, uint16_t route, uint32_t dst, uint32_t dst_pid,
                            uint8_t tag, size_t len)
{
    tb_wire_erec_t *rec;

    if (c->lost || len > TB_ENGINE_MAX_MSG) {
        return NULL;
    }
    rec = tb_shm_ring_reserve(&c->tx, len);
    if (NULL == rec) {
        return NULL;
    }
    rec->type = TB_EREC_SEND;
    rec->tag = tag;
    rec->link = tb_wire_le16(route);
    rec->vpid = tb_wire_le32(dst);
    rec->pid = tb_wire_le32(dst_pid);
    return rec + 1;
}

void tb_eclient_send_commit(tb_eclient_t *c)
{
    if (tb_shm_ring_commit(&c->tx)) {
        ring_doorbell(c, TB_EDOORBELL);
    }
}

void tb_eclient_send_cancel(tb_eclient_t *c)
{
    tb_shm_ring_cancel(&c->tx);
}

static void lose(tb_eclient_t *c, const tb_eclient_handlers_t *h, void *ctx, const char *why)
{
    if (c->lost) {
        return;
    }
    c->lost = true;
    h->engine_lost(ctx, why);
}

/* The engine's socket closes only when it exits. */
static void check_engine(tb_eclient_t *c, const tb_eclient_handlers_t *h, void *ctx)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    char buf[16];
    char why[600];

    if (poll(&pfd, 1, 0) <= 0) {
        return;
    }
    if (0 == recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT)) {
        pid_t pid = (pid_t) tb_wire_le32(c->info.engine_pid);
        bool running = pid_running(pid);
        /* A killed process closes its descriptors before it is gone: give
         * it a moment to finish dying before calling it alive. */
        for (int i = 0; running && i < 40; ++i) {
            sleep_ms(5);
            running = pid_running(pid);
        }
        if (running) {
            snprintf(why, sizeof(why), "the tbrdma engine of this host (pid %d) dropped this "
                     "process; its log: %s/" TB_ENGINE_LOG, (int) pid, c->dir);
        } else {
            /* Nobody else will: no dead socket must stay.  First, since the
             * report below usually ends the process. */
            (void) unlinkat(c->dirfd, TB_ENGINE_SOCKET, 0);
            snprintf(why, sizeof(why), "the tbrdma engine of this host (pid %d) exited or was "
                     "killed; its log, if any: %s/" TB_ENGINE_LOG, (int) pid, c->dir);
        }
        lose(c, h, ctx, why);
    }
}

int tb_eclient_progress(tb_eclient_t *c, const tb_eclient_handlers_t *h, void *ctx, uint64_t now,
                        int max)
{
    tb_wire_erec_t rec;
    const uint8_t *p;
    uint64_t end;
    char why[256];
    int n = 0;

    if (c->lost) {
        return 0;
    }
    if (now - c->last_check_ns >= 10000000ull) {
        c->last_check_ns = now;
        check_engine(c, h, ctx);
        if (c->lost) {
            return 1;
        }
    }
    while (n < max && NULL != (p = tb_shm_ring_next(&c->rx, &rec, &end))) {
        switch (rec.type) {
        case TB_EREC_RECV:
            h->recv(ctx, rec.link, rec.vpid, rec.pid, rec.tag, p, rec.len);
            break;
        case TB_EREC_PEER:
            if (sizeof(tb_wire_epeer_t) == rec.len) {
                tb_wire_epeer_t info;
                memcpy(&info, p, sizeof(info));
                h->peer(ctx, rec.link, &info);
            }
            break;
        case TB_EREC_GONE:
        case TB_EREC_DOWN:
            snprintf(why, sizeof(why), "%.*s", (int) (rec.len < 255 ? rec.len : 255),
                     (const char *) p);
            if (TB_EREC_GONE == rec.type) {
                h->gone(ctx, rec.link, rec.vpid, rec.pid, why);
            } else {
                h->down(ctx, rec.link, 0 != rec.tag, why);
            }
            break;
        default:
            break;
        }
        tb_shm_ring_release_to(&c->rx, end);
        ++n;
    }
    if (c->rx.broken) {
        lose(c, h, ctx, "the tbrdma engine of this host broke the ring protocol");
    }
    return n;
}

void tb_eclient_detach(tb_eclient_t *c)
{
    if (NULL == c) {
        return;
    }
    if (!c->lost) {
        uint64_t end = tb_now_ns() + 1000000000ull;
        /* BYE must get into the ring: the engine reads it before the close. */
        while (0 != put_record(c, TB_EREC_BYE, 0, 0, 0, 0, NULL, 0) && tb_now_ns() < end
               && !c->tx.broken) {
            sleep_ms(1);
        }
        /* Said on the socket too: its closing is then not a death, even
         * before the engine reaches the BYE in the ring. */
        ring_doorbell(c, TB_EDOORBELL_BYE);
    }
    close(c->fd);
    close(c->dirfd);
    munmap(c->seg, c->seg_len);
    free(c);
}
