package grosplit

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

const (
	xdpPass     = 2
	xdpRedirect = 4
)

// loaded is prg_grosplit loaded (not attached) for BPF_PROG_TEST_RUN.
type loaded struct {
	objs gsObjects
	n    int // CPUs in the current config
}

func load(t *testing.T) *loaded {
	t.Helper()
	testutil.RequireBPF(t)
	spec, err := loadGs()
	if err != nil {
		t.Fatal(err)
	}
	possible, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	spec.Maps[gsMapPrgGsCpus].MaxEntries = uint32(possible)
	l := &loaded{}
	if err := spec.LoadAndAssign(&l.objs, nil); err != nil {
		t.Fatalf("load: %+v", err)
	}
	t.Cleanup(func() { l.objs.Close() })
	// Every possible CPU gets a cpumap entry, so any slot -> CPU mapping redirects.
	for cpu := 0; cpu < possible; cpu++ {
		v := gsBpfCpumapVal{Qsize: 64}
		if err := l.objs.PrgGsCpus.Update(uint32(cpu), &v, ebpf.UpdateAny); err != nil {
			t.Fatalf("cpumap entry %d: %v", cpu, err)
		}
	}
	return l
}

// configure writes a config with n slots. The CPU set is synthetic: slot i -> CPU i % possible,
// so sets up to 8 work on a 2-CPU machine; assertions use the slot, which the debug stats keep.
func (l *loaded) configure(t *testing.T, n, batch int, ports []uint16) {
	t.Helper()
	possible, _ := ebpf.PossibleCPU()
	c := gsGsCfg{N_cpus: uint32(n), Batch: uint32(batch)}
	copy(c.VxlanPorts[:], ports)
	for i := 0; i < n; i++ {
		c.Cpus[i] = uint32(i % possible)
	}
	if err := l.objs.PrgGsCfg.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	l.n = n
}

// result is one test run: the action and what the run changed in the stats of its CPU.
type result struct {
	action             uint32
	redirected, passed uint64
	missed, vxlan      uint64
	slot, cpu          int
	hash               uint32
}

func (l *loaded) run(t *testing.T, frame []byte) result {
	t.Helper()
	before, err := readStats(l.objs.PrgGsStats)
	if err != nil {
		t.Fatal(err)
	}
	// Without BPF_F_TEST_XDP_LIVE_FRAMES the kernel runs the program and reports its action,
	// but performs no redirect: the cpumap choice is read back from the debug stats instead.
	// (Live frames would really redirect, but then the kernel reports no action at all.)
	ret, err := l.objs.PrgGrosplit.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	after, err := readStats(l.objs.PrgGsStats)
	if err != nil {
		t.Fatal(err)
	}
	r := result{action: ret}
	for cpu := range after.PerCPU {
		a, b := after.PerCPU[cpu], before.PerCPU[cpu]
		if a.Redirected == b.Redirected && a.Passed == b.Passed {
			continue
		}
		r.redirected, r.passed = a.Redirected-b.Redirected, a.Passed-b.Passed
		r.missed, r.vxlan = a.Missed-b.Missed, a.VXLAN-b.VXLAN
		r.slot, r.cpu, r.hash = a.LastSlot, a.LastCPU, a.LastHash
	}
	if r.redirected+r.passed != 1 {
		t.Fatalf("one run should count one frame, counted redirected=%d passed=%d", r.redirected, r.passed)
	}
	return r
}

// expectModel asserts the kernel agrees with the Go model on a frame.
func (l *loaded) expectModel(t *testing.T, name string, frame []byte, ports []uint16) result {
	t.Helper()
	r := l.run(t, frame)
	slot, hash, vx, ok := modelChoice(frame, l.n, ports)
	if !ok {
		if r.action != xdpPass || r.passed != 1 {
			t.Errorf("%s: model passes it, kernel returned action %d (redirected %d)", name, r.action, r.redirected)
		}
		return r
	}
	if r.action != xdpRedirect || r.redirected != 1 {
		t.Fatalf("%s: model redirects it, kernel returned action %d (passed %d, missed %d)", name, r.action, r.passed, r.missed)
	}
	if r.hash != hash || r.slot != slot {
		t.Errorf("%s: kernel chose slot %d (hash %#x), model slot %d (hash %#x)", name, r.slot, r.hash, slot, hash)
	}
	if (r.vxlan == 1) != vx {
		t.Errorf("%s: kernel inner-hash=%v, model %v", name, r.vxlan == 1, vx)
	}
	return r
}

