package mflow

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// Integration tests on lab topologies (names "tmf*"): a TCP connection survives attach and
// detach mid-transfer in both split modes, every byte arrives, the split really splits (batches
// on both CPUs, no cpumap drops), and refusals change nothing.

func labUp(t *testing.T, spec lab.Spec) *lab.Lab {
	t.Helper()
	testutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Cleanup(func() {
		if err := lab.Down(spec.Name, nil); err != nil && !errors.Is(err, lab.ErrNotUp) {
			t.Errorf("down: %v", err)
		}
		testutil.AssertClean(t, lab.NsPrefix(spec.Name))
		if _, err := os.Stat(pinDir(lab.NsPrefix(spec.Name) + "h1")); err == nil {
			t.Errorf("pins left behind at %s", pinDir(lab.NsPrefix(spec.Name)+"h1"))
		}
	})
	l, err := lab.Up(ctx, spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func nsOf(l *lab.Lab, short string) string { return lab.NsPrefix(l.Spec.Name) + short }

// rxKnobs reads rps_cpus and rps_flow_cnt of every device of every lab namespace.
func rxKnobs(t *testing.T, l *lab.Lab) map[string]string {
	t.Helper()
	out := map[string]string{}
	nodes := append(append(append([]lab.Node{}, l.Hosts...), l.Overlays...), l.Containers...)
	for _, n := range nodes {
		for _, d := range n.Devices {
			for _, f := range []string{"rps_cpus", "rps_flow_cnt"} {
				p := "/sys/class/net/" + d.Name + "/queues/rx-0/" + f
				if v, err := netnsutil.ReadFileIn(n.Netns, p); err == nil {
					out[n.Netns+":"+p] = v
				}
			}
		}
	}
	return out
}

// stream sends TCP from h2-c1 to h1-c1 as fast as it can until stop is closed; it returns the
// bytes sent and received once both ends are done.
func stream(t *testing.T, l *lab.Lab, stop <-chan struct{}) (sent, received int64) {
	t.Helper()
	dst := l.Spec.ContainerAddr(1, 1).Addr()
	var ln net.Listener
	if err := netnsutil.Do(nsOf(l, "h1-c1"), func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(dst, 5201).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		var n int64
		buf := make([]byte, 64<<10)
		for {
			k, err := c.Read(buf)
			n += int64(k)
			if err != nil {
				got <- n
				return
			}
		}
	}()
	var c net.Conn
	if err := netnsutil.Do(nsOf(l, "h2-c1"), func() error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(dst, 5201).String(), 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-stop:
			if err := c.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			select {
			case n := <-got:
				return sent, n
			case <-time.After(10 * time.Second):
				t.Fatal("receiver did not finish")
			}
		default:
		}
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		k, err := c.Write(buf)
		sent += int64(k)
		if err != nil {
			t.Fatalf("sender: %v (the connection did not survive)", err)
		}
	}
}

func TestTCPSurvivesAttachDetach(t *testing.T) {
	for _, at := range []string{SplitFullPath, SplitDevice} {
		t.Run(at, func(t *testing.T) {
			l := labUp(t, lab.Spec{Name: "tmftcp" + at[:1], Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
			host := l.Hosts[0].Netns
			before := rxKnobs(t, l)
			stop := make(chan struct{})
			type result struct{ sent, received int64 }
			done := make(chan result, 1)
			go func() {
				s, r := stream(t, l, stop)
				done <- result{s, r}
			}()
			time.Sleep(500 * time.Millisecond)
			o := datapath.Options{CPUs: []int{0, 1}, KeepUnderlay: true,
				Extra: map[string]string{OptSplitAt: at, OptBatch: "64", OptElephantPPS: "1000"}}
			st, err := datapath.Attach(context.Background(), host, "mflow", o)
			if err != nil {
				close(stop)
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			report, err := Mode{}.Report(st)
			if err != nil {
				t.Errorf("report: %v", err)
			}
			t.Logf("status:\n%s", report)
			flows, err := ReadFlows(st)
			if err != nil {
				t.Fatal(err)
			}
			split := false
			for _, f := range flows {
				if f.Elephant && f.Dport == 5201 && f.Batches >= 2 {
					split = true
				}
			}
			if !split {
				t.Errorf("the TCP stream was not split into batches: %+v", flows)
			}
			batchCPUs, drops := map[int]uint64{}, uint64(0)
			if at == SplitFullPath {
				ms, _ := readModeState(st)
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
			if !strings.Contains(report, "ELEPHANT") || !strings.Contains(report, "reorder") {
				t.Errorf("status lacks the split flow or the reordering counters")
			}
			if _, err := datapath.Detach(context.Background(), host, ""); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			close(stop)
			r := <-done
			if r.received != r.sent || r.sent == 0 {
				t.Fatalf("received %d bytes of %d", r.received, r.sent)
			}
			t.Logf("%d bytes carried across attach and detach", r.sent)
			after := rxKnobs(t, l)
			for k, v := range before {
				if after[k] != v {
					t.Errorf("%s is %q after detach, was %q", k, after[k], v)
				}
			}
			if _, err := os.Stat(pinDir(host)); err == nil {
				t.Errorf("pins left at %s", pinDir(host))
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	l := labUp(t, lab.Spec{Name: "tmfbad", Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}})
	host := l.Hosts[0].Netns
	before := rxKnobs(t, l)
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
		after := rxKnobs(t, l)
		for k, v := range before {
			if after[k] != v {
				t.Errorf("%s: %s changed to %q", name, k, after[k])
			}
		}
		if _, err := os.Stat(pinDir(host)); err == nil {
			t.Errorf("%s: pins left at %s", name, pinDir(host))
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
