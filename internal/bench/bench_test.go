package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

func TestParseConfigs(t *testing.T) {
	cs, err := ParseConfigs("native, docker, flannel/rps, real-flannel-nocsum/vanilla, real-flannel/fastpath, calico/fastpath")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name())
	}
	if got := strings.Join(names, ","); got != "native,docker/vanilla,flannel/rps,real-flannel-nocsum/vanilla,real-flannel/fastpath,calico/fastpath" {
		t.Fatalf("names = %s", got)
	}
	for in, want := range map[string]string{
		"cilium":             "unknown style",
		"docker/bogus":       "unknown mode",
		"native/rps":         "no overlay",
		"docker/rps@x":       "key=value",
		"docker/vanilla@a=1": "vanilla takes no options",
		"docker,docker":      "twice",
		"":                   "no configuration",
	} {
		if _, err := ParseConfigs(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseConfigs(%q) = %v, want %q", in, err, want)
		}
	}
}

func TestConfigOptions(t *testing.T) {
	c, err := ParseConfig("docker/falcon@split-cpus=1+static=true")
	if err != nil {
		t.Fatal(err)
	}
	if c.Name() != "docker/falcon@split-cpus=1+static=true" || c.Stack[0].Extra["split_cpus"] != "1" || c.Stack[0].Extra["static"] != "true" {
		t.Fatalf("parsed %+v name %s", c, c.Name())
	}
	// Options a mode does not take are refused, not silently dropped.
	for bad, want := range map[string]string{"docker/rps@split-cpus=1": "does not take", "docker/falcon@bogus=1": "bogus",
		"docker/mflow@cpus=1": "not a mode option"} {
		if _, err := ParseConfig(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", bad, err, want)
		}
	}
	st, err := ParseConfig("docker/falcon/prism@hp_cpus=1")
	if err != nil || st.Mode != "falcon+prism" || len(st.Stack) != 2 || st.Stack[1].Extra["hp_cpus"] != "1" || st.Name() != "docker/falcon/prism@hp_cpus=1" {
		t.Fatalf("stack: %+v %v", st, err)
	}
	for _, bad := range []string{"docker/falcon/falcon", "docker/vanilla/rps"} {
		if _, err := ParseConfig(bad); err == nil {
			t.Errorf("%s should be refused", bad)
		}
	}
	m := mergeExtra(map[string]string{"split_cpus": "0", "rules": "x"}, c.Stack[0].Extra)
	if m["split_cpus"] != "1" || m["rules"] != "x" {
		t.Fatalf("merge: %v", m)
	}
}

func TestScenarioValidation(t *testing.T) {
	ok := Scenario{Name: "udp-inject"}
	if err := ok.Validate(); err != nil || ok.Reps != 3 || len(ok.Sizes) != 1 || ok.Duration != 5*time.Second {
		t.Fatalf("defaults: %+v %v", ok, err)
	}
	if big := (Scenario{Name: "nginx", Sizes: []int{1024, 1 << 20}}); big.Validate() != nil {
		t.Fatalf("nginx with a 1 MiB file refused: %v", big.Validate())
	}
	if many := (Scenario{Name: "udp-flows", Flows: []int{1, 100000}}); many.Validate() != nil {
		t.Fatalf("udp-flows with 100 000 flows refused: %v", many.Validate())
	}
	if err := (&Scenario{Name: "udp-flows", Flows: []int{300000}}).Validate(); err == nil || !strings.Contains(err.Error(), "200000") {
		t.Fatalf("udp-flows with 300 000 flows: %v, want refused with the limit", err)
	}
	if err := (&Scenario{Name: "tcp", Flows: []int{1000}}).Validate(); err == nil {
		t.Fatal("tcp with 1000 flows accepted (iperf3 -P stops at 128)")
	}
	cl := Scenario{Name: "nginx-close", Sizes: []int{1 << 20}}
	if err := cl.Validate(); err != nil || cl.Flows[0] != 1 || cl.port() != 8080 || !slices.Contains(cl.tools(), "wrk") {
		t.Fatalf("nginx-close: %+v %v", cl, err)
	}
	for _, tc := range []struct {
		s    Scenario
		want string
	}{
		{Scenario{Name: "bogus"}, "unknown scenario"},
		{Scenario{Name: "tcp", Sizes: []int{8}}, "out of range"},
		{Scenario{Name: "tcp", Sizes: []int{1 << 20}}, "out of range"},
		{Scenario{Name: "nginx", Sizes: []int{128 << 20}}, "out of range"},
		{Scenario{Name: "udp-inject", Sizes: []int{4000}}, "too large"},
		{Scenario{Name: "tcp", Duration: 1500 * time.Millisecond}, "whole seconds"},
		{Scenario{Name: "tcp", Flows: []int{0}}, "flows"},
		{Scenario{Name: "pingpong", Proto: "sctp"}, "protocol"},
		{Scenario{Name: "tcp", Reps: -1}, "repetitions"},
	} {
		if err := tc.s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.s, err, tc.want)
		}
	}
}

