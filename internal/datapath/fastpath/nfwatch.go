package fastpath

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The fast path's redirect skips the FORWARD hook, so a cached flow would not see a netfilter
// rule added after it was learned until its next re-learn (every few seconds). The agent
// therefore follows nftables' change notifications (NETLINK_NETFILTER, group
// NFNLGRP_NFTABLES) in each namespace it watches: nft and iptables-nft (and kube-proxy in
// either of its modes, on top of them) announce every table, chain, rule, set and set element
// change there, and any of them forgets every cached flow, so the next packet of each flow
// goes through the normal path and its rules again. Forgetting is cheap (flows re-learn within
// a round trip), so no attempt is made to tell which flows a change could touch.
//
// iptables-legacy changes its tables with setsockopt and announces nothing; where legacy
// tables are present the agent says so once, and their changes reach cached flows at the
// re-learn only.

const (
	nfDebounce  = 20 * time.Millisecond // a burst of changes (iptables-restore) forgets once
	nfRcvBuffer = 1 << 20               // a large transaction sends a notification per object
)

// nfChange tells whether a netlink message from the nftables group reports a change of the
// rule set: every nftables message but the generation bump that closes each transaction (its
// changes came before it) and packet traces (not a change).
func nfChange(typ uint16) bool {
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return false
	}
	switch typ & 0xff {
	case unix.NFT_MSG_NEWGEN, unix.NFT_MSG_TRACE:
		return false
	}
	return true
}

// watchNetfilter follows the nftables notifications of namespaces nss (duplicates once) until
// ctx ends and calls changed (at most once per nfDebounce burst) after any rule set change, or
// after events may have been lost (a receive buffer overrun, a subscription made again).
func watchNetfilter(ctx context.Context, nss []string, lg datapath.Logger, every time.Duration, changed func(why string)) {
	ev := make(chan string, 1)
	seen := map[string]bool{}
	for _, ns := range nss {
		if !seen[ns] {
			seen[ns] = true
			warnLegacy(ns, lg)
			go followNetfilter(ctx, ns, lg, every, ev)
		}
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case why := <-ev:
				select { // let the rest of the burst arrive, then forget once
				case <-ctx.Done():
					return
				case <-time.After(nfDebounce):
				}
				select {
				case <-ev:
				default:
				}
				changed(why)
			}
		}
	}()
}

func notify(ev chan<- string, why string) {
	select {
	case ev <- why:
	default:
	}
}

// followNetfilter keeps one subscription to namespace ns's nftables notifications alive until
// ctx ends, as the datapath watch loop does for links: a failed subscription is tried again
// with a growing wait (up to every), and a renewed one counts as a change (events were lost).
func followNetfilter(ctx context.Context, ns string, lg datapath.Logger, every time.Duration, ev chan<- string) {
	wait, failing := 100*time.Millisecond, false
	for ctx.Err() == nil {
		var s *nl.NetlinkSocket
		err := netnsutil.Do(ns, func() error {
			var err error
			s, err = nl.Subscribe(unix.NETLINK_NETFILTER, unix.NFNLGRP_NFTABLES)
			return err
		})
		if err == nil {
			_ = s.SetReceiveBufferSize(nfRcvBuffer, false)
		}
		if err != nil {
			if !failing {
				lg.Printf("no netfilter events from %s (rule changes reach cached flows at their re-learn meanwhile): %v", netnsutil.Label(ns), err)
			}
			failing = true
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait = min(2*wait, max(100*time.Millisecond, every))
			continue
		}
		if failing {
			lg.Printf("netfilter events from %s again", netnsutil.Label(ns))
			notify(ev, "netfilter events resumed")
		}
		failing, wait = false, 100*time.Millisecond
		stop := context.AfterFunc(ctx, s.Close) // unblocks Receive
		err = receiveNetfilter(s, ev)
		if stop() {
			s.Close()
		}
		if ctx.Err() == nil {
			lg.Printf("netfilter events from %s ended (%v): subscribing again", netnsutil.Label(ns), err)
			notify(ev, "netfilter events lost")
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}
}

// receiveNetfilter reads notifications until the socket fails; an overrun loses events but
// keeps the socket, so it is reported as a change and reading goes on.
func receiveNetfilter(s *nl.NetlinkSocket, ev chan<- string) error {
	for {
		msgs, _, err := s.Receive()
		if errors.Is(err, unix.ENOBUFS) {
			notify(ev, "netfilter events overran")
			continue
		}
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if nfChange(m.Header.Type) {
				notify(ev, "netfilter rule change")
				break
			}
		}
	}
}

// warnLegacy says once when namespace ns has iptables-legacy tables: their changes send no
// notification.
func warnLegacy(ns string, lg datapath.Logger) {
	if tables := legacyTables(ns); len(tables) > 0 {
		lg.Printf("%s has iptables-legacy tables (%s): their rule changes send no events and reach cached flows at their re-learn (5 s), not at once",
			netnsutil.Label(ns), strings.Join(tables, " "))
	}
}

// legacyTables lists the x_tables tables (IPv4, then IPv6) that iptables-legacy registered in
// namespace ns; iptables-nft registers none. The thread's own view is read (/proc/net is the
// process's, not the namespace the thread entered).
func legacyTables(ns string) []string {
	var tables []string
	for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
		if s, err := netnsutil.ReadFileIn(ns, f); err == nil {
			tables = append(tables, strings.Fields(s)...)
		}
	}
	return tables
}
