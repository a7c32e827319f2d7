// Package ezpath is EZPath on one machine: selected container flows skip the hosts'
// VXLAN stack because the top-of-rack switches (namespaces of a `lab up --tor` lab, with an eBPF
// data plane shaped like the paper's P4 tables) do the encapsulation, and the hosts only push or
// pop an 802.1Q tag. bpf/ezpath_tor.bpf.c and bpf/ezpath_host.bpf.c explain the data planes;
// controller.go the offload policy and the mandatory order of table updates.
package ezpath

// The generated *_bpfel.{go,o} are committed so that `go build` needs no clang.
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem ezpath_tor_bpf tor ../../../bpf/ezpath_tor.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem ezpath_host_bpf host ../../../bpf/ezpath_host.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
