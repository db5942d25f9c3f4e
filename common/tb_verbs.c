/*
 * tbrdma common layer: the verbs library, loaded at run time (see tb_verbs.h).
 */
#include "tb_config.h"
#include "tb_verbs.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

const char *tb_verbs_default_library(void)
{
    return TB_VERBS_LIBRARY;
}

/* Symbol name -> slot in tb_verbs_t, so the resolve loop has one failure path. */
#define TB_VERBS_SYM(field, name) {name, offsetof(tb_verbs_t, field)}

static const struct {
    const char *name;
    size_t offset;
} verbs_symbols[] = {
    TB_VERBS_SYM(get_device_list, "ibv_get_device_list"),
    TB_VERBS_SYM(free_device_list, "ibv_free_device_list"),
    TB_VERBS_SYM(get_device_name, "ibv_get_device_name"),
    TB_VERBS_SYM(open_device, "ibv_open_device"),
    TB_VERBS_SYM(close_device, "ibv_close_device"),
    TB_VERBS_SYM(query_device, "ibv_query_device"),
    TB_VERBS_SYM(query_port, "ibv_query_port"),
    TB_VERBS_SYM(query_gid, "ibv_query_gid"),
    TB_VERBS_SYM(alloc_pd, "ibv_alloc_pd"),
    TB_VERBS_SYM(dealloc_pd, "ibv_dealloc_pd"),
    TB_VERBS_SYM(reg_mr, "ibv_reg_mr"),
    TB_VERBS_SYM(dereg_mr, "ibv_dereg_mr"),
    TB_VERBS_SYM(create_cq, "ibv_create_cq"),
    TB_VERBS_SYM(destroy_cq, "ibv_destroy_cq"),
    TB_VERBS_SYM(create_qp, "ibv_create_qp"),
    TB_VERBS_SYM(modify_qp, "ibv_modify_qp"),
    TB_VERBS_SYM(destroy_qp, "ibv_destroy_qp"),
};

static const struct {
    const char *name;
    size_t offset;
} optional_symbols[] = {
    TB_VERBS_SYM(create_comp_channel, "ibv_create_comp_channel"),
    TB_VERBS_SYM(destroy_comp_channel, "ibv_destroy_comp_channel"),
    TB_VERBS_SYM(get_cq_event, "ibv_get_cq_event"),
    TB_VERBS_SYM(ack_cq_events, "ibv_ack_cq_events"),
};

/* With the default library, a definition already in the process's global
 * scope wins: the application's own verbs library, or an interposer
 * preloaded in front of it (the virtual cluster's strict mode, tracing
 * tools), which calling the loaded copy directly would bypass.  A library
 * the user named is used as it is. */
static void *lookup(const tb_verbs_t *verbs, const char *name, bool named)
{
    void *sym = named ? NULL : dlsym(RTLD_DEFAULT, name);

    return sym ? sym : dlsym(verbs->handle, name);
}

int tb_verbs_load(tb_verbs_t *verbs, const char *path, char *err, size_t errlen)
{
    const char *dlerr;
    bool named;
    size_t i;

    memset(verbs, 0, sizeof(*verbs));
    named = NULL != path && '\0' != path[0];
    if (!named) {
        path = tb_verbs_default_library();
    }
    if (strlen(path) >= sizeof(verbs->path)) {
        snprintf(err, errlen, "verbs library path is longer than %zu characters: %s",
                 sizeof(verbs->path) - 1, path);
        return -1;
    }
    snprintf(verbs->path, sizeof(verbs->path), "%s", path);

    verbs->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (NULL == verbs->handle) {
        dlerr = dlerror();
        snprintf(err, errlen,
                 "cannot load the verbs library %s (%s). On macOS, RDMA over Thunderbolt "
                 "needs macOS 26.2 or later; on Linux install rdma-core's libibverbs "
                 "(Debian: apt-get install libibverbs1 ibverbs-providers), or name the "
                 "library with btl_tbrdma_verbs_library",
                 path, dlerr ? dlerr : "unknown error");
        return -1;
    }

    for (i = 0; i < sizeof(verbs_symbols) / sizeof(verbs_symbols[0]); ++i) {
        void *sym = lookup(verbs, verbs_symbols[i].name, named);
        if (NULL == sym) {
            snprintf(err, errlen,
                     "the verbs library %s has no %s: it is not a verbs library, or too old "
                     "(rdma-core 17 or later is needed)",
                     path, verbs_symbols[i].name);
            goto unload;
        }
        memcpy((char *) verbs + verbs_symbols[i].offset, &sym, sizeof(sym));
    }
    for (i = 0; i < sizeof(optional_symbols) / sizeof(optional_symbols[0]); ++i) {
        void *sym = lookup(verbs, optional_symbols[i].name, named);
        memcpy((char *) verbs + optional_symbols[i].offset, &sym, sizeof(sym));
    }
    /* Events only whole. */
    if (!verbs->create_comp_channel || !verbs->destroy_comp_channel || !verbs->get_cq_event
        || !verbs->ack_cq_events) {
        verbs->create_comp_channel = NULL;
    }
    return 0;

unload:
    dlclose(verbs->handle);
    memset(verbs, 0, sizeof(*verbs));
    return -1;
}

void tb_verbs_unload(tb_verbs_t *verbs)
{
    if (NULL != verbs->handle) {
        dlclose(verbs->handle);
    }
    memset(verbs, 0, sizeof(*verbs));
}
