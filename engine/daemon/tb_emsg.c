/*
 * tbrdma host engine, daemon: checking messages between host engines (tb_emsg.h).
 */
#include "tb_emsg.h"

#include <string.h>

int tb_emsg_parse(uint8_t tag, const void *data, size_t len, tb_wire_emsg_t *h, const char **why)
{
    uint8_t allowed;

    if (len < sizeof(*h)) {
        *why = "a message shorter than its header";
        return -1;
    }
    memcpy(h, data, sizeof(*h));
    switch (tag) {
    case TB_ETAG_DATA:
        allowed = TB_EMSG_F_HOST;
        break;
    case TB_ETAG_CREDIT:
        if (len != sizeof(*h)) {
            *why = "a credit message with a payload";
            return -1;
        }
        allowed = 0;
        break;
    case TB_ETAG_GONE:
        allowed = 0;
        break;
    case TB_ETAG_BACK:
    case TB_ETAG_BACK_OK:
        if (len != sizeof(*h) || 0 != h->tag || 0 != h->src_pid || 0 != h->dst_pid) {
            *why = "a message that a cable is back with more than its number";
            return -1;
        }
        allowed = 0;
        break;
    default:
        *why = "a message of an unknown kind";
        return -1;
    }
    if (0 != (h->flags & ~allowed) || 0 != h->reserved[0] || 0 != h->reserved[1]
        || 0 != h->reserved2
        || (TB_ETAG_CREDIT != tag && 0 != h->credit)
        || (TB_ETAG_CREDIT == tag && (0 != h->src_pid || 0 != h->dst_pid))
        || (TB_ETAG_GONE == tag && 0 != h->dst_pid)) {
        *why = "a message with unknown flags or reserved bytes set";
        return -1;
    }
    return 0;
}
