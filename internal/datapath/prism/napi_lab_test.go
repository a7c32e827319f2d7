package prism

import (
	"context"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// napi_threaded: attach switches the receiving host's underlay to threaded NAPI, HP traffic still
// takes prism's redirect, and detach writes back exactly what was there, also a value an operator
// had set before attach (threaded already on stays on).
func TestLabNAPIThreaded(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tpnapi", Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
	h2 := l.Hosts[1].Netns
	c11, _ := l.Node("h1-c1")
	c21, _ := l.Node("h2-c1")
	dst := c21.AddrOnly()
	udpEcho(t, c21.Netns, dst, hpPort)
	topo, err := datapath.Discover(h2, "")
	if err != nil {
		t.Fatal(err)
	}
	nic := topo.ByStage(datapath.StageNIC)[0]
	p := "/sys/class/net/" + nic.Name + "/threaded"
	threaded := func() string {
		t.Helper()
		v, err := netnsutil.ReadFileIn(nic.Netns, p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(v)
	}
	set := func(v string) {
		t.Helper()
		if err := netnsutil.WriteFileIn(nic.Netns, p, v); err != nil {
			t.Fatal(err)
		}
	}
	opts := datapath.Options{KeepUnderlay: true, Extra: map[string]string{OptRules: hpRules, "napi_threaded": "true"}}
	for _, before := range []string{"0", "1"} {
		set(before)
		if _, err := datapath.Attach(context.Background(), h2, "prism", opts); err != nil {
			t.Fatal(err)
		}
		if got := threaded(); got != "1" {
			t.Errorf("before %s: %s = %q after attach, want 1", before, p, got)
		}
		s0 := inspect(t, h2).Stats
		pingPong(t, c11.Netns, dst, hpPort, 100)
		if s1 := inspect(t, h2).Stats; s1.Redirected-s0.Redirected < 95 {
			t.Errorf("before %s: %d of 100 HP replies redirected with threaded NAPI", before, s1.Redirected-s0.Redirected)
		}
		if _, err := datapath.Detach(context.Background(), h2, ""); err != nil {
			t.Fatal(err)
		}
		if got := threaded(); got != before {
			t.Errorf("%s = %q after detach, want %q (the value before attach)", p, got, before)
		}
	}
}
