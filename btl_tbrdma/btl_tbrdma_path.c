/*
 * tbrdma BTL: which path the job takes under btl_tbrdma_path auto, one
 * answer for the whole job, so that no pair of processes ends with one on
 * each path.
 *
 * The direct path needs every host's processes within its cables'
 * queue-pair budget (two per host) and a cable to every other host: with
 * three hosts or more the cabling may be a ring or a line, which only the
 * engines' relaying reaches.  It also cannot fail over, so it is not taken
 * where a second path may exist: two hosts that both have two cables or
 * more.  The launcher's map says the first (every process reads it alike);
 * the cables only each host knows, so the first process of each host
 * publishes its count and the others wait for it before deciding.
 */
#include "tb_config.h"
#include "btl_tbrdma.h"
#include "btl_tbrdma_compat.h"

#include <stdlib.h>
#include <string.h>

#include "opal/util/error.h"
#include "opal/util/output.h"
#include "opal/util/proc.h"

#define CABLES_KEY "tbrdma.cables"
/* How long a process waits for the other host's count: that host's first
 * process reaches this point within the job's start-up unless it does not
 * run tbrdma at all (then the answer does not matter to it). */
#define CABLES_WAIT_S 60

typedef struct job_shape {
    int nhosts;
    int most;          /* processes on the fullest host */
    uint32_t first[2]; /* with two hosts: the lowest vpid of this host, of the other */
} job_shape_t;

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *) a, *(char *const *) b);
}

/* The job's shape from the launcher's map, which every process reads alike.
 * False if the runtime does not say. */
static bool job_shape(job_shape_t *shape)
{
    uint32_t size = tbrdma_compat_job_size(), me = OPAL_PROC_MY_NAME.vpid;
    char **hosts, **sorted = NULL;
    bool known = true;
    int run = 0;

    memset(shape, 0, sizeof(*shape));
    if (0 == size || size > (1u << 20) || me >= size ||
        NULL == (hosts = calloc(2 * (size_t) size, sizeof(*hosts)))) {
        return false;
    }
    for (uint32_t v = 0; v < size; ++v) {
        hosts[v] = tbrdma_compat_hostname(v);
        if (NULL == hosts[v]) {
            known = false;
            break;
        }
    }
    if (known) {
        sorted = hosts + size;
        memcpy(sorted, hosts, size * sizeof(*hosts));
        qsort(sorted, size, sizeof(*sorted), compare_strings);
        for (uint32_t v = 0; v < size; ++v) {
            bool same = v > 0 && 0 == strcmp(sorted[v], sorted[v - 1]);
            run = same ? run + 1 : 1;
            shape->nhosts += !same;
            shape->most = run > shape->most ? run : shape->most;
        }
        shape->first[0] = shape->first[1] = UINT32_MAX;
        for (uint32_t v = 0; v < size; ++v) {
            int other = 0 != strcmp(hosts[v], hosts[me]);
            if (UINT32_MAX == shape->first[other]) {
                shape->first[other] = v;
            }
        }
    }
    for (uint32_t v = 0; v < size; ++v) {
        free(hosts[v]);
    }
    free(hosts);
    return known && shape->nhosts > 0;
}

/* This host's usable devices, one per cable, as the direct path would open
 * them (btl_tbrdma_if_include/if_exclude applied). */
static uint32_t usable_cables(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    tb_device_list_t list;
    tb_namefilter_t filter;
    char err[256];
    int n;

    memset(&list, 0, sizeof(list));
    (void) tb_namefilter_parse(&filter, c->tunables.if_include, c->tunables.if_exclude, err,
                               sizeof(err));
    if (0 != tb_device_list_open(&list, c->tunables.verbs_library, &filter, err, sizeof(err))) {
        return 0;
    }
    n = tb_device_list_usable_count(&list);
    tb_device_list_close(&list);
    return n > 0 ? (uint32_t) n : 0;
}

