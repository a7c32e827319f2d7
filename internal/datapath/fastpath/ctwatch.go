package fastpath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// A cached flow replays what the normal path did while conntrack's entry was there: for a
// Service, the backend that entry's DNAT chose. When the entry goes (kube-proxy deletes the
// entries of a removed UDP endpoint after changing the rules, `conntrack -D/-F`, expiry), the
// normal path would translate the flow's next packet afresh; the cache would go on sending to
// the old backend until its re-learn (5 s). So the agent follows conntrack's DESTROY events
// (ctnetlink, group NFNLGRP_CONNTRACK_DESTROY) in every namespace it serves and makes the
// flows of a destroyed entry due for re-learning at once:
//
//   - egress: the flow's next packet from the pod takes the normal path, where conntrack makes a
//     new entry with the rules of now (the new backend), and is learned from it;
//   - ingress: a Service flow's replies keep their translation for at most forgetReplies more
//     (the fast path re-learns a Service's replies only after its egress direction, so that a
//     flushed entry is re-created with its translation: see begin_in in bpf/fastpath.h), then
//     take the normal path too; a flow without translation re-learns both ways at once.
//
// Order. A rule change comes first (its nftables event forgets every flow, nfwatch.go) and the
// deletion after it; the next packet then re-learns from the new entry. A packet that crossed
// netfilter just before the deletion could still be learned just after the event was read:
// each batch is therefore applied twice, the second time ctSettle later, to the flows learned
// no later than the event's arrival plus the coarse clock's step.
//
// Cost. Every conntrack entry of the namespace sends its DESTROY event to the agent. Events are
// gathered for ctBatchMin (longer when the last batch was slow, ctBatchMax at most) and a
// batch costs a map lookup per tuple and overlay, or, for a large batch, one walk of the flow
// map; a batch past ctBatchAll tuples, or a receive overrun, makes every flow due.
//
// Limit: with net.netfilter.nf_conntrack_events at its default (2), the kernel gives an entry
// its event record only while a ctnetlink listener exists: entries older than the agent's
// subscription (connections made before attach) send no DESTROY event, and their deletion
// reaches a cached flow at its re-learn (5 s). The agent says so at start.

const (
	ctBatchMin     = 10 * time.Millisecond
	ctBatchMax     = 400 * time.Millisecond
	ctSettle       = 30 * time.Millisecond
	ctBatchAll     = 1 << 16 // more destroyed tuples than this in one batch: every flow due
	ctLookupMax    = 1024    // up to this many tuples, look each up; above, walk the map once
	forgetReplies  = time.Second
	revalidate     = 5 * time.Second // FP_REVALIDATE_NS in bpf/fastpath.h
	coarseStep     = 10 * time.Millisecond
	ctRcvBuffer    = 4 << 20
	ctEventsSysctl = "/proc/sys/net/netfilter/nf_conntrack_events"
	ctLogEvery     = 10 * time.Second
)

// ctBatch is what one batch of events asks for: the destroyed entries' keys (local, remote,
// ports, protocol; any overlay), or every flow.
type ctBatch struct {
	keys  map[ctKey]bool
	keys6 map[ctKey6]bool // IPv6 entries' keys (the IPv6 table, bpf/fastpath6.h); made by add
	all   string          // why every flow is due ("" if not)
}

// ctKey6 is ctKey for IPv6 flows.
type ctKey6 struct {
	local, remote [4]uint32
	lport, rport  uint16
	proto         uint8
}

// size is how many keys b holds.
func (b *ctBatch) size() int { return len(b.keys) + len(b.keys6) }

type ctKey struct {
	local, remote uint32
	lport, rport  uint16
	proto         uint8
}

func (b *ctBatch) add(e ctEntry) {
	if e.v6 {
		if b.keys6 == nil {
			b.keys6 = map[ctKey6]bool{}
		}
		for i, t := range []ctTuple{e.orig, e.reply} {
			a := []ctAddrs6{e.orig6, e.reply6}[i]
			b.keys6[ctKey6{a.src, a.dst, t.sport, t.dport, t.proto}] = true
			b.keys6[ctKey6{a.dst, a.src, t.dport, t.sport, t.proto}] = true
		}
		return
	}
	for _, t := range []ctTuple{e.orig, e.reply} {
		b.keys[ctKey{t.src, t.dst, t.sport, t.dport, t.proto}] = true
		b.keys[ctKey{t.dst, t.src, t.dport, t.sport, t.proto}] = true
	}
}

