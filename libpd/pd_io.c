/* libpd: the send pool (pd_malloc/pd_free), send, receive and socket options. */
#include "pd_internal.h"

/* ---- send ring (pool) and its block table ---- */
/* release drops a block that is freed and that no send reads any more */
static void release(int slot)
{
	struct sbt *b = &pdi_g.sbt[slot];
	if (!b->live || !b->freed || b->inflight > 0)
		return;
	for (int i = 0; i < pdi_g.norder; i++)
		if (pdi_g.order[i] == slot) {
			memmove(&pdi_g.order[i], &pdi_g.order[i + 1], (pdi_g.norder - i - 1) * sizeof pdi_g.order[0]);
			pdi_g.norder--;
			break;
		}
	memset(b, 0, sizeof *b);
	pdi_g.free_slots[pdi_g.nfree++] = (uint16_t)slot;
}

void pdi_drain_cq(void)
{
	struct entry e;
	for (int q = 0; q < pdi_g.nq; q++)
		while (q_pop(cq(q), &e)) {
			int slot = e.entry_seq % SBT_SIZE;
			struct sbt *b = &pdi_g.sbt[slot];
			if (b->live && b->inflight > 0) {
				b->inflight--;
				release(slot);
			}
			if (e.type != REQ_COMPLETED && pdi_get(e.conn_id))
				__atomic_store_n((uint32_t *)(pdi_get(e.conn_id)->hdr + SH_ERROR), e.status, __ATOMIC_SEQ_CST);
		}
}

static int in_pool(const void *p, size_t len, uint64_t *off)
{
	const uint8_t *b = p;
	if (!pdi_g.inited || b < pdi_g.pool || b + len > pdi_g.pool + 2 * pdi_g.pool_size)
		return 0;
	*off = (uint64_t)(b - pdi_g.pool) & (pdi_g.pool_size - 1);
	return 1;
}

static struct sbt *block(uint64_t off, uint16_t *idx)
{
	int lo = 0, hi = pdi_g.norder;
	while (lo < hi) {
		int m = (lo + hi) / 2;
		struct sbt *b = &pdi_g.sbt[pdi_g.order[m]];
		if (b->off + b->size <= off)
			lo = m + 1;
		else
			hi = m;
	}
	if (lo < pdi_g.norder) {
		struct sbt *b = &pdi_g.sbt[pdi_g.order[lo]];
		if (b->off <= off && off < b->off + b->size && !b->freed) {
			*idx = pdi_g.order[lo];
			return b;
		}
	}
	return NULL;
}

void *pd_malloc(size_t size)
{
	LOCK();
	int e = pdi_gate();
	if (e || size == 0) {
		UNLOCK();
		errno = e ? e : EINVAL;
		return NULL;
	}
	struct psock *s = pdi_g.direct ? pdi_get(pdi_cur_sid) : NULL;
	if (s && s->peer) {
		e = pdi_sock_err(s);
		if (e) {
			UNLOCK();
			errno = e; /* the peer closed: its ring takes nothing more */
			return NULL;
		}
		uint64_t limit = ld64(s->hdr, SH_TX_LIMIT);
		if (s->dalloc + size > limit || size > pdi_g.ring) {
			UNLOCK();
			errno = EAGAIN;
			return NULL;
		}
		void *p = s->peer + (s->dalloc & (pdi_g.ring - 1));
		s->dalloc += size;
		UNLOCK();
		return p;
	}
	pdi_drain_cq();
	uint64_t sz = (size + 63) & ~(uint64_t)63;
	if (!pdi_g.nfree || sz > pdi_g.pool_size) {
		UNLOCK();
		errno = ENOMEM;
		return NULL;
	}
	int at = -1;
	uint64_t prev_end = 0;
	for (int i = 0; i < pdi_g.norder; i++) {
		struct sbt *b = &pdi_g.sbt[pdi_g.order[i]];
		if (b->off - prev_end >= sz) {
			at = i;
			break;
		}
		prev_end = b->off + b->size;
	}
	if (at < 0) {
		if (pdi_g.pool_size - prev_end < sz) {
			UNLOCK();
			errno = ENOMEM;
			return NULL;
		}
		at = pdi_g.norder;
	}
	uint16_t slot = pdi_g.free_slots[--pdi_g.nfree];
	pdi_g.sbt[slot] = (struct sbt){ .off = prev_end, .size = sz, .live = 1 };
	memmove(&pdi_g.order[at + 1], &pdi_g.order[at], (pdi_g.norder - at) * sizeof pdi_g.order[0]);
	pdi_g.order[at] = slot;
	pdi_g.norder++;
	void *p = pdi_g.pool + prev_end;
	UNLOCK();
	return p;
}

