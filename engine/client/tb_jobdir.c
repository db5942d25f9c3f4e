/*
 * tbrdma host engine: the job's private directory on a host (tb_jobdir.h).
 */
#include "tb_jobdir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tb_jobdir_open(int at, const char *name, const char *shown, bool create, char *err,
                   size_t errlen)
{
    int fd;

    if (create && 0 != mkdirat(at, name, 0700) && EEXIST != errno) {
        snprintf(err, errlen, "cannot create %s: %s", shown, strerror(errno));
        return -1;
    }
    fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && (ELOOP == errno || ENOTDIR == errno)) {
        errno = ENOTDIR;
    }
    if (fd < 0 && ENOTDIR != errno) {
        snprintf(err, errlen, "cannot open %s: %s", shown, strerror(errno));
        return -1;
    }
    if (fd < 0 || 0 != tb_jobdir_check(fd, shown, err, errlen)) {
        if (fd >= 0) {
            close(fd);
        } else {
            (void) tb_jobdir_check(-1, shown, err, errlen);
        }
        return -1;
    }
    return fd;
}

int tb_jobdir_check(int fd, const char *shown, char *err, size_t errlen)
{
    struct stat st;

    if (fd < 0 || 0 != fstat(fd, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid()
        || 0 != (st.st_mode & 077)) {
        snprintf(err, errlen,
                 "%s is not a private directory of this user (it must be a directory owned by "
                 "uid %u with mode 0700; remove it or set TMPDIR elsewhere)",
                 shown, (unsigned) getuid());
        return -1;
    }
    return 0;
}

int tb_jobdir_sock_path(int dirfd, const char *dir, const char *name, char *buf, size_t len)
{
    int n;
#if defined(__linux__)
    struct stat st;

    if (0 == stat("/proc/self/fd", &st)) {
        n = snprintf(buf, len, "/proc/self/fd/%d/%s", dirfd, name);
        return n > 0 && (size_t) n < len ? 0 : -1;
    }
#else
    (void) dirfd;
#endif
    n = snprintf(buf, len, "%s/%s", dir, name);
    return n > 0 && (size_t) n < len ? 0 : -1;
}

bool tb_jobdir_names(int dirfd, const char *name, int fd)
{
    struct stat held, named;

    return 0 == fstat(fd, &held) && 0 == fstatat(dirfd, name, &named, AT_SYMLINK_NOFOLLOW)
           && held.st_ino == named.st_ino && held.st_dev == named.st_dev;
}

pid_t tb_jobdir_engine_pid(int dirfd)
{
    FILE *f;
    int fd, pid = 0;

    fd = openat(dirfd, TB_ENGINE_PIDFILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    f = fdopen(fd, "r");
    if (NULL == f) {
        close(fd);
        return 0;
    }
    if (1 != fscanf(f, "%d", &pid) || pid <= 0) {
        pid = 0;
    }
    fclose(f);
    return (pid_t) pid;
}

void tb_jobdir_remove(int at, const char *name, int dirfd)
{
    if (tb_jobdir_names(at, name, dirfd)) {
        (void) unlinkat(at, name, AT_REMOVEDIR);
    }
}
