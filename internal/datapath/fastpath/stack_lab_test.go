package fastpath

import (
	"context"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/prism"
	"github.com/peregrine-net/peregrine/internal/lab"
)

// TestStackedUnderPrism checks that prism stacked over the fast path does not keep its
// high-priority flows off the fast path: prism redirects HP frames from the VXLAN device
// straight into the pod, past the fast path's receive learner on the pod's veth, so without the
// learning hand-off (PRG_TC_INDEX_LEARN) an HP flow was never learned and never fast.
func TestStackedUnderPrism(t *testing.T) {
	spec := lab.Spec{Name: "fpsp", Style: lab.StyleFlannel, Containers: 2}
	l := labForTest(t, spec)
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	t.Cleanup(func() { // before the lab's own cleanup (LIFO): prism too
		for _, h := range hosts {
			_, _ = datapath.Detach(context.Background(), h, "")
		}
	})
	// Both orders of attaching: the hand-off must not depend on which came first.
	attachAll(t, hosts[:1])
	for _, h := range hosts {
		if _, err := datapath.Attach(context.Background(), h, prism.Name, datapath.Options{
			Extra: map[string]string{prism.OptRules: "proto=icmp", prism.OptAgent: "off"}}); err != nil {
			t.Fatalf("attach prism %s: %v", h, err)
		}
	}
	attachAll(t, hosts[1:])

	dst := strings.Split(l.Containers[2].Addr, "/")[0]
	run(t, l.Containers[0].Netns, "ping", "-c", "30", "-i", "0.05", "-w", "5", dst)

	for _, h := range hosts {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		p, err := prism.Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		// 30 requests (h2 receives) and 30 replies (h1 receives): the first few of each take the
		// normal path while both directions are learned, the rest the fast path.
		if v.Ingress["hit"] < 20 {
			t.Errorf("%s: %d HP packets took the fast path in, want >= 20 of 30\n%s\n%s", h, v.Ingress["hit"], v.Format(), p.Format())
		}
		if p.Stats.Learn == 0 {
			t.Errorf("%s: prism left no HP frame to the fast path's learning: %+v", h, p.Stats)
		}
		if p.Stats.Learn+p.Stats.Redirected > 10 {
			t.Errorf("%s: %d HP frames reached prism (learning %d, redirected %d): the fast path should take all but the first few", h,
				p.Stats.Learn+p.Stats.Redirected, p.Stats.Learn, p.Stats.Redirected)
		}
	}
}
