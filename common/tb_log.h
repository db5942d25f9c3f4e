/*
 * tbrdma common layer: diagnostics.
 *
 * common/ has no Open MPI dependency, so it reports through a sink the
 * embedding code installs (the BTL routes it to opal_output; tests and tools
 * to stderr).  Messages are single lines without a trailing newline.
 */
#ifndef TB_LOG_H
#define TB_LOG_H

#include <stdarg.h>
#include <stdint.h>

typedef enum {
    TB_LOG_ERROR = 0, /* something failed; the message says what the user can do */
    TB_LOG_WARN = 1,
    TB_LOG_INFO = 2,
    TB_LOG_DEBUG = 3,
    TB_LOG_TRACE = 4,
} tb_log_level_t;

typedef void (*tb_log_sink_fn_t)(tb_log_level_t level, const char *msg, void *ctx);

/* Install the sink and the most verbose level passed to it; a NULL sink
 * means the default one, stderr. */
void tb_log_set_sink(tb_log_sink_fn_t sink, void *ctx, tb_log_level_t max_level);

int tb_log_enabled(tb_log_level_t level);

void tb_log(tb_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A message a peer can cause as often as it likes (a refused request, a
 * dropped frame, a repeated record): at most one a second through the same
 * limit, the next saying how many were not reported. */
typedef struct tb_log_limit {
    uint64_t last_ns; /* when the last one went out (0: never) */
    uint64_t suppressed;
} tb_log_limit_t;

void tb_log_limited(tb_log_limit_t *lim, uint64_t now_ns, tb_log_level_t level, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));

#define TB_ERROR(...) tb_log(TB_LOG_ERROR, __VA_ARGS__)
#define TB_WARN(...) tb_log(TB_LOG_WARN, __VA_ARGS__)
#define TB_INFO(...) tb_log(TB_LOG_INFO, __VA_ARGS__)
#define TB_DEBUG(...)                        \
    do {                                     \
        if (tb_log_enabled(TB_LOG_DEBUG)) {  \
            tb_log(TB_LOG_DEBUG, __VA_ARGS__); \
        }                                    \
    } while (0)

#endif /* TB_LOG_H */
