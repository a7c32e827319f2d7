// SPDX-License-Identifier: GPL-2.0
/*
 * stage probe: who did how much receive-path work, per device stage and per CPU.
 *
 * One received overlay packet crosses several device stages (underlay NIC, VXLAN, veth), each
 * with its own NET_RX softirq work. This program counts, per CPU and per device (netns inode,
 * ifindex):
 *   - skbs and bytes entering the stack on that device      (net:netif_receive_skb)
 *   - skbs and bytes queued to a CPU backlog for that device (net:netif_rx, e.g. veth xmit)
 *   - NAPI polls and their work                               (napi:napi_poll)
 *   - NET_RX softirq nanoseconds attributed to the device     (irq:softirq_entry/exit + the above)
 * and per CPU the total NET_RX softirq time, so the share nobody could be charged for is visible.
 *
 * The programs are BTF-enabled raw tracepoints (tp_btf) on those same tracepoints: they get the
 * kernel's arguments (the skb, the napi_struct) directly, so the kernel skips filling the classic
 * tracepoint's record (which copies the device name into it on every event), and they attach by
 * BTF, without tracefs.
 *
 * Time attribution (approximate, by construction): a NET_RX softirq run is cut into segments at
 * each netif_receive_skb and napi_poll event on that CPU. A segment that ends at a packet's
 * netif_receive_skb, if no packet came before it in the current poll, is charged to that packet's
 * device (the driver/GRO work that produced it). Any other segment is charged to the device of
 * the last packet received, because after the tracepoint that packet is processed by its device's
 * protocol handlers (bridge, IP, UDP, VXLAN decap, the next veth's xmit...). Known inaccuracies:
 *   - the fetch of the next packet by the driver is charged to the previous packet's device;
 *   - hard interrupts taken during the softirq are included;
 *   - work done by a NAPI poll that delivered no packet goes to that NAPI's device, and for the
 *     per-CPU backlog NAPI (no device) to "no device" (netns 0, ifindex 0);
 *   - the tail after the last event of a run (RPS IPIs, skb frees) is unattributed;
 *   - threaded NAPI and busy polling run outside softirq: their polls count, their time does not;
 *   - time charged to devices excluded by the netns filter is reported as unattributed; the
 *     backlog NAPI has no namespace, so the filter cannot apply to it and its polls are everyone's.
 * Per CPU, the device shares plus the unattributed time add up to the measured NET_RX time.
 */
#include "common.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load: non-zero means count only devices whose netns is in prg_stage_nsf.
 * A constant lets the verifier drop the lookup entirely when the filter is off. */
volatile const __u32 filter_netns = 0;

/* Counters of one device on one CPU. Field order is the Go struct's order (bpf2go generates it). */
struct stage_dev_val {
	__u64 rcv_pkts;   /* skbs seen by netif_receive_skb (a GRO aggregate counts once) */
	__u64 rcv_segs;   /* the same weighted by gso_segs: wire packets, roughly */
	__u64 rcv_bytes;  /* skb->len at netif_receive_skb (L2 header already pulled) */
	__u64 rx_pkts;    /* skbs queued by netif_rx (enqueue to a CPU backlog) */
	__u64 rx_bytes;
	__u64 polls;      /* napi_poll events of this device's NAPI instances */
	__u64 poll_work;  /* sum of the work (packets) those polls reported */
	__u64 softirq_ns; /* NET_RX softirq time attributed to the device (see above) */
};

/* Per-CPU state of the running NET_RX softirq, plus the CPU's totals. */
struct stage_cpu {
	__u64 netrx_ns;   /* total NET_RX softirq time on this CPU */
	__u64 netrx_runs; /* NET_RX softirq runs */
	__u64 unattr_ns;  /* part of netrx_ns charged to no counted device */
	/* state below is private to the programs */
	__u64 entry_ts;            /* softirq_entry time of the current run */
	__u64 mark_ts;             /* start of the current, not yet charged segment */
	struct prg_dev_key cur;    /* device of the last packet received in this poll */
	__u32 in_netrx;            /* inside a NET_RX softirq run we saw begin */
	__u32 has_cur;             /* cur is valid */
	__u32 cur_ok;              /* cur passes the netns filter */
};

