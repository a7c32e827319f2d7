/* prg_pd_sockops / prg_pd_skmsg: the socket-level shortcut PipeDevice is compared with (the paper's
 * Cilium baseline; internal/pdsockmap loads it).
 *
 * A sockops program on a cgroup (v2) records every established IPv4 TCP socket of that cgroup in
 * a sockhash keyed by its 4-tuple as seen from the socket. An sk_msg program on that sockhash runs
 * on every sendmsg of those sockets and redirects the data straight into the receive queue of the
 * peer socket (the key with the tuple reversed) when the peer is in the map too: both ends on
 * this host and in the cgroup. The payload then skips TCP/IP, the bridge and both veths; the
 * sockets, the API and the kernel copies stay. Anything else passes (SK_PASS) untouched. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "GPL";

struct prg_pd_key {
	__u32 sip, dip; /* network order */
	__u32 sport, dport; /* host order */
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct prg_pd_key);
	__type(value, __u64);
} prg_pd_socks SEC(".maps");

/* [0] sockets recorded, [1] messages redirected, [2] messages passed */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u64);
} prg_pd_stats SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&prg_pd_stats, &i);
	if (v)
		(*v)++;
}

SEC("sockops")
int prg_pd_sockops(struct bpf_sock_ops *ops)
{
	if (ops->family != 2 /* AF_INET */)
		return 1;
	switch (ops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: {
		struct prg_pd_key k = {
			.sip = ops->local_ip4,
			.dip = ops->remote_ip4,
			.sport = ops->local_port,                 /* host order */
			.dport = bpf_ntohl(ops->remote_port), /* the kernel puts the network-order port in the upper half */
		};
		if (bpf_sock_hash_update(ops, &prg_pd_socks, &k, BPF_NOEXIST) == 0)
			count(0);
		break;
	}
	}
	return 1;
}

SEC("sk_msg")
int prg_pd_skmsg(struct sk_msg_md *msg)
{
	struct prg_pd_key peer = {
		.sip = msg->remote_ip4,
		.dip = msg->local_ip4,
		.sport = bpf_ntohl(msg->remote_port),
		.dport = msg->local_port,
	};
	long r = bpf_msg_redirect_hash(msg, &prg_pd_socks, &peer, BPF_F_INGRESS);
	count(r == SK_PASS ? 1 : 2);
	return SK_PASS;
}
