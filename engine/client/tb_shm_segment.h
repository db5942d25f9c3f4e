/*
 * tbrdma host engine, client side: the shared memory a rank hands its host's engine for
 * its rings (tb_shm_ring.h), created by the rank and checked by the engine.
 */
#ifndef TB_SHM_SEGMENT_H
#define TB_SHM_SEGMENT_H

#include <stddef.h>

/* Shared memory for one segment of len bytes, sized and sealed so that no
 * process holding it can shrink it under another's mapping (which would make
 * the other's accesses fault): a sealed memfd where the system has one; else
 * a POSIX shared memory object, unlinked at once (macOS sizes such an object
 * only once).  The descriptor, or -1 with the reason in err. */
int tb_shm_segment_create(size_t len, char *err, size_t errlen);

/* The receiving side's check of a segment it was handed: at least len bytes,
 * and (where the system has seals) sealed against shrinking.  NULL if it may
 * be mapped, else why not. */
const char *tb_shm_segment_check(int fd, size_t len);

#endif /* TB_SHM_SEGMENT_H */
