/*
 * tbrdma common layer: diagnostics sink (see tb_log.h).
 */
#include "tb_log.h"

#include <stdio.h>

static const char *const level_names[] = {"error", "warning", "info", "debug", "trace"};

static void default_sink(tb_log_level_t level, const char *msg, void *ctx)
{
    (void) ctx;
    fprintf(stderr, "tbrdma %s: %s\n", level_names[level], msg);
}

static tb_log_sink_fn_t log_sink = default_sink;
static void *log_ctx;
static tb_log_level_t log_max = TB_LOG_WARN;

void tb_log_set_sink(tb_log_sink_fn_t sink, void *ctx, tb_log_level_t max_level)
{
    log_sink = sink ? sink : default_sink;
    log_ctx = sink ? ctx : NULL;
    log_max = max_level;
}

int tb_log_enabled(tb_log_level_t level)
{
    return level <= log_max;
}

void tb_log_limited(tb_log_limit_t *lim, uint64_t now_ns, tb_log_level_t level, const char *fmt,
                    ...)
{
    char buf[1024];
    va_list ap;

    if (lim->last_ns != 0 && now_ns - lim->last_ns < 1000000000ull) {
        lim->suppressed++;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (lim->suppressed) {
        tb_log(level, "%s (and %llu similar events not reported)", buf,
               (unsigned long long) lim->suppressed);
    } else {
        tb_log(level, "%s", buf);
    }
    lim->last_ns = now_ns ? now_ns : 1;
    lim->suppressed = 0;
}

void tb_log(tb_log_level_t level, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;

    if (!tb_log_enabled(level)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    log_sink(level, buf, log_ctx);
}
