/*
 * tbrdma host engine, daemon: a failed cable that works again carries its
 * traffic again.
 *
 * While a cable's flow goes round it (tb_eng_peer_detour), the end with the
 * lower engine id dials the cable again every ENG_BACK_EVERY_NS; the other
 * end accepts.  Once the new channel is set up, each end moves its own
 * direction of the flow back onto it, without loss or reordering:
 *   1. it sends BACK round the cable, numbered in the flow, as the last
 *      message that goes round, and then holds the flow (tb_eng_peer_channel
 *      gives no channel);
 *   2. the far end takes BACK in the flow's order, so after everything sent
 *      round before it, and answers BACK_OK over the new channel;
 *   3. BACK_OK moves the flow onto the cable: what waited goes over it.
 * Until the far end's BACK came, its traffic may still come round, and is
 * taken as during the detour (the cable had failed here too); after, what
 * comes round is held as for a sound cable.  A new channel that fails
 * before its flow moved onto it is dropped, the flow goes on round, and the
 * cable is tried again; one that fails after is a failed cable again.
 * BACK and BACK_OK name their try (the new channel's two epochs), so that
 * a BACK of a try that failed, come round late, moves nothing.
 */
#include "tb_engine_int.h"

#include <string.h>

#include "tb_log.h"

static bool dials(const eng_peer_t *p)
{
    return memcmp(p->e->id, p->id, sizeof(p->id)) < 0;
}

static const char *cable_name(const eng_peer_t *p)
{
    return p->e->devs[p->dev].dev->name;
}

static void back_reset(eng_peer_t *p)
{
    p->back = p->back_up = p->back_sent = p->back_came = p->back_rx = p->back_ok_due = false;
}

/* The far end's latest BACK, once this end's channel is up: this try's
 * (its flow comes over the cable now: answered), or an earlier one's. */
static void back_match(eng_peer_t *p)
{
    if (p->back_came && p->back_up) {
        p->back_came = false;
        if (p->back_came_id == p->back_id) {
            p->back_rx = p->back_ok_due = true;
        }
    }
}

uint64_t tb_eng_back_id_of(const tb_wire_emsg_t *h)
{
    return (uint64_t) tb_wire_le32(h->src) | (uint64_t) tb_wire_le32(h->dst) << 32;
}

static void back_id_put(tb_wire_emsg_t *h, uint64_t id)
{
    h->src = tb_wire_le32((uint32_t) id);
    h->dst = tb_wire_le32((uint32_t) (id >> 32));
}

void tb_eng_back_arm(eng_peer_t *p, uint64_t now)
{
    back_reset(p);
    p->back_tries = 0;
    p->back_at = dials(p) ? now + ENG_BACK_EVERY_NS : 0;
}

/* A new channel over p's cable, p still going round it. */
static bool back_conn(eng_peer_t *p)
{
    if (0 != tb_eng_peer_new_conn(p)) {
        if (0 == p->back_tries++) {
            TB_INFO("cannot make a channel to try the cable %s again (its queue pairs are "
                    "used up?): its traffic goes on round it", cable_name(p));
        }
        return false;
    }
    back_reset(p);
    p->back = true;
    return true;
}

static void dial(eng_peer_t *p, uint64_t now)
{
    p->back_at = now + ENG_BACK_EVERY_NS;
    if (!back_conn(p)) {
        return;
    }
    if (TB_CM_OK != tb_eng_peer_call(p, now)) {
        back_reset(p);
        tb_eng_peer_drop_conn(p);
    }
}

/* p's flow goes round its cable, and no channel over it is being set up. */
static bool going_round(const eng_peer_t *p)
{
    return ENG_PEER_CONNECTED == p->state && NULL != p->via && !p->routed && NULL == p->conn
           && !p->destroy;
}

bool tb_eng_back_accept(eng_peer_t *p)
{
    return going_round(p) && back_conn(p);
}

bool tb_eng_back_setup_done(eng_peer_t *p, int status, const tb_wire_addr_t *peer,
                            const char *why)
{
    tb_wire_addr_t local;

    if (!p->back || p->back_up) {
        return false;
    }
    if (TB_CM_OK == status && ENG_PEER_CONNECTED == p->state && p->conn && !p->destroy
        && (!p->known || 0 == memcmp(peer->gid, p->gid, sizeof(p->gid)))
        && TB_CHAN_OK == tb_conn_connect(p->conn, peer, tb_now_ns())) {
        tb_conn_local_addr(p->conn, &local);
        p->back_id = tb_wire_le64(local.epoch) ^ tb_wire_le64(peer->epoch);
        p->back_up = true;
        back_match(p);
        TB_INFO("the cable %s (%s) to engine %02x%02x%02x%02x works again: its traffic moves "
                "back onto it", cable_name(p), p->e->devs[p->dev].dev->netdev, p->id[0],
                p->id[1], p->id[2], p->id[3]);
        return true;
    }
    if (0 == p->back_tries++) {
        TB_INFO("the cable %s is not back yet (%s): tried again every %llu ms", cable_name(p),
                TB_CM_OK == status ? "its new channel could not be set up" : why,
                (unsigned long long) (ENG_BACK_EVERY_NS / 1000000u));
    }
    back_reset(p);
    /* Dropped outside the connection manager's callback, once. */
    p->destroy = NULL != p->conn;
    return true;
}

