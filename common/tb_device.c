/*
 * tbrdma common layer: RDMA devices, their ports, addresses and limits.
 */
#include "tb_config.h"
#include "tb_device.h"
#include "tb_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GID tables are short on every device we target; bound the scan anyway. */
#define TB_GID_SCAN_MAX 64

bool tb_gid_is_ipv4_mapped(const union ibv_gid *gid)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return 0 == memcmp(gid->raw, prefix, sizeof(prefix));
}

void tb_gid_to_string(const union ibv_gid *gid, char *buf, size_t buflen)
{
    char tmp[INET6_ADDRSTRLEN];

    if (NULL == inet_ntop(AF_INET6, gid->raw, tmp, sizeof(tmp))) {
        snprintf(tmp, sizeof(tmp), "?");
    }
    snprintf(buf, buflen, "%s", tmp);
}

uint32_t tb_mtu_to_bytes(enum ibv_mtu mtu)
{
    switch (mtu) {
    case IBV_MTU_256:
        return 256;
    case IBV_MTU_512:
        return 512;
    case IBV_MTU_1024:
        return 1024;
    case IBV_MTU_2048:
        return 2048;
    case IBV_MTU_4096:
        return 4096;
    default:
        return 0;
    }
}

static int min_int(int a, int b)
{
    return a < b ? a : b;
}

void tb_device_limits_clamp(const tb_device_limits_t *hw, tb_device_limits_t *out)
{
    *out = *hw;
    out->max_qp = min_int(hw->max_qp, TB_APPLE_MAX_QP);
    out->max_mr = min_int(hw->max_mr, TB_APPLE_MAX_MR);
    out->max_qp_wr = min_int(hw->max_qp_wr, TB_APPLE_MAX_RECV_DEPTH);
    out->max_sge = min_int(hw->max_sge, TB_APPLE_MAX_SGE);
    if (0 == hw->max_msg || hw->max_msg > TB_APPLE_MAX_MSG_SIZE) {
        out->max_msg = TB_APPLE_MAX_MSG_SIZE;
    }
}

void tb_device_guess_netdev(const char *device_name, char *netdev, size_t len)
{
    static const char prefix[] = "rdma_";

    if (0 == strncmp(device_name, prefix, sizeof(prefix) - 1) &&
        strlen(device_name) - (sizeof(prefix) - 1) < len) {
        snprintf(netdev, len, "%s", device_name + sizeof(prefix) - 1);
    } else {
        netdev[0] = '\0';
    }
}

/* Linux says which GIDs are RoCE v2 (routable over IPv4, what a /30 cable
 * subnet needs); elsewhere the file does not exist and any mapped GID does. */
static bool gid_is_rocev2(const char *dev, uint8_t port, int index)
{
    char path[256], line[32] = "";
    FILE *f;

    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%u/gid_attrs/types/%d", dev,
             (unsigned) port, index);
    f = fopen(path, "r");
    if (NULL == f) {
        return true;
    }
    if (NULL == fgets(line, sizeof(line), f)) {
        line[0] = '\0';
    }
    fclose(f);
    return NULL != strstr(line, "v2");
}

/* The interface carrying the device's address, with its netmask: both come
 * from the host's interface list, which only shows this network namespace's
 * interfaces, so a device whose address lives elsewhere is not ours to use. */
static bool find_interface(tb_device_t *dev)
{
    struct ifaddrs *ifa_list, *ifa;
    bool found = false;

    if (0 != getifaddrs(&ifa_list)) {
        TB_WARN("getifaddrs failed (%s); cannot pair %s with its IP interface", strerror(errno),
                dev->name);
        return false;
    }
    for (ifa = ifa_list; ifa && !found; ifa = ifa->ifa_next) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *) ifa->ifa_addr;
        if (NULL == sin || AF_INET != sin->sin_family ||
            sin->sin_addr.s_addr != dev->ipv4.s_addr) {
            continue;
        }
        snprintf(dev->netdev, sizeof(dev->netdev), "%s", ifa->ifa_name);
        if (ifa->ifa_netmask) {
            dev->netmask = ((const struct sockaddr_in *) ifa->ifa_netmask)->sin_addr;
        }
        found = true;
    }
    freeifaddrs(ifa_list);
    return found;
}

