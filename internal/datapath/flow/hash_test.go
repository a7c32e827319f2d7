package flow

import (
	"net/netip"
	"testing"
)

// Fmix32 is murmur3's finaliser: MurmurHash3_x86_32 of the empty input with seed s is Fmix32(s),
// so the published vectors of the empty input check it without root.
func TestFmix32PublishedVectors(t *testing.T) {
	for _, v := range []struct{ in, want uint32 }{{0, 0}, {1, 0x514e28b7}, {0xffffffff, 0x81f16f39}} {
		if got := Fmix32(v.in); got != v.want {
			t.Errorf("Fmix32(%#x) = %#x, want %#x (MurmurHash3_x86_32(\"\", seed %#x))", v.in, got, v.want, v.in)
		}
	}
}

// prg_flow_hash of known 5-tuples as bpf/falcon.bpf.c computed them through BPF_PROG_TEST_RUN
// (falcon's vectors_test.go holds the same values and checks them against the program as root).
func TestHashVectors(t *testing.T) {
	a := netip.MustParseAddr
	for _, v := range []struct {
		src, dst     netip.Addr
		sport, dport uint16
		proto        uint8
		want         uint32
	}{
		{a("198.19.2.1"), a("198.19.1.2"), 10000, 5201, 17, 0xf921f116},
		{a("10.244.1.7"), a("10.244.2.9"), 43512, 80, 6, 0x80aea95d},
		{a("fd00::1"), a("fd00:1::2"), 5353, 4000, 17, 0x1c251f6d},
		{a("2001:db8::a"), a("2001:db8::b"), 1, 65535, 6, 0xed6fb18c},
		{a("172.16.0.1"), a("172.16.0.2"), 2905, 2905, 132, 0xa27057bc},
	} {
		if got := Hash(v.src, v.dst, v.sport, v.dport, v.proto); got != v.want {
			t.Errorf("Hash(%v:%d > %v:%d proto %d) = %#x, the program's %#x", v.src, v.sport, v.dst, v.dport, v.proto, got, v.want)
		}
	}
}
