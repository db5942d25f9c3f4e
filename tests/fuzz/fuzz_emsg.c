/*
 * Fuzz target: a message from a peer engine over the cable (tb_emsg.h), as
 * the receiving engine checks it before using any of it.  A message that
 * passes must be one the engine can act on: a known tag, a whole header,
 * only the flags its tag allows, and no payload on a CREDIT, a BACK or a
 * BACK_OK (which carry nothing but their numbers and try).
 *
 * Input: the channel tag (1 byte), then the message.
 */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "tb_emsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tb_wire_emsg_t h;
    const char *why = NULL;
    size_t len;
    uint8_t *msg;

    if (size < 1) {
        return 0;
    }
    /* A copy of its own size, so ASan sees any read past the message. */
    len = size - 1;
    msg = malloc(len ? len : 1);
    if (NULL == msg) {
        return 0;
    }
    memcpy(msg, data + 1, len);
    if (0 == tb_emsg_parse(data[0], msg, len, &h, &why)) {
        FUZZ_ASSERT(len >= sizeof(h), "passed with %zu bytes", len);
        FUZZ_ASSERT(TB_ETAG_DATA == data[0] || TB_ETAG_CREDIT == data[0]
                        || TB_ETAG_GONE == data[0] || TB_ETAG_BACK == data[0]
                        || TB_ETAG_BACK_OK == data[0],
                    "passed with tag %u", data[0]);
        FUZZ_ASSERT((TB_ETAG_BACK != data[0] && TB_ETAG_BACK_OK != data[0])
                        || (len == sizeof(h) && 0 == h.tag && 0 == h.src_pid && 0 == h.credit),
                    "a BACK or BACK_OK of %zu bytes, or with a tag, pid or credit", len);
        FUZZ_ASSERT(0 == (h.flags & ~(TB_ETAG_DATA == data[0] ? TB_EMSG_F_HOST : 0)),
                    "tag %u passed with flags 0x%x", data[0], h.flags);
        FUZZ_ASSERT(TB_ETAG_CREDIT != data[0] || len == sizeof(h), "a credit of %zu bytes", len);
        FUZZ_ASSERT(0 == h.reserved[0] && 0 == h.reserved[1], "reserved bytes set");
        FUZZ_ASSERT(TB_ETAG_DATA == data[0] || 0 == h.dst_pid, "tag %u passed with a destination "
                    "pid", data[0]);
        FUZZ_ASSERT(TB_ETAG_CREDIT != data[0] || 0 == h.src_pid, "a credit with a source pid");
    } else {
        FUZZ_ASSERT(NULL != why, "refused without a reason");
    }
    free(msg);
    return 0;
}
