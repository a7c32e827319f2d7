/* libpd: client side of PipeDevice. Speaks the daemon's control protocol and uses the shared
 * memory layout of internal/pipedevice (layout.go, queue.go, proto.go): change them together.
 * This file: the library's state, the control protocol, init and the socket calls. */
#include "pd_internal.h"

struct pdi_state pdi_g;
pthread_mutex_t pdi_mu = PTHREAD_MUTEX_INITIALIZER;
__thread int pdi_cur_sid = -1;


/* call sends r and reads the reply and up to 8 fds; returns 0 or -1 with errno. The control
 * socket has send and receive timeouts (pd_init), so a daemon that hangs cannot hang us; a failed
 * call leaves the protocol out of step, so the library is dead from then on. */
static int call(int conn, struct req *r, struct rep *out, int *fds, int *nfds)
{
	*nfds = 0;
	if (pdi_g.dead && conn == pdi_g.conn)
		return errno = ECONNRESET, -1;
	if (send(conn, r, sizeof *r, MSG_NOSIGNAL) != (ssize_t)sizeof *r) {
		pdi_g.dead = 1;
		return errno = ECONNRESET, -1;
	}
	char buf[4096];
	union { struct cmsghdr h; char b[CMSG_SPACE(8 * sizeof(int))]; } cm;
	struct iovec iov = { buf, sizeof buf };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b };
	ssize_t n = recvmsg(conn, &m, MSG_CMSG_CLOEXEC);
	if (n < MSG) {
		int e = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? ETIMEDOUT : ECONNRESET;
		pdi_g.dead = 1;
		return errno = e, -1;
	}
	memcpy(out, buf, MSG);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			if (k < 0 || *nfds + k > 8)
				k = k < 0 ? 0 : 8 - *nfds; /* cannot happen with an 8-fd control buffer */
			memcpy(fds + *nfds, CMSG_DATA(c), k * sizeof(int));
			*nfds += k;
		}
	if (out->err) {
		for (int i = 0; i < *nfds; i++)
			close(fds[i]);
		*nfds = 0;
		return errno = out->err, -1;
	}
	return 0;
}

/* map_mirror maps fd twice back to back (a ring's wrapped bytes are contiguous); prot is
 * PROT_READ for our own receive ring (the daemon sealed it, or the peer writes it) */
static uint8_t *map_mirror(int fd, size_t size, int prot)
{
	uint8_t *base = mmap(NULL, 2 * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return NULL;
	for (int i = 0; i < 2; i++)
		if (mmap(base + i * size, size, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
			munmap(base, 2 * size);
			return NULL;
		}
	return base;
}

/* gone looks, without waiting, whether the daemon closed the control socket */
int pdi_gone(void)
{
	if (pdi_g.dead)
		return 1;
	struct pollfd pf = { .fd = pdi_g.conn, .events = POLLRDHUP };
	if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLRDHUP | POLLERR)))
		pdi_g.dead = 1;
	return pdi_g.dead;
}

/* dead: whether the daemon is gone. A look at the control socket costs a poll(2) (~0.5 us); a
 * clock read through the vDSO costs ~20 ns, so every call reads the clock and looks at most once
 * a millisecond: whatever the program does, a call made 1 ms or more after the daemon's end sees
 * it. Called with the lock held. */
int pdi_dead(void)
{
	if (pdi_g.dead || !pdi_g.inited)
		return pdi_g.dead;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	if (now - pdi_g.last_look < 1000000)
		return 0;
	pdi_g.last_look = now;
	return pdi_gone();
}

/* gate: what every entry point checks first (pd.h: ECONNRESET for every call once the daemon is
 * gone, never EAGAIN or 0 forever). Called with the lock held. */
int pdi_gate(void)
{
	if (!pdi_g.inited)
		return ENOTCONN;
	return pdi_dead() ? ECONNRESET : 0;
}

/* again: EAGAIN, or ECONNRESET once the daemon is gone (nothing will ever come). Called with the
 * lock held. */
int pdi_again(void)
{
	return pdi_dead() ? ECONNRESET : EAGAIN;
}

static int pow2_in(uint64_t v, uint64_t lo, uint64_t hi) { return v >= lo && v <= hi && !(v & (v - 1)); }

static uint64_t env_size(const char *name)
{
	const char *v = getenv(name);
	return v ? strtoull(v, NULL, 0) : 0;
}