void pd_free(void *buf)
{
	uint64_t off;
	uint16_t idx;
	LOCK();
	if (in_pool(buf, 1, &off)) {
		struct sbt *b = block(off, &idx);
		if (b) {
			b->freed = 1;
			release(idx);
		}
	} else if (pdi_g.inited) {
		for (int i = 0; i < pdi_g.maxsock; i++) {
			struct psock *s = &pdi_g.socks[i];
			if (s->used && s->peer && (uint8_t *)buf >= s->peer && (uint8_t *)buf < s->peer + 2 * pdi_g.ring) {
				s->dalloc = s->dpub; /* drop unsent direct reservations */
				break;
			}
		}
	}
	UNLOCK();
}

int pdi_sock_err(struct psock *s)
{
	uint32_t st = ld32(s->hdr, SH_STATE);
	if (st == ST_PEER_CLOSED || st == ST_CLOSED)
		return EPIPE;
	if (st != ST_CONNECTED)
		return ENOTCONN;
	return (int)ld32(s->hdr, SH_ERROR);
}

/* lock_sock takes the lock for a call on sid and returns its socket; or it releases the lock
 * and returns NULL with errno set, in this order: the gate's error (no daemon, or it is gone),
 * EINVAL when the call's arguments are bad, EBADF when sid is no socket. */
static struct psock *lock_sock(int sid, int bad_args)
{
	LOCK();
	struct psock *s = pdi_get(sid);
	int e = pdi_gate();
	if (!e && bad_args)
		e = EINVAL;
	if (e || !s) {
		UNLOCK();
		errno = e ? e : EBADF;
		return NULL;
	}
	return s;
}

ssize_t pd_send(int sid, const void *buf, size_t len)
{
	struct psock *s = lock_sock(sid, 0);
	if (!s)
		return -1;
	int e = pdi_sock_err(s);
	if (e) {
		UNLOCK();
		return errno = e, -1;
	}
	if (len == 0) {
		UNLOCK();
		return 0;
	}
	pdi_cur_sid = sid;
	/* the limit is in shared memory: never believe more room than one ring */
	uint64_t n = len, room = ld64(s->hdr, SH_TX_LIMIT) - s->queued;
	if (room > pdi_g.ring)
		room = pdi_g.ring;
	if (n > room)
		n = room;
	/* completions pile up when the program never calls pd_buf_refresh/pd_malloc/pd_epoll_wait:
	 * take them now, or a full completion queue stops the engine from serving this queue */
	if (q_free(cq(s->q)) <= pdi_g.depth / 2)
		pdi_drain_cq();
	uint64_t max = (uint64_t)q_free(sq(s->q)) * MAX_CHUNK;
	if (max > 64ull * MAX_CHUNK)
		max = 64ull * MAX_CHUNK;
	if (n > max)
		n = max;
	if (n == 0) {
		pdi_drain_cq();
		e = pdi_again();
		UNLOCK();
		return errno = e, -1;
	}
	struct entry es[64];
	int k = 0;
	const uint8_t *p = buf;
	uint64_t off;
	if (s->peer && p >= s->peer && p < s->peer + 2 * pdi_g.ring) {
		if ((uint64_t)((p - s->peer) & (pdi_g.ring - 1)) != (s->dpub & (pdi_g.ring - 1)) || s->dpub + n > s->dalloc) {
			UNLOCK();
			return errno = EINVAL, -1; /* direct: send buffers in the order pd_malloc gave them */
		}
		for (uint64_t sent = 0; sent < n; k++) {
			uint64_t c = n - sent < MAX_CHUNK ? n - sent : MAX_CHUNK;
			es[k] = (struct entry){ .type = REQ_SEND_DIRECT, .data_len = (uint16_t)c, .dst = s->dpub + sent, .cid = pdi_g.cid, .conn_id = (uint16_t)sid };
			sent += c;
		}
		if (!q_push(sq(s->q), es, k)) {
			UNLOCK();
			return errno = EAGAIN, -1;
		}
		s->dpub += n;
	} else {
		uint16_t idx;
		struct sbt *b;
		if (!in_pool(buf, len, &off) || !(b = block(off, &idx)) || off + len > b->off + b->size) {
			UNLOCK();
			return errno = EFAULT, -1;
		}
		for (uint64_t sent = 0; sent < n; k++) {
			uint64_t c = n - sent < MAX_CHUNK ? n - sent : MAX_CHUNK;
			es[k] = (struct entry){ .type = REQ_SEND, .data_len = (uint16_t)c, .src = off + sent, .cid = pdi_g.cid, .conn_id = (uint16_t)sid, .entry_seq = idx };
			sent += c;
		}
		if (!q_push(sq(s->q), es, k)) {
			UNLOCK();
			return errno = EAGAIN, -1;
		}
		b->inflight += k;
	}
	s->queued += n;
	st64(s->hdr, SH_TX_QUEUED, s->queued);
	ring_doorbell();
	UNLOCK();
	return (ssize_t)n;
}

