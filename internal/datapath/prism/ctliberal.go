package prism

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/ctnl"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Conntrack sees a redirected HP TCP flow only on its re-verification frames and on what the pod
// sends back through the normal path. The pod's acks then cover data conntrack never saw, so
// strict window tracking calls them INVALID, and kube-proxy's `KUBE-FORWARD -m conntrack
// --ctstate INVALID -j DROP` (like most stateful firewalls) drops them: measured on the k8s lab,
// one 200 ms retransmission timeout per ping-pong exchange. The gate (bpf/prism_gate.h) therefore
// redirects a TCP flow only once its conntrack entry is liberal both ways
// (IP_CT_TCP_FLAG_BE_LIBERAL); until then the flow takes the normal path and the gate asks, through
// the ring buffer prg_prism_ask, for that one entry to be marked. The agent reads the asks and
// marks the entries with ctnetlink in the VXLAN device's namespace, where the gate looked them
// up. Every other connection of the node keeps strict tracking; nf_conntrack_tcp_be_liberal is
// left alone. A new entry under the same tuple (a new connection on the same ports) is strict
// again, and the gate asks again.

// askLen is the size of struct prism_flow_key: netns, family, struct prg_flow.
const askLen = 48

// parseAsk reads one ask: the namespace inode of the VXLAN device (the endpoint domain) and the
// flow's TCP tuple as the frame carried it. False for anything but a well-formed TCP ask.
func parseAsk(b []byte) (domain uint32, t ctnl.Tuple, ok bool) {
	if len(b) < askLen {
		return 0, t, false
	}
	domain = binary.NativeEndian.Uint32(b[0:])
	fam := binary.NativeEndian.Uint32(b[4:])
	f := b[8:]
	switch fam {
	case 4:
		t.Src = netip.AddrFrom4([4]byte(f[0:4]))
		t.Dst = netip.AddrFrom4([4]byte(f[16:20]))
	case 6:
		t.Src = netip.AddrFrom16([16]byte(f[0:16]))
		t.Dst = netip.AddrFrom16([16]byte(f[16:32]))
	default:
		return 0, t, false
	}
	t.Sport = binary.BigEndian.Uint16(f[32:]) // network order in the frame
	t.Dport = binary.BigEndian.Uint16(f[34:])
	t.Proto = f[36]
	return domain, t, t.Proto == 6
}

// liberal marks the conntrack entries the gate asks about until ctx ends.
type liberal struct {
	target string
	lg     datapath.Logger
	ns     map[uint32]string // VXLAN device namespace inode -> its name
	socks  map[string]*ctnl.Sock
	failed map[string]bool
	// marked and missing count the updates sent and those that found no entry (gone
	// meanwhile), logged at most every logEvery.
	marked, missing, unknown int
	logged                   time.Time
}

const logEvery = 10 * time.Second

// runLiberal reads prg_prism_ask until ctx ends and marks each asked entry liberal.
func runLiberal(ctx context.Context, target string, objs *objects, lg datapath.Logger) error {
	rd, err := ringbuf.NewReader(objs.PrgPrismAsk)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		rd.Close()
	}()
	l := &liberal{target: target, lg: lg, ns: map[uint32]string{}, socks: map[string]*ctnl.Sock{}, failed: map[string]bool{}}
	defer l.close()
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		domain, t, ok := parseAsk(rec.RawSample)
		if !ok {
			continue
		}
		l.mark(domain, t)
	}
}

func (l *liberal) close() {
	for _, s := range l.socks {
		s.Close()
	}
}

// mark sets the liberal flag on both directions of the entry of t in the namespace of domain.
// An entry gone meanwhile is no error (the gate asks again for a new one).
func (l *liberal) mark(domain uint32, t ctnl.Tuple) {
	ns, ok := l.ns[domain]
	if !ok {
		l.refresh()
		if ns, ok = l.ns[domain]; !ok {
			l.unknown++ // a VXLAN device that left
			l.report()
			return
		}
	}
	s := l.socks[ns]
	if s == nil {
		var err error
		if s, err = ctnl.Open(ns); err != nil {
			if !l.failed[ns] {
				l.lg.Printf("liberal TCP tracking: %v (HP TCP flows stay on the normal path there)", err)
				l.failed[ns] = true
			}
			return
		}
		l.socks[ns] = s
	}
	missing, err := s.Send(ctnl.AppendLiberal(nil, t, 1))
	if err != nil && !l.failed[ns] {
		l.lg.Printf("liberal TCP tracking in %s: %v (HP TCP flows stay on the normal path there)", netnsutil.Label(ns), err)
		l.failed[ns] = true
	}
	l.marked++
	l.missing += missing
	l.report()
}

// report logs the counts of marks since the last report, at most every logEvery.
func (l *liberal) report() {
	if time.Since(l.logged) < logEvery {
		return
	}
	l.lg.Printf("liberal TCP tracking: %d conntrack entries marked for HP flows, %d gone before, %d asks from unknown VXLAN devices", l.marked-l.missing, l.missing, l.unknown)
	l.marked, l.missing, l.unknown, l.logged = 0, 0, 0, time.Now()
}

// refresh re-reads which namespace each VXLAN device's inode names.
func (l *liberal) refresh() {
	st, err := datapath.LoadState(l.target, Name)
	if err != nil || st == nil || st.Topology == nil {
		return
	}
	vxs, err := discoverVXLAN(st.Topology)
	if err != nil {
		return
	}
	for _, vx := range vxs {
		l.ns[vx.Inode] = vx.Dev.Netns
	}
}
