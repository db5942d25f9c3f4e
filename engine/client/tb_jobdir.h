/*
 * tbrdma host engine: the job's private directory on a host.
 *
 * Every process of one job on one host meets there: the engine listens on
 * its socket, the job's key is a file only the user can read, the lock
 * decides which rank starts the engine, and the pid file names the engine
 * that owns the directory.  Ranks (tb_eclient) and the engine (daemon) both
 * use it.
 *
 * Each opens the directory once, checks that descriptor, and reaches every
 * file through it (openat and friends): a path renamed or replaced after the
 * check cannot redirect a read, a write or a removal.  Unix sockets have no
 * *at() calls; on Linux they go through the descriptor too
 * (tb_jobdir_sock_path), elsewhere by name, and a rank checks who listens.
 */
#ifndef TB_JOBDIR_H
#define TB_JOBDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* File names in the job's directory. */
#define TB_ENGINE_SOCKET "engine.sock"
#define TB_ENGINE_KEY "key"
#define TB_ENGINE_LOCK "lock"
#define TB_ENGINE_PIDFILE "engine.pid"
#define TB_ENGINE_LOG "engine.log"

/* The directory name in the directory at (AT_FDCWD: name is a path), made
 * (mode 0700) when create and it is missing, opened: a descriptor of a
 * directory owned by this user with no access for others, not reached
 * through a link.  -1 with the reason in err otherwise, which calls it
 * shown. */
int tb_jobdir_open(int at, const char *name, const char *shown, bool create, char *err,
                   size_t errlen);

/* fd is such a directory (see above): 0, or -1 with the reason in err. */
int tb_jobdir_check(int fd, const char *shown, char *err, size_t errlen);

/* A path to name in the directory dirfd, whose own path is dir, for bind()
 * and connect(): through the descriptor (/proc/self/fd) where the system
 * has it, by name elsewhere.  0, or -1 when it does not fit in len. */
int tb_jobdir_sock_path(int dirfd, const char *dir, const char *name, char *buf, size_t len);

/* name in dirfd is the file open as fd (not one removed or replaced). */
bool tb_jobdir_names(int dirfd, const char *name, int fd);

/* The engine that owns the directory dirfd (from its pid file), or 0. */
pid_t tb_jobdir_engine_pid(int dirfd);

/* Remove the (emptied) directory dirfd, which was called name in the
 * directory at: only if name still is that directory. */
void tb_jobdir_remove(int at, const char *name, int dirfd);

#endif /* TB_JOBDIR_H */
