package fastpath

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Conntrack sees a fast-path TCP flow only on its re-learn packets (one per direction every
// 5 s): their sequence and ack numbers are then far beyond the window conntrack last saw, and
// strict window tracking calls them INVALID, which kube-proxy's KUBE-FORWARD (and most
// stateful firewalls) drop: the flow would stall at its first re-learn. Only those entries
// need liberal tracking, so the agent sets conntrack's per-entry flag
// IP_CT_TCP_FLAG_BE_LIBERAL (ctnetlink, both directions) on the entry of every TCP flow the
// fast path has learned both ways, within ctLiberalEvery of the learn and well before the
// first re-learn, and again after each re-learn (a new entry under the same tuple). Every
// other connection of the node keeps strict tracking, and nf_conntrack_tcp_be_liberal is
// left alone. A connection that ends before it is marked (a short one: learned from its
// handshake and never re-learned, FP_F_HSONLY) sends its FIN and RST on the fast path instead,
// since conntrack would call them INVALID too (bpf/fastpath.h). (An entry conntrack picks up mid-stream, after a flush, is liberal already:
// nf_conntrack_proto_tcp.c sets the flag itself there.) Where the namespace is liberal
// already (kube-proxy's --conntrack-tcp-be-liberal), nothing is sent.

const ctLiberalEvery = time.Second

const conntrackLiberal = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"

// A forgotten TCP flow meets the same check sooner: its next packet takes the normal path
// with sequence numbers as far beyond conntrack's window as the fast path carried it, and a
// flow forgotten within ctLiberalEvery of its learn (a rule change, which on a Kubernetes node
// comes in bursts every few seconds: kube-proxy's and the policy controller's syncs) was not
// marked yet. Dropped as INVALID, that packet is never learned again, nor is its peer's
// retransmission: the connection stalls for good (measured on the k8s lab: "i/o timeout" of a
// Service connection while kube-proxy restarted). So forget marks the entries of the TCP
// flows it removes first (liberalBeforeForget), synchronously, before their map entries go.

// flowTable is one address family's flow table as the agent's walks see it: the IPv4 table
// (fpFpKey, conntrack tuple ctTuple) and the IPv6 one (fpFpKey6, ctTuple6, ctliberal6.go) share
// the liberal marking, the marking before a forget and the forget itself through it.
type flowTable[K comparable, T any] struct {
	m     *ebpf.Map
	label string                   // how the log names the family's marking
	tuple func(K) (T, uint8)       // the conntrack tuple of the flow of key k, and its protocol
	send  func(*ctSock, []T) error // marks the tuples' entries liberal
	pcnt  func(K) uint64           // the per-address counter a forgotten entry counts down; nil: none
	// side holds what a translated entry (a Service flow or its alias) keeps beside it under
	// the same key (IPv6: prg_fastpath_nat6, the 128-bit addresses); forget deletes it with the
	// entry. nil: none (IPv4 keeps them in the entry).
	side *ebpf.Map
}

func (a *agent) table4() flowTable[fpFpKey, ctTuple] {
	return flowTable[fpFpKey, ctTuple]{m: a.p.PrgFastpathFlow, label: "liberal TCP tracking",
		tuple: tuple4, send: markLiberal}
}

func tuple4(k fpFpKey) (ctTuple, uint8) {
	return ctTuple{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport, proto: k.Proto}, k.Proto
}

// walk is walkTable over the table (nothing where the table is absent: an older object).
func (t flowTable[K, T]) walk(fn func(K, *fpFpFlow)) {
	if t.m != nil {
		walkTable(t.m, fn)
	}
}

// learnedTCP is the conntrack tuple of a TCP flow the fast path carried in either direction
// (ok false for any other entry).
func (t flowTable[K, T]) learnedTCP(k K, f *fpFpFlow) (T, bool) {
	tu, proto := t.tuple(k)
	if proto != 6 || f.Flags&fpFAlias != 0 || f.Flags&(fpFOut|fpFIn) == 0 {
		var zero T
		return zero, false
	}
	return tu, true
}

func learnedTCP(k fpFpKey, f *fpFpFlow) (ctTuple, bool) {
	return flowTable[fpFpKey, ctTuple]{tuple: tuple4}.learnedTCP(k, f)
}

// liberalBeforeForget marks the entries of ts, TCP flows about to be forgotten, liberal in
// every conntrack namespace the agent found (a.ctNS), synchronously. A namespace that is
// liberal already, or where the marking fails, is passed over: the forget goes ahead.
func (t flowTable[K, T]) liberalBeforeForget(a *agent, ts []T) {
	if len(ts) == 0 {
		return
	}
	for _, ns := range a.ctNS {
		if v, err := netnsutil.ReadFileIn(ns, conntrackLiberal); err != nil || strings.TrimSpace(v) == "1" {
			continue
		}
		s, err := openCTSock(ns)
		if err != nil {
			continue // liberalTCP says once that it cannot mark there
		}
		_ = t.send(s, ts)
		s.Close()
	}
}

func (a *agent) liberalBeforeForget(ts []ctTuple) { a.table4().liberalBeforeForget(a, ts) }

// liberalAll marks every learned TCP flow of the table liberal (before all are forgotten).
func (t flowTable[K, T]) liberalAll(a *agent) {
	var ts []T
	t.walk(func(k K, f *fpFpFlow) {
		if tu, ok := t.learnedTCP(k, f); ok {
			ts = append(ts, tu)
		}
	})
	t.liberalBeforeForget(a, ts)
}

// forget deletes the table's flows drop selects, their TCP entries made liberal first, and
// returns how many went (counting each deleted entry down in its address's counter where the
// table has one: pcnt).
func (t flowTable[K, T]) forget(a *agent, drop func(K, *fpFpFlow) bool) int {
	if t.m == nil {
		return 0
	}
	var del []K
	var counted, nat []bool
	var tcp []T
	t.walk(func(k K, f *fpFpFlow) {
		if drop(k, f) {
			del = append(del, k)
			counted = append(counted, f.Flags&fCounted != 0)
			nat = append(nat, f.Flags&(fDNAT|fAlias) != 0)
			if tu, ok := t.learnedTCP(k, f); ok {
				tcp = append(tcp, tu)
			}
		}
	})
	t.liberalBeforeForget(a, tcp)
	n := 0
	for i, k := range del {
		err := t.m.Delete(k)
		if nat[i] && t.side != nil {
			// Also where the entry was gone already (the sweep takes the side entry in
			// its next run then, but the agent's forget means now).
			_ = t.side.Delete(k)
		}
		if err == nil && counted[i] && t.pcnt != nil {
			pk := t.pcnt(k)
			var c uint32
			if a.p.PrgFastpathPcnt.Lookup(pk, &c) == nil && c > 0 {
				_ = a.p.PrgFastpathPcnt.Update(pk, c-1, ebpf.UpdateExist)
			}
		}
		if err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
			n++
		}
	}
	return n
}

