/*
 * tbrdma BTL: which of this host's cables reaches a peer, and the peer's
 * port at its far end.
 *
 * A subnet names the cable when it holds one port of the peer and one of
 * this host (a /30 per cable).  When ports share a subnet (a Mac's
 * self-assigned 169.254/16 addresses, or one /24 for every port), each
 * candidate port of the peer is tried through the cable's interface
 * (tb_cable_probe.h): only the port at the far end of that very cable
 * answers.  Answers are properties of the cabling, not of a process, so
 * they are kept per device and address for the whole job, and all of
 * add_procs' candidates are tried at once (one deadline, not one per peer).
 */
#include "tb_config.h"
#include "btl_tbrdma.h"
#include "tb_cable_probe.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

/* How long a port may take to answer through a cable: an address nobody on
 * the cable has costs this whole wait (once per job); a lost SYN or ARP
 * request is sent again after a second. */
#define TBRDMA_CABLE_PROBE_NS 4000000000ull

/* What was learnt: device dev of this host reaches (or not) the port ipv4. */
typedef struct tbrdma_cable_seen {
    uint32_t ipv4;
    uint8_t dev;
    int8_t result; /* TB_PROBE_* */
    int err;
} tbrdma_cable_seen_t;

static tbrdma_cable_seen_t *seen;
static size_t nseen, seen_cap;

static int dev_index(const tb_device_t *d)
{
    return (int) (d - mca_btl_tbrdma_component.devices.devices);
}

static const tbrdma_cable_seen_t *seen_find(int dev, uint32_t ipv4)
{
    for (size_t i = 0; i < nseen; ++i) {
        if (seen[i].dev == dev && seen[i].ipv4 == ipv4) {
            return &seen[i];
        }
    }
    return NULL;
}

static bool on_subnet(const tb_device_t *d, uint32_t ipv4)
{
    return d->netmask.s_addr && ipv4 != d->ipv4.s_addr &&
           (ipv4 & d->netmask.s_addr) == (d->ipv4.s_addr & d->netmask.s_addr);
}

/* Whether d's subnet names the cable to mx's host by itself: one of the
 * peer's ports on it and no other port of this host. */
static bool subnet_decides(const tb_device_t *d, const tb_wire_modex_t *mx)
{
    int dev = tb_modex_find_cable(mx, d->ipv4.s_addr, d->netmask.s_addr);

    return dev < 0 ? TB_MODEX_AMBIGUOUS != dev
                   : 1 == tb_device_list_count_subnet(&mca_btl_tbrdma_component.devices,
                                                      mx->devices[dev].ipv4);
}

/* The candidates of mx not yet tried through this host's device only (-1:
 * every device), appended to probes (capacity cap). */
static size_t add_candidates(const tb_wire_modex_t *mx, int only, tb_cable_probe_t *probes,
                             size_t n, size_t cap)
{
    tb_device_list_t *list = &mca_btl_tbrdma_component.devices;

    for (int i = 0; i < list->count; ++i) {
        tb_device_t *d = &list->devices[i];

        if ((only >= 0 && i != only) || !d->usable || !d->netdev[0] || subnet_decides(d, mx)) {
            continue;
        }
        for (unsigned j = 0; j < mx->ndevices && n < cap; ++j) {
            uint32_t ip = mx->devices[j].ipv4;
            bool dup = false;

            if (!on_subnet(d, ip) || seen_find(i, ip)) {
                continue;
            }
            for (size_t k = 0; k < n && !dup; ++k) {
                dup = probes[k].dst_ipv4 == ip && 0 == strcmp(probes[k].netdev, d->netdev);
            }
            if (dup) {
                continue;
            }
            probes[n] = (tb_cable_probe_t){.netdev = d->netdev,
                                           .src_ipv4 = d->ipv4.s_addr,
                                           .dst_ipv4 = ip,
                                           .dst_port = tb_wire_le16(mx->devices[j].cm_port)};
            ++n;
        }
    }
    return n;
}

static int netdev_index(const char *netdev)
{
    tb_device_list_t *list = &mca_btl_tbrdma_component.devices;

    for (int i = 0; i < list->count; ++i) {
        if (0 == strcmp(list->devices[i].netdev, netdev)) {
            return i;
        }
    }
    return -1;
}

/* Try the probes and keep what they said. */
static void run_probes(tb_cable_probe_t *probes, size_t n)
{
    tbrdma_cable_seen_t *grown;

    if (0 == n) {
        return;
    }
    if (nseen + n > seen_cap) {
        grown = realloc(seen, (nseen + n) * sizeof(*seen));
        if (NULL == grown) {
            return; /* untried: the cables stay unplaced */
        }
        seen = grown;
        seen_cap = nseen + n;
    }
    BTL_TBRDMA_VERBOSE(20,
                       "trying %zu of the peers' ports through the cables that may reach "
                       "them (ports share a subnet)",
                       n);
    tb_cable_probe_run(probes, n, TBRDMA_CABLE_PROBE_NS);
    for (size_t k = 0; k < n; ++k) {
        char ip[INET_ADDRSTRLEN];
        int dev = netdev_index(probes[k].netdev);

        inet_ntop(AF_INET, &probes[k].dst_ipv4, ip, sizeof(ip));
        BTL_TBRDMA_VERBOSE(20, "%s: %s:%u %s%s%s", probes[k].netdev, ip,
                           (unsigned) probes[k].dst_port,
                           TB_PROBE_REACHED == probes[k].result ? "is at the far end of its cable"
                           : TB_PROBE_NO == probes[k].result    ? "is not on its cable"
                                                                : "could not be tried",
                           probes[k].err ? ": " : "", probes[k].err ? strerror(probes[k].err) : "");
        seen[nseen++] = (tbrdma_cable_seen_t){.ipv4 = probes[k].dst_ipv4,
                                              .dev = (uint8_t) dev,
                                              .result = (int8_t) probes[k].result,
                                              .err = probes[k].err};
    }
}

