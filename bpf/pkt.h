/* Bounds-checked direct packet access for tc (struct __sk_buff) and XDP (struct xdp_md).
 *
 * Usage:
 *     struct prg_pkt p;
 *     prg_pkt_xdp(&p, ctx);                   or  prg_pkt_tc(&p, ctx);
 *     struct iphdr *ip = prg_hdr(&p, off, struct iphdr);
 *     if (!ip) return ...;                    // not all of it is in the packet's data
 * Headers are read in place, no helper call per header (bpf_skb_load_bytes copies). On tc only
 * the linear part of an skb is directly readable: a parse that fails with PRG_SHORT on an skb
 * with more data behind may call prg_pkt_tc_pull() once and parse again (PRG_TC_PARSE below).
 * Every parser in parse.h and vxlan.h returns PRG_OK, PRG_NO (not ours / malformed: leave the
 * packet alone) or PRG_SHORT (a header ends past the readable data).
 */
#ifndef PEREGRINE_PKT_H
#define PEREGRINE_PKT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define PRG_OK 0
#define PRG_NO (-1)
#define PRG_SHORT (-2)

/* No header we read starts beyond this offset; the bound lets the verifier accept variable
 * offsets (IPv4 ihl, IPv6 extension headers) into the packet. */
#define PRG_MAX_OFF 1024
/* How much of a non-linear skb prg_pkt_tc_pull makes linear: enough for outer + inner headers
 * with a few IPv6 extension headers, small enough not to copy much payload. */
#define PRG_PULL_LEN 256

struct prg_pkt {
	void *data;
	void *end;
};

/* The verifier accepts a context field only as a load at a constant offset from the context
 * pointer; clang may otherwise fold ctx + offsetof() into a shared register ("dereference of
 * modified ctx ptr"). An asm load pins the form. */
#define prg_ctx_load(ctx, type, field)                                                    \
	({                                                                                \
		__u64 __v;                                                                \
		asm volatile("%0 = *(u32 *)(%1 + %2)"                                     \
			     : "=r"(__v)                                                  \
			     : "r"(ctx), "i"(__builtin_offsetof(type, field)));           \
		__v;                                                                      \
	})

static __always_inline void prg_pkt_xdp(struct prg_pkt *p, struct xdp_md *ctx)
{
	p->data = (void *)prg_ctx_load(ctx, struct xdp_md, data);
	p->end = (void *)prg_ctx_load(ctx, struct xdp_md, data_end);
}

static __always_inline void prg_pkt_tc(struct prg_pkt *p, struct __sk_buff *ctx)
{
	p->data = (void *)prg_ctx_load(ctx, struct __sk_buff, data);
	p->end = (void *)prg_ctx_load(ctx, struct __sk_buff, data_end);
}

/* prg_pkt_tc_pull makes up to PRG_PULL_LEN bytes linear when the skb has more than its linear
 * part shows, and re-reads the pointers (a pull invalidates them). 1 when it pulled. */
static __always_inline int prg_pkt_tc_pull(struct prg_pkt *p, struct __sk_buff *ctx)
{
	__u32 have = prg_ctx_load(ctx, struct __sk_buff, data_end) - prg_ctx_load(ctx, struct __sk_buff, data);
	__u32 len = prg_ctx_load(ctx, struct __sk_buff, len);
	__u32 want = len < PRG_PULL_LEN ? len : PRG_PULL_LEN;
	if (have >= want || bpf_skb_pull_data(ctx, want))
		return 0;
	prg_pkt_tc(p, ctx);
	return 1;
}

/* PRG_TC_PARSE(r, p, ctx, call): r = call; on PRG_SHORT pull once and run call again. */
#define PRG_TC_PARSE(r, p, ctx, call)                                     \
	do {                                                                \
		(r) = (call);                                               \
		if ((r) == PRG_SHORT && prg_pkt_tc_pull((p), (ctx)))        \
			(r) = (call);                                       \
	} while (0)

/* prg_at returns a pointer to len readable bytes at off, or NULL. */
static __always_inline void *prg_at(const struct prg_pkt *p, __u32 off, __u32 len)
{
	void *ptr;

	if (off > PRG_MAX_OFF)
		return NULL;
	ptr = p->data + off;
	if (ptr + len > p->end)
		return NULL;
	return ptr;
}

#define prg_hdr(p, off, type) ((type *)prg_at((p), (off), sizeof(type)))

#endif
