/*
 * tbrdma host engine, daemon: the main loop, and creating and destroying the
 * engine (see tb_engine.h).  Its ranks' rings are in tb_engine_rank.c, their
 * attaching and leaving in tb_engine_attach.c, its devices and links to
 * other engines in tb_engine_peer.c; what they share is in tb_engine_int.h.
 */
#include "tb_engine_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tb_jobdir.h"
#include "tb_log.h"
#include "tb_random.h"
#include "tb_sha256.h"
#include "tb_usock.h"
#include "tb_x25519.h"

void tb_engine_params_default(tb_engine_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->dir_fd = -1;
    tb_tunables_defaults(&p->tunables);
    p->tunables.peer_timeout_ms = 5000;
    p->credit_window = 4u << 20;
    p->held_max = 8u << 20;
    p->idle_exit_ns = 60000000000ull;
    p->spin_ns = 1000000ull;
    p->sleep_ns = 1000000ull;
    p->events = 1;
    p->yield = 1;
}

/* ---- the loop ------------------------------------------------------------ */

/* Sockets: new ranks, doorbells, closed ranks.  Sleeps up to timeout_ms. */
static int poll_sockets(tb_engine_t *e, int timeout_ms)
{
    struct pollfd fds[TB_WIRE_ENGINE_MAX_DEVICES * (1 + ENG_CM_POLL) + 1 + ENG_MAX_PENDING
                      + ENG_MAX_RANKS];
    /* Per socket polled: the rank, or NULL with the pending slot (-1: listening). */
    eng_rank_t *who[1 + ENG_MAX_PENDING + ENG_MAX_RANKS];
    int pend[1 + ENG_MAX_PENDING + ENG_MAX_RANKS];
    unsigned n = 0, i, nev = 0, ndevev;
    uint64_t now = tb_now_ns(), wake = UINT64_MAX;
    int rc, work = 0;
    bool completions = false;

    /* Completion events of the devices first, then the other engines'
     * connection setup (a peer's handshake must not wait out a sleep), then
     * the ranks' sockets. */
    for (i = 0; i < e->ndev; ++i) {
        int fd = tb_domain_event_fd(e->devs[i].dom);
        if (fd >= 0) {
            fds[nev].fd = fd;
            fds[nev++].events = POLLIN;
        }
    }
    ndevev = nev;
    for (i = 0; i < e->ndev; ++i) {
        if (e->devs[i].cm) {
            nev += tb_cm_poll_fds(e->devs[i].cm, &fds[nev], ENG_CM_POLL, &wake);
        }
    }
    if (timeout_ms > 0 && wake != UINT64_MAX) {
        uint64_t ms = wake > now ? (wake - now + 999999u) / 1000000u : 0;
        if (ms < (uint64_t) timeout_ms) {
            timeout_ms = (int) ms;
        }
    }
    n = nev;
    /* The pending connections before the listening socket: a connection
     * accepted in this round may reuse a number closed in it. */
    tb_eng_expire_pending(e, now);
    for (i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] >= 0) {
            fds[n].fd = e->pending_fd[i];
            fds[n].events = POLLIN;
            who[n - nev] = NULL;
            pend[n++ - nev] = (int) i;
        }
    }
    if (e->listen_fd >= 0) {
        fds[n].fd = e->listen_fd;
        fds[n].events = POLLIN;
        who[n - nev] = NULL;
        pend[n++ - nev] = -1;
    }
    for (i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_FREE != r->state && r->fd >= 0) {
            fds[n].fd = r->fd;
            fds[n].events = POLLIN;
            who[n++ - nev] = r;
        }
    }
    rc = poll(fds, n, timeout_ms);
    if (rc <= 0) {
        return 0;
    }
    for (i = 0; i < nev; ++i) {
        if (fds[i].revents) {
            ++work;
            completions |= i < ndevev;
        }
    }
    if (completions) {
        for (i = 0; i < e->ndev; ++i) {
            tb_domain_event_drain(e->devs[i].dom);
        }
    }
    for (i = nev; i < n; ++i) {
        eng_rank_t *r = who[i - nev];
        char buf[4096];
        ssize_t got;
        unsigned reads;
        if (0 == fds[i].revents) {
            continue;
        }
        ++work;
        if (NULL == r && pend[i - nev] < 0) {
            tb_eng_accept(e, tb_now_ns());
            continue;
        }
        if (NULL == r) {
            e->pending_fd[pend[i - nev]] = -1;
            tb_eng_attach_rank(e, fds[i].fd);
            continue;
        }
        /* A share of what the socket holds per pass: a rank writing bytes
         * as fast as it can must not hold the loop (the devices go unpolled
         * meanwhile).  One that rang thousands of doorbells and died is seen
         * dead a few passes later. */
        reads = 0;
        do {
            got = recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (got > 0 && NULL != memchr(buf, TB_EDOORBELL_BYE, (size_t) got)) {
                r->leaving = true;
            }
        } while (got == (ssize_t) sizeof(buf) && ++reads < ENG_SOCKET_READS);
        if (got == 0 || (got < 0 && EAGAIN != errno && EWOULDBLOCK != errno && EINTR != errno)) {
            /* The rank is gone; what it left in its ring is still read
             * (ranks_progress), and tells whether it said BYE first. */
            close(r->fd);
            r->fd = -1;
        }
    }
    return work;
}