int pd_init(const char *chardev, int sqthresh, int cqthresh)
{
	LOCK();
	if (pdi_g.inited) {
		int e = pdi_dead() ? ECONNRESET : EALREADY; /* gone: pd_release, then pd_init connects afresh */
		UNLOCK();
		return errno = e, -1;
	}
	if (sqthresh < 0 || cqthresh < 0 || sqthresh > 65536 || cqthresh > 65536) {
		UNLOCK();
		return errno = EINVAL, -1;
	}
	const char *path = chardev ? chardev : getenv("PD_SOCKET");
	if (!path || !*path)
		path = PD_DEFAULT_SOCKET;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path) {
		UNLOCK();
		return errno = ENAMETOOLONG, -1;
	}
	strcpy(sa.sun_path, path);
	int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct timeval tv = { CALL_TIMEOUT_S, 0 };
	if (c >= 0) {
		setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	}
	if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		if (c >= 0)
			close(c);
		UNLOCK();
		return errno = e, -1;
	}
	/* queue depth: the larger threshold rounded up to a power of two (0: the daemon's default) */
	int want = sqthresh > cqthresh ? sqthresh : cqthresh, depth = 0;
	if (want > 0)
		for (depth = 64; depth < want; depth <<= 1) ;
	struct req r = { .op = OP_HELLO, .a0 = (uint32_t)env_size("PD_RING_SIZE"), .a1 = (uint32_t)env_size("PD_POOL_SIZE"), .a2 = (uint64_t)depth };
	struct rep rp;
	int fds[8], nf;
	pdi_g.dead = 0;
	if (call(c, &r, &rp, fds, &nf) < 0 || nf != 5) {
		int e = nf != 5 && errno == 0 ? EPROTO : errno;
		for (int i = 0; i < nf; i++)
			close(fds[i]);
		close(c);
		pdi_g.dead = 0;
		UNLOCK();
		return errno = e, -1;
	}
	/* every field of the reply is checked before it sizes a mapping or a division */
	if (rp.v[0] > 1 || rp.v[1] < 1 || rp.v[1] > 1024 || !pow2_in(rp.v[2], 64, 65536) || rp.v[3] < 1 || rp.v[3] > 65536 ||
	    !pow2_in(rp.w[0], 4096, 1u << 30) || !pow2_in(rp.w[1], 4096, 1u << 30)) {
		for (int i = 0; i < nf; i++)
			close(fds[i]);
		close(c);
		UNLOCK();
		return errno = EPROTO, -1;
	}
	pdi_g.conn = c;
	pdi_g.cid = rp.sid;
	pdi_g.direct = rp.v[0] == 1;
	pdi_g.nq = rp.v[1];
	pdi_g.depth = rp.v[2];
	pdi_g.maxsock = rp.v[3];
	pdi_g.ring = rp.w[0];
	pdi_g.pool_size = rp.w[1];
	pdi_g.doorbell = fds[2];
	pdi_g.notify = fds[3];
	pdi_g.ctl_size = (HDR_PAGE + 2 * (size_t)pdi_g.nq * queue_bytes() + (size_t)pdi_g.maxsock * SOCK_HDR + 4095) & ~(size_t)4095;
	pdi_g.ctl = mmap(NULL, pdi_g.ctl_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	pdi_g.pool = map_mirror(fds[1], pdi_g.pool_size, PROT_READ | PROT_WRITE);
	pdi_g.eng = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fds[4], 0);
	close(fds[0]);
	close(fds[1]);
	close(fds[4]);
	pdi_g.socks = calloc(pdi_g.maxsock, sizeof *pdi_g.socks);
	struct req sr = { .op = OP_SEAL };
	int sf[8], snf, ok = pdi_g.ctl != MAP_FAILED && pdi_g.pool && pdi_g.eng != MAP_FAILED && pdi_g.socks;
	/* mapped: the daemon seals the memory (no hole punching) and serves us from now on */
	if (!ok || call(c, &sr, &rp, sf, &snf) < 0) {
		int e = ok ? errno : ENOMEM;
		if (pdi_g.ctl != MAP_FAILED)
			munmap(pdi_g.ctl, pdi_g.ctl_size);
		if (pdi_g.pool)
			munmap(pdi_g.pool, 2 * pdi_g.pool_size);
		if (pdi_g.eng != MAP_FAILED)
			munmap(pdi_g.eng, 4096);
		free(pdi_g.socks);
		close(pdi_g.doorbell);
		close(pdi_g.notify);
		close(c);
		memset(&pdi_g, 0, sizeof pdi_g);
		UNLOCK();
		return errno = e, -1;
	}
	for (int i = 0; i < SBT_SIZE; i++)
		pdi_g.free_slots[i] = SBT_SIZE - 1 - i;
	pdi_g.nfree = SBT_SIZE;
	pdi_g.norder = 0;
	pdi_g.inited = 1;
	UNLOCK();
	return 0;
}

static void unmap_sock(struct psock *s)
{
	if (s->rx)
		munmap(s->rx, 2 * pdi_g.ring);
	if (s->peer)
		munmap(s->peer, 2 * pdi_g.ring);
	memset(s, 0, sizeof *s);
}

