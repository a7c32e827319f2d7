package prism

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

const tcxNext = 0xffffffff // TCX_NEXT (-1) as the run's return value

// encap wraps an inner frame as the underlay receives it: outer Ethernet/IPv4/UDP to port/VXLAN.
func encap(inner []byte, port uint16) []byte { return frames.Encap(49152, port, 4096, inner) }

// isoEnv is the program set with the rules of the ping-pong and an isolation plan.
func isoEnv(t *testing.T, c *isoConfig) *progEnv {
	t.Helper()
	e := newProgEnv(t, false, "proto=udp dport=11111; proto=tcp sport=11111")
	if c != nil {
		if err := e.o.writeIso(c, []uint16{4789, 8472}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// runNIC runs prg_prism_nic on frame and returns the decision it recorded (ok false: none). The
// program must pass the frame on unchanged (tcx "next").
func runNIC(t *testing.T, e *progEnv, frame []byte) (prsPrismLast, bool) {
	t.Helper()
	n, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	mark := make([]prsPrismLast, n)
	for i := range mark {
		mark[i].Hp = 0xff
	}
	if err := e.o.PrgPrismLast.Put(uint32(0), mark); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(frame)+256)
	ret, err := e.o.PrgPrismNic.Run(&ebpf.RunOptions{Data: frame, DataOut: out})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	if ret != tcxNext {
		t.Fatalf("program returned %#x, want TCX_NEXT", ret)
	}
	if !bytes.Equal(out[:len(frame)], frame) {
		t.Fatal("program changed the frame")
	}
	var per []prsPrismLast
	if err := e.o.PrgPrismLast.Lookup(uint32(0), &per); err != nil {
		t.Fatal(err)
	}
	for _, l := range per {
		if l.Hp != 0xff {
			return l, true
		}
	}
	return prsPrismLast{}, false
}

// isoFlow is inner flow i: HP (the ping-pong port) or LP (a bulk port), TCP or UDP, IPv4 or IPv6.
func isoFlow(i int, hp bool) frame {
	f := frame{dst: ctrMAC, src: srcCtrMAC, saddr: peerIP, daddr: ctrIP, proto: 17, sport: uint16(30000 + i), dport: 5201, payload: 16}
	if hp {
		f.dport = 11111
	}
	if i%2 == 1 { // TCP: HP by its source port (the server's replies)
		f.proto, f.sport, f.dport = 6, f.dport, f.sport
		if hp {
			f.sport = 11111
		} else {
			f.sport = 5201
		}
	}
	if i%3 == 2 {
		f.v6, f.saddr, f.daddr = true, peerIP6, ctrIP6
	}
	return f
}

func plan(hp, lp []int) *isoConfig {
	return &isoConfig{HP: hp, LP: lp, Set: slices.Sorted(slices.Values(append(slices.Clone(hp), lp...)))}
}

// isoPlans are CPU plans with 1..8 reserved CPUs, contiguous and not, so the RPS index (the CPU's
// position in the ascending set) differs from the CPU id. They leave out CPUs 0 and 1, where the
// test runs (pinned), so every packet is steered; TestIsolationKeepsPacketsOnTheirClassCPU covers
// packets that already are on a CPU of their class.
func isoPlans() []*isoConfig {
	var out []*isoConfig
	for k := 1; k <= 8; k++ {
		var hp, lp, hpOdd, lpEven []int
		for c := 0; c < k; c++ {
			hp = append(hp, 18-k+c) // the top k of 2..17
			hpOdd = append(hpOdd, 2*c+3)
			lpEven = append(lpEven, 2*c+2)
		}
		for c := 2; c < 18-k; c++ {
			lp = append(lp, c)
		}
		out = append(out, plan(hp, lp), plan(hpOdd, append(lpEven, 40)))
	}
	return out
}

// pinThread moves the (locked) test thread to cpu for the rest of the test.
func pinThread(t *testing.T, cpu int) {
	t.Helper()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Skipf("cannot pin to CPU %d: %v", cpu, err)
	}
	t.Cleanup(func() { _ = unix.SchedSetaffinity(0, &old) })
}

// checkSteer checks a recorded decision against the model and against what RPS will do.
func checkSteer(t *testing.T, c *isoConfig, hp bool, got prsPrismLast) (cpu int) {
	t.Helper()
	if (got.Hp == 1) != hp {
		t.Fatalf("classified hp=%d, want %v", got.Hp, hp)
	}
	class := c.LP
	if hp {
		class = c.HP
	}
	idx, hash := c.steer(hp, got.FlowHash, int(got.Cpu))
	if got.Idx != idx || got.Hash != hash {
		t.Fatalf("on CPU %d: program idx %#x hash %#x, model idx %#x hash %#x", got.Cpu, got.Idx, got.Hash, idx, hash)
	}
	if idx == idxStay {
		// Hash 0: get_rps_cpu finds no hash and leaves the packet on this CPU.
		if !slices.Contains(class, int(got.Cpu)) || got.Hash != 0 {
			t.Fatalf("kept on CPU %d (hash %#x), not a CPU of %v", got.Cpu, got.Hash, class)
		}
		return int(got.Cpu)
	}
	n := uint32(len(c.Set))
	if got.Hash == 0 || datapath.ReciprocalScale(got.Hash, n) != got.Idx {
		t.Fatalf("hash %#x maps to RPS index %d, program chose %d", got.Hash, datapath.ReciprocalScale(got.Hash, n), got.Idx)
	}
	cpu = c.Set[got.Idx]
	if !slices.Contains(class, cpu) {
		t.Fatalf("RPS lands on CPU %d, not in %v", cpu, class)
	}
	return cpu
}

func TestIsolationSteersHPToReservedCPUs(t *testing.T) {
	for _, c := range isoPlans() {
		t.Run(fmt.Sprintf("hp=%s,lp=%s", cpuset.Format(c.HP), cpuset.Format(c.LP)), func(t *testing.T) {
			e := isoEnv(t, c)
			pinThread(t, 0)
			used := map[bool]map[int]bool{true: {}, false: {}}
			before := e.stats()
			for i := 0; i < 64; i++ {
				for _, hp := range []bool{true, false} {
					f := isoFlow(i, hp)
					got, ok := runNIC(t, e, encap(f.bytes(), 4789))
					if !ok {
						t.Fatalf("flow %d: no decision recorded", i)
					}
					cpu := checkSteer(t, c, hp, got)
					// The same flow again: the same CPU (a flow is never reordered across CPUs).
					again, _ := runNIC(t, e, encap(f.bytes(), 4789))
					if again.Hash != got.Hash {
						t.Fatalf("flow %d: hash changed between packets (%#x, %#x)", i, got.Hash, again.Hash)
					}
					used[hp][cpu] = true
				}
			}
			// Flows spread over every CPU of their class.
			for hp, want := range map[bool][]int{true: c.HP, false: c.LP} {
				if len(want) <= 8 && len(used[hp]) != len(want) {
					t.Errorf("hp=%v flows used CPUs %v, want all of %v", hp, used[hp], want)
				}
			}
			s := e.stats()
			if s.IsoHP-before.IsoHP != 128 || s.IsoLP-before.IsoLP != 128 || s.IsoVXLAN-before.IsoVXLAN != 256 {
				t.Errorf("counters: %+v", s)
			}
		})
	}
}

// On the 2-vCPU lab's plan: a packet whose NIC stage already runs on a CPU of its class stays
// there with hash 0 (no RPS hop), the others are steered to the other CPU.
func TestIsolationKeepsPacketsOnTheirClassCPU(t *testing.T) {
	if cpus, _ := cpuset.Online(); !slices.Contains(cpus, 1) {
		t.Skip("needs CPUs 0 and 1")
	}
	c := plan([]int{1}, []int{0})
	for _, at := range []int{0, 1} {
		t.Run(fmt.Sprintf("on CPU %d", at), func(t *testing.T) {
			e := isoEnv(t, c)
			pinThread(t, at)
			before := e.stats()
			for i := 0; i < 16; i++ {
				for _, hp := range []bool{true, false} {
					got, ok := runNIC(t, e, encap(isoFlow(i, hp).bytes(), 4789))
					if !ok {
						t.Fatal("no decision recorded")
					}
					if int(got.Cpu) != at {
						t.Fatalf("ran on CPU %d, pinned to %d", got.Cpu, at)
					}
					want := 1
					if !hp {
						want = 0
					}
					if cpu := checkSteer(t, c, hp, got); cpu != want {
						t.Fatalf("hp=%v from CPU %d ends on CPU %d, want %d", hp, at, cpu, want)
					}
					if stay := got.Idx == idxStay; stay != (at == want) {
						t.Fatalf("hp=%v on CPU %d: kept=%v", hp, at, stay)
					}
				}
			}
			if s := e.stats(); s.IsoStay-before.IsoStay != 16 {
				t.Errorf("kept %d packets, want 16", s.IsoStay-before.IsoStay)
			}
		})
	}
}

func TestIsolationEdgeFrames(t *testing.T) {
	c := plan([]int{3}, []int{2}) // neither is the test's CPU: every packet is steered
	e := isoEnv(t, c)
	pinThread(t, 0)
	hp := isoFlow(0, true)

	// Not VXLAN (another UDP port): untouched, no decision.
	if got, ok := runNIC(t, e, encap(hp.bytes(), 9999)); ok {
		t.Errorf("frame to a non-VXLAN port was steered: %+v", got)
	}
	// Flannel's port is configured too.
	if got, ok := runNIC(t, e, encap(hp.bytes(), 8472)); !ok || got.Hp != 1 {
		t.Errorf("HP frame on port 8472: %+v %v", got, ok)
	}
	// Inner frames the rules cannot read (ARP, VLAN tag) never land on a reserved CPU.
	arp := append(append(append(append([]byte{}, ctrMAC...), srcCtrMAC...), 0x08, 0x06), make([]byte, 28)...)
	vlan := hp
	vlan.vlan = true
	for name, inner := range map[string][]byte{"arp": arp, "vlan": vlan.bytes()} {
		got, ok := runNIC(t, e, encap(inner, 4789))
		if !ok || got.Hp != 0 || c.Set[datapath.ReciprocalScale(got.Hash, 2)] != 2 {
			t.Errorf("%s: %+v %v, want LP on CPU 2", name, got, ok)
		}
	}
	// A truncated outer header: untouched.
	if _, ok := runNIC(t, e, encap(hp.bytes(), 4789)[:14+20+4]); ok {
		t.Error("truncated frame was steered")
	}
	// Fragments of an HP datagram: no ports, so LP, and every fragment of it on one CPU.
	fr := hp
	fr.fragOff = 0x2000
	a, _ := runNIC(t, e, encap(fr.bytes(), 4789))
	fr.fragOff = 100
	b, _ := runNIC(t, e, encap(fr.bytes(), 4789))
	if a.Hp != 0 || a.Hash != b.Hash {
		t.Errorf("fragments: %+v, %+v", a, b)
	}
}

func TestIsolationOffLeavesFramesAlone(t *testing.T) {
	e := isoEnv(t, nil) // prism without --hp-cpus: the map is all zero
	before := e.stats()
	if got, ok := runNIC(t, e, encap(isoFlow(0, true).bytes(), 4789)); ok {
		t.Errorf("steered without isolation: %+v", got)
	}
	if s := e.stats(); s != before {
		t.Errorf("counters moved without isolation: %+v", s)
	}
}

func TestParseIsolation(t *testing.T) {
	online, err := cpuset.Online()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := parseIsolation(nil, ""); c != nil || err != nil {
		t.Errorf("no --hp-cpus: %+v %v", c, err)
	}
	last := online[len(online)-1]
	bad := map[string]string{
		"x":                   "not a CPU list",
		"3-1":                 "not a CPU list",
		"-1":                  "not a CPU list",
		"4096":                "offline or absent",
		cpuset.Format(online): "reserves every CPU",
		fmt.Sprint(last + 1):  "offline or absent",
	}
	for v, want := range bad {
		if _, err := parseIsolation(nil, v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--hp-cpus %q: %v, want an error saying %q", v, err, want)
		}
	}
	if len(online) < 2 {
		t.Skip("needs 2 online CPUs")
	}
	c, err := parseIsolation(nil, fmt.Sprint(last))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.HP, []int{last}) || slices.Contains(c.LP, last) || len(c.Set) != len(online) {
		t.Errorf("plan %+v", c)
	}
	// --cpus bounds where LP goes; reserving all of --cpus is refused.
	if _, err := parseIsolation([]int{last}, fmt.Sprint(last)); err == nil {
		t.Error("reserving every CPU of --cpus was accepted")
	}
	c, err = parseIsolation([]int{online[0]}, fmt.Sprint(last))
	if err != nil || !slices.Equal(c.LP, []int{online[0]}) || !slices.Equal(c.Set, []int{online[0], last}) {
		t.Errorf("with --cpus: %+v %v", c, err)
	}
}