static int ranks_progress(tb_engine_t *e)
{
    int n = 0;

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        switch (r->state) {
        case ENG_RANK_ATTACHED:
            if (tb_eng_rank_idle(r)) {
                break;
            }
            n += tb_eng_rank_tx_progress(r);
            n += tb_eng_rank_flush_overflow(r);
            n += tb_eng_rank_credit_progress(r);
            /* Gone: one that said it finalizes leaves once its ring is
             * read; any other died, and its peers hear it now. */
            if (r->fd < 0 && ENG_RANK_ATTACHED == r->state
                && (!(r->leaving || r->bye) || !tb_shm_ring_readable(&r->tx))) {
                if (!r->bye && !r->leaving) {
                    tb_eng_rank_fail(r, "exited without finalizing (killed, or it crashed)");
                }
                r->state = ENG_RANK_DEAD;
            }
            break;
        case ENG_RANK_DEAD:
        case ENG_RANK_NODEV:
            /* Free once the socket is closed and the channels hold no
             * reference to its rings (sends from one, a message being
             * written into the other); what waits for credit in its ring
             * is copied out first. */
            if (r->npinned) {
                tb_eng_peers_unpin(e, r);
            }
            if (r->fd < 0 && 0 == r->txq_len && NULL == r->placing) {
                tb_eng_rank_free(r);
                ++n;
            }
            break;
        default:
            break;
        }
    }
    return n;
}

static void set_waiting(tb_engine_t *e, bool waiting)
{
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        if (ENG_RANK_ATTACHED == e->ranks[i].state) {
            tb_shm_ring_set_waiting(&e->ranks[i].tx, waiting);
        }
    }
}

/* A ring with records the engine can take now (a blocked one waits for
 * the engine's own work, which the sleep bound covers). */
static bool rings_readable(tb_engine_t *e)
{
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_ATTACHED == r->state && !r->blocked && tb_shm_ring_readable(&r->tx)) {
            return true;
        }
    }
    return false;
}

/* Work that waits on a rank reading its ring (which rings no doorbell) or
 * on the engine's own queues. */
static bool ranks_pending(tb_engine_t *e)
{
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_ATTACHED == r->state && (r->blocked || r->ovf_head || r->rxq_len)) {
            return true;
        }
    }
    return false;
}

/* Arm every device's completion events; true when all have them (or there
 * is none), false when one must be polled. */
static bool arm_devices(tb_engine_t *e)
{
    bool all = true;

    for (unsigned d = 0; d < e->ndev; ++d) {
        if (tb_domain_event_fd(e->devs[d].dom) < 0 || 0 != tb_domain_arm(e->devs[d].dom)) {
            all = false;
        }
    }
    e->events = all;
    return true;
}

