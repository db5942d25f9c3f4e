/*
 * tbrdma_devinfo: what tbrdma sees of this host's RDMA devices.
 *
 * For checking a cluster's cabling before running a job: every device with
 * its paired interface, address, limits (as reported, and as tbrdma uses
 * them under Apple's rules) and, for an unusable one, why and what to do
 * (tbrdma_devcheck.h).
 */
#include "tb_config.h"
#include "tb_device.h"
#include "tb_log.h"
#include "tb_namefilter.h"
#include "tbrdma_devcheck.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <net/if.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TB_HAVE_HWLOC
#    include <hwloc.h>

/* The cores nearest the device, for binding ranks next to their cable. */
static void print_locality(const char *device_name)
{
    hwloc_topology_t topo;
    hwloc_obj_t osdev = NULL, ancestor;
    char *cpus = NULL;

    if (0 != hwloc_topology_init(&topo)) {
        return;
    }
#    if HWLOC_API_VERSION >= 0x20000
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
#    else
    hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_IO_DEVICES);
#    endif
    if (0 != hwloc_topology_load(topo)) {
        goto out;
    }
    while ((osdev = hwloc_get_next_osdev(topo, osdev)) != NULL) {
        if (HWLOC_OBJ_OSDEV_OPENFABRICS == osdev->attr->osdev.type && osdev->name &&
            0 == strcmp(osdev->name, device_name)) {
            break;
        }
    }
    if (NULL == osdev) {
        printf("  near cores:    unknown (not a PCI device hwloc can place)\n");
        goto out;
    }
    ancestor = hwloc_get_non_io_ancestor_obj(topo, osdev);
    if (ancestor && ancestor->cpuset && hwloc_bitmap_list_asprintf(&cpus, ancestor->cpuset) >= 0) {
        printf("  near cores:    %s\n", cpus);
        free(cpus);
    }
out:
    hwloc_topology_destroy(topo);
}
#else
static void print_locality(const char *device_name)
{
    (void) device_name;
}
#endif

/* What to do about a bridged port or a port without an address. */
#if defined(__APPLE__)
static const char unbridge_fmt[] = "turn the Thunderbolt Bridge off (System Settings > Network > "
                                   "Thunderbolt Bridge: Inactive) or take %s out of it";
static const char address_fmt[] = "macOS gives a port without a manual address one in "
                                  "169.254.0.0/16 once its cable is up, which can take minutes; "
                                  "or give %s one";
#else
static const char unbridge_fmt[] = "take it out: ip link set %s nomaster";
static const char address_fmt[] = "give it one: ip addr add ADDRESS/30 dev %s";
#endif

/* What keeps dev from working, each said with what to do: the problems
 * found, and whether the device is fit for tbrdma. */
static bool advise(const tb_verbs_t *verbs, const tb_device_t *dev, char problems[][512],
                   int *nproblems)
{
    char ifname[IF_NAMESIZE + 1], bridge[IF_NAMESIZE + 1], what[256];
    bool fit = dev->usable;

    *nproblems = 0;
    tb_devcheck_netdev(dev, ifname, sizeof(ifname));
    if (ifname[0] && tb_devcheck_bridged(ifname, bridge, sizeof(bridge))) {
        /* Bridged ports loop broadcasts between the hosts, and the bridge,
         * not the port, holds the address. */
        snprintf(what, sizeof(what), unbridge_fmt, ifname);
        snprintf(problems[(*nproblems)++], 512, "its interface %s is a member of bridge %s: %s",
                 ifname, bridge, what);
        fit = false;
    }
    if (ifname[0] && !dev->usable) {
        switch (tb_devcheck_has_ipv4(ifname)) {
        case -1:
            snprintf(problems[(*nproblems)++], 512,
                     "this host has no interface %s (renamed after a restart?)", ifname);
            break;
        case 0:
            snprintf(what, sizeof(what), address_fmt, ifname);
            snprintf(problems[(*nproblems)++], 512, "its interface %s has no IPv4 address yet: %s",
                     ifname, what);
            break;
        default:
            break;
        }
    }
    if (dev->usable && 0 != tb_devcheck_uc_qp(verbs, dev, problems[*nproblems], 512)) {
        (*nproblems)++;
        fit = false;
    }
    return fit;
}

