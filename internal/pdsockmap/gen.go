package pdsockmap

// The generated pdsockmap_bpf_bpfel.{go,o} are committed so that `go build` needs no clang.
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem pdsockmap_bpf sm ../../bpf/pd_sockmap.bpf.c -- -nostdinc -I../../bpf -I../../bpf/include -g -O2 -Wall -mcpu=v3