void pd_release(void)
{
	LOCK();
	if (pdi_g.inited) {
		close(pdi_g.conn); /* the daemon reclaims every socket of ours */
		for (int i = 0; i < pdi_g.maxsock; i++)
			if (pdi_g.socks[i].used)
				unmap_sock(&pdi_g.socks[i]);
		munmap(pdi_g.ctl, pdi_g.ctl_size);
		munmap(pdi_g.pool, 2 * pdi_g.pool_size);
		munmap(pdi_g.eng, 4096);
		close(pdi_g.doorbell);
		close(pdi_g.notify);
		free(pdi_g.socks);
		for (int i = 0; i < MAX_EPOLL; i++)
			free(pdi_g.ep[i].items);
		memset(&pdi_g, 0, sizeof pdi_g);
	}
	UNLOCK();
}

struct psock *pdi_get(int sid)
{
	if (!pdi_g.inited || sid < 0 || sid >= pdi_g.maxsock || !pdi_g.socks[sid].used)
		return NULL;
	return &pdi_g.socks[sid];
}

/* map_peer maps a direct-mode peer ring writable and has the daemon seal it */
static int map_peer(struct psock *s, int sid, int fd)
{
	s->peer = map_mirror(fd, pdi_g.ring, PROT_READ | PROT_WRITE);
	close(fd);
	if (!s->peer)
		return errno = ENOMEM, -1;
	struct req r = { .op = OP_SEAL, .sid = (uint32_t)sid, .a0 = 1 };
	struct rep rp;
	int fds[8], nf;
	if (call(pdi_g.conn, &r, &rp, fds, &nf) < 0) {
		munmap(s->peer, 2 * pdi_g.ring);
		s->peer = NULL;
		return -1;
	}
	for (int i = 0; i < nf; i++)
		close(fds[i]);
	return 0;
}

/* add_sock maps a new socket's ring (and the peer's in direct mode) and closes the fds. The sid
 * comes from the daemon: checked like every other reply field. */
static int add_sock(int sid, int rxfd, int peerfd)
{
	if (sid < 0 || sid >= pdi_g.maxsock || pdi_g.socks[sid].used) {
		close(rxfd);
		if (peerfd >= 0)
			close(peerfd);
		return errno = EPROTO, -1;
	}
	struct psock *s = &pdi_g.socks[sid];
	memset(s, 0, sizeof *s);
	s->rx = map_mirror(rxfd, pdi_g.ring, PROT_READ);
	close(rxfd);
	if (!s->rx) {
		if (peerfd >= 0)
			close(peerfd);
		return errno = ENOMEM, -1;
	}
	if (peerfd >= 0 && map_peer(s, sid, peerfd) < 0) {
		int e = errno;
		unmap_sock(s);
		return errno = e, -1;
	}
	s->hdr = sock_hdr(sid);
	int cpu = sched_getcpu();
	s->q = (cpu < 0 ? 0 : cpu) % pdi_g.nq;
	s->used = 1;
	return 0;
}

int pd_socket(int domain, int type, int protocol)
{
	LOCK();
	int e = pdi_gate();
	if (!e && (domain != AF_INET || (type & ~SOCK_NONBLOCK & ~SOCK_CLOEXEC) != SOCK_STREAM || (protocol != 0 && protocol != IPPROTO_TCP)))
		e = EINVAL;
	if (e) {
		UNLOCK();
		return errno = e, -1;
	}
	struct req r = { .op = OP_SOCKET };
	struct rep rp;
	int fds[8], nf;
	int ret = -1;
	if (call(pdi_g.conn, &r, &rp, fds, &nf) == 0) {
		if (nf != 1) {
			for (int i = 0; i < nf; i++)
				close(fds[i]);
			errno = EPROTO;
		} else if (add_sock(rp.sid, fds[0], -1) == 0)
			ret = rp.sid;
	}
	UNLOCK();
	return ret;
}

static int addr_req(struct req *r, const struct sockaddr *addr, socklen_t len)
{
	if (!addr || len < (socklen_t)sizeof(struct sockaddr_in) || addr->sa_family != AF_INET)
		return errno = EINVAL, -1;
	const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
	memcpy(r->addr, &in->sin_addr, 4);
	r->port_be = in->sin_port; /* network order bytes, as the daemon reads them */
	return 0;
}

static int simple(struct req *r, struct rep *rp)
{
	int fds[8], nf;
	if (!pdi_g.inited)
		return errno = ENOTCONN, -1;
	int ret = call(pdi_g.conn, r, rp, fds, &nf);
	for (int i = 0; ret == 0 && i < nf; i++)
		close(fds[i]);
	return ret;
}

