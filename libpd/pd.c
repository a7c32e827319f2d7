/* libpd: client side of PipeDevice. Speaks the daemon's control protocol and uses the shared
 * memory layout of internal/pipedevice (layout.go, queue.go, proto.go): change them together. */
#define _GNU_SOURCE
#include "pd.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* layout.go */
#define HDR_PAGE 4096
#define QUEUE_HDR 128
#define ENTRY_SIZE 32
#define SOCK_HDR 64
#define MAX_CHUNK (32 << 10)
#define PH_SLEEPING 64
#define SH_RX_TAIL 0
#define SH_RX_HEAD 8
#define SH_TX_LIMIT 16
#define SH_TX_QUEUED 24
#define SH_STATE 32
#define SH_PENDING 36
#define SH_ERROR 48
#define ST_CONNECTED 3
#define ST_PEER_CLOSED 4
#define ST_CLOSED 5
#define REQ_SEND 1
#define REQ_SEND_DIRECT 2
#define REQ_RELEASE 3
#define REQ_COMPLETED 0x81
/* proto.go */
#define OP_HELLO 1
#define OP_SOCKET 2
#define OP_BIND 3
#define OP_LISTEN 4
#define OP_ACCEPT 5
#define OP_CONNECT 6
#define OP_CLOSE 7
#define OP_SEAL 10
#define MSG 64
#define CALL_TIMEOUT_S 5

#define SBT_SIZE 16384
#define MAX_EPOLL 64

struct entry { uint32_t seq; uint8_t type, table_id; uint16_t data_len; uint64_t src, dst;
	       uint16_t cid, conn_id, entry_seq, status; };
_Static_assert(sizeof(struct entry) == 32, "entry is 32 bytes");

struct sbt { uint64_t off, size; int inflight; int freed, live; };

struct psock {
	int used;
	uint8_t *hdr, *rx, *peer; /* rx and peer ring mirrored (2*R) */
	uint64_t head, unposted, queued, dalloc, dpub;
	int q;
};

struct ep_item { int sid; struct pd_epoll_event ev; };
struct epoll { int used, n, cap; struct ep_item *items; };

static struct {
	int inited, conn, doorbell, notify, direct, nq, depth, maxsock;
	int dead; /* the daemon went away or broke the protocol: every call fails with ECONNRESET */
	uint16_t cid;
	uint64_t ring, pool_size;
	uint8_t *ctl, *pool, *eng;
	size_t ctl_size;
	struct psock *socks;
	/* send block table: fixed slots (an entry's entry_seq names its block), live blocks in
	 * offset order, first fit: a buffer kept for long does not pin the pool behind it */
	struct sbt sbt[SBT_SIZE];
	uint16_t order[SBT_SIZE], free_slots[SBT_SIZE];
	int norder, nfree;
	struct epoll ep[MAX_EPOLL];
} g;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int cur_sid = -1; /* direct mode: where this thread's pd_malloc carves from */

#define LOCK() pthread_mutex_lock(&mu)
#define UNLOCK() pthread_mutex_unlock(&mu)
#define ld32(p, o) __atomic_load_n((uint32_t *)((p) + (o)), __ATOMIC_SEQ_CST)
#define ld64(p, o) __atomic_load_n((uint64_t *)((p) + (o)), __ATOMIC_SEQ_CST)
#define st64(p, o, v) __atomic_store_n((uint64_t *)((p) + (o)), (v), __ATOMIC_SEQ_CST)

static size_t queue_bytes(void) { return QUEUE_HDR + (size_t)g.depth * ENTRY_SIZE; }
static uint8_t *sq(int q) { return g.ctl + HDR_PAGE + 2 * (size_t)q * queue_bytes(); }
static uint8_t *cq(int q) { return sq(q) + queue_bytes(); }
static uint8_t *sock_hdr(int sid) { return g.ctl + HDR_PAGE + 2 * (size_t)g.nq * queue_bytes() + (size_t)sid * SOCK_HDR; }

