package fastpath

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestFormatTable6: status names the IPv6 flow table's size beside the IPv4 one's, in the
// text and the JSON; a view without it (an older attachment) reads as before.
func TestFormatTable6(t *testing.T) {
	v := &View{Layout: LayoutRouted, Table: 77136, Table6: 77136}
	if s := v.Format(); !strings.Contains(s, "flow table: 77136 entries (IPv6 table 77136) (from the node's memory)") {
		t.Fatalf("status text lacks the IPv6 table:\n%s", s)
	}
	j, err := json.Marshal(v)
	if err != nil || !strings.Contains(string(j), `"flow_table6":77136`) {
		t.Fatalf("JSON %s (%v) lacks flow_table6", j, err)
	}
	v.Table6 = 0
	if s := v.Format(); !strings.Contains(s, "flow table: 77136 entries (from the node's memory)") {
		t.Fatalf("status text without an IPv6 table changed:\n%s", s)
	}
}
