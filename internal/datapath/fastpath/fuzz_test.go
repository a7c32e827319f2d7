package fastpath

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/testutil/frames"
)

// Fuzzing the flannel-layout programs (prg_fastpath_tx, prg_fastpath_rx and their learners)
// against a Go model of their decisions, over flow and pod tables filled so that hits, misses
// and every fallback happen among the generated frames: a frame whose flow is cached, learned
// both ways, fresh, and passes every check is encapsulated (tx) or decapsulated and handed to
// the pod (rx) exactly as the model builds it; every other frame returns TCX_NEXT unchanged.
// The learners always return TCX_NEXT unchanged and learn exactly the flows the model says,
// with the model's values. The suite runs a slice; `make fuzz` a million frames per program.
// This file holds the tables and the harness; the model, the frame generator and the tests of
// each layout stand in fuzz_model_test.go, fuzz_gen_test.go, fuzz_flannel_test.go and
// fuzz_docker_test.go.

const (
	fzNetns   = 4026531840
	fzMTU     = 1500
	fzVNI     = 1
	fzPort    = 8472
	fzOtherIf = 9 // an ifindex no pod or flow should ever be delivered to
)

var (
	fzLocal  = []netip.Addr{podA, frames.Addr("198.19.1.3"), frames.Addr("198.19.1.4"), frames.Addr("198.19.1.5"), frames.Addr("198.19.1.6")}
	fzRemote = []netip.Addr{podB, frames.Addr("198.19.2.3")}
	fzVtepX  = frames.Addr("198.18.0.9") // a VTEP no flow was learned from
	fzLoMAC  = net.HardwareAddr{0, 0, 0, 0, 0, 0}
)

// Pod states: delivered to, gone (tombstone), stale (no devmap slot), stale (slot holds
// another ifindex than recorded).
const (
	podLive = iota
	podGone
	podNoSlot
	podMoved
)

type fzPod struct {
	v     fpPrgPod
	state int
}

type fzEnv struct {
	t     *testing.T
	o     *fpObjects
	cfg   fpFpCfg
	flows map[fpFpKey]fpFpFlow
	stale map[fpFpKey]bool // learned longer ago than FP_REVALIDATE_NS
	keys  []fpFpKey
	pods  map[uint32]fzPod
	rng   *rand.Rand
}

func word(a netip.Addr) uint32 { return binary.LittleEndian.Uint32(a.AsSlice()) }

func podMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0xcc, 0, 0, 0, byte(i)} }

// newFzEnv loads the objects, configures a routed flannel overlay on "lo" and fills the pod
// table (pods 0 and 4 live, 1 gone, 2 without a devmap slot, 3 moved to another veth) and the flow table: every local
// pod with every remote one over TCP, UDP and ICMP echo, each flow with its own template and
// MACs, most learned both ways and consistent, some learned one way, on another veth, from
// another VTEP, with another MAC or veth than the pod's, or stale. learner: the flows also
// carry the TTLs the fast path saw on handover (what the learners look for).
func newFzEnv(t *testing.T, learner bool) *fzEnv { return newFzEnvLayout(t, learner, false) }

// newFzEnvLayout is newFzEnv for the flannel layout or (docker) the docker one: the VXLAN device
// on "lo", the flows' templates the bridge's Ethernet header.
func newFzEnvLayout(t *testing.T, learner, docker bool) *fzEnv {
	t.Helper()
	o := testutil.LoadObjects(t, loadObjects)
	ov := &overlay{Layout: LayoutRouted, VNI: fzVNI, Port: fzPort, VTEP: net.IP(vtepA.AsSlice()), PortMin: 32768, PortMax: 60999, MTU: fzMTU,
		Underlay: devOf(1), VX: endpoints.VXLAN{Dev: devOf(1), MAC: macVxA, Inode: fzNetns, Routed: true}}
	cfg := ov.cfg()
	if docker {
		cfg.Flags |= cDocker
		cfg.VxIfindex = 1
	}
	e := &fzEnv{t: t, o: o, cfg: cfg, flows: map[fpFpKey]fpFpFlow{}, stale: map[fpFpKey]bool{}, pods: map[uint32]fzPod{},
		rng: rand.New(rand.NewPCG(7, 11))}
	if err := o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}
	for i, a := range fzLocal {
		p := fzPod{v: fpPrgPod{Slot: uint32(100 + i), Ifindex: 1}, state: []int{podLive, podGone, podNoSlot, podMoved, podLive}[i]}
		copy(p.v.CtrMac[:], podMAC(i))
		copy(p.v.BrMac[:], macBridge)
		if p.state == podGone {
			p.v.Flags = 1
		}
		if p.state != podNoSlot {
			ifx := uint32(1)
			if err := o.PrgFastpathPort.Put(p.v.Slot, fpBpfDevmapVal{Ifindex: ifx}); err != nil {
				t.Fatal(err)
			}
		}
		if p.state == podMoved {
			p.v.Ifindex = fzOtherIf
		}
		if err := o.PrgFastpathEp.Put(fpPrgPodKey{Netns: fzNetns, Family: 4, Addr: [4]uint32{word(a)}}, p.v); err != nil {
			t.Fatal(err)
		}
		e.pods[word(a)] = p
	}
	rng := rand.New(rand.NewPCG(3, 5))
	idx := 0
	for li, l := range fzLocal {
		for _, r := range fzRemote {
			for _, c := range []struct {
				proto        uint8
				lport, rport uint16
			}{{6, 40000, 5201}, {17, 53000, 53}, {1, 77, 77}} {
				idx++
				k := keyOf(l, r, c.lport, c.rport, c.proto)
				f := fpFpFlow{Vtep: word(vtepB), OutIfindex: 1, InIfindex: e.pods[word(l)].v.Ifindex, Flags: fOut | fIn,
					OutTtlDec: uint8(rng.IntN(3)), InTtlDec: uint8(rng.IntN(3))}
				copy(f.Tmpl[:], template())
				f.Tmpl[11] = byte(idx)                                     // outer source MAC: which flow's template
				binary.BigEndian.PutUint16(f.Tmpl[34:], uint16(33000+idx)) // outer UDP source port
				f.Tmpl[15] = byte(rng.IntN(64)) << 2                       // outer DSCP
				binary.BigEndian.PutUint16(f.Tmpl[24:], 0)                 // outer IPv4 checksum: the program's
				copy(f.InMac[:6], podMAC(li))
				copy(f.InMac[6:], net.HardwareAddr{0x02, 0xbb, 0, 0, 0, byte(idx)}) // which flow's MACs
				switch rng.IntN(14) {
				case 0:
					f.Flags = fOut
				case 1:
					f.Flags = fIn
				case 2:
					f.Flags = 0
				case 3:
					f.OutIfindex = fzOtherIf
				case 4:
					f.Vtep = word(fzVtepX)
				case 5:
					f.InMac[0] ^= 0x10
				case 6:
					f.InIfindex = fzOtherIf
				case 7:
					e.stale[k] = true
				}
				if c.proto == 6 && idx%3 != 0 {
					// Learned from its handshake only: its FIN and RST ride the fast path
					// (bpf/fastpath.h FP_F_HSONLY); every third TCP flow is tracked instead.
					f.Flags |= fHsOnly
				}
				if docker { // the Ethernet header the bridge sent the flow to the VXLAN device with
					copy(f.Tmpl[0:], macBridge)
					copy(f.Tmpl[6:], macPod)
					if rng.IntN(10) == 0 {
						f.Tmpl[11] ^= 0x40
					}
				}
				if learner {
					seen := []uint8{0, 1, 2, 63, 64, 65, 255}
					f.OutTtlSeen, f.InTtlSeen = seen[rng.IntN(len(seen))], seen[rng.IntN(len(seen))]
				}
				e.flows[k] = f
				e.keys = append(e.keys, k)
			}
		}
	}
	e.install()
	return e
}

