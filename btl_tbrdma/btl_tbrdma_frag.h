/*
 * tbrdma BTL: send descriptors.
 *
 * A fragment owns a buffer from one of two free lists (eager-sized and
 * max-send-sized).  The channel copies it into registered frames as credit
 * allows and completes it once every byte is in a frame (it resends from
 * there), so the fragment stays the BTL's until then.
 */
#ifndef BTL_TBRDMA_FRAG_H
#define BTL_TBRDMA_FRAG_H

#include "btl_tbrdma.h"

BEGIN_C_DECLS

typedef struct mca_btl_tbrdma_frag_t {
    mca_btl_base_descriptor_t base;
    mca_btl_base_segment_t segment;
    mca_btl_tbrdma_cookie_t cookie; /* identifies the fragment in channel completions */
    struct mca_btl_base_endpoint_t *endpoint;
    opal_free_list_t *owner;
    size_t capacity;
} mca_btl_tbrdma_frag_t;

OBJ_CLASS_DECLARATION(mca_btl_tbrdma_frag_t);

int mca_btl_tbrdma_frag_lists_init(void);
void mca_btl_tbrdma_frag_lists_fini(void);

/* A fragment able to hold size bytes, or NULL (none free, or size larger
 * than max_send_size). */
mca_btl_tbrdma_frag_t *mca_btl_tbrdma_frag_alloc(struct mca_btl_base_endpoint_t *endpoint,
                                                 size_t size);

void mca_btl_tbrdma_frag_return(mca_btl_tbrdma_frag_t *frag);

/* The channel finished the fragment's send (status: OPAL_SUCCESS or an
 * error): run the owner's callback and release it if the BTL owns it. */
void mca_btl_tbrdma_frag_complete(mca_btl_tbrdma_frag_t *frag, int status);

END_C_DECLS

#endif /* BTL_TBRDMA_FRAG_H */
