package fastpath

import (
	"context"
	"strings"
	"sync"
	"time"

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
// left alone. (An entry conntrack picks up mid-stream, after a flush, is liberal already:
// nf_conntrack_proto_tcp.c sets the flag itself there.) Where the namespace is liberal
// already (kube-proxy's --conntrack-tcp-be-liberal), nothing is sent.

const ctLiberalEvery = time.Second

const conntrackLiberal = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"

// liberal is what liberalTCP and forget share: the namespaces, their sockets, and the flows
// whose entries are marked (flow -> the egress learn time its entry was marked for).
type liberal struct {
	mu     sync.Mutex
	nss    []string
	socks  map[string]*ctSock
	failed map[string]bool
	marked map[fpFpKey]uint64
}

// wantsLiberal tells whether a flow's conntrack entry must be liberal: a TCP flow learned both
// ways, whose packets conntrack no longer sees.
func wantsLiberal(k fpFpKey, f *fpFpFlow) bool {
	return k.Proto == 6 && f.Flags&fpFAlias == 0 && f.Flags&(fpFOut|fpFIn) == fpFOut|fpFIn && f.OutNs != 0
}

func ctTupleOf(k fpFpKey) ctTuple {
	return ctTuple{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport, proto: 6}
}

// liberalTCP marks the conntrack entries of learned TCP flows in namespaces nss until ctx ends.
func (a *agent) liberalTCP(ctx context.Context, nss []string) {
	l := &a.lib
	l.mu.Lock()
	l.nss, l.socks, l.failed, l.marked = nss, map[string]*ctSock{}, map[string]bool{}, map[fpFpKey]uint64{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		for _, s := range l.socks {
			s.Close()
		}
		l.nss, l.socks = nil, nil
		l.mu.Unlock()
	}()
	tick := time.NewTicker(ctLiberalEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var todo []ctTuple
		next := map[fpFpKey]uint64{}
		l.mu.Lock()
		walkFlows(a.p.PrgFastpathFlow, func(k fpFpKey, f *fpFpFlow) {
			if !wantsLiberal(k, f) {
				return
			}
			next[k] = f.OutNs
			if l.marked[k] != f.OutNs {
				todo = append(todo, ctTupleOf(k))
			}
		})
		l.marked = next
		a.markLiberalIn(todo)
		l.mu.Unlock()
	}
}

// liberalBeforeForget marks, before the flows in keys are forgotten, the entries of those not
// marked yet: a flow forgotten before liberalTCP's tick came (a rule change, a conntrack or
// endpoint change within a second of its learn) sends its next packet through conntrack far
// beyond the window conntrack last saw; strict tracking calls it INVALID, kube-proxy drops it,
// and so every retransmission after it: the connection stalls for good. keys and flows are
// parallel.
func (a *agent) liberalBeforeForget(keys []fpFpKey, flows []fpFpFlow) {
	l := &a.lib
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.socks == nil {
		return // not following (no agent loop, or it ended)
	}
	var todo []ctTuple
	for i, k := range keys {
		if wantsLiberal(k, &flows[i]) && l.marked[k] != flows[i].OutNs {
			todo = append(todo, ctTupleOf(k))
			l.marked[k] = flows[i].OutNs
		}
	}
	a.markLiberalIn(todo)
}

// markLiberalIn sends the updates for todo in every namespace that tracks strictly; l.mu held.
func (a *agent) markLiberalIn(todo []ctTuple) {
	l := &a.lib
	if len(todo) == 0 {
		return
	}
	for _, ns := range l.nss {
		if v, err := netnsutil.ReadFileIn(ns, conntrackLiberal); err != nil || strings.TrimSpace(v) == "1" {
			continue // no conntrack there, or every entry liberal already
		}
		s := l.socks[ns]
		if s == nil {
			var err error
			if s, err = openCTSock(ns); err != nil {
				if !l.failed[ns] {
					a.lg.Printf("liberal TCP tracking: %v (fast-path TCP flows may be dropped as INVALID at their re-learn)", err)
					l.failed[ns] = true
				}
				continue
			}
			l.socks[ns] = s
		}
		if err := markLiberal(s, todo); err != nil && !l.failed[ns] {
			a.lg.Printf("liberal TCP tracking in %s: %v", netnsutil.Label(ns), err)
			l.failed[ns] = true
		}
	}
}

// markLiberal sends the updates for tuples ts in buffers of up to 32 KiB.
func markLiberal(s *ctSock, ts []ctTuple) error {
	var b []byte
	var first error
	flush := func() {
		if _, err := s.send(b); err != nil && first == nil {
			first = err
		}
		b = b[:0]
	}
	for i, t := range ts {
		b = appendCTLiberal(b, t, uint32(i+1))
		if len(b) > 32<<10 {
			flush()
		}
	}
	flush()
	return first
}
