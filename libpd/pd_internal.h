/* libpd's internals shared by its source files (pd.c: state, control protocol, sockets; pd_io.c:
 * the send pool, send and receive; pd_epoll.c: readiness). Not installed: applications include
 * only pd.h. Every name with external linkage starts with pdi_, so the static library cannot clash
 * with an application's symbols. */
#ifndef PD_INTERNAL_H
#define PD_INTERNAL_H
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

/* layout.go (internal/pipedevice TestLayoutMatchesLibpd compares this section and the structs below with Go) */
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

struct pdi_state {
	int inited, conn, doorbell, notify, direct, nq, depth, maxsock;
	int dead; /* the daemon went away or broke the protocol: every call fails with ECONNRESET */
	uint64_t last_look; /* CLOCK_MONOTONIC ns of pdi_dead's last look at the control socket */
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
};
extern struct pdi_state pdi_g;
extern pthread_mutex_t pdi_mu;
extern __thread int pdi_cur_sid; /* direct mode: where this thread's pd_malloc carves from */

#define LOCK() pthread_mutex_lock(&pdi_mu)
#define UNLOCK() pthread_mutex_unlock(&pdi_mu)
#define ld32(p, o) __atomic_load_n((uint32_t *)((p) + (o)), __ATOMIC_SEQ_CST)
#define ld64(p, o) __atomic_load_n((uint64_t *)((p) + (o)), __ATOMIC_SEQ_CST)
#define st64(p, o, v) __atomic_store_n((uint64_t *)((p) + (o)), (v), __ATOMIC_SEQ_CST)


static inline size_t queue_bytes(void) { return QUEUE_HDR + (size_t)pdi_g.depth * ENTRY_SIZE; }
static inline uint8_t *sq(int q) { return pdi_g.ctl + HDR_PAGE + 2 * (size_t)q * queue_bytes(); }
static inline uint8_t *cq(int q) { return sq(q) + queue_bytes(); }
static inline uint8_t *sock_hdr(int sid) { return pdi_g.ctl + HDR_PAGE + 2 * (size_t)pdi_g.nq * queue_bytes() + (size_t)sid * SOCK_HDR; }

/* queue.go's algorithm: claim n slots by CAS on the tail, write, publish each slot's sequence. */
static inline int q_push(uint8_t *q, const struct entry *es, int n)
{
	uint64_t mask = pdi_g.depth - 1;
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

static inline int q_pop(uint8_t *q, struct entry *e)
{
	uint64_t pos = __atomic_load_n((uint64_t *)(q + 64), __ATOMIC_SEQ_CST);
	uint8_t *s = q + QUEUE_HDR + (pos & (pdi_g.depth - 1)) * ENTRY_SIZE;
	if (__atomic_load_n((uint32_t *)s, __ATOMIC_SEQ_CST) != (uint32_t)(pos + 1))
		return 0;
	memcpy(e, s, ENTRY_SIZE);
	__atomic_store_n((uint32_t *)s, (uint32_t)(pos + pdi_g.depth), __ATOMIC_SEQ_CST);
	__atomic_store_n((uint64_t *)(q + 64), pos + 1, __ATOMIC_SEQ_CST);
	return 1;
}

static inline int q_free(uint8_t *q)
{
	return pdi_g.depth - (int)(__atomic_load_n((uint64_t *)q, __ATOMIC_SEQ_CST) - __atomic_load_n((uint64_t *)(q + 64), __ATOMIC_SEQ_CST));
}

static inline void ring_doorbell(void)
{
	if (ld32(pdi_g.eng, 0) > 0) {
		uint64_t one = 1;
		if (write(pdi_g.doorbell, &one, 8) < 0) { /* the engine polls anyway */ }
	}
}

/* ---- control protocol ---- */
struct req { uint32_t op, sid, a0, a1; uint64_t a2; uint8_t addr[4]; uint16_t port_be; uint8_t pad[34]; };
struct rep { uint32_t err, sid, v[6]; uint64_t w[2]; uint8_t addr[4]; uint16_t port_be; uint8_t pad[10]; };
_Static_assert(sizeof(struct req) == MSG && sizeof(struct rep) == MSG, "64-byte messages");

/* Shared between the source files. */
int pdi_gone(void);                    /* the daemon is gone or broke the protocol (ECONNRESET) */
int pdi_again(void);                   /* EAGAIN, or ECONNRESET once the daemon is gone */
int pdi_dead(void);                    /* the daemon is gone: looks at most once a millisecond */
int pdi_gate(void);                    /* 0, or the errno of every call: ENOTCONN, ECONNRESET */
struct psock *pdi_get(int sid);        /* the socket, or NULL when sid names none */
void pdi_drain_cq(void);               /* reap completions: release send blocks */
int pdi_sock_err(struct psock *s);     /* the socket's pending error, as errno */
void pdi_flush_release(int sid, struct psock *s);

#endif