int pd_buf_refresh(int sid, void **ptrs, int ptrlen)
{
	LOCK();
	/* the daemon is gone: no send will ever complete, so say so rather than 0 forever (a
	 * sender waiting for its buffers would spin) */
	int e = pdi_gate();
	if (!e && (ptrlen < 0 || (ptrlen > 0 && !ptrs)))
		e = EINVAL;
	if (e || !pdi_get(sid)) {
		UNLOCK();
		return errno = e ? e : EBADF, -1;
	}
	pdi_drain_cq();
	int n = 0;
	for (int i = 0; i < ptrlen; i++) {
		uint64_t off;
		uint16_t idx;
		struct sbt *b;
		if (in_pool(ptrs[i], 1, &off) && (b = block(off, &idx)) && b->inflight == 0) {
			void *t = ptrs[n];
			ptrs[n++] = ptrs[i];
			ptrs[i] = t;
		}
	}
	UNLOCK();
	return n;
}

ssize_t pd_recv(int sid, size_t buflen, void **recvbuf)
{
	struct psock *s = lock_sock(sid, !recvbuf);
	if (!s)
		return -1;
	int e;
	/* the tail is in shared memory: never believe more than one ring */
	uint64_t avail = ld64(s->hdr, SH_RX_TAIL) - s->head;
	if (avail > pdi_g.ring)
		avail = pdi_g.ring;
	if (avail == 0) {
		uint32_t st = ld32(s->hdr, SH_STATE);
		e = st == ST_CONNECTED ? pdi_again() : ENOTCONN;
		UNLOCK();
		if (st == ST_PEER_CLOSED)
			return 0;
		return errno = e, -1;
	}
	if (buflen < avail)
		avail = buflen;
	*recvbuf = s->rx + (s->head & (pdi_g.ring - 1));
	UNLOCK();
	return (ssize_t)avail;
}

int pd_recv_done(int sid, size_t len)
{
	struct psock *s = lock_sock(sid, 0);
	if (!s)
		return -1;
	uint64_t tail = ld64(s->hdr, SH_RX_TAIL);
	if (len > tail - s->head || len > pdi_g.ring) {
		UNLOCK();
		return errno = EINVAL, -1;
	}
	s->head += len;
	s->unposted += len;
	st64(s->hdr, SH_RX_HEAD, s->head);
	/* batch the releases, but always tell when drained so a waiting sender hears of it */
	if (s->unposted >= pdi_g.ring / 4 || s->head == tail)
		pdi_flush_release(sid, s);
	UNLOCK();
	return 0;
}

int pd_getsockopt(int sid, int level, int optname, void *optval, socklen_t *optlen)
{
	if (!optval || !optlen || *optlen < (socklen_t)sizeof(int))
		return errno = EINVAL, -1;
	LOCK();
	struct psock *s = pdi_get(sid);
	int v, ret = 0, e = pdi_gate();
	/* the daemon is gone: SO_ERROR says so as its value (what PD_EPOLLERR points at), every
	 * other option fails with it */
	if (e == ECONNRESET && s && level == SOL_SOCKET && optname == SO_ERROR)
		e = 0;
	if (!e && level != SOL_SOCKET)
		e = ENOPROTOOPT;
	if (e || !s) {
		UNLOCK();
		return errno = e ? e : EBADF, -1;
	}
	switch (optname) {
	case SO_RCVBUF: v = (int)pdi_g.ring; break;
	case SO_SNDBUF: v = (int)pdi_g.pool_size; break;
	case SO_TYPE: v = SOCK_STREAM; break;
	case SO_ERROR:
		v = pdi_g.dead ? ECONNRESET : (int)__atomic_exchange_n((uint32_t *)(s->hdr + SH_ERROR), 0, __ATOMIC_SEQ_CST);
		break;
	default: ret = -1; errno = ENOPROTOOPT;
	}
	UNLOCK();
	if (ret == 0) {
		memcpy(optval, &v, sizeof v);
		*optlen = sizeof v;
	}
	return ret;
}

int pd_setsockopt(int sid, int level, int optname, const void *optval, socklen_t optlen)
{
	LOCK();
	struct psock *s = pdi_get(sid);
	int e = pdi_gate();
	UNLOCK();
	if (e || !s)
		return errno = e ? e : EBADF, -1;
	if (!optval || optlen < (socklen_t)sizeof(int))
		return errno = EINVAL, -1;
	if (level == SOL_SOCKET && (optname == SO_RCVBUF || optname == SO_SNDBUF)) {
		int v;
		memcpy(&v, optval, sizeof v);
		uint64_t have = optname == SO_RCVBUF ? pdi_g.ring : pdi_g.pool_size;
		if ((uint64_t)v == have)
			return 0;
		return errno = EINVAL, -1; /* fixed per process: set PD_RING_SIZE / PD_POOL_SIZE before pd_init */
	}
	return errno = ENOPROTOOPT, -1;
}