/* How long the engine may sleep: with completion events, until the next
 * timer that can matter (a retransmission while data is unacknowledged, or
 * a keepalive); without, briefly, since only polling sees incoming frames. */
static int sleep_ms(tb_engine_t *e)
{
    if (0 == e->npeers && 0 == e->nranks) {
        return 100;
    }
    if (ranks_pending(e)) {
        return 1;
    }
    if (!e->events) {
        return (int) ((e->p.sleep_ns + 999999u) / 1000000u);
    }
    if (0 != tb_eng_peers_unacked(e)) {
        return 1;
    }
    /* While traffic flows the channels' timers (delayed acks, keepalives)
     * want it back soon; after a second of silence only keepalives do, a
     * tenth of the peer timeout apart (and arrivals wake it anyway). */
    return tb_now_ns() - e->last_traffic_ns < 1000000000ull ? 20 : 250;
}

#define ENG_SLOW_PASS_NS 1000000000ull
#define ENG_UPKEEP_SPIN_NS 50000ull

static const char *const phase_name[ENG_PH_SLEEP] = {[ENG_PH_DEVICES] = "devices",
                                                     [ENG_PH_RANKS] = "ranks",
                                                     [ENG_PH_PEERS] = "peers",
                                                     [ENG_PH_SOCKETS] = "sockets"};

static uint64_t phase_end(tb_engine_t *e, int phase, uint64_t start)
{
    uint64_t now = tb_now_ns();

    if (now - start > e->max_ns[phase]) {
        e->max_ns[phase] = now - start;
    }
    /* Peers give up after engine_peer_timeout without an acknowledgement:
     * a pass this long is said when it happens, not only at the end. */
    if (now - start > ENG_SLOW_PASS_NS && phase != ENG_PH_SLEEP) {
        TB_WARN("one pass of the engine's %s phase took %llu ms", phase_name[phase],
                (unsigned long long) ((now - start) / 1000000));
    }
    return now;
}

void tb_eng_log_loop(const tb_engine_t *e)
{
    TB_WARN("the engine's longest loop phases (ms): devices %.1f, ranks %.1f, peers %.1f, "
            "sockets %.1f, sleep %.1f; longest gap between device polls %.1f",
            e->max_ns[ENG_PH_DEVICES] / 1e6, e->max_ns[ENG_PH_RANKS] / 1e6,
            e->max_ns[ENG_PH_PEERS] / 1e6, e->max_ns[ENG_PH_SOCKETS] / 1e6,
            e->max_ns[ENG_PH_SLEEP] / 1e6, e->max_ns[ENG_PH_GAP] / 1e6);
    tb_eng_log_sleeps(e, TB_LOG_WARN);
}

void tb_eng_log_sleeps(const tb_engine_t *e, tb_log_level_t level)
{
    if (0 == e->sleeps) {
        return;
    }
    tb_log(level,
           "the engine slept %llu times: %llu ran to their end (the longest overran what it "
           "asked by %.1f ms, waiting for a CPU), and %llu of those found messages waiting "
           "when they ended (the longest such sleep %.1f ms); the others were woken by a "
           "rank's doorbell, a completion or a socket",
           (unsigned long long) e->sleeps, (unsigned long long) e->sleeps_full,
           e->sleep_overrun_max_ns / 1e6, (unsigned long long) e->sleeps_late,
           e->sleep_late_max_ns / 1e6);
}

