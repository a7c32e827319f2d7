/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fastpath_closed.h: the hand-over of connections closed on the fast path to the agent
 * (included by fastpath.h after its flow types and maps, before closing()).
 *
 * A short TCP connection (FP_F_HSONLY: conntrack saw only its SYN and SYN-ACK) sends its data,
 * FINs and RST on the fast path, so conntrack's entry waits in SYN_RECV for 60 s; a new
 * connection on the same ports (a client's ports wrap in seconds under load) meets it, its SYN
 * is ignored (INVALID, dropped by kube-proxy's KUBE-FORWARD) and waits for retransmissions.
 * The agent deletes such entries. It used to find them by walking the flow table once a
 * second, which missed some: the sweep deletes a closed entry FP_CLOSE_NS after its first FIN,
 * a new generation resets its flags, a reused port clears them (syn_open), and a walk late
 * under load sees none of them. So the close itself hands the tuple over, exactly once: the
 * CPU whose atomic fetch-or completes FP_F_DONE pushes a record to a ring buffer the agent
 * drains continuously (internal/datapath/fastpath/ctclosed.go).
 */
#ifndef PRG_FASTPATH_CLOSED_H
#define PRG_FASTPATH_CLOSED_H

/* One closed connection: the flow's key as conntrack knows it on this node. The key of a
 * Service flow holds the Service address and port the pod sent to (its alias is never closed
 * here), which is the original tuple of the client node's conntrack entry; the backend's node
 * keys the same connection by the backend and the client pod, the reply tuple of its entry,
 * which conntrack finds as well. Same-node flows (FP_F_LOCAL) close on the normal path.
 * An IPv6 connection's record is struct fp_closed6 (fastpath6.h), 48 bytes where this one is 24:
 * one ring, the agent tells the two apart by their length (ctclosed.go). */
struct fp_closed {
	__u32 local;  /* network order, as fp_key */
	__u32 remote;
	__u16 lport;
	__u16 rport;
	__u8 proto;
	__u8 ovl;
	__u8 pad[2];
	__u64 ns;     /* when it closed (bpf_ktime_get_ns): the agent reports the hand-over's lag */
};

/* 1 MiB: 32 768 records of 32 bytes (with the ring's header), 16 s of 2 000 closes a second
 * should the agent stall; a record that does not fit is counted (FP_R_CLOSED_LOST). */
#define FP_CLOSED_RING (1U << 20)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FP_CLOSED_RING);
} prg_fastpath_closed SEC(".maps");

/* ---- Expiring the entry in the kernel at the close ----
 * The ring and the agent's ctnetlink GET + DELETE cost a round of agent work per connection,
 * which set the fast path's CRR tail (docs/results.md). So the closing CPU first looks the entry
 * up itself (bpf_skb_ct_lookup, in the netns of the packet's device, which is the node's) and
 * sets its timeout to 0: an expired entry is skipped by lookups and dumps, and a reused port's
 * SYN creates a new one. Only when that fails (no entry, -EPERM for a fixed-timeout entry, one
 * already dying) does the record go to the ring as before; FP_R_CLOSED_CT counts the closes
 * expired here, so the agent's "handed over" plus this are all closes. The key is conntrack's
 * original tuple (client node) or its reply tuple (backend node): the lookup matches either.
 *
 * The expired entry is reaped lazily: by conntrack's GC or, often first, by the lookup of the
 * next connection on the same ports, whose SYN has by then reopened the flow (syn_open). Its
 * DESTROY event then reached the agent's conntrack watch, which made the NEW connection's flow
 * due: the rest of it went the normal path, where its entry (SYN_RECV: conntrack saw only the
 * handshake) calls the server's FIN or data INVALID (they acknowledge data conntrack never saw)
 * and the host drops them and every retransmission (TestLabClosedLeaveNoConntrack: about 1 % of
 * the connections stalled, "N flows made due" in the agent's log, the pod's FIN retransmitted
 * for 30 s). So the entry is also marked IPS_FIXED_TIMEOUT (after the timeout: the bit makes
 * bpf_ct_change_timeout refuse), which no handshake-only TCP entry has otherwise, and the agent
 * ignores DESTROY events so marked (ctwatch.go), as it ignores those of the entries it deletes
 * itself. A close whose mark fails goes to the ring as well: the agent's delete finds the entry
 * gone, but its ctSelf covers the event. */
#define FP_IPS_FIXED_TIMEOUT 1024 /* IPS_FIXED_TIMEOUT */

extern int bpf_ct_change_status(struct nf_conn *nfct, __u32 status) __ksym;
extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;
extern int bpf_ct_change_timeout(struct nf_conn *nfct, __u32 timeout) __ksym;

#define FP_CT_CURRENT_NETNS (-1) /* BPF_F_CURRENT_NETNS */
#define FP_CT_OPTS_SZ 16	 /* struct bpf_ct_opts since 6.6 */

/* closed_expire: 1 when conntrack's entry of tuple t (tsz bytes) is now expired and marked. */
static __always_inline int closed_expire(struct __sk_buff *ctx, struct bpf_sock_tuple *t, __u32 tsz, __u8 proto)
{
	struct bpf_ct_opts o = {.netns_id = FP_CT_CURRENT_NETNS, .l4proto = proto};
	struct nf_conn *ct = bpf_skb_ct_lookup(ctx, t, tsz, &o, FP_CT_OPTS_SZ);
	if (!ct)
		return 0;
	int err = bpf_ct_change_timeout(ct, 0);
	if (!err)
		err = bpf_ct_change_status(ct, (__u32)ct->status | FP_IPS_FIXED_TIMEOUT);
	bpf_ct_release(ct);
	return err == 0;
}

/* ct_known: 0 only when conntrack (the node's netns, as closed_expire) has no live entry for
 * tuple t (tsz bytes): the lookup answered -ENOENT. Any other failure counts as known, so a
 * caller that keeps a packet off the normal path on 0 does so only on conntrack's own word. An
 * expired entry not yet reaped is not found (the lookup skips it). */
static __always_inline int ct_known(struct __sk_buff *ctx, struct bpf_sock_tuple *t, __u32 tsz, __u8 proto)
{
	struct bpf_ct_opts o = {.netns_id = FP_CT_CURRENT_NETNS, .l4proto = proto};
	struct nf_conn *ct = bpf_skb_ct_lookup(ctx, t, tsz, &o, FP_CT_OPTS_SZ);
	if (!ct)
		return o.error != -2; /* -ENOENT */
	bpf_ct_release(ct);
	return 1;
}

/* ct_known4: ct_known for IPv4 flow k's connection (its key as conntrack's tuple, either way). */
static __always_inline int ct_known4(struct __sk_buff *ctx, const struct fp_key *k)
{
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = k->local;
	t.ipv4.daddr = k->remote;
	t.ipv4.sport = k->lport;
	t.ipv4.dport = k->rport;
	return ct_known(ctx, &t, sizeof(t.ipv4), k->proto);
}

/* closed_due: closed_push's test, for either family's record. */

/* closed_push hands flow k to the agent when this FIN or RST (fin) completed its close: old are
 * the flags before the fetch-or that set fin, so of the CPUs racing on one flow's last FINs
 * exactly one sees the transition, and a repeated FIN none. Only a handshake-only connection
 * whose FIN rides the fast path (fin_fast's condition) leaves conntrack's entry behind. */
static __always_inline int closed_due(__u32 old, __u32 fin, __u8 proto)
{
	if ((old & FP_F_DONE) == FP_F_DONE || ((old | fin) & FP_F_DONE) != FP_F_DONE)
		return 0;
	return (old & FP_F_HSONLY) && !(old & (FP_F_ALIAS | FP_F_LOCAL)) && proto == IPPROTO_TCP;
}

static __always_inline void closed_push(struct __sk_buff *ctx, const struct fp_key *k, __u32 old, __u32 fin,
					__u32 dir)
{
	if (!closed_due(old, fin, k->proto))
		return;
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = k->local;
	t.ipv4.daddr = k->remote;
	t.ipv4.sport = k->lport;
	t.ipv4.dport = k->rport;
	if (closed_expire(ctx, &t, sizeof(t.ipv4), k->proto)) {
		count(dir, FP_R_CLOSED_CT);
		return;
	}
	struct fp_closed c = {.local = k->local, .remote = k->remote, .lport = k->lport, .rport = k->rport,
			      .proto = k->proto, .ovl = k->ovl, .ns = bpf_ktime_get_ns()};
	/* Flags 0: the kernel wakes the agent only when it had read everything before. */
	if (bpf_ringbuf_output(&prg_fastpath_closed, &c, sizeof(c), 0))
		count(dir, FP_R_CLOSED_LOST);
}

#endif