/* The cables of the host whose first process is vpid: this process's own
 * count, or that process's as published.  False if it did not say. */
static bool cables_of(uint32_t vpid, uint32_t mine, uint32_t *cables)
{
    int rc;

    if (vpid == OPAL_PROC_MY_NAME.vpid) {
        *cables = mine;
        return true;
    }
    rc = tbrdma_compat_wait_u32(vpid, CABLES_KEY, CABLES_WAIT_S, cables);
    if (OPAL_SUCCESS != rc) {
        /* Said once per host: every process of this host reads the same. */
        if (opal_process_info.my_local_rank <= 0) {
            opal_output(0,
                        "btl:tbrdma on %s: process %u, the first of its host, did not say "
                        "within %d s how many cables its host has (%s); btl_tbrdma_path auto "
                        "takes the direct path.  If that host runs tbrdma, set btl_tbrdma_path "
                        "to direct or engine on every host",
                        opal_process_info.nodename, (unsigned) vpid, CABLES_WAIT_S,
                        opal_strerror(rc));
        }
        return false;
    }
    return true;
}

/* With two hosts of at most two processes each, each host's first process
 * publishes its host's count (0: none, also when it cannot count), which its
 * host's processes and the other host's read.  Returns what it published. */
static uint32_t publish_cables(const job_shape_t *shape, bool count)
{
    uint32_t mine;

    if (2 != shape->nhosts || shape->most > 2 || shape->first[0] != OPAL_PROC_MY_NAME.vpid) {
        return 0;
    }
    mine = count ? usable_cables() : 0;
    if (OPAL_SUCCESS != tbrdma_compat_publish_u32(CABLES_KEY, mine)) {
        /* The others read nothing and take the direct path: so does this one. */
        BTL_TBRDMA_VERBOSE(10, "path auto: cannot publish this host's cable count");
        return 0;
    }
    return mine;
}

void mca_btl_tbrdma_path_auto_none(void)
{
    job_shape_t shape;

    if (job_shape(&shape)) {
        (void) publish_cables(&shape, false);
    }
}

bool mca_btl_tbrdma_path_auto_engine(void)
{
    uint32_t mine, here = 0, there = 0;
    bool engine, read_here = false, read_there = false;
    char counts[64] = "";
    job_shape_t shape;
    const char *why;

    if (!job_shape(&shape)) {
        why = "the runtime does not say where the processes run";
        engine = true;
    } else if (shape.nhosts > 2 || shape.most > 2) {
        why = shape.nhosts > 2 ? "more than 2 hosts: the cabling may need relaying"
                               : "more than 2 processes on a host: the direct path's queue "
                                 "pairs would not fit";
        engine = true;
    } else if (1 == shape.nhosts) {
        why = "one host";
        engine = false;
    } else {
        mine = publish_cables(&shape, true);
        /* Decided on the first process's counts of both hosts, which every
         * process of the job reads alike. */
        read_here = cables_of(shape.first[0], mine, &here);
        read_there = read_here && here >= 2 && cables_of(shape.first[1], mine, &there);
        engine = read_there && there >= 2;
        if (!read_here) {
            why = "this host's first process did not say how many cables it has";
        } else if (here < 2) {
            why = "one cable on this host at most: no second path to the other";
        } else if (!read_there) {
            why = "the other host's first process did not say how many cables it has";
        } else if (there < 2) {
            why = "one cable on the other host at most: no second path to it";
        } else {
            why = "2 cables or more on each host: a second path the host engines fail over to";
        }
        snprintf(counts, sizeof(counts), ", cables: %s%u, %s%u", read_here ? "" : "unknown ",
                 (unsigned) here, read_there ? "" : "unknown ", (unsigned) there);
    }
    BTL_TBRDMA_VERBOSE(10, "path auto: %s (%d hosts, at most %d processes on one%s; %s)",
                       engine ? "host engines" : "direct", shape.nhosts, shape.most, counts, why);
    return engine;
}