bool tb_eng_back_failed(eng_peer_t *p, int status, const char *why)
{
    if (!p->back || NULL == p->via || TB_CHAN_ECLOSED == status) {
        return false;
    }
    TB_WARN("the cable %s failed again before its traffic moved back onto it (%s): it goes on "
            "round it", cable_name(p), why);
    back_reset(p);
    p->destroy = true;
    p->back_at = dials(p) ? tb_now_ns() + ENG_BACK_EVERY_NS : 0;
    return true;
}

/* BACK round the cable, as the flow's next message: 1 once sent. */
static int send_back(eng_peer_t *p)
{
    uint32_t seq = p->tx_seq;

    if (!tb_eng_send_ctrl(p, TB_ETAG_BACK, (uint32_t) p->back_id, 0,
                          (uint32_t) (p->back_id >> 32), 0, NULL, false)) {
        return 0;
    }
    p->back_seq = seq;
    p->back_sent = true;
    return 1;
}

/* BACK_OK over the new channel, naming the BACK it answers: 1 once sent. */
static int send_back_ok(eng_peer_t *p)
{
    tb_channel_t *ch = tb_conn_channel(p->conn);
    tb_wire_emsg_t h;
    void *slot;

    memset(&h, 0, sizeof(h));
    back_id_put(&h, p->back_id);
    h.seq = tb_wire_le32(p->back_ok_seq);
    slot = tb_channel_send_begin(ch, TB_ETAG_BACK_OK, sizeof(h));
    if (NULL == slot) {
        return 0;
    }
    memcpy(slot, &h, sizeof(h));
    (void) tb_channel_send_commit(ch);
    p->back_ok_due = false;
    return 1;
}

/* The new channel is up, and was not failed meanwhile (a send can fail it
 * at once, inside the callbacks that drop it or send the flow round). */
static bool back_standing(const eng_peer_t *p)
{
    return p->back && p->back_up && ENG_PEER_CONNECTED == p->state && NULL != p->conn
           && !p->destroy;
}

int tb_eng_back_progress(eng_peer_t *p, uint64_t now)
{
    int n = 0;

    if (p->back_at && now >= p->back_at && going_round(p) && p->known && p->e->have_key) {
        dial(p, now);
        return 1;
    }
    if (!back_standing(p)) {
        return 0;
    }
    if (p->back_ok_due) {
        n += send_back_ok(p);
        if (!back_standing(p)) {
            return n;
        }
    }
    /* Once frames from the far end showed its end of the channel is up: a
     * channel only one end set up would hold the flow till it timed out. */
    if (p->via && !p->back_sent && tb_channel_is_connected(tb_conn_channel(p->conn))) {
        n += send_back(p);
    }
    if (NULL == p->via && p->back_rx && !p->back_ok_due) {
        /* Both ways over the cable again: what comes round it now is held
         * as for any sound cable. */
        back_reset(p);
        p->back_at = 0;
        ++n;
    }
    return n;
}

void tb_eng_back_came(eng_peer_t *p, uint64_t id, uint32_t seq)
{
    /* Matched with this end's try once its channel is up (the far end may
     * have set it up first). */
    p->back_came = true;
    p->back_came_id = id;
    p->back_ok_seq = seq;
    back_match(p);
}

void tb_eng_back_ok(eng_peer_t *p, uint64_t id, uint32_t seq)
{
    if (!p->back || !p->back_up || !p->back_sent || ENG_PEER_CONNECTED != p->state
        || id != p->back_id || seq != p->back_seq) {
        return; /* the answer to an earlier try's BACK */
    }
    p->via = NULL;
    p->tunnel = false; /* what it carried for others goes over it again, after what went round */
    p->back_sent = false;
    p->credit_changed = true;
    p->ret_pending = true;
    TB_WARN("the cable %s (%s) to engine %02x%02x%02x%02x carries its traffic again",
            cable_name(p), p->e->devs[p->dev].dev->netdev, p->id[0], p->id[1], p->id[2],
            p->id[3]);
}