/* Room for every candidate of one entry: each device against each port. */
#define ENTRY_CANDIDATES (TB_WIRE_MODEX_MAX_DEVICES * TB_WIRE_MODEX_MAX_DEVICES)

void mca_btl_tbrdma_cable_probe_procs(opal_proc_t **procs, size_t nprocs)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    tb_cable_probe_t *probes = NULL, *grown;
    size_t n = 0, cap = 0;

    for (size_t i = 0; i < nprocs; ++i) {
        tb_wire_modex_t *mx = NULL;
        size_t size = 0;
        int rc;

        if (procs[i] == opal_proc_local_get() || OPAL_PROC_ON_LOCAL_NODE(procs[i]->proc_flags)) {
            continue;
        }
        OPAL_MODEX_RECV(rc, &c->super.btl_version, &procs[i]->proc_name, (void **) &mx, &size);
        if (OPAL_SUCCESS != rc || NULL == mx) {
            continue;
        }
        if (0 == tb_modex_check(mx, size, NULL)) {
            if (cap - n < ENTRY_CANDIDATES) {
                grown = realloc(probes, (cap + 4 * ENTRY_CANDIDATES) * sizeof(*probes));
                if (NULL == grown) {
                    free(mx);
                    break;
                }
                probes = grown;
                cap += 4 * ENTRY_CANDIDATES;
            }
            n = add_candidates(mx, -1, probes, n, cap);
        }
        free(mx);
    }
    run_probes(probes, n);
    free(probes);
}

/* The peer's port at the far end of this host's device d: -1 (none),
 * TB_MODEX_AMBIGUOUS with *why (cannot tell), or its index in mx. */
static int cable_from(const tb_device_t *d, const tb_wire_modex_t *mx, const char **why)
{
    tb_cable_probe_t probes[TB_WIRE_MODEX_MAX_DEVICES];
    int dev = tb_modex_find_cable(mx, d->ipv4.s_addr, d->netmask.s_addr), found = -1, nfound = 0;
    int i = dev_index(d);

    *why = NULL;
    if (-1 == dev || subnet_decides(d, mx)) {
        return dev;
    }
    if (!d->netdev[0]) {
        *why = "the device's interface is unknown, so nothing can be sent through it alone";
        return TB_MODEX_AMBIGUOUS;
    }
    run_probes(probes, add_candidates(mx, i, probes, 0, TB_WIRE_MODEX_MAX_DEVICES));
    for (unsigned j = 0; j < mx->ndevices; ++j) {
        const tbrdma_cable_seen_t *s;

        if (!on_subnet(d, mx->devices[j].ipv4)) {
            continue;
        }
        s = seen_find(i, mx->devices[j].ipv4);
        if (NULL == s || TB_PROBE_UNKNOWN == s->result) {
            *why = s && s->err ? strerror(s->err) : "its ports could not be tried";
            return TB_MODEX_AMBIGUOUS;
        }
        if (TB_PROBE_REACHED == s->result) {
            found = (int) j;
            ++nfound;
        }
    }
    if (nfound > 1) {
        *why = "several of the peer's ports answered through this one cable";
        return TB_MODEX_AMBIGUOUS;
    }
    return found;
}

/* Said once per host (by its first process): which device could not be
 * placed and why, since a wrong guess would dial a peer over a cable that
 * does not reach it. */
static void report_ambiguous(const tb_device_t *device, opal_proc_t *proc, const char *why)
{
    static bool said;
    char addr[INET_ADDRSTRLEN] = "?";
    int bits = 0;

    BTL_TBRDMA_VERBOSE(10, "%s: cannot tell which cable reaches %s: %s", device->name,
                       opal_get_proc_hostname(proc), why);
    if (said || opal_process_info.my_local_rank > 0) {
        return;
    }
    said = true;
    inet_ntop(AF_INET, &device->ipv4, addr, sizeof(addr));
    for (uint32_t m = ntohl(device->netmask.s_addr); m & 0x80000000u; m <<= 1) {
        ++bits;
    }
    mca_btl_tbrdma_show_help("ambiguous cable", opal_process_info.nodename,
                             opal_get_proc_hostname(proc), device->name,
                             device->netdev[0] ? device->netdev : "?", addr, bits, why);
}

int mca_btl_tbrdma_cable_find(const mca_btl_tbrdma_module_t *module, opal_proc_t *proc,
                              const tb_wire_modex_t *mx, tb_device_t **device)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    bool local = OPAL_PROC_ON_LOCAL_NODE(proc->proc_flags);
    const char *why = NULL, *found_why = NULL;
    int dev = -1;

    if (!module->host) {
        *device = module->device;
        dev = local ? -1 : cable_from(module->device, mx, &why);
        found_why = why;
    }
    for (int i = 0; module->host && i < c->devices.count; ++i) {
        tb_device_t *d = &c->devices.devices[i];
        int found = local ? tb_modex_find_device(mx, d->ipv4.s_addr) : cable_from(d, mx, &why);

        if (found >= 0 || (TB_MODEX_AMBIGUOUS == found && dev < 0)) {
            dev = found;
            found_why = why;
            *device = d;
        }
        if (found >= 0) {
            break;
        }
    }
    if (TB_MODEX_AMBIGUOUS == dev) {
        report_ambiguous(*device, proc, found_why ? found_why : "?");
    }
    return dev;
}

void mca_btl_tbrdma_cable_forget(void)
{
    free(seen);
    seen = NULL;
    nseen = seen_cap = 0;
}
