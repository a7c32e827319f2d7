// Package stage attributes receive-path work to device stages and CPUs with eBPF.
//
// An overlay packet crosses several devices (underlay NIC, VXLAN, veth), each a separate NET_RX
// softirq stage, and where those stages run decides overlay performance. The probe counts, per CPU
// and per device (network namespace inode, ifindex), the skbs entering the stack
// (net:netif_receive_skb), the skbs queued to a CPU backlog (net:netif_rx), NAPI polls and their
// work (napi:napi_poll), and the NET_RX softirq time (irq:softirq_entry/exit) split between devices.
// bpf/stage_probe.bpf.c documents how the time split is done and where it is approximate.
//
// The probe is not pinned: it lives only as long as the process that started it.
package stage

// The generated stage_probe_bpfel.{go,o} are committed so that `go build` needs no clang.
// Regenerate with `make generate` after editing bpf/stage_probe.bpf.c or bpf/common.h.
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem stage_probe stage ../../../bpf/stage_probe.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