// The stage probe must see one flow's packets at each of the three receive stages of the
// docker style: the host's NIC, vxlan0 in the overlay namespace, the container's veth.
func TestStageProbeSeesThreeDockerStages(t *testing.T) {
	testutil.RequireRoot(t)
	if err := stage.Check(); err != nil {
		t.Fatalf("stage probe cannot run on this kernel: %v", err)
	}
	spec := lab.Spec{Name: "tstg", Style: lab.StyleDocker, Containers: 1, RxCPUs: []int{0}}
	t.Cleanup(func() { lab.Down(spec.Name, nil, nil); testutil.AssertClean(t, lab.NsPrefix(spec.Name)) })
	l, err := lab.Up(context.Background(), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	nss, _ := netnsutil.List(lab.NsPrefix(spec.Name))
	p, err := stage.Start(stage.Options{NetnsNames: nss})
	if err != nil {
		t.Fatal(stage.Explain(err))
	}
	defer p.Close()
	dst, _ := l.Node("h2-c1")
	var sink net.PacketConn
	if err := netnsutil.Do(dst.Netns, func() (err error) { sink, err = net.ListenPacket("udp4", dst.AddrOnly()+":7000"); return }); err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	before, _ := p.Snapshot()
	const n = 3000
	src, _ := l.Node("h1-c1")
	err = netnsutil.Do(src.Netns, func() error {
		c, err := net.Dial("udp4", dst.AddrOnly()+":7000")
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < n; i++ {
			if _, err := c.Write([]byte("peregrine stage probe test")); err != nil {
				return err
			}
			if i%200 == 0 {
				time.Sleep(time.Millisecond) // stay below any drop threshold
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	after, _ := p.Snapshot()
	d := after.Sub(before)
	devs, _ := stage.ResolveDevices()
	d.Annotate(devs)
	seen := map[string]uint64{}
	for _, dc := range d.Devices {
		seen[dc.NetnsName+"/"+dc.Name] += dc.Packets
	}
	for _, want := range []string{"prg-tstg-h2/eth0", "prg-tstg-h2-ov/vxlan0", "prg-tstg-h2-c1/eth0"} {
		// GRO may merge nothing for UDP here; the floor is half because the probe's tp_btf
		// programs can miss events when the machine is busy (labtest.StageCPUs).
		if seen[want] < n/2 {
			t.Errorf("stage device %s saw %d packets, want >= %d (all: %v)", want, seen[want], n/2, seen)
		}
	}
}

func shortOptions(t *testing.T, scenario string) Options {
	return Options{
		Configs:  []Config{{Style: lab.StyleNative, Mode: ModeVanilla}, {Style: lab.StyleDocker, Mode: ModeVanilla}},
		Scenario: Scenario{Name: scenario, Duration: time.Second, Reps: 1, Warmup: 0},
		OutDir:   t.TempDir(),
	}
}

func TestBenchRunWritesValidResultAndCleansUp(t *testing.T) {
	testutil.RequireRoot(t)
	o := shortOptions(t, "udp-inject")
	run, path, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	testutil.AssertClean(t, fmt.Sprintf("prg-b%dx", os.Getpid()%100000))
	back, err := results.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Complete || len(back.Points) != 2 || len(back.Configs) != 2 {
		t.Fatalf("run incomplete or wrong shape: complete=%v points=%d configs=%d", back.Complete, len(back.Points), len(back.Configs))
	}
	if probs := run.Validate(); len(probs) > 0 {
		t.Fatalf("result does not validate: %v", probs)
	}
	for _, p := range back.Points {
		rep := p.Reps[0]
		if rep.Metrics[results.MetricDeliveredPPS] <= 0 || rep.Metrics[results.MetricDelivered] > rep.Metrics[results.MetricSent] {
			t.Errorf("%s: delivered %v of sent %v", p.Config, rep.Metrics[results.MetricDelivered], rep.Metrics[results.MetricSent])
		}
		if len(rep.CPU) == 0 || len(rep.Softirqs["NET_RX"]) == 0 {
			t.Errorf("%s: probes missing: cpu %d softirqs %v", p.Config, len(rep.CPU), rep.Softirqs)
		}
		if p.Config == "docker/vanilla" {
			stages := map[string]bool{}
			for _, s := range rep.Stages {
				stages[s.Stage] = true
			}
			for _, want := range []string{"nic", "vxlan", "veth"} {
				if !stages[want] {
					t.Errorf("docker run has no %s stage rows: %+v", want, rep.Stages)
				}
			}
		}
	}
	for _, c := range back.Configs {
		if c.Placement != results.PlacementOneCore {
			t.Errorf("%s: placement %q, want one-core (no mode attached)", c.Name, c.Placement)
		}
	}
	if back.Env.Kernel == "" || back.Env.CPUs == 0 || len(back.Configs[1].Offloads) == 0 {
		t.Errorf("environment or offloads not recorded: %+v %v", back.Env, back.Configs[1].Offloads)
	}
}

// A workload that dies midway: the rep is marked failed, the run incomplete, the partial
// result is still written, and no lab, process or pin is left behind.
func TestFailedWorkloadLeavesNothingBehind(t *testing.T) {
	testutil.RequireRoot(t)
	o := shortOptions(t, "tcp")
	o.Scenario.Duration = 3 * time.Second
	o.Configs = o.Configs[1:] // docker only
	stop := make(chan struct{})
	go func() {
		// Kill every iperf3 in this process's bench labs once it runs.
		prefix := fmt.Sprintf("prg-b%dx", os.Getpid()%100000)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			nss, _ := netnsutil.List(prefix)
			for _, ns := range nss {
				ino, err := netnsutil.Inode(netnsutil.Path(ns))
				if err != nil {
					continue
				}
				for _, pid := range netnsutil.PIDsIn(ino) {
					if b, _ := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "comm")); strings.TrimSpace(string(b)) == "iperf3" {
						exec.Command("kill", "-9", fmt.Sprint(pid)).Run()
					}
				}
			}
		}
	}()
	run, path, err := Run(context.Background(), o)
	close(stop)
	if err == nil {
		t.Fatal("a run whose tool was killed should fail")
	}
	t.Logf("run error: %v", err)
	if run == nil || run.Complete || path == "" {
		t.Fatalf("want a partial, incomplete result file; got run=%v path=%q", run != nil, path)
	}
	back, rerr := results.Read(path)
	if rerr != nil || back.Complete || back.Points[0].Reps[0].Error == "" {
		t.Fatalf("partial result not marked: %v", rerr)
	}
	if e := back.Points[0].Reps[0].Error; !strings.Contains(e, "iperf3") {
		t.Fatalf("the failed rep should name the tool that died: %q", e)
	}
	t.Logf("rep error: %s", back.Points[0].Reps[0].Error)
	testutil.AssertClean(t, fmt.Sprintf("prg-b%dx", os.Getpid()%100000))
}

func TestInterruptedRunIsMarkedIncomplete(t *testing.T) {
	testutil.RequireRoot(t)
	o := shortOptions(t, "pingpong")
	o.Scenario.Reps = 5
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	run, path, err := Run(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "interrupted") && !strings.Contains(err.Error(), "context") {
		t.Fatalf("want an interruption error, got %v", err)
	}
	if run == nil || run.Complete || path == "" {
		t.Fatal("interrupted run should still write an incomplete result")
	}
	testutil.AssertClean(t, fmt.Sprintf("prg-b%dx", os.Getpid()%100000))
}

func TestBenchBetweenGivenNamespaces(t *testing.T) {
	testutil.RequireRoot(t)
	// Two plain namespaces made by someone else (here: a native lab), measured as found.
	spec := lab.Spec{Name: "tgiv", Style: lab.StyleNative}
	t.Cleanup(func() { lab.Down(spec.Name, nil, nil) })
	if _, err := lab.Up(context.Background(), spec, nil); err != nil {
		t.Fatal(err)
	}
	o := Options{Scenario: Scenario{Name: "tcp", Duration: time.Second, Reps: 1}, OutDir: t.TempDir(),
		Given: &Given{ServerNS: "prg-tgiv-h2", ServerAddr: "198.18.0.2", ClientNS: "prg-tgiv-h1"}}
	run, _, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Points) != 1 || run.Points[0].Reps[0].Metrics[results.MetricThroughput] <= 0 {
		t.Fatalf("no throughput measured between given namespaces: %+v", run.Points)
	}
	if !netnsutil.Exists("prg-tgiv-h1") {
		t.Fatal("a run on given namespaces must not remove them")
	}
	bad := o
	bad.Given = &Given{ServerNS: "prg-nosuch", ServerAddr: "198.18.0.2"}
	if _, _, err := Run(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing namespace: %v", err)
	}
}

// TestInjectorPerPoint: auto sends flat-out points with the XDP injector and paced ones with
// AF_PACKET (the XDP sender cannot hold an offered rate); an explicit choice always wins.
func TestInjectorPerPoint(t *testing.T) {
	s := Scenario{Name: "udp-inject"}
	if err := s.Validate(); err != nil || s.Injector != InjectorAuto {
		t.Fatalf("default injector %q (%v), want auto", s.Injector, err)
	}
	for _, c := range []struct {
		injector string
		rate     int
		want     string
	}{{"auto", 0, "xdp"}, {"auto", 50000, "packet"}, {"xdp", 50000, "xdp"}, {"packet", 0, "packet"}} {
		if got := injectorFor(c.injector, c.rate); got != c.want {
			t.Errorf("%s at %d pps: %s, want %s", c.injector, c.rate, got, c.want)
		}
	}
	bad := Scenario{Name: "udp-inject", Injector: "dpdk"}
	if err := bad.Validate(); err == nil {
		t.Fatal("unknown injector accepted")
	}
}

func TestLinuxConfig(t *testing.T) {
	c, err := ParseConfig("linux")
	if err != nil || c.Style != lab.StyleLinux || c.Mode != ModeVanilla || len(c.Stack) != 0 {
		t.Fatalf("ParseConfig(linux) = %+v, %v", c, err)
	}
	// Modes need a container overlay: the config must say so before any lab is built.
	for _, s := range []string{"linux/falcon", "linux/fastpath", "native/rps"} {
		if _, err := ParseConfig(s); err == nil || !strings.Contains(err.Error(), "docker or flannel") {
			t.Errorf("ParseConfig(%s) = %v, want an error naming the styles modes run on", s, err)
		}
	}
}
