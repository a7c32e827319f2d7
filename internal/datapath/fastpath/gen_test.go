package fastpath

// The tests' own object (bpf/fastpath_tctest.bpf.c: the programs with their hand-over tag in
// cb[0]); generated into _test files, so the binary neither embeds nor loads it.
//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -output-stem fptc_bpf fptc ../../../bpf/fastpath_tctest.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