func TestVXLANRedirectMatchesModel(t *testing.T) {
	l := load(t)
	ports := DefaultVXLANPorts
	l.configure(t, 4, 0, ports)
	inner := innerTCP4(40000, 5201)
	r := l.expectModel(t, "vxlan 4789", vxlan4(51000, 4789, inner), ports)
	if r.vxlan != 1 {
		t.Errorf("a VXLAN frame on port 4789 must hash on the inner 5-tuple")
	}
	// The same inner flow under another outer source port and on Flannel's port: same slot,
	// because only the inner tuple counts.
	for _, f := range [][]byte{vxlan4(61234, 4789, inner), vxlan4(51000, 8472, inner)} {
		if r2 := l.expectModel(t, "same inner flow", f, ports); r2.slot != r.slot {
			t.Errorf("same inner flow went to slot %d, then %d", r.slot, r2.slot)
		}
	}
	// An inner IPv6 UDP flow, and outer VLAN tags, are understood as well.
	in6 := cat(ethHdr(0x86dd), ipv6Hdr("fd00::2", "fd00::3", 17, 8), l4(17, 1234, 9000, 0))
	l.expectModel(t, "vxlan inner v6", vxlan4(51000, 4789, in6), ports)
	tagged := vxlan4(51000, 4789, inner)
	tagged = cat(ethHdr(0x8100), []byte{0, 7}, tagged[12:])
	if r3 := l.expectModel(t, "vlan-tagged vxlan", tagged, ports); r3.slot != r.slot {
		t.Errorf("a VLAN tag on the outer frame changed the slot (%d vs %d)", r3.slot, r.slot)
	}
}

// TestFlowAffinity: for CPU sets of 1..8, every flow maps to the model's slot, every time,
// and a few hundred flows use every slot.
func TestFlowAffinity(t *testing.T) {
	l := load(t)
	ports := DefaultVXLANPorts
	rng := rand.New(rand.NewSource(1))
	type flow struct{ sport, dport uint16 }
	flows := make([]flow, 200)
	for i := range flows {
		flows[i] = flow{uint16(1024 + rng.Intn(60000)), uint16(1 + rng.Intn(65535))}
	}
	for n := 1; n <= 8; n++ {
		l.configure(t, n, 0, ports)
		used := map[int]int{}
		for i, f := range flows {
			var first int
			for rep := 0; rep < 3; rep++ {
				// The outer source port changes per repetition: it must not matter.
				frame := vxlan4(uint16(49152+rep*97+i), 4789, innerTCP4(f.sport, f.dport))
				r := l.expectModel(t, fmt.Sprintf("n=%d flow %d rep %d", n, i, rep), frame, ports)
				if rep == 0 {
					first = r.slot
				} else if r.slot != first {
					t.Fatalf("n=%d flow %d: slot %d then %d", n, i, first, r.slot)
				}
			}
			used[first]++
		}
		if len(used) != n {
			t.Errorf("n=%d: 200 flows used only %d slots: %v", n, len(used), used)
		}
	}
}