int tb_engine_run(tb_engine_t *e)
{
    uint64_t now = tb_now_ns(), last_work = now, last_sockets = 0, drain_end = 0;
    uint64_t started = now, polled = now, rx_seen = 0, t, slept_full = 0;

    for (;;) {
        int work = 0, w, from_ranks;

        now = tb_now_ns();
        if (now - polled > e->max_ns[ENG_PH_GAP]) {
            e->max_ns[ENG_PH_GAP] = now - polled;
        }
        if (now - polled > ENG_SLOW_PASS_NS) {
            TB_WARN("the engine polled no device for %llu ms",
                    (unsigned long long) ((now - polled) / 1000000));
        }
        polled = now;
        /* A phase is timed only when it did something: an idle pass, which
         * decides how soon a message is seen, reads the clock once. */
        t = now;
        w = tb_eng_devices_progress(e, now);
        t = w ? phase_end(e, ENG_PH_DEVICES, t) : t;
        work += w;
        w = from_ranks = ranks_progress(e);
        t = w ? phase_end(e, ENG_PH_RANKS, t) : t;
        work += w;
        w = tb_eng_peers_progress(e, now);
        t = w ? phase_end(e, ENG_PH_PEERS, t) : t;
        work += w;
        if (now - last_sockets >= 1000000ull) {
            last_sockets = now;
            work += poll_sockets(e, 0);
            (void) phase_end(e, ENG_PH_SOCKETS, t);
        }
        if (work) {
            last_work = now;
        }
        /* The channels' keepalives and acks must not hold the engine in its
         * short sleeps: they made an idle engine wake 60 times a second. */
        if (from_ranks || e->rx_msgs != rx_seen) {
            rx_seen = e->rx_msgs;
            e->last_traffic_ns = now;
            if (slept_full) {
                e->sleeps_late++;
                if (slept_full > e->sleep_late_max_ns) {
                    e->sleep_late_max_ns = slept_full;
                }
            }
        }
        slept_full = 0;
        if (0 == e->nranks) {
            if (!e->ever_attached && now - started > e->p.idle_exit_ns) {
                TB_INFO("no rank attached for %llu s: exiting",
                        (unsigned long long) (e->p.idle_exit_ns / 1000000000ull));
                return 0;
            }
            if (e->ever_attached) {
                /* Every rank left: no new one is taken (a rank of the job
                 * arriving now starts the next engine); give the channels a
                 * moment to deliver what they still hold, then say goodbye. */
                if (0 == drain_end) {
                    drain_end = now + 2000000000ull;
                    close(e->listen_fd);
                    e->listen_fd = -1;
                    (void) unlinkat(e->dirfd, TB_ENGINE_SOCKET, 0);
                }
                if (0 == tb_eng_peers_unacked(e) || now > drain_end) {
                    tb_eng_peers_close(e);
                    e->finished = true;
                    return 0;
                }
            }
        } else {
            drain_end = 0;
        }
        /* Spin for a while after messages moved (an answer is likely to
         * come soon), briefly after the channels' own upkeep (keepalives
         * must not keep an idle engine spinning). */
        if (now - e->last_traffic_ns < e->p.spin_ns || now - last_work < ENG_UPKEEP_SPIN_NS) {
            /* The ranks may hold every core: one that has work runs now,
             * and the engine's next pass comes when they yield or their
             * slice ends. */
            if (!work && e->p.yield) {
                sched_yield();
            }
            continue;
        }
        /* Idle: sleep until a rank rings, a socket changes, a completion
         * comes (where the devices have events), or a timer may be due.  The
         * flag and the events first, then one more look, so what came in
         * between is not missed. */
        set_waiting(e, true);
        if (!rings_readable(e) && arm_devices(e) && 0 == tb_eng_devices_progress(e, tb_now_ns())) {
            int ms = sleep_ms(e);
            uint64_t asked = (uint64_t) ms * 1000000u;
            t = tb_now_ns();
            e->sleeps++;
            if (poll_sockets(e, ms)) {
                last_work = tb_now_ns();
            } else {
                slept_full = tb_now_ns() - t;
                e->sleeps_full++;
                if (slept_full > asked && slept_full - asked > e->sleep_overrun_max_ns) {
                    e->sleep_overrun_max_ns = slept_full - asked;
                }
            }
            (void) phase_end(e, ENG_PH_SLEEP, t);
            last_sockets = tb_now_ns();
        } else {
            last_work = tb_now_ns();
        }
        set_waiting(e, false);
    }
}

/* ---- create and destroy -------------------------------------------------- */

