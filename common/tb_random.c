/*
 * tbrdma common layer: random values (see tb_random.h).
 */
#include "tb_random.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

uint64_t tb_random64(void)
{
    static uint64_t mix;
    uint64_t v = 0;
    struct timespec ts;
    int fd = open("/dev/urandom", O_RDONLY);

    if (fd >= 0) {
        if (read(fd, &v, sizeof(v)) != (ssize_t) sizeof(v)) {
            v = 0;
        }
        close(fd);
    }
    /* Without /dev/urandom, time, pid and a counter still make epochs of two
     * incarnations differ, which is all the channel needs. */
    clock_gettime(CLOCK_REALTIME, &ts);
    mix += 0x9e3779b97f4a7c15ull;
    v ^= mix ^ ((uint64_t) ts.tv_sec << 30) ^ (uint64_t) ts.tv_nsec ^ ((uint64_t) getpid() << 42);
    v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
    v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
    v ^= v >> 31;
    return v ? v : 1;
}