// TestPassAndOuterHash covers the frames the program must leave alone or hash on the outer tuple.
func TestPassAndOuterHash(t *testing.T) {
	l := load(t)
	ports := DefaultVXLANPorts
	l.configure(t, 2, 0, ports)
	vx := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	badIHL := plain4("198.18.0.1", "198.18.0.2", 17, 1000, 53)
	badIHL[14] = 0x44
	notV4 := plain4("198.18.0.1", "198.18.0.2", 17, 1000, 53)
	notV4[14] = 0x65
	arp := cat(ethHdr(0x0806), make([]byte, 28))
	passes := map[string][]byte{
		"arp (non-IP)":             arp,
		"bare ethernet header":     ethHdr(0x0800),
		"IPv4 header cut short":    cat(ethHdr(0x0800), ipv4Hdr("198.18.0.1", "198.18.0.2", 17, 8, 0)[:12]),
		"IPv6 header cut short":    cat(ethHdr(0x86dd), ipv6Hdr("fd00::1", "fd00::2", 17, 8)[:30]),
		"UDP ports cut short":      cat(ethHdr(0x0800), ipv4Hdr("198.18.0.1", "198.18.0.2", 17, 8, 0), []byte{0x13}),
		"IPv4 ihl < 5":             badIHL,
		"version 6 under 0x0800":   notV4,
		"vxlan, inner frame cut":   vx[:14+20+8+8+10],
		"vxlan, inner IP cut":      vx[:14+20+8+8+14+10],
		"vxlan, inner ports cut":   vx[:14+20+8+8+14+20+2],
		"VLAN tag cut short":       cat(ethHdr(0x8100), []byte{0}),
		"garbage after an IP type": cat(ethHdr(0x0800), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
	}
	for name, f := range passes {
		if r := l.expectModel(t, name, f, ports); r.action != xdpPass {
			t.Errorf("%s: action %d, want XDP_PASS", name, r.action)
		}
	}
	// Well-formed packets that are not VXLAN: redirected on the outer 5-tuple.
	outer := map[string][]byte{
		"UDP to port 53":       plain4("198.18.0.1", "198.18.0.2", 17, 1000, 53),
		"TCP to port 4789":     plain4("198.18.0.1", "198.18.0.2", 6, 1000, 4789),
		"ICMP (no ports)":      cat(ethHdr(0x0800), ipv4Hdr("198.18.0.1", "198.18.0.2", 1, 8, 0), make([]byte, 8)),
		"IPv4 fragment":        cat(ethHdr(0x0800), ipv4Hdr("198.18.0.1", "198.18.0.2", 17, 16, 0x2000|185), make([]byte, 16)),
		"IPv6 UDP":             cat(ethHdr(0x86dd), ipv6Hdr("fd00::1", "fd00::2", 17, 8), l4(17, 1000, 53, 0)),
		"vxlan with inner ARP": vxlan4(51000, 4789, arp),
	}
	for name, f := range outer {
		r := l.expectModel(t, name, f, ports)
		if r.action != xdpRedirect || r.vxlan != 0 {
			t.Errorf("%s: action %d inner-hash %d, want XDP_REDIRECT on the outer tuple", name, r.action, r.vxlan)
		}
	}
	// A fragment hashes without ports, so the fragments of one datagram stay together.
	a := cat(ethHdr(0x0800), ipv4Hdr("198.18.0.1", "198.18.0.2", 17, 16, 0x2000), l4(17, 1000, 53, 8))
	b := cat(ethHdr(0x0800), ipv4Hdr("198.18.0.1", "198.18.0.2", 17, 16, 2), make([]byte, 16))
	if ra, rb := l.run(t, a), l.run(t, b); ra.hash != rb.hash {
		t.Errorf("first and later fragment hash differently: %#x vs %#x", ra.hash, rb.hash)
	}
	// With VXLAN ports configured away, a VXLAN frame hashes on the outer tuple.
	l.configure(t, 2, 0, []uint16{})
	if r := l.expectModel(t, "vxlan with no ports configured", vx, []uint16{}); r.vxlan != 0 {
		t.Errorf("inner hashing with an empty port set")
	}
}

func TestSplitOffAndMissingCPU(t *testing.T) {
	l := load(t)
	frame := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	l.configure(t, 0, 0, DefaultVXLANPorts)
	if r := l.run(t, frame); r.action != xdpPass {
		t.Errorf("with no CPUs configured the frame must pass, action %d", r.action)
	}
	// A slot naming a CPU without a cpumap entry (a CPU-set change in flight): pass, never drop.
	l.configure(t, 1, 0, DefaultVXLANPorts)
	if err := l.objs.PrgGsCpus.Delete(uint32(0)); err != nil {
		t.Fatal(err)
	}
	if r := l.run(t, frame); r.action != xdpPass || r.missed != 1 {
		t.Errorf("missing cpumap entry: action %d missed %d, want XDP_PASS and a miss", r.action, r.missed)
	}
}

// TestBatchRotation: MFLOW micro-flows of B packets rotate over the slots from the flow's slot.
func TestBatchRotation(t *testing.T) {
	l := load(t)
	const n, batch = 3, 4
	l.configure(t, n, batch, DefaultVXLANPorts)
	frame := vxlan4(51000, 4789, innerTCP4(40000, 5201))
	base, _, _, _ := modelChoice(frame, n, DefaultVXLANPorts)
	for i := 0; i < 5*batch; i++ {
		r := l.run(t, frame)
		if want := (base + i/batch) % n; r.action != xdpRedirect || r.slot != want {
			t.Fatalf("packet %d: action %d slot %d, want redirect to slot %d", i, r.action, r.slot, want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	cases := map[string]Config{
		"no device":      {CPUs: []int{0}},
		"no CPUs":        {Device: "eth0"},
		"CPU twice":      {Device: "eth0", CPUs: []int{0, 0}},
		"CPU absent":     {Device: "eth0", CPUs: []int{4095}},
		"negative batch": {Device: "eth0", CPUs: []int{0}, Batch: -1},
		"queue too big":  {Device: "eth0", CPUs: []int{0}, QueueSize: MaxQueueSize + 1},
		"port 0":         {Device: "eth0", CPUs: []int{0}, VXLANPorts: []uint16{0}},
	}
	for name, c := range cases {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c, err := Config{Netns: "prg-x", Device: "eth0", CPUs: []int{0}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.QueueSize != DefaultQueueSize || len(c.VXLANPorts) != 2 || c.PinDir != PinRoot+"/prg-x/grosplit-eth0" {
		t.Errorf("defaults not applied: %+v", c)
	}
}
