/*
 * tbrdma BTL: send descriptors.
 */
#include "tb_config.h"
#include "btl_tbrdma_frag.h"

static void frag_construct(mca_btl_tbrdma_frag_t *frag)
{
    frag->base.des_segments = &frag->segment;
    frag->base.des_segment_count = 1;
    frag->cookie.kind = TBRDMA_COOKIE_FRAG;
    frag->endpoint = NULL;
}

OBJ_CLASS_INSTANCE(mca_btl_tbrdma_frag_t, mca_btl_base_descriptor_t, frag_construct, NULL);

static int frag_init(opal_free_list_item_t *item, void *ctx)
{
    mca_btl_tbrdma_frag_t *frag = (mca_btl_tbrdma_frag_t *) item;
    opal_free_list_t *list = (opal_free_list_t *) ctx;

    frag->owner = list;
    frag->capacity = list == &mca_btl_tbrdma_component.eager_frags
                         ? mca_btl_tbrdma_component.eager_frag_size
                         : mca_btl_tbrdma_component.max_frag_size;
    frag->segment.seg_addr.pval = item->ptr;
    return OPAL_SUCCESS;
}

static int init_list(opal_free_list_t *list, size_t payload)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;

    OBJ_CONSTRUCT(list, opal_free_list_t);
    return opal_free_list_init(list, sizeof(mca_btl_tbrdma_frag_t), opal_cache_line_size,
                               OBJ_CLASS(mca_btl_tbrdma_frag_t), payload, opal_cache_line_size,
                               c->free_list_num, c->free_list_max, c->free_list_inc, NULL, 0,
                               NULL, frag_init, list);
}

int mca_btl_tbrdma_frag_lists_init(void)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    int rc;

    rc = init_list(&c->eager_frags, c->eager_frag_size);
    if (OPAL_SUCCESS != rc) {
        OBJ_DESTRUCT(&c->eager_frags);
        return rc;
    }
    rc = init_list(&c->max_frags, c->max_frag_size);
    if (OPAL_SUCCESS != rc) {
        OBJ_DESTRUCT(&c->max_frags);
        OBJ_DESTRUCT(&c->eager_frags);
    }
    return rc;
}

void mca_btl_tbrdma_frag_lists_fini(void)
{
    OBJ_DESTRUCT(&mca_btl_tbrdma_component.max_frags);
    OBJ_DESTRUCT(&mca_btl_tbrdma_component.eager_frags);
}

mca_btl_tbrdma_frag_t *mca_btl_tbrdma_frag_alloc(struct mca_btl_base_endpoint_t *endpoint,
                                                 size_t size)
{
    mca_btl_tbrdma_component_t *c = &mca_btl_tbrdma_component;
    opal_free_list_t *list;
    mca_btl_tbrdma_frag_t *frag;

    if (size <= c->eager_frag_size) {
        list = &c->eager_frags;
    } else if (size <= c->max_frag_size) {
        list = &c->max_frags;
    } else {
        return NULL;
    }
    frag = (mca_btl_tbrdma_frag_t *) opal_free_list_get(list);
    if (NULL == frag) {
        return NULL;
    }
    frag->endpoint = endpoint;
    frag->segment.seg_len = size;
    frag->base.des_flags = 0;
    frag->base.des_cbfunc = NULL;
    frag->base.des_cbdata = NULL;
    frag->base.des_context = NULL;
    frag->base.order = MCA_BTL_NO_ORDER;
    return frag;
}

void mca_btl_tbrdma_frag_return(mca_btl_tbrdma_frag_t *frag)
{
    opal_free_list_return(frag->owner, &frag->base.super);
}

void mca_btl_tbrdma_frag_complete(mca_btl_tbrdma_frag_t *frag, int status)
{
    struct mca_btl_base_endpoint_t *endpoint = frag->endpoint;
    int owned = frag->base.des_flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP;

    if (frag->base.des_cbfunc) {
        frag->base.des_cbfunc(&endpoint->module->super, endpoint, &frag->base, status);
    }
    if (owned) {
        mca_btl_tbrdma_frag_return(frag);
    }
}