// watchConntrack follows the DESTROY events of namespaces nss until ctx ends and makes the
// matching flows due (dueFlows).
func (a *agent) watchConntrack(ctx context.Context, nss []string) {
	ev := make(chan ctEntry, 4096)
	lost := make(chan string, 1)
	seen := map[string]bool{}
	for _, ns := range nss {
		if seen[ns] {
			continue
		}
		seen[ns] = true
		if v, err := netnsutil.ReadFileIn(ns, ctEventsSysctl); err == nil && len(v) > 0 && v[0] == '0' {
			a.lg.Printf("%s: nf_conntrack_events is 0: conntrack deletions send no events and reach cached flows at their re-learn (5 s)", netnsutil.Label(ns))
		}
		go a.followConntrack(ctx, ns, ev, lost)
	}
	a.lg.Printf("conntrack deletions: entries made before now send no event (nf_conntrack_events 2); theirs reach cached flows at the re-learn (5 s)")
	go func() {
		wait := ctBatchMin
		due, why, logged := 0, "", time.Time{}
		for {
			b := ctBatch{keys: map[ctKey]bool{}}
			select {
			case <-ctx.Done():
				return
			case e := <-ev:
				if a.ctSelf.has(e) {
					continue // deleted by the agent: a connection closed on the fast path (ctclosed.go)
				}
				b.add(e)
			case why := <-lost:
				b.all = why
			}
			// Gather the rest of the burst.
			timer := time.NewTimer(wait)
		gather:
			for {
				select {
				case <-ctx.Done():
					timer.Stop()
					return
				case e := <-ev:
					if a.ctSelf.has(e) {
						continue
					}
					if b.size() < ctBatchAll {
						b.add(e)
					} else if b.all == "" {
						b.all = "conntrack deletion storm"
					}
				case why := <-lost:
					b.all = why
				case <-timer.C:
					break gather
				}
			}
			start := time.Now()
			due += a.applyCT(&b)
			if b.all != "" {
				why = b.all
			}
			if due > 0 && time.Since(logged) >= ctLogEvery {
				// Connections end all the time, and a storm repeats: a line per ctLogEvery at most.
				msg := fmt.Sprintf("conntrack entries deleted: %d flows made due for re-learning since the last note", due)
				if why != "" {
					msg += " (every flow, last for: " + why + ")"
				}
				a.lg.Print(msg)
				due, why, logged = 0, "", time.Now()
			}
			// A slow batch (a storm against a full map) widens the next window: the agent
			// spends at most about a fifth of a CPU here, and the bound stays under 1 s.
			wait = min(max(ctBatchMin, 4*time.Since(start)), ctBatchMax)
		}
	}()
}

// applyCT makes a batch's flows due, and again ctSettle later for those learned by then from a
// packet that crossed netfilter before the deletion; it returns how many.
func (a *agent) applyCT(b *ctBatch) int {
	at := monoNs()
	n := a.dueFlows(b, 0)
	if b.all == "" { // after lost events, the renewed subscription makes every flow due again
		time.AfterFunc(ctSettle, func() { a.dueFlows(b, at+uint64(coarseStep)) })
	}
	return n
}

