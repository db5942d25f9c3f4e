/*
 * tbrdma host engine, daemon: ranks attaching over the engine's socket,
 * detaching, and dying.
 */
#include "tb_engine_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tb_log.h"
#include "tb_shm_segment.h"
#include "tb_usock.h"

/* ---- attach, detach, death ----------------------------------------------- */

void tb_eng_rank_free(eng_rank_t *r)
{
    tb_engine_t *e = r->e;
    eng_msg_t *m, *next;

    tb_eng_peers_forget_rank(e, r);
    for (m = r->ovf_head; m; m = next) {
        next = m->next;
        free(m);
    }
    if (r->seg) {
        munmap(r->seg, r->seg_len);
    }
    if (r->fd >= 0) {
        close(r->fd);
    }
    free(r->rxq);
    free(r->routes);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
    r->state = ENG_RANK_FREE;
    r->e = e;
    r->slot = (unsigned) (r - e->ranks);
    e->nranks--;
    while (e->rank_hwm > 0 && ENG_RANK_FREE == e->ranks[e->rank_hwm - 1].state) {
        e->rank_hwm--;
    }
    e->last_detach_ns = tb_now_ns();
}

/* The host's other ranks may hold routes to r on any device: each hears it
 * on every device's local link. */
static void local_rank_gone(eng_rank_t *r, const char *why)
{
    tb_engine_t *e = r->e;

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *o = &e->ranks[i];
        if (o == r || ENG_RANK_ATTACHED != o->state) {
            continue;
        }
        for (unsigned d = 0; d < e->ndev; ++d) {
            tb_eng_rank_post(o, TB_EREC_GONE, 0, (uint16_t) (TB_ELINK_LOCAL + d), r->vpid,
                             (uint32_t) r->pid, why, strlen(why), NULL, 0);
        }
    }
}

void tb_eng_rank_fail(eng_rank_t *r, const char *why)
{
    char text[200];

    if (ENG_RANK_ATTACHED != r->state) {
        return;
    }
    r->state = ENG_RANK_DEAD;
    if (0 == r->e->faults++) {
        /* What the links held when the job started to fail. */
        tb_eng_peers_log_state(r->e);
        tb_eng_log_loop(r->e);
    }
    if (r->fd >= 0) {
        /* It learns at once that the engine dropped it. */
        close(r->fd);
        r->fd = -1;
    }
    if (!r->bye) {
        snprintf(text, sizeof(text), "rank %u (pid %d) on the engine's host %s", (unsigned) r->vpid,
                 (int) r->pid, why);
        TB_WARN("%s", text);
        tb_eng_peers_rank_gone(r->e, r->vpid, (uint32_t) r->pid, text);
        local_rank_gone(r, text);
    }
}

static void reply_attach(tb_engine_t *e, int fd, pid_t pid, uint8_t status, const char *why)
{
    tb_wire_eattach_reply_t rep;

    memset(&rep, 0, sizeof(rep));
    rep.magic = tb_wire_le32(TB_WIRE_ENGINE_MAGIC);
    rep.version = TB_WIRE_ENGINE_VERSION;
    rep.status = status;
    rep.engine_pid = tb_wire_le32((uint32_t) getpid());
    rep.max_record = tb_wire_le32(e->max_record);
    rep.rank_pid = tb_wire_le32((uint32_t) pid);
    memcpy(rep.engine_id, e->id, sizeof(rep.engine_id));
    snprintf(rep.why, sizeof(rep.why), "%s", why ? why : "");
    if (TB_EATTACH_OK == status) {
        rep.ndevices = (uint8_t) e->ndev;
        for (unsigned d = 0; d < e->ndev; ++d) {
            const tb_device_t *dev = e->devs[d].dev;
            tb_wire_edev_t *o = &rep.devices[d];
            snprintf(o->name, sizeof(o->name), "%s", dev->name);
            snprintf(o->netdev, sizeof(o->netdev), "%s", dev->netdev);
            o->ipv4 = dev->ipv4.s_addr;
            o->netmask = dev->netmask.s_addr;
            memcpy(o->gid, dev->gid.raw, sizeof(o->gid));
            o->cm_port = tb_wire_le16(e->devs[d].port);
        }
    }
    (void) tb_usock_send(fd, &rep, sizeof(rep), -1);
}

