/*
 * tbrdma common layer: which cable reaches an address (tb_cable_probe.h).
 */
#include "tb_config.h"
#include "tb_cable_probe.h"
#include "tb_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int tb_sock_bind_netdev(int fd, const char *netdev)
{
    if (!netdev || !netdev[0] || strlen(netdev) >= IF_NAMESIZE) {
        return -EINVAL;
    }
#if defined(SO_BINDTODEVICE)
    if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, netdev, (socklen_t) strlen(netdev) + 1)
        != 0) {
        return -errno;
    }
    return 0;
#elif defined(IP_BOUND_IF)
    {
        unsigned int idx = if_nametoindex(netdev);

        if (0 == idx) {
            return -ENODEV;
        }
        if (setsockopt(fd, IPPROTO_IP, IP_BOUND_IF, &idx, sizeof(idx)) != 0) {
            return -errno;
        }
        return 0;
    }
#elif defined(__APPLE__)
#error "IP_BOUND_IF is not declared: build with _DARWIN_C_SOURCE (tb_config.h)"
#else
    (void) fd;
    return -ENOTSUP;
#endif
}

int tb_sock_dial_from(const char *netdev, uint32_t src_ipv4)
{
    struct sockaddr_in sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0), rc;

    if (fd < 0 || !netdev || !netdev[0]) {
        return fd;
    }
    rc = tb_sock_bind_netdev(fd, netdev);
    if (rc != 0) {
        errno = -rc;
        goto fail;
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = src_ipv4;
    if (bind(fd, (struct sockaddr *) &sin, sizeof(sin)) != 0) {
        goto fail;
    }
    return fd;

fail:
    rc = errno;
    close(fd);
    errno = rc;
    return -1;
}

/* A non-blocking socket bound to p's interface and source, connecting. */
static int probe_start(tb_cable_probe_t *p)
{
    struct sockaddr_in sin;
    int fd;

    /* Unbound, a connect proves nothing about the cable. */
    if (!p->netdev || !p->netdev[0]) {
        p->err = EINVAL;
        return -1;
    }
    fd = tb_sock_dial_from(p->netdev, p->src_ipv4);
    if (fd < 0) {
        p->err = errno;
        return -1;
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK) < 0
        || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        p->err = errno;
        close(fd);
        return -1;
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = p->dst_ipv4;
    sin.sin_port = htons(p->dst_port);
    if (connect(fd, (struct sockaddr *) &sin, sizeof(sin)) == 0) {
        p->result = TB_PROBE_REACHED;
        close(fd);
        return -1;
    }
    if (errno != EINPROGRESS && errno != EINTR) {
        p->err = errno;
        p->result = TB_PROBE_NO;
        close(fd);
        return -1;
    }
    return fd;
}

void tb_cable_probe_run(tb_cable_probe_t *probes, size_t n, uint64_t timeout_ns)
{
    uint64_t deadline = tb_now_ns() + timeout_ns;
    struct pollfd *pfd;
    size_t *which, live = 0, i;

    for (i = 0; i < n; ++i) {
        probes[i].result = TB_PROBE_UNKNOWN;
        probes[i].err = 0;
    }
    pfd = calloc(n ? n : 1, sizeof(*pfd));
    which = calloc(n ? n : 1, sizeof(*which));
    if (!pfd || !which) {
        for (i = 0; i < n; ++i) {
            probes[i].err = ENOMEM;
        }
        goto out;
    }
    for (i = 0; i < n; ++i) {
        int fd = probe_start(&probes[i]);

        if (fd >= 0) {
            pfd[live].fd = fd;
            pfd[live].events = POLLOUT;
            which[live++] = i;
        }
    }
    while (live > 0) {
        uint64_t now = tb_now_ns();
        int ms, rc;

        if (now >= deadline) {
            break;
        }
        ms = (int) ((deadline - now + 999999) / 1000000);
        rc = poll(pfd, (nfds_t) live, ms);
        if (rc < 0 && errno != EINTR) {
            break;
        }
        for (i = 0; rc > 0 && i < live;) {
            tb_cable_probe_t *p = &probes[which[i]];
            socklen_t len = sizeof(p->err);

            if (0 == pfd[i].revents) {
                ++i;
                continue;
            }
            if (getsockopt(pfd[i].fd, SOL_SOCKET, SO_ERROR, &p->err, &len) != 0) {
                p->err = errno;
            }
            p->result = 0 == p->err ? TB_PROBE_REACHED : TB_PROBE_NO;
            close(pfd[i].fd);
            pfd[i] = pfd[--live];
            which[i] = which[live];
        }
    }
    /* No answer in time: nobody on that cable has the address. */
    for (i = 0; i < live; ++i) {
        probes[which[i]].result = TB_PROBE_NO;
        probes[which[i]].err = ETIMEDOUT;
        close(pfd[i].fd);
    }
out:
    free(pfd);
    free(which);
}
