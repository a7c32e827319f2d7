// Package prism is PRISM's run-to-completion (sync) mode for high-priority overlay flows on a
// stock kernel: a tc program at ingress of the VXLAN device classifies each decapsulated frame
// by its inner headers and hands HP frames with bpf_redirect_peer straight to the container, past
// the bridge and the veth backlog stage. bpf/prism.bpf.c explains the datapath.
//
// The mode registers itself as "prism" with the datapath package. Rules are changed live
// (`peregrine prism add|del|rules`); a node agent (`peregrine agent prism`) keeps the endpoint
// map current as containers come and go.
package prism

// The generated prism_bpf_bpfel.{go,o} are committed so that `go build` needs no clang.
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem prism_bpf prs ../../../bpf/prism.bpf.c -- -I../../../bpf -I/usr/include -g -O2 -Wall -mcpu=v3
