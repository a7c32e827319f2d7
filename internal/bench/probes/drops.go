package probes

import (
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Every repetition reports the packets dropped on its path beside its rate: the backlogs'
// (softnet) and every device's of the testbed's namespaces (a veth whose peer's NAPI ring was
// full counts its drop as tx_dropped; a redirect to a device that refuses counts there too),
// and the sender's retransmitted segments as the kernel counts them (Tcp.RetransSegs), which,
// unlike the workload's own figure, every TCP workload has.
const (
	MetricDrops       = results.MetricDrops
	MetricRetransSegs = results.MetricRetransSegs
	// counterLinkDrops is the link part of MetricDrops, kept apart in Rep.Counters.
	counterLinkDrops = "links.dropped"
)

// linkDrops maps "netns/device" to its rx_dropped + tx_dropped.
type linkDrops map[string]uint64

// readLinkDrops reads every device's drop counters in the namespaces; a namespace it cannot
// read is skipped (the drops it misses are not invented).
func readLinkDrops(nss []string) linkDrops {
	out := linkDrops{}
	for _, ns := range nss {
		h, err := netnsutil.Handle(ns)
		if err != nil {
			continue
		}
		nh, err := netlink.NewHandleAt(h)
		h.Close()
		if err != nil {
			continue
		}
		links, err := nh.LinkList()
		nh.Close()
		if err != nil {
			continue
		}
		for _, l := range links {
			a := l.Attrs()
			if a.Statistics == nil {
				continue
			}
			out[ns+"/"+a.Name] = a.Statistics.RxDropped + a.Statistics.TxDropped
		}
	}
	return out
}

// since is the drops counted since before, over the devices present both times (a device
// created or removed in between has no delta).
func (after linkDrops) since(before linkDrops) uint64 {
	var n uint64
	for k, v := range after {
		if b, ok := before[k]; ok && v >= b {
			n += v - b
		}
	}
	return n
}

// fillDrops derives the drop and retransmit metrics from what fillProbes put into the rep's
// counters and the link deltas. Missing inputs leave the metric out rather than report 0.
func fillDrops(rep *results.Rep, links uint64, haveLinks bool) {
	if rep.Metrics == nil {
		rep.Metrics = map[string]float64{}
	}
	backlog, haveBacklog := rep.Counters["softnet.dropped"]
	if haveLinks {
		if rep.Counters == nil {
			rep.Counters = map[string]float64{}
		}
		rep.Counters[counterLinkDrops] = float64(links)
	}
	if haveBacklog || haveLinks {
		rep.Metrics[MetricDrops] = backlog + float64(links)
	}
	if v, ok := rep.Counters["sender.Tcp.RetransSegs"]; ok {
		rep.Metrics[MetricRetransSegs] = v
	} else if v, ok := rep.Counters["receiver.Tcp.RetransSegs"]; ok && len(rep.Counters) > 0 && !hasSender(rep) {
		rep.Metrics[MetricRetransSegs] = v // sender and receiver share a namespace
	}
}

func hasSender(rep *results.Rep) bool {
	for k := range rep.Counters {
		if len(k) > 7 && k[:7] == "sender." {
			return true
		}
	}
	return false
}
