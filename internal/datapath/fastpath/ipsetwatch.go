package fastpath

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// ipset has no change notifications: its netlink subsystem (NFNL_SUBSYS_IPSET) answers
// requests and has no multicast group (the kernel's nfnetlink groups are conntrack's, nftables'
// and accounting's; ip_set_core.c sends nothing unasked), and an iptables rule that matches a
// set (`-m set --match-set S src -j DROP`) does not change when the set does. So the agent asks:
// every ipsetPollEvery it lists the headers of every set of each namespace it serves (one
// netlink dump, IPSET_FLAG_LIST_HEADER: name, type, sizes, entry count; no members) and
// compares, per set a rule references, a digest of that with the last poll's; a difference
// forgets every cached flow, as an nftables change does. A set no rule references cannot
// decide a packet, so its changes are ignored (a rule that comes to reference one is an
// nftables change, or an iptables-legacy one).
//
// What this catches within ipsetPollEvery: every change of a referenced set's entry count (an
// add of a new member, a del, a flush), a set created, destroyed, renamed or swapped with one
// of another type, size or count. What it does not: a del and an add within one poll (the count
// unchanged), `ipset swap` with a set of the same type and count, a member's timeout or
// options changed in place: those reach cached flows at their re-learn (5 s). Comparing the
// members themselves would catch those too, but a dump of 10 sets of 10 000 members cost
// 40 ms of CPU (kernel and agent) on the 2-vCPU dev VM: 8 % of a CPU at this rate, against
// about 1 % for the headers (whose element count the kernel also counts by walking the set);
// docs/modes/fastpath.md has the figures.

const (
	ipsetPollEvery      = 500 * time.Millisecond
	ipsetFlagListHeader = 1 << 2 // IPSET_FLAG_LIST_HEADER
)

// watchIPSets polls the sets of namespaces nss until ctx ends and calls changed after a
// referenced set changed.
func watchIPSets(ctx context.Context, nss []string, lg datapath.Logger, changed func(why string)) {
	nss = slices.Compact(slices.Clone(nss))
	last := map[string]map[string]uint64{}
	failed := map[string]bool{}
	tick := time.NewTicker(ipsetPollEvery)
	defer tick.Stop()
	for {
		for _, ns := range nss {
			cur, err := ipsetDigests(ns, true)
			if err != nil {
				if !failed[ns] {
					lg.Printf("ipsets of %s cannot be listed (their changes reach cached flows at the re-learn, 5 s): %v", netnsutil.Label(ns), err)
					failed[ns] = true
				}
				continue
			}
			failed[ns] = false
			prev, known := last[ns]
			last[ns] = cur
			if !known {
				continue
			}
			if why := ipsetDiff(prev, cur); why != "" {
				changed(fmt.Sprintf("ipset change in %s (%s)", netnsutil.Label(ns), why))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// ipsetDiff names the referenced sets that differ between two polls ("" if none).
func ipsetDiff(prev, cur map[string]uint64) string {
	var d []string
	for name, h := range cur {
		if p, ok := prev[name]; !ok || p != h {
			d = append(d, name)
		}
	}
	for name := range prev {
		if _, ok := cur[name]; !ok {
			d = append(d, name)
		}
	}
	slices.Sort(d)
	return strings.Join(d, " ")
}

// ipsetDigests lists the sets of namespace ns and returns a digest per set that a rule
// references (no sets, or no ipset module: none).
func ipsetDigests(ns string, terse bool) (map[string]uint64, error) {
	var msgs [][]byte
	err := netnsutil.Do(ns, func() error {
		req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_IPSET<<8|nl.IPSET_CMD_LIST, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
		if terse { // headers only: name, type, sizes and entry count, no members
			req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FLAGS|unix.NLA_F_NET_BYTEORDER, binary.BigEndian.AppendUint32(nil, ipsetFlagListHeader)))
		}
		var err error
		msgs, err = req.Execute(unix.NETLINK_NETFILTER, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	return digestIPSets(msgs), nil
}

// digestIPSets folds a LIST dump's messages (each: nfgenmsg, then the set's name, type and
// header or a part of its members) into a digest per referenced set.
func digestIPSets(msgs [][]byte) map[string]uint64 {
	hs := map[string]uint64{}
	refs := map[string]bool{}
	for _, m := range msgs {
		if len(m) < sizeofNfgenmsg {
			continue
		}
		attrs := m[sizeofNfgenmsg:]
		var name string
		nlAttrs(attrs, func(typ uint16, v []byte) {
			switch typ {
			case nl.IPSET_ATTR_SETNAME:
				name = strings.TrimRight(string(v), "\x00")
			case nl.IPSET_ATTR_DATA:
				nlAttrs(v, func(typ uint16, v []byte) {
					if typ == nl.IPSET_ATTR_REFERENCES && len(v) == 4 && binary.BigEndian.Uint32(v) > 0 {
						refs[name] = true
					}
				})
			}
		})
		if name == "" {
			continue
		}
		h := fnv.New64a()
		var seed [8]byte
		binary.NativeEndian.PutUint64(seed[:], hs[name])
		h.Write(seed[:])
		// Left out: what changes without the set matching anything else (the references
		// count, the memory size, and each member's remaining timeout and counters).
		put := func(typ uint16, v []byte) {
			h.Write([]byte{byte(typ), byte(typ >> 8)})
			h.Write(v)
		}
		nlAttrs(attrs, func(typ uint16, v []byte) {
			switch typ {
			case nl.IPSET_ATTR_DATA:
				nlAttrs(v, func(t uint16, w []byte) {
					if t != nl.IPSET_ATTR_REFERENCES && t != nl.IPSET_ATTR_MEMSIZE {
						put(t, w)
					}
				})
			case nl.IPSET_ATTR_ADT:
				nlAttrs(v, func(_ uint16, entry []byte) {
					nlAttrs(entry, func(t uint16, w []byte) {
						if t != nl.IPSET_ATTR_TIMEOUT && t != nl.IPSET_ATTR_BYTES && t != nl.IPSET_ATTR_PACKETS {
							put(t, w)
						}
					})
				})
			default:
				put(typ, v)
			}
		})
		hs[name] = h.Sum64()
	}
	for name := range hs {
		if !refs[name] {
			delete(hs, name)
		}
	}
	return hs
}
