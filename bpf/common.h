/* Shared by every peregrine eBPF program. Keep this small: only what more than one program needs. */
#ifndef PEREGRINE_COMMON_H
#define PEREGRINE_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

/* Softirq vector numbers are a kernel enum that BTF carries, but the values have been
 * stable since 2.6 and the tracepoint reports the raw number, so a constant is clearer. */
#define PRG_NET_RX_SOFTIRQ 3

/* A network device is unique by (netns inode, ifindex): ifindex alone repeats across
 * namespaces (every namespace has its own lo = 1, and veth peers often share numbers). */
struct prg_dev_key {
	__u32 netns;   /* inode of the device's network namespace (ns.inum), as ls -i /proc/PID/ns/net shows */
	__u32 ifindex; /* 0 with netns 0 means "no device" (the per-CPU backlog NAPI) */
};

/* prg_dev_key_of fills key from a net_device given as a BTF-typed pointer (tp_btf, fentry).
 * The plain dereferences are still CO-RE: vmlinux.h marks every struct preserve_access_index,
 * so the offsets are relocated at load time. They compile to the verifier's fault-safe direct
 * loads, several times cheaper than the bpf_probe_read_kernel call behind each BPF_CORE_READ,
 * which matters on a per-packet path. Programs without BTF-typed arguments use BPF_CORE_READ. */
static __always_inline void prg_dev_key_of(struct net_device *dev, struct prg_dev_key *key)
{
	key->ifindex = dev->ifindex;
	key->netns = dev->nd_net.net->ns.inum;
}

/* skb->tc_index of a frame the fast path handed to the kernel's normal overlay path so that it can
 * learn the flow from how that path delivers it (fastpath.bpf.c). A program that would take such a
 * frame off the normal path before the learner sees it (prism's redirect from the VXLAN device)
 * leaves it alone; the learner gives the field back. tc_index rather than skb->mark: netfilter,
 * which the frame still crosses, matches on marks (kube-proxy's 0x4000, Calico's upper bits), and
 * no classifier of a current kernel reads tc_index (cls_tcindex and sch_dsmark are gone). */
#define PRG_TC_INDEX_LEARN 0xfa57

#endif
