package datapath

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/cpuset"
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
			st, err := Attach(context.Background(), host, "rps", Options{})
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
			if _, err := Attach(context.Background(), host, "rps", Options{}); err == nil || !strings.Contains(err.Error(), "already attached") {
				t.Fatalf("second attach should be refused, got %v", err)
			}
			if _, err := Detach(context.Background(), host, ""); err != nil {
				t.Fatal(err)
			}
			after := labtest.RxKnobs(t, l, "rps_cpus")
			for k, v := range before {
				if after[k] != v {
					t.Errorf("%s: before %q, after detach %q", k, v, after[k])
				}
			}
			if st, _ := LoadState(host, "rps"); st != nil {
				t.Error("record left after detach")
			}
		})
	}
}

func TestAttachRefusesNamespaceWithoutOverlay(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tnoov", Style: lab.StyleNative})
	_, err := Attach(context.Background(), l.Hosts[0].Netns, "rps", Options{})
	if !errors.Is(err, ErrNoOverlay) {
		t.Fatalf("want ErrNoOverlay, got %v", err)
	}
	if st, _ := LoadState(l.Hosts[0].Netns, "rps"); st != nil {
		t.Fatal("a refused attach left a record")
	}
}

func TestAttachBadInputChangesNothing(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tbad", Style: lab.StyleDocker})
	before := labtest.RxKnobs(t, l, "rps_cpus")
	host := l.Hosts[0].Netns
	for _, tc := range []struct {
		mode string
		o    Options
		want string
	}{
		{"nosuchmode", Options{}, "unknown mode"},
		{"rps", Options{CPUs: []int{4095}}, "offline or absent"},
		{"rps", Options{Underlay: "nosuchdev"}, "does not exist"},
	} {
		if _, err := Attach(context.Background(), host, tc.mode, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("attach %s %+v: got %v, want %q", tc.mode, tc.o, err, tc.want)
		}
	}
	if _, err := Attach(context.Background(), "prg-nosuch-ns", "rps", Options{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
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
	topo, err := Discover(l.Hosts[1].Netns, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		StageNIC:      "prg-tdisc-h2/eth0",
		StageVXLAN:    "prg-tdisc-h2-ov/vxlan0",
		StageVethHost: "prg-tdisc-h2-ov/veth1",
		StageVeth:     "prg-tdisc-h2-c1/eth0",
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
	for i := 0; i < numCPU(); i++ {
		c = append(c, i)
	}
	return c
}
