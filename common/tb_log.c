/*
 * tbrdma common layer: diagnostics sink (see tb_log.h).
 */
#include "tb_log.h"

#include <stdatomic.h>
#include <stdio.h>

static const char *const level_names[] = {"error", "warning", "info", "debug", "trace"};

static void default_sink(tb_log_level_t level, const char *msg, void *ctx)
{
    (void) ctx;
    fprintf(stderr, "tbrdma %s: %s\n", level_names[level], msg);
}

/* Atomic: a process's keeper thread (tb_keeper.h) and an engine's test
 * threads log while the owner may set the sink. */
static _Atomic(tb_log_sink_fn_t) log_sink = default_sink;
static _Atomic(void *) log_ctx;
static _Atomic int log_max = TB_LOG_WARN;

void tb_log_set_sink(tb_log_sink_fn_t sink, void *ctx, tb_log_level_t max_level)
{
    atomic_store_explicit(&log_ctx, sink ? ctx : NULL, memory_order_relaxed);
    atomic_store_explicit(&log_sink, sink ? sink : default_sink, memory_order_release);
    atomic_store_explicit(&log_max, (int) max_level, memory_order_relaxed);
}

int tb_log_enabled(tb_log_level_t level)
{
    return (int) level <= atomic_load_explicit(&log_max, memory_order_relaxed);
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
    atomic_load_explicit(&log_sink, memory_order_acquire)(
        level, buf, atomic_load_explicit(&log_ctx, memory_order_relaxed));
}
