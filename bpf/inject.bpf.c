/* prg_inject_xdp: the live-frame injector's program (internal/workload/inject, method xdp).
 *
 * Userspace hands one prebuilt frame to BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES and a
 * repeat count; the kernel runs this program once per copy and, on XDP_TX, transmits the copy
 * out of the sending host's underlay device (test_run turns XDP_TX into a redirect to the same
 * device). On a veth that is veth_xdp_xmit into the peer's ring, which the peer's NAPI (GRO on,
 * or an XDP program there) drains: no socket, no skb, no qdisc on the sending side.
 *
 * The only per-frame work is the sequence number: the program reads the flow id the frame
 * carries (payload bytes 8..11, see payload.go), stamps that flow's next number into payload
 * bytes 0..7 (big endian) and counts it. The counters are per CPU: the injector pins its thread,
 * and test_run does not migrate while it runs, so each flow's numbers are dense and ordered.
 *
 * prg_inject_limit (0: none) caps the frames sent in all: a BPF_PROG_RUN interrupted by a signal
 * is run again whole by the loader, so without a cap an exact-count run could send a partial
 * batch twice. Past the cap frames are dropped unstamped (not sent, not counted). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "GPL";

#define PRG_INJECT_MAX_FLOWS 1024

/* Set before load: payload offset in the frame (42 plain UDP, 92 VXLAN-encapsulated). */
volatile const __u32 prg_inject_off = 42;
volatile const __u64 prg_inject_limit = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PRG_INJECT_MAX_FLOWS);
	__type(key, __u32);
	__type(value, __u64);
} prg_inject_seq SEC(".maps");

/* Frames stamped in all (per CPU; the injector's threads share one CPU), for prg_inject_limit. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} prg_inject_total SEC(".maps");

SEC("xdp")
int prg_inject_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 off = prg_inject_off & 0xff;
	__u8 *p = data + off;

	if ((void *)(p + 16) > data_end)
		return XDP_ABORTED;
	__u32 flow = bpf_ntohl(*(__u32 *)(p + 8));
	__u64 *seq = bpf_map_lookup_elem(&prg_inject_seq, &flow);
	if (!seq)
		return XDP_ABORTED;
	if (prg_inject_limit) {
		__u32 zero = 0;
		__u64 *total = bpf_map_lookup_elem(&prg_inject_total, &zero);
		if (!total)
			return XDP_ABORTED;
		if (*total >= prg_inject_limit)
			return XDP_DROP;
		*total += 1;
	}
	*(__u64 *)p = __builtin_bswap64(*seq);
	*seq += 1;
	return XDP_TX;
}