static bool key_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;

    for (unsigned i = 0; i < TB_WIRE_SECRET_SIZE; ++i) {
        d |= (uint8_t) (a[i] ^ b[i]);
    }
    return 0 == d;
}

/* A new connection waits among the pending ones until its request arrives
 * (tb_eng_attach_rank); when they are all taken, the oldest gives way. */
void tb_eng_accept(tb_engine_t *e, uint64_t now)
{
    unsigned i, slot = 0;
    uid_t uid;
    pid_t pid;
    int fd = accept(e->listen_fd, NULL, NULL);

    if (fd < 0) {
        return;
    }
    /* Only this user's processes: anyone else is closed on unheard. */
    if (0 != tb_usock_peer(fd, &uid, &pid) || uid != getuid()) {
        TB_WARN("refused a process of uid %d on the engine's socket", (int) uid);
        close(fd);
        return;
    }
    /* Said, not inherited: Linux's accept gives a blocking socket, macOS's
     * the listener's O_NONBLOCK, and the engine must never wait on a rank. */
    if (0 != fcntl(fd, F_SETFL, O_NONBLOCK)) {
        TB_WARN("could not make a rank's socket non-blocking (fcntl: %s): closed it",
                strerror(errno));
        close(fd);
        return;
    }
    for (i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] < 0) {
            slot = i;
            break;
        }
        if (e->pending_since[i] < e->pending_since[slot]) {
            slot = i;
        }
    }
    if (e->pending_fd[slot] >= 0) {
        TB_WARN("more than %d processes connected without asking to attach: "
                "dropped the oldest", ENG_MAX_PENDING);
        close(e->pending_fd[slot]);
    }
    e->pending_fd[slot] = fd;
    e->pending_since[slot] = now;
}

/* Connections that said nothing for too long are dropped. */
void tb_eng_expire_pending(tb_engine_t *e, uint64_t now)
{
    for (unsigned i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] >= 0 && now - e->pending_since[i] > ENG_PENDING_NS) {
            TB_WARN("a process connected and did not ask to attach within %llu s: dropped",
                    (unsigned long long) (ENG_PENDING_NS / 1000000000ull));
            close(e->pending_fd[i]);
            e->pending_fd[i] = -1;
        }
    }
}

/* The request has arrived on fd (poll said so): it is read at once, never
 * waited for. */
