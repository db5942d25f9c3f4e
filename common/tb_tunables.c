/*
 * tbrdma common layer: the user-settable parameters and their validation.
 */
#include "tb_tunables.h"
#include "tb_channel.h"
#include "tb_device.h"
#include "tb_namefilter.h"

#include <stdio.h>
#include <string.h>

void tb_tunables_defaults(tb_tunables_t *t)
{
    memset(t, 0, sizeof(*t));
    t->verbs_library = "";
    t->if_include = "";
    t->if_exclude = "";
    t->lanes = 2;
    t->small_frame_size = TB_FRAME_SIZE;
    t->bulk_frame_size = 16 * TB_FRAME_SIZE;
    t->recv_depth = TB_APPLE_MAX_RECV_DEPTH;
    t->qps_per_device = TB_APPLE_MAX_QP;
    /* A process's keeper thread answers for it while it computes (the BTL's
     * direct path, tb_keeper.h), and an engine always answers: silence this
     * long is a dead peer or a cut cable. */
    t->peer_timeout_ms = 5000;
    /* Data not acknowledged while frames do arrive: a frame of 16 packets
     * at 10 % packet loss gets through about one try in five, so its resends
     * may take seconds; a peer that takes nothing for this long is broken. */
    t->stall_timeout_ms = 30000;
    /* A timeout first probes (a header-only frame) before resending, and a
     * frame that is merely late cannot be overtaken by its resend on a UC
     * queue pair: a floor in milliseconds costs nothing on a healthy link,
     * where 200 us fired on every stall of the emulated cluster. */
    t->rto_min_us = 2000;
    /* Payload integrity is the link's job (Thunderbolt's and RoCE's own CRCs),
     * as in Open MPI's other transports; a software CRC32C of every payload
     * byte on both sides cost 55 us of CPU per 4 KiB message and 15 ms per
     * MiB under emulation (the profile in bench/results), and would cost
     * bandwidth at 9 GB/s.  The header, which steers where data lands, is
     * always checked. */
    t->checksum = TB_CHECKSUM_HEADER;
}

static int check_frame(const char *prefix, const char *name, uint32_t value, char *err,
                       size_t errlen)
{
    if (0 == value || 0 != value % TB_FRAME_SIZE || value > TB_APPLE_MAX_MSG_SIZE) {
        snprintf(err, errlen,
                 "%s%s = %u: must be a multiple of %u bytes (the 4 KiB RDMA frame) between "
                 "%u and %u",
                 prefix, name, (unsigned) value, TB_FRAME_SIZE, TB_FRAME_SIZE,
                 TB_APPLE_MAX_MSG_SIZE);
        return -1;
    }
    return 0;
}

static int check_range(const char *prefix, const char *name, long value, long lo, long hi,
                       const char *why, char *err, size_t errlen)
{
    if (value < lo || value > hi) {
        snprintf(err, errlen, "%s%s = %ld: must be between %ld and %ld%s%s", prefix, name, value,
                 lo, hi, why ? " " : "", why ? why : "");
        return -1;
    }
    return 0;
}

int tb_tunables_validate(const tb_tunables_t *t, const char *prefix, char *err, size_t errlen)
{
    tb_namefilter_t filter;
    char ferr[256];

    if (0 != tb_namefilter_parse(&filter, t->if_include, t->if_exclude, ferr, sizeof(ferr))) {
        snprintf(err, errlen, "%sif_include/%sif_exclude: %s", prefix, prefix, ferr);
        return -1;
    }
    if (0 != check_range(prefix, "lanes", t->lanes, 1, 2,
                         "(1: all traffic in small frames; 2: small and bulk queue pairs)", err,
                         errlen) ||
        0 != check_frame(prefix, "small_frame_size", t->small_frame_size, err, errlen) ||
        0 != check_frame(prefix, "bulk_frame_size", t->bulk_frame_size, err, errlen) ||
        0 != check_range(prefix, "recv_depth", t->recv_depth, 2, TB_APPLE_MAX_RECV_DEPTH,
                         "(Apple's RDMA refuses more outstanding receives per queue pair)",
                         err, errlen) ||
        0 != check_range(prefix, "qps_per_device", t->qps_per_device, t->lanes,
                         TB_APPLE_MAX_QP,
                         "(Apple's RDMA allows 10 queue pairs per device, and a connection "
                         "needs one per lane)",
                         err, errlen) ||
        0 != check_range(prefix, "peer_timeout", t->peer_timeout_ms, 100, 3600000,
                         "milliseconds", err, errlen) ||
        0 != check_range(prefix, "stall_timeout", t->stall_timeout_ms, 100, 3600000,
                         "milliseconds", err, errlen) ||
        0 != check_range(prefix, "rto_min", t->rto_min_us, 10, 10000000, "microseconds", err,
                         errlen)) {
        return -1;
    }
    if (2 == t->lanes && t->bulk_frame_size <= t->small_frame_size) {
        snprintf(err, errlen,
                 "%sbulk_frame_size = %u must be larger than %ssmall_frame_size = %u "
                 "(or set %slanes = 1)",
                 prefix, (unsigned) t->bulk_frame_size, prefix, (unsigned) t->small_frame_size,
                 prefix);
        return -1;
    }
    if ((uint64_t) t->rto_min_us >= (uint64_t) t->peer_timeout_ms * 1000u) {
        snprintf(err, errlen, "%srto_min = %u us must be shorter than %speer_timeout = %u ms",
                 prefix, (unsigned) t->rto_min_us, prefix, (unsigned) t->peer_timeout_ms);
        return -1;
    }
    if (NULL == tb_checksum_mode_name(t->checksum)) {
        snprintf(err, errlen, "%schecksum = %d: must be \"full\" or \"header\"", prefix,
                 t->checksum);
        return -1;
    }
    return 0;
}

int tb_checksum_mode_parse(const char *name)
{
    if (0 == strcmp(name, "full")) {
        return TB_CHECKSUM_FULL;
    }
    if (0 == strcmp(name, "header")) {
        return TB_CHECKSUM_HEADER;
    }
    return -1;
}

const char *tb_checksum_mode_name(int mode)
{
    switch (mode) {
    case TB_CHECKSUM_FULL:
        return "full";
    case TB_CHECKSUM_HEADER:
        return "header";
    default:
        return NULL;
    }
}

void tb_tunables_channel_params(const tb_tunables_t *t, struct tb_channel_params *p)
{
    tb_channel_params_default(p);
    p->nlanes = (unsigned) t->lanes;
    p->frame_size[0] = t->small_frame_size;
    p->frame_size[1] = t->bulk_frame_size;
    for (unsigned lane = 0; lane < TB_WIRE_MAX_LANES; ++lane) {
        p->recv_depth[lane] = (unsigned) t->recv_depth;
    }
    p->recv_depth_max = TB_APPLE_MAX_RECV_DEPTH;
    p->payload_crc = TB_CHECKSUM_FULL == t->checksum;
    p->rto_min_ns = (uint64_t) t->rto_min_us * 1000u;
    if (p->rto_max_ns < p->rto_min_ns) {
        p->rto_max_ns = p->rto_min_ns;
    }
    p->peer_timeout_ns = (uint64_t) t->peer_timeout_ms * 1000000u;
    p->stall_timeout_ns = tb_tunables_stall_timeout_ns(t);
}

uint64_t tb_tunables_stall_timeout_ns(const tb_tunables_t *t)
{
    uint32_t ms = t->stall_timeout_ms > t->peer_timeout_ms ? t->stall_timeout_ms
                                                           : t->peer_timeout_ms;
    return (uint64_t) ms * 1000000u;
}
