/* libpd: epoll over PipeDevice sockets (readiness from the shared socket headers). */
#include "pd_internal.h"

/* ---- epoll ---- */
int pd_epoll_create(int size)
{
	if (size <= 0)
		return errno = EINVAL, -1;
	LOCK();
	if (pdi_g.inited && pdi_dead()) { /* before pd_init an epoll set may be made; after the daemon's end not */
		UNLOCK();
		return errno = ECONNRESET, -1;
	}
	for (int i = 0; i < MAX_EPOLL; i++)
		if (!pdi_g.ep[i].used) {
			pdi_g.ep[i] = (struct epoll){ .used = 1 };
			UNLOCK();
			return i;
		}
	UNLOCK();
	return errno = EMFILE, -1;
}

int pd_epoll_ctl(int epfd, int op, int sid, struct pd_epoll_event *ev)
{
	LOCK();
	if (pdi_g.inited && pdi_dead()) {
		UNLOCK();
		return errno = ECONNRESET, -1;
	}
	if (epfd < 0 || epfd >= MAX_EPOLL || !pdi_g.ep[epfd].used) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	struct epoll *ep = &pdi_g.ep[epfd];
	int at = -1;
	for (int i = 0; i < ep->n; i++)
		if (ep->items[i].sid == sid)
			at = i;
	int ret = 0;
	switch (op) {
	case PD_EPOLL_CTL_ADD:
		if (!pdi_get(sid) || !ev) { ret = -1; errno = !ev ? EINVAL : EBADF; break; }
		if (at >= 0) { ret = -1; errno = EEXIST; break; }
		if (ep->n == ep->cap) {
			int nc = ep->cap ? 2 * ep->cap : 16;
			struct ep_item *it = realloc(ep->items, nc * sizeof *it);
			if (!it) { ret = -1; errno = ENOMEM; break; }
			ep->items = it;
			ep->cap = nc;
		}
		ep->items[ep->n++] = (struct ep_item){ sid, *ev };
		break;
	case PD_EPOLL_CTL_MOD:
		if (at < 0 || !ev) { ret = -1; errno = !ev ? EINVAL : ENOENT; break; }
		ep->items[at].ev = *ev;
		break;
	case PD_EPOLL_CTL_DEL:
		if (at < 0) { ret = -1; errno = ENOENT; break; }
		ep->items[at] = ep->items[--ep->n];
		break;
	default:
		ret = -1;
		errno = EINVAL;
	}
	UNLOCK();
	return ret;
}

static uint32_t readiness(int sid)
{
	struct psock *s = pdi_get(sid);
	if (!s)
		return PD_EPOLLERR | PD_EPOLLHUP;
	uint32_t ev = 0, st = ld32(s->hdr, SH_STATE);
	if (ld64(s->hdr, SH_RX_TAIL) != s->head || ld32(s->hdr, SH_PENDING) > 0)
		ev |= PD_EPOLLIN;
	if (st == ST_PEER_CLOSED || st == ST_CLOSED)
		ev |= PD_EPOLLIN | PD_EPOLLHUP;
	if (st == ST_CONNECTED) {
		uint64_t used = (pdi_g.direct && s->peer) ? s->dalloc : s->queued;
		if (ld64(s->hdr, SH_TX_LIMIT) > used)
			ev |= PD_EPOLLOUT;
	}
	if (ld32(s->hdr, SH_ERROR))
		ev |= PD_EPOLLERR;
	return ev;
}

static int collect(struct epoll *ep, struct pd_epoll_event *out, int max)
{
	int n = 0;
	pdi_drain_cq();
	for (int i = 0; i < ep->n && n < max; i++) {
		uint32_t r = readiness(ep->items[i].sid) & (ep->items[i].ev.events | PD_EPOLLERR | PD_EPOLLHUP);
		if (r) {
			out[n].events = r;
			out[n].data = ep->items[i].ev.data;
			n++;
		}
	}
	return n;
}

int pd_epoll_wait(int epfd, struct pd_epoll_event *events, int maxevents, int timeout_ms)
{
	if (!events || maxevents <= 0)
		return errno = EINVAL, -1;
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	uint32_t *sleeping = NULL;
	for (;;) {
		LOCK();
		if (epfd < 0 || epfd >= MAX_EPOLL || !pdi_g.ep[epfd].used || !pdi_g.inited) {
			UNLOCK();
			return errno = EBADF, -1;
		}
		if (pdi_gone()) {
			/* the daemon is gone: every watched socket reports an error (SO_ERROR: ECONNRESET) */
			struct epoll *ep = &pdi_g.ep[epfd];
			int n = 0;
			for (int i = 0; i < ep->n && n < maxevents; i++) {
				struct psock *s = pdi_get(ep->items[i].sid);
				if (s)
					__atomic_store_n((uint32_t *)(s->hdr + SH_ERROR), ECONNRESET, __ATOMIC_SEQ_CST);
				events[n].events = PD_EPOLLERR | PD_EPOLLHUP;
				events[n++].data = ep->items[i].ev.data;
			}
			UNLOCK();
			return n ? n : (errno = ECONNRESET, -1);
		}
		int n = collect(&pdi_g.ep[epfd], events, maxevents);
		if (n || timeout_ms == 0) {
			UNLOCK();
			return n;
		}
		/* announce the sleep, look again (the engine checks the flag after publishing) */
		sleeping = (uint32_t *)(pdi_g.ctl + PH_SLEEPING);
		__atomic_add_fetch(sleeping, 1, __ATOMIC_SEQ_CST);
		n = collect(&pdi_g.ep[epfd], events, maxevents);
		int nfd = pdi_g.notify, cfd = pdi_g.conn;
		UNLOCK();
		if (n) {
			__atomic_sub_fetch(sleeping, 1, __ATOMIC_SEQ_CST);
			return n;
		}
		int wait = -1;
		if (timeout_ms > 0) {
			struct timespec now;
			clock_gettime(CLOCK_MONOTONIC, &now);
			long el = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
			if (el >= timeout_ms) {
				__atomic_sub_fetch(sleeping, 1, __ATOMIC_SEQ_CST);
				return 0;
			}
			wait = timeout_ms - (int)el;
		}
		/* the control socket too: the daemon going away (a crash) wakes us at once */
		struct pollfd pf[2] = { { .fd = nfd, .events = POLLIN }, { .fd = cfd, .events = POLLRDHUP } };
		poll(pf, 2, wait < 0 || wait > 100 ? 100 : wait);
		uint64_t v;
		if (read(nfd, &v, 8) < 0) { /* nothing to drain */ }
		__atomic_sub_fetch(sleeping, 1, __ATOMIC_SEQ_CST);
	}
}