/* queue.go's algorithm: claim n slots by CAS on the tail, write, publish each slot's sequence. */
static int q_push(uint8_t *q, const struct entry *es, int n)
{
	uint64_t mask = g.depth - 1;
	for (;;) {
		uint64_t pos = __atomic_load_n((uint64_t *)q, __ATOMIC_SEQ_CST);
		uint64_t last = pos + n - 1;
		uint32_t seq = __atomic_load_n((uint32_t *)(q + QUEUE_HDR + (last & mask) * ENTRY_SIZE), __ATOMIC_SEQ_CST);
		int32_t d = (int32_t)(seq - (uint32_t)last);
		if (d < 0)
			return 0;
		if (d > 0)
			continue;
		if (!__atomic_compare_exchange_n((uint64_t *)q, &pos, pos + n, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
			continue;
		for (int i = 0; i < n; i++) {
			uint8_t *s = q + QUEUE_HDR + ((pos + i) & mask) * ENTRY_SIZE;
			memcpy(s + 4, (const uint8_t *)&es[i] + 4, ENTRY_SIZE - 4);
			__atomic_store_n((uint32_t *)s, (uint32_t)(pos + i + 1), __ATOMIC_SEQ_CST);
		}
		return 1;
	}
}

static int q_pop(uint8_t *q, struct entry *e)
{
	uint64_t pos = __atomic_load_n((uint64_t *)(q + 64), __ATOMIC_SEQ_CST);
	uint8_t *s = q + QUEUE_HDR + (pos & (g.depth - 1)) * ENTRY_SIZE;
	if (__atomic_load_n((uint32_t *)s, __ATOMIC_SEQ_CST) != (uint32_t)(pos + 1))
		return 0;
	memcpy(e, s, ENTRY_SIZE);
	__atomic_store_n((uint32_t *)s, (uint32_t)(pos + g.depth), __ATOMIC_SEQ_CST);
	__atomic_store_n((uint64_t *)(q + 64), pos + 1, __ATOMIC_SEQ_CST);
	return 1;
}

static int q_free(uint8_t *q)
{
	return g.depth - (int)(__atomic_load_n((uint64_t *)q, __ATOMIC_SEQ_CST) - __atomic_load_n((uint64_t *)(q + 64), __ATOMIC_SEQ_CST));
}

static void ring_doorbell(void)
{
	if (ld32(g.eng, 0) > 0) {
		uint64_t one = 1;
		if (write(g.doorbell, &one, 8) < 0) { /* the engine polls anyway */ }
	}
}

/* ---- control protocol ---- */
struct req { uint32_t op, sid, a0, a1; uint64_t a2; uint8_t addr[4]; uint16_t port_be; uint8_t pad[34]; };
struct rep { uint32_t err, sid, v[6]; uint64_t w[2]; uint8_t addr[4]; uint16_t port_be; uint8_t pad[10]; };
_Static_assert(sizeof(struct req) == MSG && sizeof(struct rep) == MSG, "64-byte messages");

/* call sends r and reads the reply and up to 8 fds; returns 0 or -1 with errno. The control
 * socket has send and receive timeouts (pd_init), so a daemon that hangs cannot hang us; a failed
 * call leaves the protocol out of step, so the library is dead from then on. */
static int call(int conn, struct req *r, struct rep *out, int *fds, int *nfds)
{
	*nfds = 0;
	if (g.dead && conn == g.conn)
		return errno = ECONNRESET, -1;
	if (send(conn, r, sizeof *r, MSG_NOSIGNAL) != (ssize_t)sizeof *r) {
		g.dead = 1;
		return errno = ECONNRESET, -1;
	}
	char buf[4096];
	union { struct cmsghdr h; char b[CMSG_SPACE(8 * sizeof(int))]; } cm;
	struct iovec iov = { buf, sizeof buf };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b };
	ssize_t n = recvmsg(conn, &m, MSG_CMSG_CLOEXEC);
	if (n < MSG) {
		int e = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? ETIMEDOUT : ECONNRESET;
		g.dead = 1;
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
static int gone(void)
{
	if (g.dead)
		return 1;
	struct pollfd pf = { .fd = g.conn, .events = POLLRDHUP };
	if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLRDHUP | POLLERR)))
		g.dead = 1;
	return g.dead;
}

/* again: EAGAIN, or ECONNRESET once the daemon is gone (nothing will ever come). A look costs a
 * syscall: every 64th EAGAIN (a spinning caller gets there in microseconds; pd_epoll_wait polls
 * the control socket anyway). Called with the lock held. */
