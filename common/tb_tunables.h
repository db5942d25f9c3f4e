/*
 * tbrdma common layer: the user-settable parameters and their validation.
 *
 * The BTL registers these as MCA parameters (btl_tbrdma_<name>) and tools
 * take them as options; both validate here so the rules and the messages
 * are the same everywhere.
 */
#ifndef TB_TUNABLES_H
#define TB_TUNABLES_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TB_CHECKSUM_FULL = 0,   /* CRC32C over header and payload */
    TB_CHECKSUM_HEADER = 1, /* header only: trusts the link's own CRC for data */
} tb_checksum_mode_t;

typedef struct tb_tunables {
    const char *verbs_library; /* "" = platform default */
    const char *if_include;    /* device-name patterns */
    const char *if_exclude;
    int lanes;                 /* queue pairs per connection: 1 small, or small + bulk */
    uint32_t small_frame_size; /* bytes per small-lane receive, a multiple of 4 KiB */
    uint32_t bulk_frame_size;  /* bytes per bulk-lane receive, a multiple of 4 KiB */
    int recv_depth;            /* receives posted per queue pair */
    int qps_per_device;        /* QP budget this process may use on one device */
    uint32_t peer_timeout_ms;  /* silence after which a peer is declared dead */
    uint32_t stall_timeout_ms; /* a peer that answers but takes nothing for this long is failed
                                * (at least peer_timeout_ms) */
    uint32_t rto_min_us;       /* first retransmit timeout */
    int checksum;              /* tb_checksum_mode_t */
} tb_tunables_t;

void tb_tunables_defaults(tb_tunables_t *t);

/* Check every field.  Returns 0, or -1 with a message in err naming the
 * parameter as <prefix><name>, the bad value and the allowed range. */
int tb_tunables_validate(const tb_tunables_t *t, const char *prefix, char *err, size_t errlen);

/* The channel parameters the tunables set (lanes, frames, depth, checksum,
 * retransmit floor, peer timeout), the rest at their defaults; the caller
 * sets max_msg_size. */
struct tb_channel_params;
void tb_tunables_channel_params(const tb_tunables_t *t, struct tb_channel_params *p);

/* How long a peer may answer yet take nothing (stall_timeout_ms, at least
 * peer_timeout_ms), in ns: data unacknowledged, put/get answers that do not
 * come, a connection setup that does not finish. */
uint64_t tb_tunables_stall_timeout_ns(const tb_tunables_t *t);

/* "full"/"header" <-> tb_checksum_mode_t; -1 for an unknown name. */
int tb_checksum_mode_parse(const char *name);
const char *tb_checksum_mode_name(int mode);

#endif /* TB_TUNABLES_H */