struct stage_dev_name {
	char name[16]; /* IFNAMSIZ; the name when the device was first seen */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct prg_dev_key);
	__type(value, struct stage_dev_val);
} prg_stage_dev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stage_cpu);
} prg_stage_cpu SEC(".maps");

/* Written once per device (on its first entry in prg_stage_dev), so not per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct prg_dev_key);
	__type(value, struct stage_dev_name);
} prg_stage_names SEC(".maps");

/* netns inodes to count when filter_netns is set; the value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} prg_stage_nsf SEC(".maps");

static __always_inline struct stage_cpu *cpu_state(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&prg_stage_cpu, &zero);
}

static __always_inline struct stage_dev_val *dev_new(const struct prg_dev_key *key, struct net_device *dev);

static __always_inline int counted(const struct prg_dev_key *key)
{
	if (!filter_netns)
		return 1;
	if (key->netns == 0) /* "no device": the backlog, always a per-CPU fact worth keeping */
		return 1;
	return bpf_map_lookup_elem(&prg_stage_nsf, &key->netns) != NULL;
}

/* dev_val returns this CPU's counters of the device, creating them (and its name) on first use. */
static __always_inline struct stage_dev_val *dev_val(const struct prg_dev_key *key, struct net_device *dev)
{
	struct stage_dev_val *v = bpf_map_lookup_elem(&prg_stage_dev, key);
	if (v)
		return v;
	return dev_new(key, dev);
}

/* counted_val is dev_val for a device that passes the netns filter, else NULL. Counters exist
 * only for counted devices, so an existing entry answers the filter too: one hash lookup per
 * event on the measured path instead of two (issue 12). */
static __always_inline struct stage_dev_val *counted_val(const struct prg_dev_key *key, struct net_device *dev)
{
	struct stage_dev_val *v = bpf_map_lookup_elem(&prg_stage_dev, key);
	if (v || !counted(key))
		return v;
	return dev_new(key, dev);
}

/* dev_new creates this CPU's counters of the device (and its name) and returns them. */
static __always_inline struct stage_dev_val *dev_new(const struct prg_dev_key *key, struct net_device *dev)
{
	struct stage_dev_val zero = {};
	/* NOEXIST: another program on this CPU cannot interleave, but keep updates idempotent anyway. */
	bpf_map_update_elem(&prg_stage_dev, key, &zero, BPF_NOEXIST);
	if (dev) {
		struct stage_dev_name n = {};
		BPF_CORE_READ_STR_INTO(&n.name, dev, name);
		bpf_map_update_elem(&prg_stage_names, key, &n, BPF_NOEXIST);
	}
	return bpf_map_lookup_elem(&prg_stage_dev, key); /* NULL only if the map is full */
}

/* charge adds the segment [mark_ts, now] to a device's counters v (NULL: to unattributed) and
 * starts the next segment. */
static __always_inline void charge(struct stage_cpu *st, __u64 now, struct stage_dev_val *v)
{
	__u64 d = now - st->mark_ts;
	st->mark_ts = now;
	if (v)
		v->softirq_ns += d;
	else
		st->unattr_ns += d;
}

/* charge_open closes the open segment: to the device of the last packet received if there is one
 * (with v being this event's device, whose counters are already at hand when it is the same one),
 * else to this event's device. */
static __always_inline void charge_open(struct stage_cpu *st, __u64 now, const struct prg_dev_key *key,
					struct stage_dev_val *v)
{
	if (!st->has_cur || (st->cur.netns == key->netns && st->cur.ifindex == key->ifindex)) {
		charge(st, now, v);
		return;
	}
	charge(st, now, st->cur_ok ? dev_val(&st->cur, NULL) : NULL);
}

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

