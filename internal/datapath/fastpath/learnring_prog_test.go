package fastpath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// learnedRecords drains the ring of flows due for liberal marking (prg_fastpath_learned).
func learnedRecords(t *testing.T, m *ebpf.Map) [][]byte {
	t.Helper()
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rd.SetDeadline(time.Now())
	var out [][]byte
	for {
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]byte(nil), rec.RawSample...))
	}
}

func keyBytes(t *testing.T, k any) []byte {
	t.Helper()
	b, err := binary.Append(nil, binary.NativeEndian, k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// encap4 is what flannel.1 on node A sends for pod A's IPv4 frame (routed: inner MACs flannel.1's).
func encap4(inner frame) []byte {
	inner.dst, inner.src = macVxB, macVxA
	inner.ttl = 63
	b := template()
	out := append(b[:50:50], inner.bytes()...)
	binary.BigEndian.PutUint16(out[16:], uint16(len(out)-14))
	binary.BigEndian.PutUint16(out[24:], 0)
	binary.BigEndian.PutUint16(out[24:], csum(out[14:34], 0))
	binary.BigEndian.PutUint16(out[38:], uint16(len(out)-34))
	return out
}

// learner4 drives the IPv4 learners over flow k (pod A <-> pod B, protocol of k) as the normal
// path hands its frames to them.
type learner4 struct {
	e *progEnv
	k fpFpKey
}

func (l learner4) put(t *testing.T, set, clear uint32, out bool) {
	t.Helper()
	f := l.e.flow(t, l.k)
	f.Flags = f.Flags&^clear | set
	if out {
		f.OutTtlSeen = 64 // handed over: the learner's cue
	} else {
		f.InTtlSeen = 64
	}
	if err := l.e.o.PrgFastpathFlow.Put(l.k, f); err != nil {
		t.Fatal(err)
	}
}

func (l learner4) learnOut(t *testing.T) {
	t.Helper()
	l.put(t, 0, 0, true)
	fr := podFrame()
	fr.proto = l.k.Proto
	if ret, _ := l.e.run(t, l.e.o.PrgFastpathLrnTx, encap4(fr), 0); ret != tcxNext {
		t.Fatalf("egress learn: verdict %d", int32(ret))
	}
	if f := l.e.flow(t, l.k); f.OutTtlSeen != 0 || f.Flags&fOut == 0 {
		t.Fatalf("egress not learned: %+v", f)
	}
}

func (l learner4) learnIn(t *testing.T) {
	t.Helper()
	l.put(t, 0, 0, false)
	d := frame{dst: macPod, src: macBridge, saddr: podB, daddr: podA, proto: l.k.Proto, sport: 5201, dport: 40000, tcpFlags: 0x10, ttl: 63}
	if ret, _ := l.e.run(t, l.e.o.PrgFastpathLrnRx, d.bytes(), 0); ret != tcxNext {
		t.Fatalf("ingress learn: verdict %d", int32(ret))
	}
	if f := l.e.flow(t, l.k); f.InTtlSeen != 0 || f.Flags&fIn == 0 {
		t.Fatalf("ingress not learned: %+v", f)
	}
}

// The learners report a TCP flow to the agent (bpf/fastpath_learned.h) exactly when its
// conntrack entry is due for liberal marking: once when it becomes learned both ways, again at
// each egress re-learn (a new out_ns: conntrack's entry may be a new one), never at an ingress
// re-learn of a flow learned both ways, nor for UDP or an alias entry.
func TestLearnedRingIPv4(t *testing.T) {
	e := newProgEnv(t)
	k := keyOf(podA, podB, 40000, 5201, 6)
	want := keyBytes(t, k)
	l := learner4{e, k}
	e.learn(t, k, 1)
	l.put(t, 0, fIn, true) // learned one way only
	expect := func(what string, n int) {
		t.Helper()
		got := learnedRecords(t, e.o.PrgFastpathLearned)
		if len(got) != n {
			t.Fatalf("%s: %d records %x, want %d", what, len(got), got, n)
		}
		for _, r := range got {
			if !bytes.Equal(r, want) {
				t.Fatalf("%s: record %x, want the flow's key %x", what, r, want)
			}
		}
	}
	l.learnOut(t)
	expect("egress learned, ingress not", 0)
	l.learnIn(t)
	expect("learned both ways", 1)
	l.learnIn(t)
	expect("ingress re-learned", 0)
	l.learnOut(t)
	expect("egress re-learned", 1)
	l.learnOut(t)
	l.learnOut(t)
	expect("egress re-learned twice", 2)

	// UDP: no conntrack window to fall out of.
	u := learner4{e, keyOf(podA, podB, 40000, 5201, 17)}
	e.learn(t, u.k, 1)
	u.put(t, 0, fIn, true)
	u.learnIn(t)
	u.learnOut(t)
	if f := e.flow(t, u.k); f.Flags&(fOut|fIn) != fOut|fIn {
		t.Fatalf("UDP flow not learned both ways: %#x", f.Flags)
	}
	if got := learnedRecords(t, e.o.PrgFastpathLearned); len(got) != 0 {
		t.Fatalf("UDP flow: records %x, want none", got)
	}
	// An alias (a Service's translated view) is no flow of its own.
	l.put(t, fpFAlias, fIn, false)
	e.run(t, e.o.PrgFastpathLrnRx, frame{dst: macPod, src: macBridge, saddr: podB, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10, ttl: 63}.bytes(), 0)
	if got := learnedRecords(t, e.o.PrgFastpathLearned); len(got) != 0 {
		t.Fatalf("alias: records %x, want none", got)
	}
	if n := lostCount(t, e.o.PrgFastpathLearnedLost, 0); n != 0 {
		t.Fatalf("lost %d records with room in the ring", n)
	}
}

// TestLearnedRingIPv6: the same for an IPv6 flow, its record the 40-byte IPv6 key.
func TestLearnedRingIPv6(t *testing.T) {
	e := newProgEnv(t)
	e.learn6(t)
	k := key6(pod6A, pod6B, 40000, 5201, 6)
	want := keyBytes(t, k)
	got := learnedRecords(t, e.o.PrgFastpathLearned)
	if len(got) != 1 || !bytes.Equal(got[0], want) {
		t.Fatalf("learned both ways: records %x, want one of %x", got, want)
	}
	f := e.flow6(t, k)
	f.OutTtlSeen = 64
	if err := e.o.PrgFastpathFlow6.Put(k, f); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "its VXLAN frame again", e.o.PrgFastpathLrnTx, encap6(pod6Frame()), tcxNext, 0, "learned")
	got = learnedRecords(t, e.o.PrgFastpathLearned)
	if len(got) != 1 || !bytes.Equal(got[0], want) {
		t.Fatalf("egress re-learned: records %x, want one of %x", got, want)
	}
}

func lostCount(t *testing.T, m *ebpf.Map, fam uint32) uint64 {
	t.Helper()
	var per []uint64
	if err := m.Lookup(fam, &per); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}

// A report the ring has no room for is counted (the agent then walks the table once): every
// re-learn either lands in the ring or in the IPv4 family's lost count.
func TestLearnedRingFullCounts(t *testing.T) {
	o := testutil.LoadObjects(t, func() (*fpObjects, error) {
		spec, err := loadFp()
		if err != nil {
			return nil, err
		}
		if err := sizeFlowTable(spec); err != nil {
			return nil, err
		}
		spec.Maps["prg_fastpath_learned"].MaxEntries = uint32(os.Getpagesize()) // the smallest ring
		var o fpObjects
		return &o, spec.LoadAndAssign(&o, nil)
	})
	e := newProgEnv(t)
	e.o.Close()
	e.o = o
	if err := o.PrgFastpathCfg.Put(uint32(0), e.cfg); err != nil {
		t.Fatal(err)
	}
	k := keyOf(podA, podB, 40000, 5201, 6)
	e.learn(t, k, 1)
	l := learner4{e, k}
	const n = 400 // 24 bytes a record: more than a page holds
	for range n {
		l.learnOut(t)
	}
	got := learnedRecords(t, o.PrgFastpathLearned)
	lost := lostCount(t, o.PrgFastpathLearnedLost, 0)
	if lost == 0 || uint64(len(got))+lost != n || lostCount(t, o.PrgFastpathLearnedLost, 1) != 0 {
		t.Fatalf("%d re-learns: %d records, %d lost (IPv6 %d), want some lost and every one accounted for",
			n, len(got), lost, lostCount(t, o.PrgFastpathLearnedLost, 1))
	}
}