static int again(void)
{
	static unsigned n;
	return g.dead || ((++n & 63) == 0 && gone()) ? ECONNRESET : EAGAIN;
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
	if (g.inited) {
		UNLOCK();
		return errno = EALREADY, -1;
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
	g.dead = 0;
	if (call(c, &r, &rp, fds, &nf) < 0 || nf != 5) {
		int e = nf != 5 && errno == 0 ? EPROTO : errno;
		for (int i = 0; i < nf; i++)
			close(fds[i]);
		close(c);
		g.dead = 0;
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
	g.conn = c;
	g.cid = rp.sid;
	g.direct = rp.v[0] == 1;
	g.nq = rp.v[1];
	g.depth = rp.v[2];
	g.maxsock = rp.v[3];
	g.ring = rp.w[0];
	g.pool_size = rp.w[1];
	g.doorbell = fds[2];
	g.notify = fds[3];
	g.ctl_size = (HDR_PAGE + 2 * (size_t)g.nq * queue_bytes() + (size_t)g.maxsock * SOCK_HDR + 4095) & ~(size_t)4095;
	g.ctl = mmap(NULL, g.ctl_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	g.pool = map_mirror(fds[1], g.pool_size, PROT_READ | PROT_WRITE);
	g.eng = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fds[4], 0);
	close(fds[0]);
	close(fds[1]);
	close(fds[4]);
	g.socks = calloc(g.maxsock, sizeof *g.socks);
	struct req sr = { .op = OP_SEAL };
	int sf[8], snf, ok = g.ctl != MAP_FAILED && g.pool && g.eng != MAP_FAILED && g.socks;
	/* mapped: the daemon seals the memory (no hole punching) and serves us from now on */
	if (!ok || call(c, &sr, &rp, sf, &snf) < 0) {
		int e = ok ? errno : ENOMEM;
		if (g.ctl != MAP_FAILED)
			munmap(g.ctl, g.ctl_size);
		if (g.pool)
			munmap(g.pool, 2 * g.pool_size);
		if (g.eng != MAP_FAILED)
			munmap(g.eng, 4096);
		free(g.socks);
		close(g.doorbell);
		close(g.notify);
		close(c);
		memset(&g, 0, sizeof g);
		UNLOCK();
		return errno = e, -1;
	}
	for (int i = 0; i < SBT_SIZE; i++)
		g.free_slots[i] = SBT_SIZE - 1 - i;
	g.nfree = SBT_SIZE;
	g.norder = 0;
	g.inited = 1;
	UNLOCK();
	return 0;
}

static void unmap_sock(struct psock *s)
{
	if (s->rx)
		munmap(s->rx, 2 * g.ring);
	if (s->peer)
		munmap(s->peer, 2 * g.ring);
	memset(s, 0, sizeof *s);
}

void pd_release(void)
{
	LOCK();
	if (g.inited) {
		close(g.conn); /* the daemon reclaims every socket of ours */
		for (int i = 0; i < g.maxsock; i++)
			if (g.socks[i].used)
				unmap_sock(&g.socks[i]);
		munmap(g.ctl, g.ctl_size);
		munmap(g.pool, 2 * g.pool_size);
		munmap(g.eng, 4096);
		close(g.doorbell);
		close(g.notify);
		free(g.socks);
		for (int i = 0; i < MAX_EPOLL; i++)
			free(g.ep[i].items);
		memset(&g, 0, sizeof g);
	}
	UNLOCK();
}

static struct psock *get(int sid)
{
	if (!g.inited || sid < 0 || sid >= g.maxsock || !g.socks[sid].used)
		return NULL;
	return &g.socks[sid];
}

/* map_peer maps a direct-mode peer ring writable and has the daemon seal it */
static int map_peer(struct psock *s, int sid, int fd)
{
	s->peer = map_mirror(fd, g.ring, PROT_READ | PROT_WRITE);
	close(fd);
	if (!s->peer)
		return errno = ENOMEM, -1;
	struct req r = { .op = OP_SEAL, .sid = (uint32_t)sid, .a0 = 1 };
	struct rep rp;
	int fds[8], nf;
	if (call(g.conn, &r, &rp, fds, &nf) < 0) {
		munmap(s->peer, 2 * g.ring);
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
	if (sid < 0 || sid >= g.maxsock || g.socks[sid].used) {
		close(rxfd);
		if (peerfd >= 0)
			close(peerfd);
		return errno = EPROTO, -1;
	}
	struct psock *s = &g.socks[sid];
	memset(s, 0, sizeof *s);
	s->rx = map_mirror(rxfd, g.ring, PROT_READ);
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
	s->q = (cpu < 0 ? 0 : cpu) % g.nq;
	s->used = 1;
	return 0;
}

int pd_socket(int domain, int type, int protocol)
{
	if (domain != AF_INET || (type & ~SOCK_NONBLOCK & ~SOCK_CLOEXEC) != SOCK_STREAM || (protocol != 0 && protocol != IPPROTO_TCP))
		return errno = EINVAL, -1;
	LOCK();
	if (!g.inited) {
		UNLOCK();
		return errno = ENOTCONN, -1;
	}
	struct req r = { .op = OP_SOCKET };
	struct rep rp;
	int fds[8], nf;
	int ret = -1;
	if (call(g.conn, &r, &rp, fds, &nf) == 0) {
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
	if (!g.inited)
		return errno = ENOTCONN, -1;
	int ret = call(g.conn, r, rp, fds, &nf);
	for (int i = 0; ret == 0 && i < nf; i++)
		close(fds[i]);
	return ret;
}

int pd_bind(int sid, const struct sockaddr *addr, socklen_t addrlen)
{
	struct req r = { .op = OP_BIND, .sid = (uint32_t)sid };
	struct rep rp;
	if (addr_req(&r, addr, addrlen) < 0)
		return -1;
	LOCK();
	int ret = get(sid) ? simple(&r, &rp) : (errno = EBADF, -1);
	UNLOCK();
	return ret;
}

int pd_listen(int sid, int backlog)
{
	struct req r = { .op = OP_LISTEN, .sid = (uint32_t)sid, .a0 = backlog > 0 ? (uint32_t)backlog : 0 };
	struct rep rp;
	LOCK();
	int ret = get(sid) ? simple(&r, &rp) : (errno = EBADF, -1);
	UNLOCK();
	return ret;
}

int pd_accept(int sid, struct sockaddr *addr, socklen_t *addrlen)
{
	struct req r = { .op = OP_ACCEPT, .sid = (uint32_t)sid };
	struct rep rp;
	int fds[8], nf, ret = -1;
	LOCK();
	if (!get(sid)) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	if (call(g.conn, &r, &rp, fds, &nf) == 0) {
		if (nf < 1 || nf > 2) {
			for (int i = 0; i < nf; i++)
				close(fds[i]);
			errno = EPROTO;
		} else if (add_sock(rp.sid, fds[0], nf > 1 ? fds[1] : -1) == 0) {
			ret = rp.sid;
			cur_sid = ret;
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
	if (addr_req(&r, addr, addrlen) < 0)
		return -1;
	LOCK();
	struct psock *s = get(sid);
	if (!s) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	if (call(g.conn, &r, &rp, fds, &nf) == 0) {
		ret = 0;
		if (nf > 1 || (nf == 1 && s->peer)) {
			for (int i = 0; i < nf; i++)
				close(fds[i]);
			ret = -1, errno = EPROTO;
		} else if (nf == 1 && map_peer(s, sid, fds[0]) < 0)
			ret = -1;
		cur_sid = sid;
	}
	UNLOCK();
	return ret;
}

static void drain_cq(void);
static int sock_err(struct psock *s);

static void flush_release(int sid, struct psock *s)
{
	if (!s->unposted)
		return;
	struct entry e = { .type = REQ_RELEASE, .dst = s->unposted, .cid = g.cid, .conn_id = (uint16_t)sid };
	while (!q_push(sq(s->q), &e, 1)) {
		if (gone())
			return; /* nobody will take it */
		drain_cq();
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
	struct psock *s = get(sid);
	if (!s) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	flush_release(sid, s);
	drain_cq();
	struct req r = { .op = OP_CLOSE, .sid = (uint32_t)sid, .a0 = (uint32_t)s->q };
	struct rep rp;
	int ret = simple(&r, &rp);
	unmap_sock(s);
	if (cur_sid == sid)
		cur_sid = -1;
	/* as close(2) does for epoll: a closed socket leaves every interest list */
	for (int i = 0; i < MAX_EPOLL; i++) {
		struct epoll *ep = &g.ep[i];
		for (int j = 0; ep->used && j < ep->n; j++)
			if (ep->items[j].sid == sid)
				ep->items[j--] = ep->items[--ep->n];
	}
	UNLOCK();
	return ret;
}

/* ---- send ring (pool) and its block table ---- */
/* release drops a block that is freed and that no send reads any more */
static void release(int slot)
{
	struct sbt *b = &g.sbt[slot];
	if (!b->live || !b->freed || b->inflight > 0)
		return;
	for (int i = 0; i < g.norder; i++)
		if (g.order[i] == slot) {
			memmove(&g.order[i], &g.order[i + 1], (g.norder - i - 1) * sizeof g.order[0]);
			g.norder--;
			break;
		}
	memset(b, 0, sizeof *b);
	g.free_slots[g.nfree++] = (uint16_t)slot;
}

static void drain_cq(void)
{
	struct entry e;
	for (int q = 0; q < g.nq; q++)
		while (q_pop(cq(q), &e)) {
			int slot = e.entry_seq % SBT_SIZE;
			struct sbt *b = &g.sbt[slot];
			if (b->live && b->inflight > 0) {
				b->inflight--;
				release(slot);
			}
			if (e.type != REQ_COMPLETED && get(e.conn_id))
				__atomic_store_n((uint32_t *)(get(e.conn_id)->hdr + SH_ERROR), e.status, __ATOMIC_SEQ_CST);
		}
}

static int in_pool(const void *p, size_t len, uint64_t *off)
{
	const uint8_t *b = p;
	if (!g.inited || b < g.pool || b + len > g.pool + 2 * g.pool_size)
		return 0;
	*off = (uint64_t)(b - g.pool) & (g.pool_size - 1);
	return 1;
}

static struct sbt *block(uint64_t off, uint16_t *idx)
{
	int lo = 0, hi = g.norder;
	while (lo < hi) {
		int m = (lo + hi) / 2;
		struct sbt *b = &g.sbt[g.order[m]];
		if (b->off + b->size <= off)
			lo = m + 1;
		else
			hi = m;
	}
	if (lo < g.norder) {
		struct sbt *b = &g.sbt[g.order[lo]];
		if (b->off <= off && off < b->off + b->size && !b->freed) {
			*idx = g.order[lo];
			return b;
		}
	}
	return NULL;
}

void *pd_malloc(size_t size)
{
	LOCK();
	if (!g.inited || size == 0 || g.dead) {
		UNLOCK();
		errno = !g.inited ? ENOTCONN : g.dead ? ECONNRESET : EINVAL;
		return NULL;
	}
	struct psock *s = g.direct ? get(cur_sid) : NULL;
	if (s && s->peer) {
		int e = sock_err(s);
		if (e) {
			UNLOCK();
			errno = e; /* the peer closed: its ring takes nothing more */
			return NULL;
		}
		uint64_t limit = ld64(s->hdr, SH_TX_LIMIT);
		if (s->dalloc + size > limit || size > g.ring) {
			UNLOCK();
			errno = EAGAIN;
			return NULL;
		}
		void *p = s->peer + (s->dalloc & (g.ring - 1));
		s->dalloc += size;
		UNLOCK();
		return p;
	}
	drain_cq();
	uint64_t sz = (size + 63) & ~(uint64_t)63;
	if (!g.nfree || sz > g.pool_size) {
		UNLOCK();
		errno = ENOMEM;
		return NULL;
	}
	int at = -1;
	uint64_t prev_end = 0;
	for (int i = 0; i < g.norder; i++) {
		struct sbt *b = &g.sbt[g.order[i]];
		if (b->off - prev_end >= sz) {
			at = i;
			break;
		}
		prev_end = b->off + b->size;
	}
	if (at < 0) {
		if (g.pool_size - prev_end < sz) {
			UNLOCK();
			errno = ENOMEM;
			return NULL;
		}
		at = g.norder;
	}
	uint16_t slot = g.free_slots[--g.nfree];
	g.sbt[slot] = (struct sbt){ .off = prev_end, .size = sz, .live = 1 };
	memmove(&g.order[at + 1], &g.order[at], (g.norder - at) * sizeof g.order[0]);
	g.order[at] = slot;
	g.norder++;
	void *p = g.pool + prev_end;
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
	} else if (g.inited) {
		for (int i = 0; i < g.maxsock; i++) {
			struct psock *s = &g.socks[i];
			if (s->used && s->peer && (uint8_t *)buf >= s->peer && (uint8_t *)buf < s->peer + 2 * g.ring) {
				s->dalloc = s->dpub; /* drop unsent direct reservations */
				break;
			}
		}
	}
	UNLOCK();
}

static int sock_err(struct psock *s)
{
	uint32_t st = ld32(s->hdr, SH_STATE);
	if (st == ST_PEER_CLOSED || st == ST_CLOSED)
		return EPIPE;
	if (st != ST_CONNECTED)
		return ENOTCONN;
	return (int)ld32(s->hdr, SH_ERROR);
}

ssize_t pd_send(int sid, const void *buf, size_t len)
{
	LOCK();
	struct psock *s = get(sid);
	int e;
	if (!s) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	if (g.dead) {
		UNLOCK();
		return errno = ECONNRESET, -1;
	}
	if ((e = sock_err(s))) {
		UNLOCK();
		return errno = e, -1;
	}
	if (len == 0) {
		UNLOCK();
		return 0;
	}
	cur_sid = sid;
	/* the limit is in shared memory: never believe more room than one ring */
	uint64_t n = len, room = ld64(s->hdr, SH_TX_LIMIT) - s->queued;
	if (room > g.ring)
		room = g.ring;
	if (n > room)
		n = room;
	/* completions pile up when the program never calls pd_buf_refresh/pd_malloc/pd_epoll_wait:
	 * take them now, or a full completion queue stops the engine from serving this queue */
	if (q_free(cq(s->q)) <= g.depth / 2)
		drain_cq();
	uint64_t max = (uint64_t)q_free(sq(s->q)) * MAX_CHUNK;
	if (max > 64ull * MAX_CHUNK)
		max = 64ull * MAX_CHUNK;
	if (n > max)
		n = max;
	if (n == 0) {
		drain_cq();
		e = again();
		UNLOCK();
		return errno = e, -1;
	}
	struct entry es[64];
	int k = 0;
	const uint8_t *p = buf;
	uint64_t off;
	if (s->peer && p >= s->peer && p < s->peer + 2 * g.ring) {
		if ((uint64_t)((p - s->peer) & (g.ring - 1)) != (s->dpub & (g.ring - 1)) || s->dpub + n > s->dalloc) {
			UNLOCK();
			return errno = EINVAL, -1; /* direct: send buffers in the order pd_malloc gave them */
		}
		for (uint64_t sent = 0; sent < n; k++) {
			uint64_t c = n - sent < MAX_CHUNK ? n - sent : MAX_CHUNK;
			es[k] = (struct entry){ .type = REQ_SEND_DIRECT, .data_len = (uint16_t)c, .dst = s->dpub + sent, .cid = g.cid, .conn_id = (uint16_t)sid };
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
			es[k] = (struct entry){ .type = REQ_SEND, .data_len = (uint16_t)c, .src = off + sent, .cid = g.cid, .conn_id = (uint16_t)sid, .entry_seq = idx };
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
	if (ptrlen < 0 || (ptrlen > 0 && !ptrs))
		return errno = EINVAL, -1;
	LOCK();
	if (!get(sid)) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	drain_cq();
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
	if (!recvbuf)
		return errno = EINVAL, -1;
	LOCK();
	struct psock *s = get(sid);
	if (!s) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	/* the tail is in shared memory: never believe more than one ring */
	uint64_t avail = ld64(s->hdr, SH_RX_TAIL) - s->head;
	if (avail > g.ring)
		avail = g.ring;
	if (avail == 0) {
		uint32_t st = ld32(s->hdr, SH_STATE);
		int e = st == ST_CONNECTED ? again() : ENOTCONN;
		UNLOCK();
		if (st == ST_PEER_CLOSED)
			return 0;
		return errno = e, -1;
	}
	if (buflen < avail)
		avail = buflen;
	*recvbuf = s->rx + (s->head & (g.ring - 1));
	UNLOCK();
	return (ssize_t)avail;
}

int pd_recv_done(int sid, size_t len)
{
	LOCK();
	struct psock *s = get(sid);
	if (!s) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	uint64_t tail = ld64(s->hdr, SH_RX_TAIL);
	if (len > tail - s->head || len > g.ring) {
		UNLOCK();
		return errno = EINVAL, -1;
	}
	s->head += len;
	s->unposted += len;
	st64(s->hdr, SH_RX_HEAD, s->head);
	/* batch the releases, but always tell when drained so a waiting sender hears of it */
	if (s->unposted >= g.ring / 4 || s->head == tail)
		flush_release(sid, s);
	UNLOCK();
	return 0;
}

int pd_getsockopt(int sid, int level, int optname, void *optval, socklen_t *optlen)
{
	if (!optval || !optlen || *optlen < (socklen_t)sizeof(int))
		return errno = EINVAL, -1;
	if (level != SOL_SOCKET)
		return errno = ENOPROTOOPT, -1;
	LOCK();
	struct psock *s = get(sid);
	int v, ret = 0;
	if (!s) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	switch (optname) {
	case SO_RCVBUF: v = (int)g.ring; break;
	case SO_SNDBUF: v = (int)g.pool_size; break;
	case SO_TYPE: v = SOCK_STREAM; break;
	case SO_ERROR:
		v = (int)__atomic_exchange_n((uint32_t *)(s->hdr + SH_ERROR), 0, __ATOMIC_SEQ_CST);
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
	struct psock *s = get(sid);
	UNLOCK();
	if (!s)
		return errno = EBADF, -1;
	if (!optval || optlen < (socklen_t)sizeof(int))
		return errno = EINVAL, -1;
	if (level == SOL_SOCKET && (optname == SO_RCVBUF || optname == SO_SNDBUF)) {
		int v;
		memcpy(&v, optval, sizeof v);
		uint64_t have = optname == SO_RCVBUF ? g.ring : g.pool_size;
		if ((uint64_t)v == have)
			return 0;
		return errno = EINVAL, -1; /* fixed per process: set PD_RING_SIZE / PD_POOL_SIZE before pd_init */
	}
	return errno = ENOPROTOOPT, -1;
}

/* ---- epoll ---- */
int pd_epoll_create(int size)
{
	if (size <= 0)
		return errno = EINVAL, -1;
	LOCK();
	for (int i = 0; i < MAX_EPOLL; i++)
		if (!g.ep[i].used) {
			g.ep[i] = (struct epoll){ .used = 1 };
			UNLOCK();
			return i;
		}
	UNLOCK();
	return errno = EMFILE, -1;
}

int pd_epoll_ctl(int epfd, int op, int sid, struct pd_epoll_event *ev)
{
	LOCK();
	if (epfd < 0 || epfd >= MAX_EPOLL || !g.ep[epfd].used) {
		UNLOCK();
		return errno = EBADF, -1;
	}
	struct epoll *ep = &g.ep[epfd];
	int at = -1;
	for (int i = 0; i < ep->n; i++)
		if (ep->items[i].sid == sid)
			at = i;
	int ret = 0;
	switch (op) {
	case PD_EPOLL_CTL_ADD:
		if (!get(sid) || !ev) { ret = -1; errno = !ev ? EINVAL : EBADF; break; }
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
	struct psock *s = get(sid);
	if (!s)
		return PD_EPOLLERR | PD_EPOLLHUP;
	uint32_t ev = 0, st = ld32(s->hdr, SH_STATE);
	if (ld64(s->hdr, SH_RX_TAIL) != s->head || ld32(s->hdr, SH_PENDING) > 0)
		ev |= PD_EPOLLIN;
	if (st == ST_PEER_CLOSED || st == ST_CLOSED)
		ev |= PD_EPOLLIN | PD_EPOLLHUP;
	if (st == ST_CONNECTED) {
		uint64_t used = (g.direct && s->peer) ? s->dalloc : s->queued;
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
	drain_cq();
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
		if (epfd < 0 || epfd >= MAX_EPOLL || !g.ep[epfd].used || !g.inited) {
			UNLOCK();
			return errno = EBADF, -1;
		}
		if (gone()) {
			/* the daemon is gone: every watched socket reports an error (SO_ERROR: ECONNRESET) */
			struct epoll *ep = &g.ep[epfd];
			int n = 0;
			for (int i = 0; i < ep->n && n < maxevents; i++) {
				struct psock *s = get(ep->items[i].sid);
				if (s)
					__atomic_store_n((uint32_t *)(s->hdr + SH_ERROR), ECONNRESET, __ATOMIC_SEQ_CST);
				events[n].events = PD_EPOLLERR | PD_EPOLLHUP;
				events[n++].data = ep->items[i].ev.data;
			}
			UNLOCK();
			return n ? n : (errno = ECONNRESET, -1);
		}
		int n = collect(&g.ep[epfd], events, maxevents);
		if (n || timeout_ms == 0) {
			UNLOCK();
			return n;
		}
		/* announce the sleep, look again (the engine checks the flag after publishing) */
		sleeping = (uint32_t *)(g.ctl + PH_SLEEPING);
		__atomic_add_fetch(sleeping, 1, __ATOMIC_SEQ_CST);
		n = collect(&g.ep[epfd], events, maxevents);
		int nfd = g.notify, cfd = g.conn;
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
