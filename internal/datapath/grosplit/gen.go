// Package grosplit moves skb allocation and GRO of the NIC receive stage off the IRQ core.
//
// It is the stock-kernel carrier of FALCON's GRO split and MFLOW's IRQ split: an XDP program on
// the underlay device redirects each raw frame into a BPF_MAP_TYPE_CPUMAP whose entries are the
// split CPUs; the remote CPU's cpumap kthread builds the skb, runs GRO and the rest of the stack.
// A flow always goes to the same split CPU (hash of the inner 5-tuple for VXLAN, else the outer),
// unless Config.Batch asks for MFLOW micro-flows. bpf/grosplit.bpf.c documents the datapath.
//
// Everything is pinned (the XDP link included), so the split outlives the process that attached
// it; Detach detaches the XDP link and removes the pins.
//
// Caveats (measured on Linux 6.18, 2 vCPUs, lab docker style):
//   - On veth, XDP runs in the veth's NAPI poll on the *sender's* CPU (veth xmit schedules the
//     peer's NAPI locally), not on an IRQ core; and veth copies every skb into a page_pool page
//     to give XDP its headroom, a per-packet cost a real NIC's XDP does not have.
//   - A veth peer with tx checksum offload on sends CHECKSUM_PARTIAL skbs; the cpumap-built skb
//     has lost that flag and the stack drops it as a checksum error. Check refuses such a veth
//     and names the fix (ethtool -K <peer> tx off), which also turns TSO off on the peer.
//   - RPS on the device still applies to cpumap-built skbs (after the split CPU's GRO): with
//     rps_cpus set (the lab's --rx-cpus emulation of the IRQ core), the NIC stage goes back to the
//     RPS CPU. Clear the device's rps_cpus while a split is attached, or the split only moves GRO.
//   - cpumap work runs in a kthread (cpumap/<cpu>/map:<id>), not in NET_RX softirq: softirq
//     accounting (the stage probe's softirq_ns, /proc/softirqs) does not see it.
package grosplit

// The generated grosplit_bpfel.{go,o} are committed so that `go build` needs no clang.
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem grosplit_bpf gs ../../../bpf/grosplit.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