static bool print_device(const tb_verbs_t *verbs, const tb_device_t *dev)
{
    char gid[64], ip[INET_ADDRSTRLEN], mask[INET_ADDRSTRLEN], problems[3][512];
    int nproblems;
    bool fit = advise(verbs, dev, problems, &nproblems);

    printf("%s: %s\n", dev->name, fit ? "usable" : "NOT USABLE");
    if (!dev->usable) {
        printf("  reason:        %s\n", dev->reason);
    }
    for (int i = 0; i < nproblems; ++i) {
        printf("  problem:       %s\n", problems[i]);
    }
    printf("  interface:     %s\n", dev->netdev[0] ? dev->netdev : "unknown");
    if (dev->gid_index >= 0) {
        tb_gid_to_string(&dev->gid, gid, sizeof(gid));
        inet_ntop(AF_INET, &dev->ipv4, ip, sizeof(ip));
        inet_ntop(AF_INET, &dev->netmask, mask, sizeof(mask));
        printf("  port %u GID %d: %s\n", (unsigned) dev->port, dev->gid_index, gid);
        printf("  IPv4:          %s netmask %s\n", ip, mask);
    }
    if (dev->hw.max_qp > 0) {
        printf("  limits:        reported / used by tbrdma\n");
        printf("    queue pairs  %d / %d\n", dev->hw.max_qp, dev->limits.max_qp);
        printf("    memory regs  %d / %d\n", dev->hw.max_mr, dev->limits.max_mr);
        printf("    queue depth  %d / %d\n", dev->hw.max_qp_wr, dev->limits.max_qp_wr);
        printf("    SGEs         %d / %d\n", dev->hw.max_sge, dev->limits.max_sge);
        printf("    message      %u / %u bytes\n", (unsigned) dev->hw.max_msg,
               (unsigned) dev->limits.max_msg);
        printf("    path MTU     %u bytes\n", (unsigned) dev->hw.mtu);
        print_locality(dev->name);
    }
    return fit;
}

static void usage(FILE *out, const char *argv0)
{
    fprintf(out,
            "usage: %s [--verbose] [--verbs-library PATH] [--include PATTERNS | --exclude PATTERNS]\n"
            "Lists the RDMA devices tbrdma can use on this host and why others are not.\n"
            "Exit status: 0 with at least one usable device, 1 with none, 2 on error.\n",
            argv0);
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"verbs-library", required_argument, NULL, 'l'},
        {"include", required_argument, NULL, 'i'},
        {"exclude", required_argument, NULL, 'x'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *library = NULL, *include = NULL, *exclude = NULL;
    tb_device_list_t list;
    tb_namefilter_t filter;
    char err[512];
    int opt, i, usable;

    while ((opt = getopt_long(argc, argv, "l:i:x:vh", options, NULL)) != -1) {
        switch (opt) {
        case 'l':
            library = optarg;
            break;
        case 'i':
            include = optarg;
            break;
        case 'x':
            exclude = optarg;
            break;
        case 'v':
            tb_log_set_sink(NULL, NULL, TB_LOG_DEBUG);
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    if (0 != tb_namefilter_parse(&filter, include, exclude, err, sizeof(err))) {
        fprintf(stderr, "tbrdma_devinfo: %s\n", err);
        return 2;
    }
    if (0 != tb_device_list_open(&list, library, &filter, err, sizeof(err))) {
        fprintf(stderr, "tbrdma_devinfo: %s\n", err);
#if defined(__APPLE__)
        fprintf(stderr, "tbrdma_devinfo: %s\n", tb_devcheck_no_device_hint());
#endif
        return 2;
    }
    printf("verbs library: %s\n", list.verbs.path);
    if (0 == list.count && filter.count) {
        printf("no RDMA device passes the filter\n");
    } else if (0 == list.count) {
        printf("no RDMA device: %s\n", tb_devcheck_no_device_hint());
    }
    usable = 0;
    for (i = 0; i < list.count; ++i) {
        usable += print_device(&list.verbs, &list.devices[i]) ? 1 : 0;
    }
    tb_device_list_close(&list);
    return usable > 0 ? 0 : 1;
}
