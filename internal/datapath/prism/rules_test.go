package prism

import (
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
)

func TestParseRuleCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"proto=tcp dport=11211":                     "proto=tcp dport=11211",
		"dport=11211,proto=TCP":                     "proto=tcp dport=11211",
		"proto=udp sport=5000-5999":                 "proto=udp sport=5000-5999",
		"dst=198.19.2.0/24 dscp=ef":                 "dst=198.19.2.0/24 dscp=46",
		"src=198.19.1.7":                            "src=198.19.1.7/32",
		"dst=fd00::/64 proto=6":                     "proto=tcp dst=fd00::/64",
		"proto=icmpv6":                              "proto=icmpv6",
		"family=ipv6 dport=53":                      "family=ipv6 dport=53",
		"all":                                       "all",
		"dscp=af41":                                 "dscp=34",
		"proto=sctp sport=1 dport=2 src=10.0.0.0/8": "proto=sctp src=10.0.0.0/8 sport=1 dport=2",
	} {
		r, err := ParseRule(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if r.String() != want {
			t.Errorf("%q: got %q, want %q", in, r.String(), want)
		}
		// The canonical text parses back to the same rule.
		if r2, err := ParseRule(r.String()); err != nil || !r2.same(r) {
			t.Errorf("%q does not round-trip: %v", r.String(), err)
		}
	}
}

func TestParseRuleErrors(t *testing.T) {
	for in, want := range map[string]string{
		"":                            "empty rule",
		"dst=198.19.0.0/33":           "bad CIDR",
		"dst=198.19.0.300":            "bad address",
		"src=198.19.2.5/16":           "host bits set",
		"dport=0":                     "out of range",
		"dport=65536":                 "out of range",
		"sport=2000-1000":             "is empty",
		"dport=http":                  "not a number",
		"proto=foo":                   "unknown protocol",
		"proto=256":                   "out of range",
		"proto=icmp dport=80":         "matches nothing",
		"proto=icmp family=ipv6":      "matches nothing",
		"proto=icmpv6 dst=10.0.0.0/8": "matches nothing",
		"src=10.0.0.0/8 dst=fd00::/8": "matches nothing",
		"family=ipv4 dst=fd00::/8":    "matches nothing",
		"dscp=64":                     "out of range",
		"dscp=gold":                   "unknown DSCP",
		"colour=red":                  "unknown key",
		"dport":                       "want key=value",
		"dport=1 dport=2":             "given twice",
		"all proto=tcp":               "takes no other criteria",
		"dst=::ffff:10.0.0.0/104":     "IPv4-mapped",
		"family=ipx":                  "unknown family",
	} {
		_, err := ParseRule(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error with %q", in, err, want)
		}
	}
}

func TestParseRulesFileAndIDs(t *testing.T) {
	rs, err := ParseRules("# HP services\nproto=tcp dport=11211   # memcached\n\nproto=udp dport=53; dscp=ef\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("%d rules", len(rs))
	}
	if _, err := ParseRules("proto=tcp\nproto=bogus"); err == nil || !strings.Contains(err.Error(), "rule 2") {
		t.Errorf("error should name the rule's position: %v", err)
	}
	have, err := mergeRules(nil, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range have {
		if r.ID != i {
			t.Errorf("rule %d got id %d", i, r.ID)
		}
	}
	if _, err := mergeRules(have, rs[:1]); err == nil || !strings.Contains(err.Error(), "already installed") {
		t.Errorf("duplicate accepted: %v", err)
	}
	// A freed ID is reused; the others keep theirs (their counters stay meaningful).
	left, ids, err := removeRules(have, []string{"1"})
	if err != nil || len(ids) != 1 || ids[0] != 1 || len(left) != 2 {
		t.Fatalf("remove by id: %v %v %v", left, ids, err)
	}
	more, _ := ParseRules("proto=tcp dport=80")
	next, err := mergeRules(left, more)
	if err != nil || next[2].ID != 1 || next[0].ID != 0 || next[1].ID != 2 {
		t.Fatalf("ids after reuse: %+v %v", next, err)
	}
	if _, _, err := removeRules(next, []string{"proto=udp dport=9"}); err == nil {
		t.Error("removing a rule that is not installed must fail")
	}
	if _, _, err := removeRules(next, []string{"proto=tcp dport=80"}); err != nil {
		t.Errorf("remove by text: %v", err)
	}
	var many []Rule
	for i := 0; i <= MaxRules; i++ {
		many = append(many, Rule{Proto: 6, DSCP: -1, DPort: PortRange{uint16(i + 1), uint16(i + 1)}})
	}
	if _, err := mergeRules(nil, many); err == nil || !strings.Contains(err.Error(), "too many") {
		t.Errorf("overflow: %v", err)
	}
}

func TestEncodeRule(t *testing.T) {
	r, _ := ParseRule("proto=tcp src=198.19.1.0/24 dport=10-20 dscp=ef")
	v := encodeRule(r)
	if v.Flags != rProto|rSrc|rDPort|rDSCP || v.Family != 4 || v.DportLo != 10 || v.DportHi != 20 || v.Dscp != 46 {
		t.Fatalf("%+v", v)
	}
	// Little-endian words hold the raw network-order bytes.
	if v.Src[0] != 198|19<<8|1<<16 || v.Smask[0] != 0x00ffffff || v.Smask[1] != 0 {
		t.Fatalf("src %x mask %x", v.Src, v.Smask)
	}
	r6, _ := ParseRule("dst=fd00:19::/33")
	v6 := encodeRule(r6)
	if v6.Family != 6 || v6.Dmask[0] != 0xffffffff || v6.Dmask[1] != 0x80 || v6.Dmask[2] != 0 {
		t.Fatalf("ipv6 mask %x", v6.Dmask)
	}
}

// status names every address refused as claimed by several pods, and the gate's counters.
func TestFormatShowsConflictsAndGate(t *testing.T) {
	v := &View{Agent: "running", Pods: 2, ConflictsSeen: 3,
		Conflicts: []endpoints.Conflict{{Domain: 1, Addr: "198.19.2.2", Veths: []string{"prg-x-h2/veth1", "prg-x-h2/veth2"}}},
		Stats:     Stats{Elsewhere: 7, Delivered: 11}}
	s := v.Format()
	for _, want := range []string{"1 refused as claimed by several pods (3 since attach)", "2 pods gated",
		"198.19.2.2 claimed by 2 pods (prg-x-h2/veth1, prg-x-h2/veth2): refused", "another veth or MAC than the endpoint's 7",
		"delivered to a pod 11"} {
		if !strings.Contains(s, want) {
			t.Errorf("status lacks %q:\n%s", want, s)
		}
	}
}