int pd_bind(int sid, const struct sockaddr *addr, socklen_t addrlen)
{
	struct req r = { .op = OP_BIND, .sid = (uint32_t)sid };
	struct rep rp;
	LOCK();
	int e = pdi_gate(), ret = e ? (errno = e, -1) : addr_req(&r, addr, addrlen) < 0 ? -1 : pdi_get(sid) ? simple(&r, &rp) : (errno = EBADF, -1);
	UNLOCK();
	return ret;
}

int pd_listen(int sid, int backlog)
{
	struct req r = { .op = OP_LISTEN, .sid = (uint32_t)sid, .a0 = backlog > 0 ? (uint32_t)backlog : 0 };
	struct rep rp;
	LOCK();
	int e = pdi_gate(), ret = e ? (errno = e, -1) : pdi_get(sid) ? simple(&r, &rp) : (errno = EBADF, -1);
	UNLOCK();
	return ret;
}

int pd_accept(int sid, struct sockaddr *addr, socklen_t *addrlen)
{
	struct req r = { .op = OP_ACCEPT, .sid = (uint32_t)sid };
	struct rep rp;
	int fds[8], nf, ret = -1;
	LOCK();
	int e = pdi_gate();
	if (e || !pdi_get(sid)) {
		UNLOCK();
		return errno = e ? e : EBADF, -1;
	}
	if (call(pdi_g.conn, &r, &rp, fds, &nf) == 0) {
		if (nf < 1 || nf > 2) {
			for (int i = 0; i < nf; i++)
				close(fds[i]);
			errno = EPROTO;
		} else if (add_sock(rp.sid, fds[0], nf > 1 ? fds[1] : -1) == 0) {
			ret = rp.sid;
			pdi_cur_sid = ret;
			if (addr && addrlen && *addrlen >= (socklen_t)sizeof(struct sockaddr_in)) {
				struct sockaddr_in in = { .sin_family = AF_INET, .sin_port = rp.port_be };
				memcpy(&in.sin_addr, rp.addr, 4);
				memcpy(addr, &in, sizeof in);
				*addrlen = sizeof in;
			}
		}
	}
	UNLOCK();
	return ret;
}

int pd_connect(int sid, const struct sockaddr *addr, socklen_t addrlen)
{
	struct req r = { .op = OP_CONNECT, .sid = (uint32_t)sid };
	struct rep rp;
	int fds[8], nf, ret = -1;
	LOCK();
	int e = pdi_gate();
	if (e || addr_req(&r, addr, addrlen) < 0) {
		UNLOCK();
		return e ? (errno = e, -1) : -1;
	}
	struct psock *s = pdi_get(sid);
	if (!s) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	if (call(pdi_g.conn, &r, &rp, fds, &nf) == 0) {
		ret = 0;
		if (nf > 1 || (nf == 1 && s->peer)) {
			for (int i = 0; i < nf; i++)
				close(fds[i]);
			ret = -1, errno = EPROTO;
		} else if (nf == 1 && map_peer(s, sid, fds[0]) < 0)
			ret = -1;
		pdi_cur_sid = sid;
	}
	UNLOCK();
	return ret;
}

void pdi_flush_release(int sid, struct psock *s)
{
	if (!s->unposted)
		return;
	struct entry e = { .type = REQ_RELEASE, .dst = s->unposted, .cid = pdi_g.cid, .conn_id = (uint16_t)sid };
	while (!q_push(sq(s->q), &e, 1)) {
		if (pdi_gone())
			return; /* nobody will take it */
		pdi_drain_cq();
		ring_doorbell();
		struct timespec ts = { 0, 20000 };
		nanosleep(&ts, NULL);
	}
	s->unposted = 0;
	ring_doorbell();
}

int pd_close(int sid)
{
	LOCK();
	int e = pdi_gate();
	struct psock *s = pdi_get(sid);
	if (!s) {
		UNLOCK();
		return errno = e ? e : EBADF, -1;
	}
	int ret = -1;
	if (!e) {
		pdi_flush_release(sid, s);
		pdi_drain_cq();
		struct req r = { .op = OP_CLOSE, .sid = (uint32_t)sid, .a0 = (uint32_t)s->q };
		struct rep rp;
		ret = simple(&r, &rp);
	} else
		errno = e; /* the daemon is gone: the socket is released here all the same */
	unmap_sock(s);
	if (pdi_cur_sid == sid)
		pdi_cur_sid = -1;
	/* as close(2) does for epoll: a closed socket leaves every interest list */
	for (int i = 0; i < MAX_EPOLL; i++) {
		struct epoll *ep = &pdi_g.ep[i];
		for (int j = 0; ep->used && j < ep->n; j++)
			if (ep->items[j].sid == sid)
				ep->items[j--] = ep->items[--ep->n];
	}
	UNLOCK();
	return ret;
}