static void query_device(tb_verbs_t *verbs, struct ibv_device *ibdev, tb_device_t *dev)
{
    struct ibv_device_attr dattr;
    struct ibv_port_attr pattr;
    char addr[INET_ADDRSTRLEN];
    int i, rc;

    dev->gid_index = -1;
    dev->port = 1;
    tb_device_guess_netdev(dev->name, dev->netdev, sizeof(dev->netdev));

    dev->context = verbs->open_device(ibdev);
    if (NULL == dev->context) {
        snprintf(dev->reason, sizeof(dev->reason),
                 "ibv_open_device failed: %s (check permissions on /dev/infiniband/*)",
                 strerror(errno));
        return;
    }
    rc = verbs->query_device(dev->context, &dattr);
    if (0 != rc) {
        snprintf(dev->reason, sizeof(dev->reason), "ibv_query_device failed: %s",
                 strerror(rc > 0 ? rc : errno));
        goto close;
    }
    memset(&pattr, 0, sizeof(pattr));
    rc = verbs->query_port(dev->context, dev->port, &pattr);
    if (0 != rc) {
        snprintf(dev->reason, sizeof(dev->reason), "ibv_query_port(port %u) failed: %s",
                 (unsigned) dev->port, strerror(rc > 0 ? rc : errno));
        goto close;
    }
    dev->hw.max_qp = dattr.max_qp;
    dev->hw.max_mr = dattr.max_mr;
    dev->hw.max_qp_wr = dattr.max_qp_wr;
    dev->hw.max_sge = dattr.max_sge;
    dev->hw.max_cqe = dattr.max_cqe;
    dev->hw.max_msg = pattr.max_msg_sz;
    dev->hw.mtu = tb_mtu_to_bytes(pattr.active_mtu);
    tb_device_limits_clamp(&dev->hw, &dev->limits);

    if (IBV_PORT_ACTIVE != pattr.state) {
        snprintf(dev->reason, sizeof(dev->reason),
                 "port %u is not active (state %d): is the cable plugged in and the "
                 "interface up?",
                 (unsigned) dev->port, (int) pattr.state);
        goto close;
    }
    for (i = 0; i < pattr.gid_tbl_len && i < TB_GID_SCAN_MAX; ++i) {
        union ibv_gid gid;
        if (0 != verbs->query_gid(dev->context, dev->port, i, &gid)) {
            continue;
        }
        if (tb_gid_is_ipv4_mapped(&gid) && gid_is_rocev2(dev->name, dev->port, i)) {
            dev->gid = gid;
            dev->gid_index = i;
            memcpy(&dev->ipv4.s_addr, &gid.raw[12], 4);
            break;
        }
    }
    if (dev->gid_index < 0) {
        snprintf(dev->reason, sizeof(dev->reason),
                 "no IPv4-mapped GID: give the paired interface%s%s an IPv4 address "
                 "(one /30 subnet per cable)",
                 dev->netdev[0] ? " " : "", dev->netdev);
        goto close;
    }
    if (!find_interface(dev)) {
        inet_ntop(AF_INET, &dev->ipv4, addr, sizeof(addr));
        snprintf(dev->reason, sizeof(dev->reason),
                 "its address %s is on no interface of this host (network namespace)", addr);
        goto close;
    }
    if (dev->limits.max_qp < 1 || dev->limits.max_qp_wr < 1 || dev->limits.max_sge < 1) {
        snprintf(dev->reason, sizeof(dev->reason),
                 "device limits too small (max_qp %d, max_qp_wr %d, max_sge %d)", dev->hw.max_qp,
                 dev->hw.max_qp_wr, dev->hw.max_sge);
        goto close;
    }
    dev->usable = true;
    return;

close:
    verbs->close_device(dev->context);
    dev->context = NULL;
}

int tb_device_list_open(tb_device_list_t *list, const char *verbs_library,
                        const tb_namefilter_t *filter, char *err, size_t errlen)
{
    struct ibv_device **ibdevs;
    int n = 0, i;

    memset(list, 0, sizeof(*list));
    if (0 != tb_verbs_load(&list->verbs, verbs_library, err, errlen)) {
        return -1;
    }
    ibdevs = list->verbs.get_device_list(&n);
    if (NULL == ibdevs) {
        /* rdma-core returns NULL with ENOSYS when the kernel has no verbs
         * support: the same "no device" outcome, with a reason. */
        TB_INFO("ibv_get_device_list failed: %s", strerror(errno));
        return 0;
    }
    if (n > 0) {
        list->devices = calloc((size_t) n, sizeof(*list->devices));
        if (NULL == list->devices) {
            snprintf(err, errlen, "out of memory listing %d RDMA devices", n);
            list->verbs.free_device_list(ibdevs);
            tb_verbs_unload(&list->verbs);
            return -1;
        }
    }
    for (i = 0; i < n; ++i) {
        const char *name = list->verbs.get_device_name(ibdevs[i]);
        tb_device_t *dev;

        if (NULL == name || (filter && !tb_namefilter_accepts(filter, name))) {
            continue;
        }
        dev = &list->devices[list->count++];
        snprintf(dev->name, sizeof(dev->name), "%s", name);
        query_device(&list->verbs, ibdevs[i], dev);
        if (!dev->usable) {
            TB_INFO("device %s not used: %s", dev->name, dev->reason);
        }
    }
    list->verbs.free_device_list(ibdevs);
    return 0;
}

int tb_device_list_usable_count(const tb_device_list_t *list)
{
    int i, n = 0;

    for (i = 0; i < list->count; ++i) {
        n += list->devices[i].usable;
    }
    return n;
}

int tb_device_list_count_subnet(const tb_device_list_t *list, uint32_t ipv4)
{
    int i, n = 0;

    for (i = 0; i < list->count; ++i) {
        const tb_device_t *d = &list->devices[i];
        n += d->usable && d->netmask.s_addr
             && (d->ipv4.s_addr & d->netmask.s_addr) == (ipv4 & d->netmask.s_addr);
    }
    return n;
}

void tb_device_list_close(tb_device_list_t *list)
{
    int i;

    for (i = 0; i < list->count; ++i) {
        if (list->devices[i].context) {
            list->verbs.close_device(list->devices[i].context);
        }
    }
    free(list->devices);
    if (list->verbs.handle) {
        tb_verbs_unload(&list->verbs);
    }
    memset(list, 0, sizeof(*list));
}
