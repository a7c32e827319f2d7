// Package falcon is FALCON's softirq pipelining and two-choice balancing (EuroSys'21) on a stock
// kernel: RPS on each stage device carries the stage transition, and tc (tcx) programs on the
// device before each stage choose the next stage's CPU by writing a hash RPS maps to it.
// bpf/falcon.bpf.c explains the datapath; model.go mirrors its arithmetic in Go.
//
// The mode registers itself as "falcon" with the datapath package. A node agent
// (`peregrine agent falcon`) started by attach keeps the load map and the gate current and
// follows containers that come and go.
package falcon

// The generated falcon_bpfel.{go,o} are committed so that `go build` needs no clang.
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem falcon_bpf fal ../../../bpf/falcon.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