// dueFlows makes the flows of batch b due; with learnedBy, only those whose egress was
// learned no later than that (coarse monotonic ns). It returns how many it changed.
func (a *agent) dueFlows(b *ctBatch, learnedBy uint64) int {
	now := monoNs()
	match := func(k fpFpKey) bool {
		return b.all != "" || b.keys[ctKey{k.Local, k.Remote, k.Lport, k.Rport, k.Proto}]
	}
	due := func(f *fpFpFlow) bool {
		if f.Flags&fpFAlias != 0 || f.Flags&(fpFOut|fpFIn) == 0 {
			return false // an alias only points at its flow; a flow never learned has nothing to replay
		}
		if learnedBy != 0 && (f.OutNs == 0 || f.OutNs > learnedBy) {
			return false
		}
		if f.Flags&(fDone|fHsOnly) == fDone|fHsOnly {
			// Closed on the fast path: the agent deleted the entry itself (ctclosed.go), and
			// the connection's last packets (the final ACK, a retransmitted FIN) must stay on
			// the fast path. Due, they would meet conntrack without an entry: an ACK picked up
			// as a new ESTABLISHED one (which the next connection on the ports then meets, its
			// SYN ignored as INVALID), a FIN or RST called INVALID and dropped.
			return false
		}
		return markDue(f, now)
	}
	n := 0
	if b.all == "" && b.size() <= ctLookupMax {
		var f fpFpFlow
		if m := a.p.PrgFastpathFlow6; m != nil {
			for ck := range b.keys6 {
				for _, ov := range *a.ovs.Load() {
					k := fpFpKey6{Local: ck.local, Remote: ck.remote, Lport: ck.lport, Rport: ck.rport, Proto: ck.proto, Ovl: uint8(ov.Index)}
					if m.Lookup(&k, &f) == nil && due(&f) && m.Update(&k, &f, ebpf.UpdateExist) == nil {
						n++
					}
				}
			}
		}
		for ck := range b.keys {
			for _, ov := range *a.ovs.Load() {
				k := fpFpKey{Local: ck.local, Remote: ck.remote, Lport: ck.lport, Rport: ck.rport, Proto: ck.proto, Ovl: uint8(ov.Index)}
				if err := a.p.PrgFastpathFlow.Lookup(&k, &f); err != nil {
					continue
				}
				if due(&f) && a.p.PrgFastpathFlow.Update(&k, &f, ebpf.UpdateExist) == nil {
					n++
				}
			}
		}
		return n
	}
	type kv struct {
		k fpFpKey
		f fpFpFlow
	}
	var upd []kv
	walkFlows(a.p.PrgFastpathFlow, func(k fpFpKey, f *fpFpFlow) {
		if match(k) && due(f) {
			upd = append(upd, kv{k, *f})
		}
	})
	for _, u := range upd {
		if a.p.PrgFastpathFlow.Update(&u.k, &u.f, ebpf.UpdateExist) == nil {
			n++
		}
	}
	if m := a.p.PrgFastpathFlow6; m != nil && (b.all != "" || len(b.keys6) > 0) {
		type kv6 struct {
			k fpFpKey6
			f fpFpFlow
		}
		var upd6 []kv6
		_ = walkFlows6(m, func(k fpFpKey6, f *fpFpFlow) {
			if (b.all != "" || b.keys6[ctKey6{k.Local, k.Remote, k.Lport, k.Rport, k.Proto}]) && due(f) {
				upd6 = append(upd6, kv6{k, *f})
			}
		})
		for _, u := range upd6 {
			if m.Update(&u.k, &u.f, ebpf.UpdateExist) == nil {
				n++
			}
		}
	}
	return n
}

// markDue changes a learned flow so that it is due for re-learning (false: it was already):
// a flow without translation both ways at once. A Service flow's replies wait for the client's
// packets to be re-learned first (begin_in for a remote backend, local_reply_due for one on
// this node: should the entry be gone, the client's packet re-creates it with its
// translation, where a reply first would reach the client untranslated and its RST end the
// connection), for at most 2 intervals after they were learned: they get forgetReplies of
// that. So a Service's client flow (FP_F_DNAT) is due at once on egress and within
// forgetReplies on ingress, and a same-node backend's reply flow (FP_F_SNAT) within
// forgetReplies.
func markDue(f *fpFpFlow, now uint64) bool {
	lim := uint64(1) // the oldest learn time a Service reply may keep: now - 2 intervals + forgetReplies
	if now > uint64(2*revalidate) {
		lim = now - uint64(2*revalidate) + uint64(forgetReplies)
	}
	out, in := uint64(0), uint64(0)
	switch {
	case f.Flags&fpFSNAT != 0:
		out = min(f.OutNs, lim)
	case f.Flags&fpFDNAT != 0:
		in = min(f.InNs, lim)
	}
	if f.OutNs == out && f.InNs == in {
		return false
	}
	f.OutNs, f.InNs = out, in
	return true
}

// The flow flags the agent reads (FP_F_* in bpf/fastpath.h).
const (
	fpFOut   = 1
	fpFIn    = 2
	fpFDNAT  = 4
	fpFAlias = 8
	fpFSNAT  = 64
)

