/*
 * The checks behind tbrdma_devinfo's advice (tbrdma_devcheck.h).
 */
#include "tb_config.h"

#include "tbrdma_devcheck.h"

#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

void tb_devcheck_netdev(const tb_device_t *dev, char *ifname, size_t len)
{
    char path[256];
    FILE *f;

    snprintf(ifname, len, "%s", dev->netdev);
    if (ifname[0]) {
        return;
    }
    /* Linux pairs each GID with its interface; elsewhere the file is absent. */
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%u/gid_attrs/ndevs/0",
             dev->name, (unsigned) dev->port);
    f = fopen(path, "r");
    if (NULL == f) {
        return;
    }
    if (NULL != fgets(ifname, (int) len, f)) {
        ifname[strcspn(ifname, "\n")] = '\0';
    } else {
        ifname[0] = '\0';
    }
    fclose(f);
}

int tb_devcheck_has_ipv4(const char *ifname)
{
    struct ifaddrs *all, *a;
    int found = 0;

    if (0 == if_nametoindex(ifname)) {
        return -1;
    }
    if (0 != getifaddrs(&all)) {
        return -1;
    }
    for (a = all; a; a = a->ifa_next) {
        if (a->ifa_addr && AF_INET == a->ifa_addr->sa_family && 0 == strcmp(a->ifa_name, ifname)) {
            found = 1;
            break;
        }
    }
    freeifaddrs(all);
    return found;
}

bool tb_devcheck_ifconfig_lists_member(const char *text, const char *ifname)
{
    static const char key[] = "member:";
    size_t n = strlen(ifname);
    const char *p = text;

    while (n > 0 && NULL != (p = strstr(p, key))) {
        p += sizeof(key) - 1;
        while (' ' == *p || '\t' == *p) {
            ++p;
        }
        if (0 == strncmp(p, ifname, n) && (p[n] == '\0' || isspace((unsigned char) p[n]))) {
            return true;
        }
    }
    return false;
}

#if defined(__APPLE__)
/* A name getifaddrs gave, safe on a command line. */
static bool plain_name(const char *s)
{
    for (; *s; ++s) {
        if (!isalnum((unsigned char) *s)) {
            return false;
        }
    }
    return true;
}

/* macOS keeps a bridge's members behind a private ioctl; ifconfig prints
 * them, and the user would look there too. */
static bool bridge_lists(const char *bridge, const char *ifname)
{
    char cmd[64], text[65536];
    size_t got = 0, n;
    FILE *p;

    if (!plain_name(bridge)) {
        return false;
    }
    snprintf(cmd, sizeof(cmd), "/sbin/ifconfig %s 2>/dev/null", bridge);
    p = popen(cmd, "r");
    if (NULL == p) {
        return false;
    }
    while (got < sizeof(text) - 1 && (n = fread(text + got, 1, sizeof(text) - 1 - got, p)) > 0) {
        got += n;
    }
    text[got] = '\0';
    pclose(p);
    return tb_devcheck_ifconfig_lists_member(text, ifname);
}

bool tb_devcheck_bridged(const char *ifname, char *bridge, size_t len)
{
    struct ifaddrs *all, *a;
    bool found = false;

    if (0 != getifaddrs(&all)) {
        return false;
    }
    for (a = all; a && !found; a = a->ifa_next) {
        /* One entry per address family: ask each bridge once, by its link entry. */
        if (0 == strncmp(a->ifa_name, "bridge", 6) && a->ifa_addr
            && AF_LINK == a->ifa_addr->sa_family && bridge_lists(a->ifa_name, ifname)) {
            snprintf(bridge, len, "%s", a->ifa_name);
            found = true;
        }
    }
    freeifaddrs(all);
    return found;
}
#else
bool tb_devcheck_bridged(const char *ifname, char *bridge, size_t len)
{
    char path[64 + 2 * IF_NAMESIZE], target[PATH_MAX];
    const char *master;
    struct stat st;
    ssize_t n;

    if (strlen(ifname) >= IF_NAMESIZE) {
        return false;
    }
    snprintf(path, sizeof(path), "/sys/class/net/%s/master", ifname);
    n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0) {
        return false;
    }
    target[n] = '\0';
    master = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    if (strlen(master) >= IF_NAMESIZE) {
        return false;
    }
    snprintf(path, sizeof(path), "/sys/class/net/%s/bridge", master);
    if (0 != stat(path, &st)) {
        return false; /* a bond or a VRF, not a bridge */
    }
    snprintf(bridge, len, "%s", master);
    return true;
}
#endif

int tb_devcheck_uc_qp(const tb_verbs_t *verbs, const tb_device_t *dev, char *why, size_t len)
{
    struct ibv_qp_init_attr init;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    const char *call;
    int err, rc = -1;

    pd = verbs->alloc_pd(dev->context);
    if (NULL == pd) {
        call = "ibv_alloc_pd";
        err = errno;
        goto report;
    }
    cq = verbs->create_cq(dev->context, 2, NULL, NULL, 0);
    if (NULL == cq) {
        call = "ibv_create_cq";
        err = errno;
        goto free_pd;
    }
    memset(&init, 0, sizeof(init));
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_UC;
    init.cap.max_send_wr = 1;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    qp = verbs->create_qp(pd, &init);
    if (NULL == qp) {
        call = "ibv_create_qp(UC)";
        err = errno;
        goto free_cq;
    }
    verbs->destroy_qp(qp);
    rc = 0;
free_cq:
    verbs->destroy_cq(cq);
free_pd:
    verbs->dealloc_pd(pd);
    if (0 == rc) {
        return 0;
    }
report:
    snprintf(why, len,
             "it lists but cannot make a UC queue pair (%s failed: %s): Thunderbolt 4 "
             "ports show rdma_en* devices too; use a Thunderbolt 5 port and cable, or "
             "check that no other program holds all of the device's queue pairs",
             call, strerror(err));
    return rc;
}

const char *tb_devcheck_no_device_hint(void)
{
#if defined(__APPLE__)
    return "RDMA over Thunderbolt needs macOS 26.2 or later and Thunderbolt 5, and is off "
           "until enabled: start in Recovery, run `rdma_ctl enable` in its Terminal and "
           "restart; `ibv_devices` then lists the rdma_en* devices";
#else
    return "load the driver of the RDMA adapter, or for soft-RoCE: "
           "`rdma link add rxe0 type rxe netdev IFACE`";
#endif
}
