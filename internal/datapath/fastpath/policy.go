package fastpath

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// policyNotes are what attach tells the user about policy changes the fast path cannot
// follow within 1 s on this node: iptables-legacy tables in a namespace it serves (no change
// events: their rule changes reach cached flows at the re-learn, 5 s), and, without the agent,
// every policy change (nothing follows them) and conntrack's strict TCP window check.
func policyNotes(host string, ovs []*overlay, agent bool) []string {
	nss := []string{host}
	for _, ov := range ovs {
		if !slices.Contains(nss, ov.VX.Dev.Netns) {
			nss = append(nss, ov.VX.Dev.Netns)
		}
	}
	var notes []string
	for _, ns := range nss {
		if tables := legacyTables(ns); len(tables) > 0 {
			notes = append(notes, fmt.Sprintf("%s has iptables-legacy tables (%s): their rule changes send no event, so a change reaches cached flows at their re-learn, within %v, not 1 s; use iptables-nft (or nft) for changes that must apply at once",
				netnsutil.Label(ns), strings.Join(tables, " "), revalidate))
		}
	}
	if !agent {
		notes = append(notes, fmt.Sprintf("without the agent nothing follows rule, ipset, conntrack, route or neighbour changes: they reach cached flows at their re-learn (within %v); and TCP flows' conntrack entries are not made liberal, so where INVALID packets are dropped (kube-proxy's KUBE-FORWARD) a TCP flow through conntrack stalls at its first re-learn unless nf_conntrack_tcp_be_liberal is 1", revalidate))
	}
	return notes
}

// followPolicy starts what follows the policy state nftables' events do not announce (issue
// 28): conntrack deletions (ctwatch.go), ipset changes (ipsetwatch.go), and the liberal
// tracking of the fast path's TCP entries (ctliberal.go), until ctx ends.
func (a *agent) followPolicy(ctx context.Context, nss []string) {
	a.watchConntrack(ctx, nss)
	go a.liberalTCP(ctx, nss)
	go a.deleteClosed(ctx, nss) // conntrack entries of connections closed on the fast path (ctclosed.go)
	go a.liberalTCP6(ctx, nss)  // ctliberal6.go
	go watchIPSets(ctx, nss, a.lg, func(why string) {
		a.lg.Printf("%s: forgot %d flows", why, a.forget(func(fpFpKey, *fpFpFlow) bool { return true })+
			a.forget6(func(fpFpKey6, *fpFpFlow) bool { return true }))
	})
}
