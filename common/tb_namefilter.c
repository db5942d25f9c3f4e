/*
 * tbrdma common layer: include/exclude lists of device-name patterns.
 */
#include "tb_namefilter.h"

#include <ctype.h>
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

static int parse_list(tb_namefilter_t *filter, const char *list, const char *what, char *err,
                      size_t errlen)
{
    const char *p = list;

    while (1) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t) (end - p) : strlen(p);
        const char *q;

        while (len > 0 && isspace((unsigned char) p[0])) {
            ++p;
            --len;
        }
        while (len > 0 && isspace((unsigned char) p[len - 1])) {
            --len;
        }
        if (0 == len) {
            snprintf(err, errlen, "%s list \"%s\" has an empty entry", what, list);
            return -1;
        }
        if (len > TB_NAMEFILTER_MAX_LEN) {
            snprintf(err, errlen, "%s list \"%s\": entry \"%.*s\" is longer than %d characters",
                     what, list, (int) len, p, TB_NAMEFILTER_MAX_LEN);
            return -1;
        }
        for (q = p; q < p + len; ++q) {
            if (isspace((unsigned char) *q) || !isprint((unsigned char) *q)) {
                snprintf(err, errlen,
                         "%s list \"%s\": entry \"%.*s\" contains a space or control character",
                         what, list, (int) len, p);
                return -1;
            }
        }
        if (filter->count == TB_NAMEFILTER_MAX_PATTERNS) {
            snprintf(err, errlen, "%s list \"%s\" has more than %d entries", what, list,
                     TB_NAMEFILTER_MAX_PATTERNS);
            return -1;
        }
        memcpy(filter->patterns[filter->count], p, len);
        filter->patterns[filter->count][len] = '\0';
        filter->count++;
        if (NULL == end) {
            return 0;
        }
        p = end + 1;
    }
}

int tb_namefilter_parse(tb_namefilter_t *filter, const char *include, const char *exclude,
                        char *err, size_t errlen)
{
    bool has_include = include && include[0];
    bool has_exclude = exclude && exclude[0];

    memset(filter, 0, sizeof(*filter));
    if (has_include && has_exclude) {
        snprintf(err, errlen,
                 "device include list \"%s\" and exclude list \"%s\" are both set; "
                 "set only one of them",
                 include, exclude);
        return -1;
    }
    if (has_include) {
        return parse_list(filter, include, "device include", err, errlen);
    }
    if (has_exclude) {
        filter->exclude = true;
        return parse_list(filter, exclude, "device exclude", err, errlen);
    }
    return 0;
}

bool tb_namefilter_accepts(const tb_namefilter_t *filter, const char *name)
{
    int i;

    for (i = 0; i < filter->count; ++i) {
        if (0 == fnmatch(filter->patterns[i], name, 0)) {
            return !filter->exclude;
        }
    }
    return 0 == filter->count || filter->exclude;
}