// followConntrack keeps one DESTROY subscription of namespace ns alive until ctx ends, as
// followNetfilter does; lost events (an overrun, a renewed subscription) make every flow due.
// A storm (more than ctStormEvents in ctStormWindow) closes the subscription for ctStormPause,
// which the kernel's queue goes with, and makes every flow due when it closes and again when
// it resumes: the agent's cost stays bounded whatever the rate of deletions.
func (a *agent) followConntrack(ctx context.Context, ns string, ev chan<- ctEntry, lost chan<- string) {
	wait, failing, storm, filterNoted := 100*time.Millisecond, false, false, false
	for ctx.Err() == nil {
		f, ferr, err := subscribeCT(ns)
		if ferr != nil && !filterNoted {
			a.lg.Printf("conntrack events from %s unfiltered (each short connection's DESTROY is read and skipped): %v", netnsutil.Label(ns), ferr)
			filterNoted = true
		}
		if err != nil {
			if !failing {
				a.lg.Printf("no conntrack events from %s (deletions reach cached flows at their re-learn meanwhile): %v", netnsutil.Label(ns), err)
			}
			failing = true
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait = min(2*wait, resyncEvery)
			continue
		}
		if failing {
			a.lg.Printf("conntrack events from %s again", netnsutil.Label(ns))
			notify(lost, "conntrack events resumed")
		} else if storm {
			notify(lost, "conntrack events resumed after a storm")
		}
		failing, storm, wait = false, false, 100*time.Millisecond
		stop := context.AfterFunc(ctx, func() { f.Close() })
		err = receiveConntrack(f, ev, lost)
		if stop() {
			f.Close()
		}
		if ctx.Err() != nil {
			return
		}
		pause := wait
		if errors.Is(err, errCTStorm) {
			pause, storm = ctStormPause, true
			notify(lost, "conntrack deletion storm")
		} else {
			a.lg.Printf("conntrack events from %s ended (%v): subscribing again", netnsutil.Label(ns), err)
			notify(lost, "conntrack events lost")
			failing = true // the next subscription makes every flow due again
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

const (
	ctStormEvents = 2048
	ctStormWindow = 100 * time.Millisecond
	ctStormPause  = 250 * time.Millisecond
)

var errCTStorm = errors.New("conntrack deletion storm")

// subscribeCT opens a ctnetlink socket in namespace ns subscribed to DESTROY events, read
// through the runtime's poller (so that Close ends a blocked read). ferr says why the DESTROY
// filter (ctfilter.go) could not be attached: the subscription then works without it.
func subscribeCT(ns string) (f *os.File, ferr, err error) {
	fd := -1
	err = netnsutil.Do(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_CONNTRACK_DESTROY - 1)})
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, ctRcvBuffer); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, ctRcvBuffer)
	}
	// The fast-path closes' DESTROY events stay in the kernel (ctfilter.go); without the
	// filter they are read and skipped, as before it.
	ferr = attachCTFilter(fd)
	return os.NewFile(uintptr(fd), "ctnetlink-destroy"), ferr, nil
}

// receiveConntrack reads events into ev until the socket fails or a storm begins; one buffer
// serves every read (an event is one netlink message of a few hundred bytes).
func receiveConntrack(f *os.File, ev chan<- ctEntry, lost chan<- string) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	win, inWin := time.Now(), 0
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return err
		}
		if errors.Is(rerr, unix.ENOBUFS) {
			notify(lost, "conntrack events overran")
			continue
		}
		if rerr != nil {
			return rerr
		}
		for b := buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < unix.SizeofNlMsghdr || l > len(b) {
				break
			}
			typ := binary.NativeEndian.Uint16(b[4:])
			if typ == unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCTDel {
				e, ok := parseCTEvent(b[unix.SizeofNlMsghdr:l])
				if ok && e.closedFast() {
					// A connection the programs expired at its close: nothing to act on,
					// and no deletion towards a storm either (one per short connection).
					b = b[min(len(b), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
					continue
				}
				if ok {
					select {
					case ev <- e:
					default:
						notify(lost, "conntrack events overran the agent")
					}
				}
				if inWin++; inWin > ctStormEvents {
					if time.Since(win) < ctStormWindow {
						return errCTStorm
					}
					win, inWin = time.Now(), 0
				}
			}
			b = b[min(len(b), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
		}
	}
}