// liberalTCP marks, every ctLiberalEvery until ctx ends, the conntrack entries of the TCP
// flows the fast path learned both ways since it last looked, in each namespace of nss.
func (a *agent) liberalTCP(ctx context.Context, nss []string) { a.table4().liberalLoop(ctx, a, nss) }

func (t flowTable[K, T]) liberalLoop(ctx context.Context, a *agent, nss []string) {
	if t.m == nil {
		return
	}
	socks := map[string]*ctSock{}
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	marked := map[K]uint64{} // flow -> the egress learn time its entry was marked for
	failed := map[string]bool{}
	tick := time.NewTicker(ctLiberalEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var todo []T
		next := map[K]uint64{}
		t.walk(func(k K, f *fpFpFlow) {
			tu, proto := t.tuple(k)
			if proto != 6 || f.Flags&fpFAlias != 0 || f.Flags&(fpFOut|fpFIn) != fpFOut|fpFIn || f.OutNs == 0 {
				return
			}
			// Both FINs went through conntrack (the normal path): closing, nothing to mark.
			if f.Flags&fDone == fDone {
				return
			}
			next[k] = f.OutNs
			if marked[k] != f.OutNs {
				todo = append(todo, tu)
			}
		})
		marked = next
		if len(todo) == 0 {
			continue
		}
		for _, ns := range nss {
			if v, err := netnsutil.ReadFileIn(ns, conntrackLiberal); err != nil || strings.TrimSpace(v) == "1" {
				continue // no conntrack there, or every entry liberal already
			}
			s := socks[ns]
			if s == nil {
				var err error
				if s, err = openCTSock(ns); err != nil {
					if !failed[ns] {
						a.lg.Printf("%s: %v (fast-path TCP flows may be dropped as INVALID at their re-learn)", t.label, err)
						failed[ns] = true
					}
					continue
				}
				socks[ns] = s
			}
			if err := t.send(s, todo); err != nil && !failed[ns] {
				a.lg.Printf("%s in %s: %v", t.label, netnsutil.Label(ns), err)
				failed[ns] = true
			}
		}
	}
}

// markLiberal sets IP_CT_TCP_FLAG_BE_LIBERAL on the entries of ts (both directions), in one
// batch of requests; an entry that is gone (ENOENT) is no error.
func markLiberal(s *ctSock, ts []ctTuple) error { return sendAll(s, ts, appendCTLiberal) }

// sendAll sends one request per tuple, made by add (appendCTLiberal, appendCTDelete).
func sendAll[T any](s *ctSock, ts []T, add func([]byte, T, uint32) []byte) error {
	_, err := sendCounted(s, ts, add)
	return err
}
