package doctor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The fast path (and any mode that caches a decision) learns from the normal path and must
// hear of policy changes: nftables and iptables-nft announce theirs, conntrack its deletions
// (when events are on), ipsets are polled. iptables-legacy announces nothing.

// relearnBound is how long a change nothing announces takes to reach a cached flow: the fast
// path's re-learn interval (FP_REVALIDATE_NS, bpf/fastpath.h).
const relearnBound = "5 s"

// policyEventsCheck looks, in the overlay's host namespace and the namespaces of its VXLAN
// devices, for what sends no change events: iptables-legacy tables, conntrack events off.
func policyEventsCheck(label string, t *datapath.Topology) Check {
	c := Check{Name: "policy-events", Target: label, Status: OK}
	nss := []string{t.Host}
	for _, d := range t.ByStage(datapath.StageVXLAN) {
		if !slices.Contains(nss, d.Netns) {
			nss = append(nss, d.Netns)
		}
	}
	var legacy, noCT []string
	for _, ns := range nss {
		var tables []string
		for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
			if s, err := netnsutil.ReadFileIn(ns, f); err == nil {
				tables = append(tables, strings.Fields(s)...)
			}
		}
		if len(tables) > 0 {
			legacy = append(legacy, fmt.Sprintf("%s (%s)", netnsutil.Label(ns), strings.Join(tables, " ")))
		}
		if v, err := netnsutil.ReadFileIn(ns, "/proc/sys/net/netfilter/nf_conntrack_events"); err == nil && strings.TrimSpace(v) == "0" {
			noCT = append(noCT, netnsutil.Label(ns))
		}
	}
	var found, fixes []string
	if len(legacy) > 0 {
		found = append(found, "iptables-legacy tables in "+strings.Join(legacy, ", ")+": their rule changes send no event and reach the fast path's cached flows at their re-learn, within "+relearnBound+", not 1 s")
		fixes = append(fixes, "change rules with iptables-nft or nft (which announce every change); tables iptables-legacy registered stay until the namespace goes (rmmod ip_tables on the host)")
	}
	if len(noCT) > 0 {
		found = append(found, "nf_conntrack_events is 0 in "+strings.Join(noCT, ", ")+": a deleted conntrack entry (a removed Service backend) reaches cached flows at their re-learn, within "+relearnBound)
		fixes = append(fixes, "sysctl -w net.netfilter.nf_conntrack_events=2 (the default)")
	}
	if len(found) == 0 {
		c.Detail = "nftables/iptables-nft rule changes and conntrack deletions send events; ipsets are polled (500 ms)"
		return c
	}
	c.Status, c.Detail, c.Fix = Warn, strings.Join(found, "; "), strings.Join(fixes, "; ")
	return c
}
