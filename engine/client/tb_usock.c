/*
 * tbrdma host engine, client side: Unix socket helpers (see tb_usock.h).
 */
#define _GNU_SOURCE
#include "tb_usock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <sys/ucred.h>
#endif

static int fill_addr(struct sockaddr_un *sa, const char *path)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa->sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa->sun_path, path);
    return 0;
}

static int new_socket(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);

    if (fd >= 0) {
        (void) fcntl(fd, F_SETFD, FD_CLOEXEC);
#if defined(SO_NOSIGPIPE)
        {
            int one = 1;
            (void) setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
        }
#endif
    }
    return fd;
}

int tb_usock_listen(const char *path)
{
    struct sockaddr_un sa;
    int fd, saved;

    if (0 != fill_addr(&sa, path)) {
        return -1;
    }
    fd = new_socket();
    if (fd < 0) {
        return -1;
    }
    if (0 != bind(fd, (struct sockaddr *) &sa, sizeof(sa)) || 0 != listen(fd, 64)
        || 0 != fcntl(fd, F_SETFL, O_NONBLOCK)) {
        saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int tb_usock_connect(const char *path)
{
    struct sockaddr_un sa;
    int fd, saved;

    if (0 != fill_addr(&sa, path)) {
        return -1;
    }
    fd = new_socket();
    if (fd < 0) {
        return -1;
    }
    /* Never blocking: a listener whose backlog is full (one that does not
     * accept) would hold a blocking connect for good. */
    if (0 != fcntl(fd, F_SETFL, O_NONBLOCK)) {
        goto fail;
    }
    if (0 != connect(fd, (struct sockaddr *) &sa, sizeof(sa))) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (EINPROGRESS != errno) {
            goto fail;
        }
        if (1 != poll(&pfd, 1, 100)) {
            errno = EAGAIN;
            goto fail;
        }
        if (0 != getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) || 0 != soerr) {
            errno = soerr ? soerr : errno;
            goto fail;
        }
    }
    if (0 != fcntl(fd, F_SETFL, 0)) {
        goto fail;
    }
    return fd;

fail:
    saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

#if defined(MSG_NOSIGNAL)
#define TB_SEND_FLAGS MSG_NOSIGNAL
#else
#define TB_SEND_FLAGS 0
#endif

int tb_usock_send(int sock, const void *buf, size_t len, int fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = (void *) buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    const char *p = buf;
    ssize_t n;

    if (fd >= 0) {
        struct cmsghdr *cm;
        memset(&control, 0, sizeof(control));
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    while (len > 0) {
        n = sendmsg(sock, &msg, TB_SEND_FLAGS);
        if (n < 0) {
            if (EINTR == errno) {
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t) n;
        iov.iov_base = (void *) p;
        iov.iov_len = len;
        msg.msg_control = NULL;
        msg.msg_controllen = 0;
    }
    return 0;
}

int tb_usock_recv(int sock, void *buf, size_t len, int *fd, int timeout_ms)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    char *p = buf;

    if (fd) {
        *fd = -1;
    }
    while (len > 0) {
        struct iovec iov = {.iov_base = p, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        struct cmsghdr *cm;
        ssize_t n;
        int rc;

        rc = poll(&pfd, 1, timeout_ms);
        if (rc < 0 && EINTR == errno) {
            continue;
        }
        if (rc <= 0) {
            errno = 0 == rc ? ETIMEDOUT : errno;
            goto fail;
        }
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        n = recvmsg(sock, &msg, 0);
        if (n < 0 && EINTR == errno) {
            continue;
        }
        if (n <= 0) {
            errno = 0 == n ? ECONNRESET : errno;
            goto fail;
        }
        for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (SOL_SOCKET == cm->cmsg_level && SCM_RIGHTS == cm->cmsg_type) {
                /* Within what was received, whatever the header claims. */
                size_t room = msg.msg_controllen - (size_t) ((char *) CMSG_DATA(cm) - control.buf);
                size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                if (nfd > room / sizeof(int)) {
                    nfd = room / sizeof(int);
                }
                for (size_t i = 0; i < nfd; ++i) {
                    int got;
                    memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                    if (fd && *fd < 0) {
                        *fd = got;
                    } else {
                        close(got);
                    }
                }
            }
        }
        if (msg.msg_flags & MSG_CTRUNC) {
            /* More descriptors than asked for: refuse the message. */
            errno = EPROTO;
            goto fail;
        }
        p += n;
        len -= (size_t) n;
    }
    return 0;

fail:
    if (fd && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return -1;
}

int tb_usock_peer(int sock, uid_t *uid, pid_t *pid)
{
#if defined(SO_PEERCRED)
    struct ucred cred;
    socklen_t len = sizeof(cred);

    if (0 != getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len)) {
        return -1;
    }
    *uid = cred.uid;
    *pid = cred.pid;
    return 0;
#elif defined(__APPLE__)
    gid_t gid;
    socklen_t len = sizeof(*pid);

    if (0 != getpeereid(sock, uid, &gid)) {
        return -1;
    }
    if (0 != getsockopt(sock, SOL_LOCAL, LOCAL_PEERPID, pid, &len)) {
        *pid = 0;
    }
    return 0;
#else
    (void) sock;
    (void) uid;
    (void) pid;
    errno = ENOTSUP;
    return -1;
#endif
}
