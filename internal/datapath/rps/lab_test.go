package rps

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

func TestRPSAttachDetachRestoresByteForByte(t *testing.T) {
	for _, style := range []string{lab.StyleDocker, lab.StyleFlannel} {
		t.Run(style, func(t *testing.T) {
			l := labtest.Up(t, lab.Spec{Name: "trps" + style[:2], Style: style, Containers: 2})
			// A non-default starting value proves detach restores, not resets.
			if err := lab.SetRPS(l.Containers[0].Netns, "eth0", []int{0}); err != nil {
				t.Fatal(err)
			}
			before := labtest.RxKnobs(t, l, "rps_cpus")
			host := l.Hosts[0].Netns
			st, err := datapath.Attach(context.Background(), host, "rps", datapath.Options{})
			if err != nil {
				t.Fatal(err)
			}
			// nic + vxlan + 2 bridge-side veths + 2 container veths
			if len(st.Topology.Devs) != 6 {
				t.Fatalf("discovered %d devices, want 6: %+v", len(st.Topology.Devs), st.Topology.Devs)
			}
			during := labtest.RxKnobs(t, l, "rps_cpus")
			changed := 0
			for k, v := range during {
				if v != before[k] {
					changed++
					if !cpuset.SameMask(v, cpuset.Mask(allCPUs())) {
						t.Errorf("%s = %q, want all CPUs", k, v)
					}
				}
			}
			if changed == 0 {
				t.Fatal("attach rps changed no mask")
			}
			if _, err := datapath.Attach(context.Background(), host, "rps", datapath.Options{}); err == nil || !strings.Contains(err.Error(), "already attached") {
				t.Fatalf("second attach should be refused, got %v", err)
			}
			if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
				t.Fatal(err)
			}
			after := labtest.RxKnobs(t, l, "rps_cpus")
			for k, v := range before {
				if after[k] != v {
					t.Errorf("%s: before %q, after detach %q", k, v, after[k])
				}
			}
			if st, _ := datapath.LoadState(host, "rps"); st != nil {
				t.Error("record left after detach")
			}
		})
	}
}

func TestAttachRefusesNamespaceWithoutOverlay(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tnoov", Style: lab.StyleNative})
	_, err := datapath.Attach(context.Background(), l.Hosts[0].Netns, "rps", datapath.Options{})
	if !errors.Is(err, datapath.ErrNoOverlay) {
		t.Fatalf("want datapath.ErrNoOverlay, got %v", err)
	}
	if st, _ := datapath.LoadState(l.Hosts[0].Netns, "rps"); st != nil {
		t.Fatal("a refused attach left a record")
	}
}

func TestAttachBadInputChangesNothing(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tbad", Style: lab.StyleDocker})
	before := labtest.RxKnobs(t, l, "rps_cpus")
	host := l.Hosts[0].Netns
	for _, tc := range []struct {
		mode string
		o    datapath.Options
		want string
	}{
		{"nosuchmode", datapath.Options{}, "unknown mode"},
		{"rps", datapath.Options{CPUs: []int{4095}}, "offline or absent"},
		{"rps", datapath.Options{Underlay: "nosuchdev"}, "does not exist"},
	} {
		if _, err := datapath.Attach(context.Background(), host, tc.mode, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("attach %s %+v: got %v, want %q", tc.mode, tc.o, err, tc.want)
		}
	}
	if _, err := datapath.Attach(context.Background(), "prg-nosuch-ns", "rps", datapath.Options{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing namespace: %v", err)
	}
	after := labtest.RxKnobs(t, l, "rps_cpus")
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed by a refused attach: %q -> %q", k, v, after[k])
		}
	}
}

func TestDiscoveryDockerFindsOverlayNamespace(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tdisc", Style: lab.StyleDocker, Containers: 1})
	topo, err := datapath.Discover(l.Hosts[1].Netns, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		datapath.StageNIC:      "prg-tdisc-h2/eth0",
		datapath.StageVXLAN:    "prg-tdisc-h2-ov/vxlan0",
		datapath.StageVethHost: "prg-tdisc-h2-ov/veth1",
		datapath.StageVeth:     "prg-tdisc-h2-c1/eth0",
	}
	for stage, dev := range want {
		got := topo.ByStage(stage)
		if len(got) != 1 || got[0].String() != dev {
			t.Errorf("stage %s: got %v, want %s", stage, got, dev)
		}
	}
}

func allCPUs() []int {
	var c []int
	for i := 0; i < runtime.NumCPU(); i++ {
		c = append(c, i)
	}
	return c
}

// rps takes no option of its own: the framework refuses any, and its own keys among them.
func TestConfigureRefusesStrayOptions(t *testing.T) {
	for extra, want := range map[string]map[string]string{
		"does not take":     {"split_cpus": "1"},
		"not a mode option": {datapath.OptCPUs: "0-1"},
	} {
		if _, err := datapath.Configure(Name, datapath.Options{Extra: want}); err == nil || !strings.Contains(err.Error(), extra) {
			t.Errorf("rps with %v: %v, want an error saying %q", want, err, extra)
		}
	}
	if _, err := datapath.Configure(Name, datapath.Options{CPUs: []int{0}}); err != nil {
		t.Errorf("rps with --cpus only: %v", err)
	}
	if got := datapath.FilterOptions(Name, map[string]string{"split_cpus": "1"}); len(got) != 0 {
		t.Errorf("FilterOptions kept %v for rps", got)
	}
}
