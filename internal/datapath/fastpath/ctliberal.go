package fastpath

import (
	"context"
	"strings"
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

// learnedTCP is the conntrack tuple of a TCP flow the fast path carried in either direction
// (ok false for any other entry).
func learnedTCP(k fpFpKey, f *fpFpFlow) (ctTuple, bool) {
	if k.Proto != 6 || f.Flags&fpFAlias != 0 || f.Flags&(fpFOut|fpFIn) == 0 {
		return ctTuple{}, false
	}
	return ctTuple{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport, proto: 6}, true
}

// liberalBeforeForget marks the conntrack entries of tuples ts liberal in the agent's
// namespaces (where they are not liberal already); an entry that is gone is no error.
func (a *agent) liberalBeforeForget(ts []ctTuple) {
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
		_ = markLiberal(s, ts)
		s.Close()
	}
}

// liberalTCP marks the conntrack entries of learned TCP flows in namespaces nss until ctx ends.
func (a *agent) liberalTCP(ctx context.Context, nss []string) {
	socks := map[string]*ctSock{}
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	marked := map[fpFpKey]uint64{} // flow -> the egress learn time its entry was marked for
	failed := map[string]bool{}
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
		walkFlows(a.p.PrgFastpathFlow, func(k fpFpKey, f *fpFpFlow) {
			if k.Proto != 6 || f.Flags&fpFAlias != 0 || f.Flags&(fpFOut|fpFIn) != fpFOut|fpFIn || f.OutNs == 0 {
				return
			}
			// Both FINs went through conntrack already, or rode the fast path (fHsOnly: the
			// agent deletes that entry as the close is handed over, ctclosed.go): no data
			// follows them, nothing of this connection can meet the window check again. A
			// short connection (TCP_CRR, HTTP with Connection: close) costs no update.
			if f.Flags&fDone == fDone {
				return
			}
			next[k] = f.OutNs
			if marked[k] != f.OutNs {
				todo = append(todo, ctTuple{src: k.Local, dst: k.Remote, sport: k.Lport, dport: k.Rport, proto: 6})
			}
		})
		marked = next
		if len(todo) == 0 {
			continue
		}
		for _, ns := range nss {
			liberal := false
			if v, err := netnsutil.ReadFileIn(ns, conntrackLiberal); err != nil {
				continue // no conntrack there
			} else {
				liberal = strings.TrimSpace(v) == "1" // every entry liberal already
			}
			if liberal {
				continue
			}
			s := socks[ns]
			if s == nil {
				var err error
				if s, err = openCTSock(ns); err != nil {
					if !failed[ns] {
						a.lg.Printf("liberal TCP tracking: %v (fast-path TCP flows may be dropped as INVALID at their re-learn)", err)
						failed[ns] = true
					}
					continue
				}
				socks[ns] = s
			}
			if err := markLiberal(s, todo); err != nil && !failed[ns] {
				a.lg.Printf("liberal TCP tracking in %s: %v", netnsutil.Label(ns), err)
				failed[ns] = true
			}
		}
	}
}

// markLiberal sends the updates for tuples ts in buffers of up to 32 KiB.
func markLiberal(s *ctSock, ts []ctTuple) error { return sendAll(s, ts, appendCTLiberal) }

// sendAll sends one request per tuple, made by add (sendCounted); entries already gone are no
// error.
func sendAll(s *ctSock, ts []ctTuple, add func([]byte, ctTuple, uint32) []byte) error {
	_, err := sendCounted(s, ts, add)
	return err
}
