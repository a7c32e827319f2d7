package fastpath

import (
	"strings"
	"testing"
)

// Same-node hits are part of the hits, shown beside them, and neither a fallback nor a
// reason of their own in the fallback list; "nat" is a fallback.
func TestFormatLocalAndNAT(t *testing.T) {
	v := &View{Layout: LayoutRouted, Egress: Direction{"hit": 100, "local": 40, "miss": 2, "nat": 7, "learned": 3}, Ingress: Direction{"hit": 60}}
	out := v.Format()
	if !strings.Contains(out, "hits 100 (40 to pods on this node), misses 2, learned 3, fallbacks 7 (nat 7)") {
		t.Fatalf("egress line:\n%s", out)
	}
	if strings.Contains(out, "local 40") || v.Egress.Fallbacks() != 7 {
		t.Fatalf("local counted as a fallback (%d):\n%s", v.Egress.Fallbacks(), out)
	}
	if !strings.Contains(out, "fastpath ingress: hits 60, misses 0") {
		t.Fatalf("ingress line:\n%s", out)
	}
	if Reasons[len(Reasons)-1] != "local" {
		t.Fatalf("Reasons must follow FP_R_* (FP_R_LOCAL last): %v", Reasons)
	}
}
