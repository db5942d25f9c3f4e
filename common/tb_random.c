/*
 * tbrdma common layer: random values (see tb_random.h).
 */
#include "tb_random.h"

#include <time.h>
#include <unistd.h>
#ifdef __APPLE__
#    include <sys/random.h>
#endif

int tb_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;

    /* getentropy() (Linux glibc 2.25+, macOS 10.12+) serves at most 256
     * bytes per call and never returns short. */
    while (len > 0) {
        size_t n = len > 256 ? 256 : len;
        if (getentropy(p, n) != 0) {
            return -1;
        }
        p += n;
        len -= n;
    }
    return 0;
}

uint64_t tb_random64(void)
{
    static uint64_t mix;
    uint64_t v = 0;
    struct timespec ts;

    if (tb_random_bytes(&v, sizeof(v)) != 0) {
        v = 0;
    }
    /* Without an entropy source, time, pid and a counter still make epochs
     * of two incarnations differ, which is all the channel needs. */
    clock_gettime(CLOCK_REALTIME, &ts);
    mix += 0x9e3779b97f4a7c15ull;
    v ^= mix ^ ((uint64_t) ts.tv_sec << 30) ^ (uint64_t) ts.tv_nsec ^ ((uint64_t) getpid() << 42);
    v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
    v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
    v ^= v >> 31;
    return v ? v : 1;
}
