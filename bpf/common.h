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

#endif
