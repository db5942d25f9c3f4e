/*
 * tbrdma_chan: what its setup (tbrdma_chan.c) and its modes
 * (tbrdma_chan_modes.c) share: the run's configuration on the wire, the
 * state of the one connection, and the clock.
 */
#ifndef TBRDMA_CHAN_H
#define TBRDMA_CHAN_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tb_channel.h"
#include "tb_cm.h"
#include "tb_domain.h"

#define MIB (1024.0 * 1024.0)
#define MAX_MSG (16u << 20)
#define LISTENER_ID "tbrdma_chan-listener"
#define CONNECTOR_ID "tbrdma_chan-connector"

enum { TAG_CONFIG = 1, TAG_DATA, TAG_END, TAG_BYE, TAG_PING, TAG_PONG, TAG_BW_DONE };
enum { MODE_NONE, MODE_STREAM, MODE_LAT, MODE_BW, MODE_WAIT, MODE_COUNT };
extern const char *const mode_names[MODE_COUNT];

/* The first message: what the connecting side wants (little-endian). */
typedef struct __attribute__((packed)) run_config {
    uint32_t mode;
    uint32_t size;
    uint64_t seed;
    uint64_t total;
    uint64_t iters;
    uint32_t max_size;
} run_config_t;

typedef struct end_msg {
    uint64_t msgs;
    uint64_t bytes;
} end_msg_t;

typedef struct app {
    run_config_t cfg;
    int listener;
    tb_domain_t *domain;
    tb_conn_t *conn;
    tb_channel_t *ch;
    tb_cm_t *cm;
    int connected;    /* blobs exchanged, tb_conn_connect called */
    int setup_error;
    int chan_status;  /* 0, or the status the channel failed with */
    char chan_why[256];
    double fail_wall; /* wall-clock time of the failure */
    /* stream */
    uint64_t tx_seed, rx_seed;
    uint64_t tx_next, tx_bytes, tx_done, tx_inflight_bytes;
    int tx_end_queued, bye_queued, bye_acked;
    uint64_t rx_next, rx_bytes;
    int rx_end, rx_bye;
    uint64_t lost, dup, corrupt, bad_len;
    unsigned char *echo; /* lat: the pong's copy of the ping */
    size_t echo_len;
    /* lat / bw */
    uint64_t got_pong, got_bw_done, bw_recv, bw_bytes;
    int config_seen;
    uint64_t send_errors;
} app_t;

extern app_t A;

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static inline double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double) ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Print the message and exit with status 2 (a setup error). */
__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...);

/* tbrdma_chan.c */
void chan_progress(void);

/* tbrdma_chan_modes.c */
void chan_on_recv(void *ctx, uint8_t tag, const void *data, size_t len);
void chan_on_send_done(void *ctx, void *cookie, int status);
void chan_on_error(void *ctx, int status, const char *why);
void chan_print_counters(const char *who);
int chan_run_stream(void);
int chan_run_lat_client(void);
int chan_run_bw_client(void);
int chan_run_wait(const char *fault_file);
int chan_serve(const char *fault_file);

#endif /* TBRDMA_CHAN_H */
