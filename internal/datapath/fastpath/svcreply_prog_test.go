package fastpath

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// A Service reply due for re-learning (its ingress 5-s revalidation) goes to the normal path
// only where conntrack still holds the connection's translated entry. After `conntrack -F`, and
// before the agent's watch has made the flow due, the egress may have been re-learned after the
// ingress (out_ns > in_ns): a reply handed over then found no entry, created an untranslated
// one, and the pod's kernel answered it with an RST (TestServiceConntrackFlush's rare failure).
// The program now asks conntrack (bpf_skb_ct_lookup, in the netns the test run's skb belongs
// to: the calling thread's) and keeps the reply on the fast path while the entry is gone.

// inCtNetns moves the test's thread into a fresh namespace for the rest of the test, so the
// program's conntrack lookups see only the entries the test inserts there; it returns the name.
func inCtNetns(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("prg-ctk-%d", os.Getpid())
	testutil.TempNetns(t, name)
	h, err := netnsutil.Handle(name)
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread() // else the thread stays locked and dies with the test
		}
		orig.Close()
		h.Close()
	})
	return name
}

// ctInsert adds to namespace ns conntrack's entry of a TCP connection from client:40000 to
// svc:80 translated to backend:5201, established.
func ctInsert(t *testing.T, ns, client, svc, backend string) {
	t.Helper()
	argv := []string{"conntrack", "-I", "-p", "tcp", "-s", client, "-d", svc, "--sport", "40000", "--dport", "80",
		"-r", backend, "-q", client, "--reply-port-src", "5201", "--reply-port-dst", "40000",
		"--state", "ESTABLISHED", "-u", "ASSURED", "-t", "60"}
	if out, err := netnsutil.Run(context.Background(), ns, argv...); err != nil {
		t.Fatalf("%v: %v: %s", argv, err, out)
	}
}

// replyDue sets flow f's times: egress re-learned 1 s ago, ingress learned inAgo ago.
func replyDue(f *fpFpFlow, inAgo time.Duration) {
	now := monoNs()
	f.OutNs, f.InNs = now-uint64(time.Second), now-uint64(inAgo)
}

func TestServiceReplyWithoutConntrackEntry(t *testing.T) {
	testutil.RequireRoot(t)
	t.Run("ipv4", func(t *testing.T) {
		ns := inCtNetns(t)
		e := newProgEnv(t)
		e.learnDNAT(t, 6)
		e.putPod4(t)
		fk := keyOf(podA, svcAddr, 40000, 80, 6)
		due := func(inAgo time.Duration) {
			t.Helper()
			f := e.flow(t, fk)
			replyDue(&f, inAgo)
			if err := e.o.PrgFastpathFlow.Put(fk, f); err != nil {
				t.Fatal(err)
			}
		}
		reply := frame{dst: macVxA, src: macVxB, saddr: podB, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10,
			payload: []byte("the backend answers")}
		e.replyRule(t, e.o.PrgFastpathRx, 1, vx6(reply.bytes()), due, "hit", func() { // vx6 wraps any inner frame
			ctInsert(t, ns, podA.String(), svcAddr.String(), podB.String())
		})
	})
	t.Run("ipv6", func(t *testing.T) {
		onOneCPU(t)
		ns := inCtNetns(t)
		e := newProgEnv(t)
		e.learnSvc6(t, 6)
		fk := key6(pod6A, svc6, 40000, 80, 6)
		due := func(inAgo time.Duration) {
			t.Helper()
			f := e.flow6(t, fk)
			replyDue(&f, inAgo)
			if err := e.o.PrgFastpathFlow6.Put(fk, f); err != nil {
				t.Fatal(err)
			}
		}
		e.replyRule(t, e.o.PrgFastpathRx, 1, vx6(backend6Reply(6).bytes()), due, "hit", func() {
			ctInsert(t, ns, pod6A.String(), svc6.String(), pod6B.String())
		})
	})
}

// TestLocalServiceReplyWithoutConntrackEntry: the same rule for a same-node backend's reply
// (local_reply_due, fastpath_local.h), at the backend's veth.
func TestLocalServiceReplyWithoutConntrackEntry(t *testing.T) {
	testutil.RequireRoot(t)
	ns := inCtNetns(t)
	e := newProgEnv(t)
	cl, be := e.localSvc(t)
	ck, bk := keyOf(podA, svcAddr, 40000, 80, 6), keyOf(podA2, podA, 5201, 40000, 6)
	due := func(outAgo time.Duration) {
		t.Helper()
		now := monoNs()
		cl.OutNs, be.OutNs, be.InNs = now-uint64(time.Second), now-uint64(outAgo), now-uint64(outAgo)
		if err := e.o.PrgFastpathFlow.Put(ck, cl); err != nil {
			t.Fatal(err)
		}
		if err := e.o.PrgFastpathFlow.Put(bk, be); err != nil {
			t.Fatal(err)
		}
	}
	rep := frame{dst: macPod, src: macPo2, saddr: podA2, daddr: podA, proto: 6, sport: 5201, dport: 40000, tcpFlags: 0x10,
		payload: []byte("reply from the backend")}
	e.replyRule(t, e.o.PrgFastpathTx, 0, rep.bytes(), due, "local", func() {
		ctInsert(t, ns, podA.String(), svcAddr.String(), podA2.String())
	})
}

// replyRule runs a Service reply pkt, due for re-learning, through prog (direction dir) three
// times: due(age) sets how long ago the reply's direction was learned (its client's egress
// re-learned after it). No conntrack entry: delivered (counted hit). Two intervals old: the
// normal path (stale). With the translated entry insert puts in: the normal path (stale).
func (e *progEnv) replyRule(t *testing.T, prog *ebpf.Program, dir int, pkt []byte, due func(time.Duration), hit string, insert func()) {
	t.Helper()
	due(6 * time.Second)
	e.expect(t, "reply due, no conntrack entry", prog, pkt, tcActRedirect, dir, hit)
	due(11 * time.Second)
	e.expect(t, "reply due, no entry, 2 intervals old", prog, pkt, tcxNext, dir, "stale")
	insert()
	due(6 * time.Second)
	e.expect(t, "reply due, entry there", prog, pkt, tcxNext, dir, "stale")
}

// putPod4 registers pod A (slot 7, on "lo") in the endpoint table, as a delivery needs.
func (e *progEnv) putPod4(t *testing.T) {
	t.Helper()
	pod := fpPrgPod{Slot: 7, Ifindex: 1}
	copy(pod.CtrMac[:], macPod)
	copy(pod.BrMac[:], macBridge)
	if err := e.o.PrgFastpathPort.Put(pod.Slot, fpBpfDevmapVal{Ifindex: 1}); err != nil {
		t.Fatal(err)
	}
	k := fpPrgPodKey{Netns: e.cfg.Netns, Family: 4, Addr: [4]uint32{binary.LittleEndian.Uint32(podA.AsSlice())}}
	if err := e.o.PrgFastpathEp.Put(k, pod); err != nil {
		t.Fatal(err)
	}
}