int tb_engine_create(const tb_engine_params_t *p, tb_engine_t **out, char *err, size_t errlen)
{
    tb_engine_t *e = calloc(1, sizeof(*e));
    char path[600], tmpname[64];
    ssize_t n;
    int fd;
    unsigned i;

    if (NULL == e) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    e->p = *p;
    e->listen_fd = -1;
    e->dirfd = -1;
    e->dh_tokens = ENG_DH_BURST;
    e->dh_refill_ns = tb_now_ns();
    for (i = 0; i < ENG_MAX_PENDING; ++i) {
        e->pending_fd[i] = -1;
    }
    for (i = 0; i < ENG_MAX_RANKS; ++i) {
        e->ranks[i].e = e;
        e->ranks[i].slot = i;
        e->ranks[i].fd = -1;
    }
    /* The largest record a rank's ring takes bounds every message. */
    e->max_record = TB_ENGINE_MAX_MSG;
    if (0 != tb_x25519_keypair(e->id, e->id_priv)) {
        snprintf(err, errlen, "no random source for the engine's identity: %s", strerror(errno));
        goto fail;
    }
    /* The directory the starting rank checked and holds, not whatever its
     * path names by now. */
    if (p->dir_fd >= 0) {
        if (0 != fcntl(p->dir_fd, F_SETFD, FD_CLOEXEC)) {
            snprintf(err, errlen, "--dir-fd %d is no open descriptor: %s (the rank that starts "
                     "the engine passes it)", p->dir_fd, strerror(errno));
            goto fail;
        }
        e->dirfd = p->dir_fd;
        if (0 != tb_jobdir_check(e->dirfd, p->dir, err, errlen)) {
            goto fail;
        }
    } else {
        e->dirfd = tb_jobdir_open(AT_FDCWD, p->dir, p->dir, false, err, errlen);
        if (e->dirfd < 0) {
            goto fail;
        }
    }
    fd = openat(e->dirfd, TB_ENGINE_KEY, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    n = fd >= 0 ? read(fd, e->key, sizeof(e->key)) : -1;
    if (fd >= 0) {
        close(fd);
    }
    if ((ssize_t) sizeof(e->key) != n) {
        snprintf(err, errlen, "cannot read the job key %s/%s: %s", p->dir, TB_ENGINE_KEY,
                 n >= 0 ? "too short" : strerror(errno));
        goto fail;
    }
    /* Who runs the directory: ranks tell a live engine from a dead one by it.
     * Written aside and renamed: a rank reading it half-written would take
     * the engine for dead and start another. */
    snprintf(tmpname, sizeof(tmpname), "%s.%d", TB_ENGINE_PIDFILE, (int) getpid());
    fd = openat(e->dirfd, tmpname, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    n = snprintf(path, sizeof(path), "%d\n", (int) getpid());
    if (fd < 0 || n != write(fd, path, (size_t) n)
        || 0 != renameat(e->dirfd, tmpname, e->dirfd, TB_ENGINE_PIDFILE)) {
        snprintf(err, errlen, "cannot write %s/%s: %s", p->dir, TB_ENGINE_PIDFILE,
                 strerror(errno));
        if (fd >= 0) {
            close(fd);
            (void) unlinkat(e->dirfd, tmpname, 0);
        }
        goto fail;
    }
    close(fd);
    if (0 != tb_eng_devices_open(e, e->nodev_why, sizeof(e->nodev_why))) {
        TB_INFO("no device: %s", e->nodev_why);
    }
    snprintf(tmpname, sizeof(tmpname), "%s.%d", TB_ENGINE_SOCKET, (int) getpid());
    (void) unlinkat(e->dirfd, tmpname, 0);
    if (0 == tb_jobdir_sock_path(e->dirfd, p->dir, tmpname, path, sizeof(path))) {
        e->listen_fd = tb_usock_listen(path);
    }
    /* Listening before the name appears: a rank that can connect can attach. */
    if (e->listen_fd < 0 || 0 != renameat(e->dirfd, tmpname, e->dirfd, TB_ENGINE_SOCKET)) {
        snprintf(err, errlen, "cannot listen at %s/%s: %s", p->dir, TB_ENGINE_SOCKET,
                 strerror(errno));
        (void) unlinkat(e->dirfd, tmpname, 0);
        goto fail;
    }
    *out = e;
    return 0;

fail:
    tb_engine_destroy(e);
    return -1;
}

void tb_engine_destroy(tb_engine_t *e)
{
    if (NULL == e) {
        return;
    }
    for (unsigned i = 0; i < ENG_MAX_RANKS; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_FREE != r->state) {
            r->state = ENG_RANK_DEAD;
        }
    }
    tb_eng_cms_close(e);
    tb_eng_peers_destroy(e);
    if (e->tx_bytes || e->rx_bytes) {
        TB_INFO("data between this host's ranks and other engines: sent %.1f MiB, %.2f copies "
                "per byte; received %.1f MiB, %.2f copies per byte",
                (double) e->tx_bytes / 1048576.0,
                e->tx_bytes ? (double) e->tx_copied / (double) e->tx_bytes : 0.0,
                (double) e->rx_bytes / 1048576.0,
                e->rx_bytes ? (double) e->rx_copied / (double) e->rx_bytes : 0.0);
    }
    tb_eng_log_sleeps(e, TB_LOG_INFO);
    if (e->relayed_msgs) {
        TB_INFO("relayed for other hosts: %llu messages, %.1f MiB",
                (unsigned long long) e->relayed_msgs, (double) e->relayed_bytes / 1048576.0);
    }
    for (unsigned i = 0; i < ENG_MAX_RANKS; ++i) {
        if (ENG_RANK_FREE != e->ranks[i].state) {
            tb_eng_rank_free(&e->ranks[i]);
        }
    }
    tb_eng_devices_close(e);
    for (unsigned i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] >= 0) {
            close(e->pending_fd[i]);
        }
    }
    if (e->listen_fd >= 0) {
        close(e->listen_fd);
        (void) unlinkat(e->dirfd, TB_ENGINE_SOCKET, 0);
    }
    if (e->dirfd >= 0 && e->finished && tb_jobdir_engine_pid(e->dirfd) == getpid()) {
        /* The job is over on this host: leave nothing behind, unless a rank
         * holds the lock to start the next engine (a late rank of the job).
         * After a fault the log (and the lock) stay, for the user the ranks'
         * messages send there; later jobs sweep them (tb_eclient.c). */
        static const char *const files[] = {TB_ENGINE_KEY, TB_ENGINE_PIDFILE,
                                            /* kept after a fault: */ TB_ENGINE_LOCK,
                                            TB_ENGINE_LOG};
        /* The log is kept too when the user asked for information in it. */
        const bool keep = e->faults || tb_log_enabled(TB_LOG_INFO);
        const size_t nfiles = keep ? 2 : sizeof(files) / sizeof(files[0]);
        const char *name = strrchr(e->p.dir, '/');
        int lock, parent;
        lock = openat(e->dirfd, TB_ENGINE_LOCK, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (lock >= 0 && 0 == flock(lock, LOCK_EX | LOCK_NB)) {
            if (e->faults) {
                TB_INFO("%u fault%s in this job: keeping this log", e->faults,
                        1 == e->faults ? "" : "s");
            }
            for (size_t i = 0; i < nfiles; ++i) {
                (void) unlinkat(e->dirfd, files[i], 0);
            }
            /* Through the directory's real parent, and only if its name
             * there is still this directory. */
            parent = openat(e->dirfd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (parent >= 0) {
                tb_jobdir_remove(parent, name ? name + 1 : e->p.dir, e->dirfd);
                close(parent);
            }
        }
        if (lock >= 0) {
            close(lock);
        }
    }
    if (e->dirfd >= 0) {
        close(e->dirfd);
    }
    tb_mem_wipe(e->id_priv, sizeof(e->id_priv));
    tb_mem_wipe(e->job_key, sizeof(e->job_key));
    tb_mem_wipe(e->key, sizeof(e->key));
    free(e);
}
