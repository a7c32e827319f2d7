package fastpath

import (
	"encoding/binary"
	"net"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// BenchmarkHitCost times one fast-path hit of each direction with BPF_PROG_TEST_RUN (the
// program alone, warm caches: a floor for what the bench's BPF statistics measure under load).
//
//	go test -run '^$' -bench HitCost ./internal/datapath/fastpath/
func BenchmarkHitCost(b *testing.B) {
	testutil.RequireRoot(b)
	o, err := loadObjects()
	if p := os.Getenv("PRG_FP_OBJ"); p != "" { // another build of bpf/fastpath.bpf.c, to compare
		o.Close()
		o = &fpObjects{}
		spec, serr := ebpf.LoadCollectionSpec(p)
		if serr != nil {
			b.Fatal(serr)
		}
		err = spec.LoadAndAssign(o, nil)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	ov := &overlay{Layout: LayoutRouted, VNI: 1, Port: 8472, VTEP: net.IP(vtepA.AsSlice()), PortMin: 32768, PortMax: 60999, MTU: 1500,
		Underlay: devOf(1), VX: endpoints.VXLAN{Dev: devOf(1), MAC: macVxA, Inode: 4026531840, Routed: true}}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(o.PrgFastpathCfg.Put(uint32(0), ov.cfg()))
	pod := fpPrgPod{Slot: 7, Ifindex: 1}
	copy(pod.CtrMac[:], macPod)
	copy(pod.BrMac[:], macBridge)
	must(o.PrgFastpathPort.Put(pod.Slot, fpBpfDevmapVal{Ifindex: 1}))
	must(o.PrgFastpathEp.Put(fpPrgPodKey{Netns: 4026531840, Family: 4, Addr: [4]uint32{binary.LittleEndian.Uint32(podA.AsSlice())}}, pod))
	// Flows are (re)installed before each case: a case runs for about a second, and a flow
	// learned more than 5 s ago is due for re-learning (not a hit).
	learnAll := func() {
		for _, proto := range []uint8{6, 17} {
			f := fpFpFlow{Vtep: binary.LittleEndian.Uint32(vtepB.AsSlice()), OutIfindex: 1, InIfindex: 1, OutNs: monoNs(), InNs: monoNs(),
				Flags: fOut | fIn, OutTtlDec: 1, InTtlDec: 1}
			copy(f.Tmpl[:], template())
			copy(f.InMac[:6], macPod)
			copy(f.InMac[6:], macBridge)
			must(o.PrgFastpathFlow.Put(keyOf(podA, podB, 40000, 5201, proto), f))
		}
		// A Service flow (client port 40001 to svcAddr:80, translated to pod B:5201) and its alias.
		nf := fpFpFlow{Vtep: binary.LittleEndian.Uint32(vtepB.AsSlice()), OutIfindex: 1, InIfindex: 1, OutNs: monoNs(), InNs: monoNs(),
			Flags: fOut | fIn | fDNAT, OutTtlDec: 1, InTtlDec: 1, NatAddr: binary.LittleEndian.Uint32(podB.AsSlice()), NatPort: htons(5201)}
		copy(nf.Tmpl[:], template())
		copy(nf.InMac[:6], macPod)
		copy(nf.InMac[6:], macBridge)
		must(o.PrgFastpathFlow.Put(keyOf(podA, svcAddr, 40001, 80, 6), nf))
		must(o.PrgFastpathFlow.Put(keyOf(podA, podB, 40001, 5201, 6),
			fpFpFlow{Flags: fAlias, NatAddr: binary.LittleEndian.Uint32(svcAddr.AsSlice()), NatPort: htons(80)}))
	}
	lo := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	for _, c := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
		want  uint32
	}{
		{"tx-udp64", o.PrgFastpathTx, frame{dst: macBridge, src: macPod, saddr: podA, daddr: podB, proto: 17, sport: 40000, dport: 5201, payload: make([]byte, 64)}.bytes(), tcActRedirect},
		{"rx-udp64", o.PrgFastpathRx, frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
			payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 17, sport: 5201, dport: 40000, payload: make([]byte, 64)}.bytes()...)}.bytes(), tcActRedirect},
		{"rx-tcp1448", o.PrgFastpathRx, frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
			payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10, payload: make([]byte, 1398)}.bytes()...)}.bytes(), tcActRedirect},
		{"tx-tcp1448", o.PrgFastpathTx, frame{dst: macBridge, src: macPod, saddr: podA, daddr: podB, proto: 6, sport: 40000, dport: 5201, tcpFlags: 0x10, payload: make([]byte, 1398)}.bytes(), tcActRedirect},
		{"tx-tcp1448-service", o.PrgFastpathTx, frame{dst: macBridge, src: macPod, saddr: podA, daddr: svcAddr, proto: 6, sport: 40001, dport: 80, tcpFlags: 0x10, payload: make([]byte, 1398)}.bytes(), tcActRedirect},
		{"rx-tcp1448-service", o.PrgFastpathRx, frame{dst: lo, src: macNicB, saddr: vtepB, daddr: vtepA, proto: 17, sport: 40001, dport: 8472,
			payload: append([]byte{8, 0, 0, 0, 0, 0, 1, 0}, frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 6, sport: 5201, dport: 40001, tcpFlags: 0x10, payload: make([]byte, 1398)}.bytes()...)}.bytes(), tcActRedirect},
	} {
		b.Run(c.name, func(b *testing.B) {
			learnAll()
			ret, err := c.prog.Run(&ebpf.RunOptions{Data: c.frame, DataOut: make([]byte, len(c.frame)+128)})
			if err != nil {
				b.Fatal(err)
			}
			if ret != c.want {
				b.Fatalf("verdict %d, want %d (not a hit)", int32(ret), c.want)
			}
			var total float64
			for i := 0; i < b.N; i++ {
				_, d, err := c.prog.Benchmark(c.frame, 100000, nil)
				if err != nil {
					b.Fatal(err)
				}
				total += float64(d.Nanoseconds())
			}
			b.ReportMetric(total/float64(b.N), "ns/run")
		})
	}
}