/* gso_segs lives in skb_shared_info at skb->head + skb->end (end is an offset on 64-bit kernels).
 * The computed pointer has no BTF type for the verifier; bpf_rdonly_cast gives it one, so the
 * load is a plain (fault-safe) load instead of a probe-read helper call per packet. */
static __always_inline __u64 skb_segs(struct sk_buff *skb)
{
	unsigned char *head = skb->head;
	__u64 end = skb->end;
	struct skb_shared_info *sh = bpf_rdonly_cast(head + end, bpf_core_type_id_kernel(struct skb_shared_info));
	__u16 segs = sh->gso_segs;
	return segs ? segs : 1;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(prg_stage_rcv, struct sk_buff *skb)
{
	struct net_device *dev = skb->dev;
	if (!dev)
		return 0;
	struct prg_dev_key key = {};
	prg_dev_key_of(dev, &key);
	/* Look up (and name) the device first, so that charging never creates it nameless. */
	struct stage_dev_val *v = counted_val(&key, dev);

	struct stage_cpu *st = cpu_state();
	if (st && st->in_netrx) {
		charge_open(st, bpf_ktime_get_ns(), &key, v);
		st->cur = key;
		st->has_cur = 1;
		st->cur_ok = v != NULL;
	}
	if (!v)
		return 0;
	v->rcv_pkts++;
	v->rcv_segs += skb_segs(skb);
	v->rcv_bytes += skb->len;
	return 0;
}

SEC("tp_btf/netif_rx")
int BPF_PROG(prg_stage_rx, struct sk_buff *skb)
{
	/* No time segmentation here: netif_rx runs inside the processing of the packet that is being
	 * forwarded (e.g. bridge -> veth xmit), which belongs to the upstream stage's segment. */
	struct net_device *dev = skb->dev;
	if (!dev)
		return 0;
	struct prg_dev_key key = {};
	prg_dev_key_of(dev, &key);
	struct stage_dev_val *v = counted_val(&key, dev);
	if (!v)
		return 0;
	v->rx_pkts++;
	v->rx_bytes += skb->len;
	return 0;
}

SEC("tp_btf/napi_poll")
int BPF_PROG(prg_stage_napi, struct napi_struct *napi, int work, int budget)
{
	struct net_device *dev = napi->dev;
	struct prg_dev_key key = {};
	if (dev)
		prg_dev_key_of(dev, &key);
	struct stage_dev_val *v = counted_val(&key, dev);

	/* The tracepoint fires after the poll returned: the open segment is this poll's tail. */
	struct stage_cpu *st = cpu_state();
	if (st && st->in_netrx) {
		charge_open(st, bpf_ktime_get_ns(), &key, v);
		st->has_cur = 0;
	}
	if (!v)
		return 0;
	v->polls++;
	if (work > 0)
		v->poll_work += work;
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(prg_stage_sqin, unsigned int vec)
{
	if (vec != PRG_NET_RX_SOFTIRQ)
		return 0;
	struct stage_cpu *st = cpu_state();
	if (!st)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	st->entry_ts = now;
	st->mark_ts = now;
	st->has_cur = 0;
	st->in_netrx = 1;
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(prg_stage_sqout, unsigned int vec)
{
	if (vec != PRG_NET_RX_SOFTIRQ)
		return 0;
	struct stage_cpu *st = cpu_state();
	/* A run whose entry we did not see (the probe attached mid-run) has no start time: skip it. */
	if (!st || !st->in_netrx)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	/* The tail (after the last poll: RPS IPIs, deferred frees) is nobody's in particular. */
	charge(st, now, st->has_cur && st->cur_ok ? dev_val(&st->cur, NULL) : NULL);
	st->netrx_ns += now - st->entry_ts;
	st->netrx_runs++;
	st->in_netrx = 0;
	st->has_cur = 0;
	return 0;
}
