/*
 * tbrdma host engine, client side: the shared memory a rank hands its engine (see
 * tb_shm_segment.h).
 */
#include "tb_config.h"

#include "tb_shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tb_random.h"

#if defined(HAVE_MEMFD_CREATE) && defined(F_ADD_SEALS)
#define TB_SHM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#endif

int tb_shm_segment_create(size_t len, char *err, size_t errlen)
{
    const char *what;
    int fd;

#ifdef TB_SHM_SEALS
    what = "memfd_create";
    fd = memfd_create("tbrdma-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
#else
    char name[64];
    what = "shm_open";
    snprintf(name, sizeof(name), "/tbrdma-%d-%llx", (int) getpid(),
             (unsigned long long) tb_random64());
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        /* Unnamed at once: nothing is left behind, whatever happens to us. */
        (void) shm_unlink(name);
    }
#endif
    if (fd < 0) {
        snprintf(err, errlen, "cannot create shared memory for the engine (%s): %s", what,
                 strerror(errno));
        return -1;
    }
    if (0 != ftruncate(fd, (off_t) len)) {
        snprintf(err, errlen, "cannot size %zu bytes of shared memory for the engine: %s", len,
                 strerror(errno));
        goto fail;
    }
#ifdef TB_SHM_SEALS
    if (0 != fcntl(fd, F_ADD_SEALS, TB_SHM_SEALS)) {
        snprintf(err, errlen, "cannot seal the shared memory for the engine (fcntl): %s",
                 strerror(errno));
        goto fail;
    }
#endif
    return fd;
fail:
    close(fd);
    return -1;
}

const char *tb_shm_segment_check(int fd, size_t len)
{
    struct stat st;

    if (fd < 0 || 0 != fstat(fd, &st)) {
        return "no shared memory for the rings";
    }
    if ((uint64_t) st.st_size < len) {
        return "the shared memory for the rings is too small";
    }
#ifdef TB_SHM_SEALS
    {
        int seals = fcntl(fd, F_GET_SEALS);
        if (seals < 0 || (seals & TB_SHM_SEALS) != TB_SHM_SEALS) {
            return "the shared memory for the rings is not sealed against resizing";
        }
    }
#endif
    return NULL;
}
