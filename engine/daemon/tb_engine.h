/*
 * tbrdma host engine: the daemon.
 *
 * Apple's limits (about 10 queue pairs and 100 registrations per device) are
 * per host, so one process per host and job owns the devices: the engine.
 * The job's processes on the host (ranks) attach to it over a Unix socket in
 * the job's private directory and exchange records with it through two
 * rings in shared memory each (tb_shm_ring.h, formats in tb_eproto.h).
 *
 * Between hosts, engines hold one reliable channel (tb_channel.h) per pair
 * of hosts per cable, shared by every rank at both ends, so the queue pairs
 * and registrations of a device do not grow with the number of ranks.  A
 * message names its source and destination rank.  Flow control is per
 * destination rank: an engine has at most credit_window bytes in flight to
 * one remote rank, returned as that rank consumes them, so a rank that stops
 * reading holds back only the traffic sent to it (which waits at the sending
 * engine, at most held_max bytes per sending rank, then in that rank's ring).
 *
 * Engines progress all the time, so acknowledgements, retransmissions and
 * keepalives do not depend on what the ranks are doing; when nothing moves
 * the engine sleeps in poll() on the ranks' sockets (doorbells) with a short
 * timeout for the channels' timers.
 *
 * Lifetime: the first rank of the job on the host starts it (tb_eclient.h);
 * it exits once every rank has detached (after giving the channels time to
 * deliver what they hold), or when no rank attached within idle_exit_ns.  A
 * rank that closes its socket without saying BYE died: the engine tells the
 * engines it talks to, whose ranks fail their endpoints to it at once.
 */
#ifndef TB_ENGINE_H
#define TB_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tb_eproto.h"
#include "tb_tunables.h"

typedef struct tb_engine tb_engine_t;

typedef struct tb_engine_params {
    const char *dir;        /* the job's private directory on this host */
    int dir_fd;             /* that directory as the rank that started the engine
                             * opened it, or -1: open dir */
    tb_tunables_t tunables; /* devices, frames, lanes, timeouts */
    uint64_t credit_window; /* bytes in flight to one remote rank */
    uint64_t held_max;      /* bytes one rank may have waiting for credit */
    uint64_t idle_exit_ns;  /* exit when no rank attached for this long */
    uint64_t spin_ns;       /* poll without sleeping this long after the last message */
    uint64_t sleep_ns;      /* longest sleep while channels are open */
    int events;             /* sleep on the devices' completion events where they have them */
    int yield;              /* give the CPU up at each idle pass of the spin */
} tb_engine_params_t;

/* Credit window 4 MiB, 8 MiB held per rank, exit after 60 s without a rank,
 * spin 1 ms after the last message (50 us after other work) yielding the
 * CPU at each idle pass; completion events on: where the devices have them,
 * a completion wakes the engine, which sleeps 20 ms at a time while traffic
 * flows and 250 ms after a second without (without them, 1 ms). */
void tb_engine_params_default(tb_engine_params_t *p);

/* Open the devices and listen at dir/engine.sock.  No usable device is not
 * an error: the engine then tells each rank why at attach.  0, or -1 with
 * the reason in err. */
int tb_engine_create(const tb_engine_params_t *p, tb_engine_t **out, char *err, size_t errlen);

/* Serve until the job is over.  The process's exit status. */
int tb_engine_run(tb_engine_t *e);

/* Close everything and remove the socket. */
void tb_engine_destroy(tb_engine_t *e);

#endif /* TB_ENGINE_H */
