package prism

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"
)

// TestParseAsk: the agent reads what the gate writes (struct prism_flow_key) and nothing else.
func TestParseAsk(t *testing.T) {
	if n := int(unsafe.Sizeof(prsPrismFlowKey{})); n != askLen {
		t.Fatalf("struct prism_flow_key is %d bytes, the agent reads %d", n, askLen)
	}
	b := make([]byte, askLen)
	binary.NativeEndian.PutUint32(b, 77)
	binary.NativeEndian.PutUint32(b[4:], 4)
	copy(b[8:], []byte{10, 244, 0, 2})
	copy(b[24:], []byte{10, 244, 1, 3})
	binary.BigEndian.PutUint16(b[40:], 40000)
	binary.BigEndian.PutUint16(b[42:], 11211)
	b[44] = 6
	dom, tu, ok := parseAsk(b)
	if !ok || dom != 77 || tu.Src != netip.MustParseAddr("10.244.0.2") || tu.Dst != netip.MustParseAddr("10.244.1.3") || tu.Sport != 40000 || tu.Dport != 11211 {
		t.Fatalf("parseAsk: %d %+v %v", dom, tu, ok)
	}
	for name, mut := range map[string]func([]byte) []byte{
		"short":  func(b []byte) []byte { return b[:askLen-1] },
		"udp":    func(b []byte) []byte { b[44] = 17; return b },
		"family": func(b []byte) []byte { binary.NativeEndian.PutUint32(b[4:], 5); return b },
	} {
		if _, _, ok := parseAsk(mut(append([]byte{}, b...))); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}