// install (re)writes the flow table as the model holds it: the learned flows with fresh or
// stale timestamps, and nothing else (the handovers of missed frames add entries; the table
// is an LRU that could otherwise evict a learned flow).
func (e *fzEnv) install() {
	e.t.Helper()
	var k fpFpKey
	var v fpFpFlow
	var extra []fpFpKey
	it := e.o.PrgFastpathFlow.Iterate()
	for it.Next(&k, &v) {
		if _, ok := e.flows[k]; !ok {
			extra = append(extra, k)
		}
	}
	for _, k := range extra {
		_ = e.o.PrgFastpathFlow.Delete(k)
	}
	now := monoNs()
	for _, k := range e.keys {
		f := e.flows[k]
		f.OutNs, f.InNs = now, now
		if e.stale[k] {
			f.OutNs, f.InNs = now-uint64(10*time.Second), now-uint64(10*time.Second)
		}
		if err := e.o.PrgFastpathFlow.Put(k, f); err != nil {
			e.t.Fatal(err)
		}
	}
}

// fzRun runs p on pkt; gso > 0 passes GSO metadata (gso_size, gso_segs) in the context, mark
// a skb mark. It returns the verdict, the frame after the program and the mark after it.
func (e *fzEnv) fzRun(p *ebpf.Program, pkt []byte, gso, mark uint32) (uint32, []byte, uint32) {
	out := make([]byte, len(pkt)+128)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ctx := make([]byte, 192) // struct __sk_buff: mark at 8, wire_len 160, gso_segs 164, gso_size 176
	binary.LittleEndian.PutUint32(ctx[8:], mark)
	if gso > 0 {
		binary.LittleEndian.PutUint32(ctx[160:], uint32(len(pkt)))
		binary.LittleEndian.PutUint32(ctx[164:], 2)
		binary.LittleEndian.PutUint32(ctx[176:], gso)
	}
	ctxOut := make([]byte, 192)
	opts.Context, opts.ContextOut = ctx, ctxOut
	ret, err := p.Run(opts)
	if err != nil {
		e.t.Fatalf("test run: %v (gso %d, % x)", err, gso, pkt)
	}
	return ret, opts.DataOut, binary.LittleEndian.Uint32(ctxOut[8:])
}

// fzCovered logs how many of the runs took the program's path (what: "encapsulated", ...) and
// fails when none or all did: the generator would then miss a path.
func fzCovered(t *testing.T, runs, hits int, what string) {
	t.Helper()
	t.Logf("%d frames, %d %s", runs, hits, what)
	if hits == 0 || hits == runs {
		t.Fatalf("%d of %d frames %s: the generator misses a path", hits, runs, what)
	}
}

// fzEach runs n frames from gen through check, every 4096th frame also truncated at every
// offset, and reinstalls the tables every 2048 runs (timestamps fresh, handover entries gone).
func (e *fzEnv) fzEach(n int, gen func() []byte, check func([]byte)) int {
	runs := 0
	return frames.Each(e.t.Failed, n, 4096, gen, func(b []byte) {
		if runs%2048 == 0 {
			e.install()
		}
		runs++
		check(b)
	})
}

func (e *fzEnv) counters(t *testing.T) (Direction, Direction) {
	return (&progEnv{o: e.o}).counters(t)
}