void tb_eng_attach_rank(tb_engine_t *e, int fd)
{
    tb_wire_eattach_t req;
    eng_rank_t *r = NULL;
    uid_t uid;
    pid_t pid;
    const char *why;
    int shm = -1;
    unsigned i;
    void *seg;
    size_t seg_len;

    if (0 != tb_usock_peer(fd, &uid, &pid)
        || 0 != tb_usock_recv(fd, &req, sizeof(req), &shm, 0)) {
        close(fd);
        return;
    }
    if (TB_WIRE_ENGINE_MAGIC != tb_wire_le32(req.magic) || TB_WIRE_ENGINE_VERSION != req.version) {
        reply_attach(e, fd, pid, TB_EATTACH_REFUSED,
                     "another tbrdma version's engine runs for this job (mixed installations?)");
        goto refuse;
    }
    if (!key_equal(req.key, e->key)) {
        reply_attach(e, fd, pid, TB_EATTACH_REFUSED, "wrong job key");
        goto refuse;
    }
    if (pid <= 0) {
        /* A rank is bound to its pid, so one the engine cannot name is
         * nobody's; a rank in such a namespace refuses the engine too. */
        reply_attach(e, fd, pid, TB_EATTACH_REFUSED,
                     "the engine cannot see the rank's process (another pid namespace): a job's "
                     "ranks on one host run in one pid namespace");
        goto refuse;
    }
    /* A vpid is one process's: a second claim of a live one (another
     * process of the user holding the job's key) would read that rank's
     * messages, send in its name, and announce its death when it left. */
    for (i = 0; i < e->rank_hwm; ++i) {
        const eng_rank_t *o = &e->ranks[i];
        if ((ENG_RANK_ATTACHED == o->state || ENG_RANK_NODEV == o->state)
            && o->vpid == tb_wire_le32(req.vpid)) {
            char text[200];
            snprintf(text, sizeof(text), "rank %u is attached already (pid %d); pid %d claims it too",
                     (unsigned) o->vpid, (int) o->pid, (int) pid);
            TB_WARN("refused an attach: %s", text);
            reply_attach(e, fd, pid, TB_EATTACH_REFUSED, text);
            goto refuse;
        }
    }
    if (e->ndev == 0) {
        reply_attach(e, fd, pid, TB_EATTACH_NODEV, e->nodev_why);
        /* Kept open so the engine lives while ranks may still ask. */
    }
    for (i = 0; i < ENG_MAX_RANKS; ++i) {
        if (ENG_RANK_FREE == e->ranks[i].state) {
            r = &e->ranks[i];
            break;
        }
    }
    if (NULL == r) {
        if (e->ndev) {
            reply_attach(e, fd, pid, TB_EATTACH_FULL,
                         "the engine serves at most 64 ranks per host");
        }
        goto refuse;
    }
    seg_len = tb_shm_ring_segment_size(tb_wire_le64(req.ring_size));
    if (e->ndev && (!tb_shm_ring_size_ok(tb_wire_le64(req.ring_size))
                    || tb_wire_le64(req.ring_size) < TB_ENGINE_MIN_RING)) {
        reply_attach(e, fd, pid, TB_EATTACH_REFUSED, "bad ring size");
        goto refuse;
    }
    /* A segment the rank could still shrink would fault the engine's accesses. */
    if (e->ndev && NULL != (why = tb_shm_segment_check(shm, seg_len))) {
        reply_attach(e, fd, pid, TB_EATTACH_REFUSED, why);
        goto refuse;
    }
    memset(r, 0, sizeof(*r));
    r->e = e;
    r->slot = i;
    if (i + 1 > e->rank_hwm) {
        e->rank_hwm = i + 1;
    }
    r->fd = fd;
    r->vpid = tb_wire_le32(req.vpid);
    r->pid = pid;
    r->state = ENG_RANK_ATTACHED;
    e->nranks++;
    e->ever_attached = true;
    if (0 == e->ndev) {
        r->state = ENG_RANK_NODEV;
        if (shm >= 0) {
            close(shm);
        }
        return;
    }
    seg = mmap(NULL, seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    close(shm);
    shm = -1;
    r->routes = malloc(ENG_MAX_ROUTES * sizeof(*r->routes));
    if (MAP_FAILED == seg || NULL == r->routes) {
        r->seg = NULL;
        reply_attach(e, fd, pid, TB_EATTACH_REFUSED, "the engine cannot map the rings");
        r->state = ENG_RANK_DEAD;
        if (MAP_FAILED != seg) {
            munmap(seg, seg_len);
        }
        return;
    }
    for (i = 0; i < ENG_MAX_ROUTES; ++i) {
        r->routes[i] = -1;
    }
    memset(r->route_host, 0, sizeof(r->route_host));
    r->seg = seg;
    r->seg_len = seg_len;
    /* The rank reset both rings before sharing them. */
    tb_shm_ring_attach(&r->tx, seg, tb_wire_le64(req.ring_size), 0, false);
    tb_shm_ring_attach(&r->rx, seg, tb_wire_le64(req.ring_size), 1, false);
    /* A rank polls its ring and never sleeps on it: no doorbell to ask for. */
    tb_shm_ring_consumer_spins(&r->rx);
    reply_attach(e, fd, pid, TB_EATTACH_OK, NULL);
    TB_INFO("rank %u (pid %d) attached", (unsigned) r->vpid, (int) pid);
    return;

refuse:
    if (shm >= 0) {
        close(shm);
    }
    close(fd);
}

