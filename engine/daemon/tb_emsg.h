/*
 * tbrdma host engine, daemon: the messages between host engines (tb_eproto.h,
 * tb_wire_emsg_t), as a receiving engine checks them.  Their bytes come from
 * a cable: nothing of a message is used before it passes.
 */
#ifndef TB_EMSG_H
#define TB_EMSG_H

#include <stddef.h>
#include <stdint.h>

#include "tb_eproto.h"

/* The header of a message that arrived with channel tag tag, len bytes at
 * data.  0 with *h filled (its payload follows at data + sizeof(*h)), or -1
 * with *why: short, an unknown tag, flags or reserved bytes that tag does
 * not allow, or a CREDIT with a payload. */
int tb_emsg_parse(uint8_t tag, const void *data, size_t len, tb_wire_emsg_t *h, const char **why);

#endif /* TB_EMSG_H */
