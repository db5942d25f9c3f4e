/*
 * tbrdma common layer: include/exclude lists of device-name patterns.
 *
 * Users pick devices the way Open MPI's other BTLs do (btl_tcp_if_include):
 * a comma-separated list of shell patterns, either an include list or an
 * exclude list, never both.  Apple renames rdma_enX devices across reboots,
 * hence patterns rather than fixed names.
 */
#ifndef TB_NAMEFILTER_H
#define TB_NAMEFILTER_H

#include <stdbool.h>
#include <stddef.h>

#define TB_NAMEFILTER_MAX_PATTERNS 64
#define TB_NAMEFILTER_MAX_LEN 63

typedef struct tb_namefilter {
    bool exclude; /* true: names matching a pattern are dropped */
    int count;    /* 0: everything passes */
    char patterns[TB_NAMEFILTER_MAX_PATTERNS][TB_NAMEFILTER_MAX_LEN + 1];
} tb_namefilter_t;

/* Parse the include and exclude lists (NULL or "" for none).  Returns 0, or
 * -1 with a message naming the offending entry in err. */
int tb_namefilter_parse(tb_namefilter_t *filter, const char *include, const char *exclude,
                        char *err, size_t errlen);

bool tb_namefilter_accepts(const tb_namefilter_t *filter, const char *name);

#endif /* TB_NAMEFILTER_H */
