/*
 * tbrdma host engine, client side: the Unix socket between a rank and its host's engine
 * (the private directory that holds it is tb_jobdir.h's).
 */
#ifndef TB_USOCK_H
#define TB_USOCK_H

#include <stddef.h>
#include <sys/types.h>

/* A listening socket at path (which must not exist), non-blocking,
 * close-on-exec.  The fd, or -1 with errno. */
int tb_usock_listen(const char *path);

/* Connect to path without waiting for a listener that does not accept
 * (EAGAIN then); the fd is blocking and close-on-exec.  The fd, or -1 with
 * errno. */
int tb_usock_connect(const char *path);

/* Send len bytes and, if fd >= 0, that descriptor; blocking.  0 or -1. */
int tb_usock_send(int sock, const void *buf, size_t len, int fd);

/* Receive exactly len bytes (blocking, at most timeout_ms) and, if fd is not
 * NULL, one descriptor sent with them (-1 if none).  0, or -1 with errno
 * (ECONNRESET when the other side closed, ETIMEDOUT). */
int tb_usock_recv(int sock, void *buf, size_t len, int *fd, int timeout_ms);

/* The user and process at the other end of a connected socket.  0 or -1. */
int tb_usock_peer(int sock, uid_t *uid, pid_t *pid);

#endif /* TB_USOCK_H */