// TestIsolationUpdatesAreAtomic: the isolation config is double-buffered. What a writer puts in
// the slot not in use is never seen; writeIso flips to a complete new plan (classes of the old
// plan gone with it) and back.
func TestIsolationUpdatesAreAtomic(t *testing.T) {
	a, b := plan([]int{5}, []int{2, 3}), plan([]int{2, 3}, []int{0, 4, 6})
	e := isoEnv(t, a)
	pinThread(t, 0)
	check := func(c *isoConfig) {
		t.Helper()
		for i := 0; i < 16; i++ {
			for _, hp := range []bool{true, false} {
				got, ok := runNIC(t, e, encap(isoFlow(i, hp).bytes(), 4789))
				if !ok {
					t.Fatalf("flow %d: no decision recorded", i)
				}
				checkSteer(t, c, hp, got)
			}
		}
	}
	check(a)
	var act uint32
	if err := e.o.PrgPrismIsoact.Lookup(uint32(0), &act); err != nil {
		t.Fatal(err)
	}
	// A half-written config in the other slot (every index pointing at CPU 0's position) and
	// classes that would keep everything on CPU 0: not in use, so not seen.
	junk := prsPrismIso{N: 7, HpCount: 1, LpCount: 1}
	if err := e.o.PrgPrismIso.Put(act^1, junk); err != nil {
		t.Fatal(err)
	}
	if err := e.o.PrgPrismCpucls.Put((act^1)*maxCPUID, uint8(clsHP)); err != nil {
		t.Fatal(err)
	}
	check(a)
	for _, c := range []*isoConfig{b, a, b} {
		if err := e.o.writeIso(c, []uint16{4789, 8472}); err != nil {
			t.Fatal(err)
		}
		check(c) // b keeps LP packets on CPU 0 (hash 0); a steers them away: a's classes are gone
	}
}

// napi_threaded is a plain bool option: anything else is refused before anything changes.
func TestNAPIThreadedOption(t *testing.T) {
	c, err := ParseConfig(nil, map[string]string{OptRules: hpRules, "napi_threaded": "true"})
	if err != nil || !c.NAPIThreaded {
		t.Fatalf("napi_threaded=true: %+v %v", c.NAPIThreaded, err)
	}
	if c, err := ParseConfig(nil, map[string]string{OptRules: hpRules}); err != nil || c.NAPIThreaded {
		t.Fatalf("default: napi_threaded %v %v, want off", c.NAPIThreaded, err)
	}
	for _, bad := range []string{"maybe", "2", "", "1; rm -rf /"} {
		if _, err := ParseConfig(nil, map[string]string{OptRules: hpRules, "napi_threaded": bad}); err == nil {
			t.Errorf("napi_threaded=%q accepted", bad)
		}
	}
}
