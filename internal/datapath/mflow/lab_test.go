package mflow

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// Integration tests on lab topologies (names "tmf*"): a TCP connection survives attach and
// detach mid-transfer in both split modes, every byte arrives, the split really splits (batches
// on both CPUs, no cpumap drops), and refusals change nothing.

func TestTCPSurvivesAttachDetach(t *testing.T) {
	for _, at := range []string{SplitFullPath, SplitDevice} {
		t.Run(at, func(t *testing.T) {
			l := labtest.Up(t, lab.Spec{Name: "tmftcp" + at[:1], Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
			host := l.Hosts[0].Netns
			before := labtest.RxKnobs(t, l)
			tcp := labtest.StartTCP(t, labtest.NS(l, "h2-c1"), labtest.NS(l, "h1-c1"),
				netip.AddrPortFrom(l.Spec.ContainerAddr(1, 1).Addr(), 5201), 0)
			tcp.WaitFlowing(t, 1<<20, 5*time.Second)
			o := datapath.Options{CPUs: []int{0, 1}, KeepUnderlay: true,
				Extra: map[string]string{OptSplitAt: at, OptBatch: "64", OptElephantPPS: "1000"}}
			st, err := datapath.Attach(context.Background(), host, Name, o)
			if err != nil {
				t.Fatal(err)
			}
			// The split is visible once the stream is an elephant cut into batches.
			var flows []Flow
			labtest.Eventually(t, 5*time.Second, "the TCP stream split into batches", func() (bool, string) {
				if flows, err = ReadFlows(st); err != nil {
					return false, err.Error()
				}
				for _, f := range flows {
					if f.Elephant && f.Dport == 5201 && f.Batches >= 2 {
						return true, ""
					}
				}
				return false, fmt.Sprintf("flows %+v", flows)
			})
			report, err := mode{}.Report(st)
			if err != nil {
				t.Errorf("report: %v", err)
			}
			t.Logf("status:\n%s", report)
			batchCPUs, drops := map[int]uint64{}, uint64(0)
			if at == SplitFullPath {
				ms, err := datapath.LoadModeState[modeState](st)
				if err != nil {
					t.Fatal(err)
				}
				s, err := grosplit.ReadStats(ms.SplitDirs[0])
				if err != nil {
					t.Fatal(err)
				}
				batchCPUs, drops = s.Sum().BatchToCPU, s.Sum().Dropped
			} else {
				s, err := ReadSkbStats(host)
				if err != nil {
					t.Fatal(err)
				}
				batchCPUs = s.BatchToCPU
			}
			if batchCPUs[0] == 0 || batchCPUs[1] == 0 || drops != 0 {
				t.Errorf("batches by CPU %v (want both CPUs), cpumap drops %d (want 0)", batchCPUs, drops)
			}
			// HELD: split, then held on one path by the reorder guard.
			if !(strings.Contains(report, "ELEPHANT") || strings.Contains(report, "HELD")) || !strings.Contains(report, "reorder") {
				t.Errorf("status lacks the split flow or the reordering counters")
			}
			if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
				t.Fatal(err)
			}
			tcp.WaitFlowing(t, 1<<20, 5*time.Second) // still running after detach
			t.Logf("%d bytes carried across attach and detach", tcp.Finish(t))
			labtest.SameKnobs(t, l, before, "after detach")
			if _, err := os.Stat(datapath.ModePinDir(host, Name)); err == nil {
				t.Errorf("pins left at %s", datapath.ModePinDir(host, Name))
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	l := labtest.Up(t, lab.Spec{Name: "tmfbad", Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
	host := l.Hosts[0].Netns
	before := labtest.RxKnobs(t, l)
	for name, c := range map[string]struct {
		o    datapath.Options
		want string
	}{
		"batch 0":         {datapath.Options{Extra: map[string]string{OptBatch: "0"}}, "at least 1 packet"},
		"batch huge":      {datapath.Options{Extra: map[string]string{OptBatch: "1000000"}}, "never rotate"},
		"one CPU":         {datapath.Options{CPUs: []int{1}}, "at least 2"},
		"absent CPU":      {datapath.Options{CPUs: []int{0, 1000}}, "CPU 1000"},
		"bad split point": {datapath.Options{Extra: map[string]string{OptSplitAt: "socket"}}, "full-path"},
		// lo has no native XDP: the IRQ split cannot run there.
		"no XDP": {datapath.Options{Underlay: "lo"}, "no native XDP support"},
	} {
		_, err := datapath.Attach(context.Background(), host, "mflow", c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one saying %q", name, err, c.want)
		}
		if st, _ := datapath.LoadState(host, "mflow"); st != nil {
			t.Errorf("%s: a record was left", name)
		}
		labtest.SameKnobs(t, l, before, name)
		if _, err := os.Stat(datapath.ModePinDir(host, Name)); err == nil {
			t.Errorf("%s: pins left at %s", name, datapath.ModePinDir(host, Name))
		}
	}
}

func TestOverlap(t *testing.T) {
	c := Config{CPUs: []int{0, 1}}
	if _, err := checkOverlap(Config{CPUs: []int{0, 1}}, []int{0, 1}); err == nil {
		t.Error("splitting CPUs that are all IRQ CPUs were accepted")
	}
	if note, err := checkOverlap(c, []int{0}); err != nil || note == "" {
		t.Errorf("partial overlap: note %q err %v, want a note and no error", note, err)
	}
	if note, err := checkOverlap(Config{CPUs: []int{2, 3}}, []int{0}); err != nil || note != "" {
		t.Errorf("disjoint: note %q err %v", note, err)
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]int{3, 2}, map[string]string{OptElephantBPS: "1.5G", OptMice: "affine"}, []int{0, 1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	if c.Batch != DefaultBatch || c.ElephantBPS != 1.5e9 || !c.MiceAffine || c.CPUs[0] != 2 || len(c.CPUs) != 2 || c.SplitAt != SplitFullPath {
		t.Errorf("parsed %+v", c)
	}
	if c, _ := ParseConfig(nil, nil, []int{0, 1, 2, 3}); len(c.CPUs) != DefaultSplitCPUs {
		t.Errorf("default splitting CPUs %v, want %d", c.CPUs, DefaultSplitCPUs)
	}
	for _, bad := range []map[string]string{{OptElephantPPS: "-1"}, {OptWindow: "0s"}, {OptMice: "drop"}, {OptQueue: "0"}, {"cpus": "1"}, {"bogus": "1"}} {
		if _, err := ParseConfig(nil, bad, []int{0, 1}); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
