package mflow

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
	"github.com/peregrine-net/peregrine/internal/probe"
)

// SkbStats are the counters of the skb-level programs (device split and merge), summed over CPUs.
type SkbStats struct {
	Split, Mice, Passed, Batches, Merged uint64
	Holds                                uint64 // reorder guard: flows put on hold
	ToCPU, BatchToCPU, MergeToCPU        map[int]uint64
}

// ReadSkbStats reads prg_mf_stats of an attachment.
func ReadSkbStats(target string) (SkbStats, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(datapath.ModePinDir(target, Name), mapStats), nil)
	if err != nil {
		return SkbStats{}, fmt.Errorf("mflow: open stats: %w", err)
	}
	defer m.Close()
	var per []mfMfStats
	if err := m.Lookup(uint32(0), &per); err != nil {
		return SkbStats{}, fmt.Errorf("mflow: read stats: %w", err)
	}
	s := SkbStats{ToCPU: map[int]uint64{}, BatchToCPU: map[int]uint64{}, MergeToCPU: map[int]uint64{}}
	for _, v := range per {
		s.Split += v.Split
		s.Mice += v.Mice
		s.Passed += v.Passed
		s.Batches += v.Batches
		s.Merged += v.Merged
		s.Holds += v.Holds
		for i := range v.ToCpu {
			s.ToCPU[i] += v.ToCpu[i]
			s.BatchToCPU[i] += v.BatchToCpu[i]
			s.MergeToCPU[i] += v.MergeToCpu[i]
		}
	}
	return s, nil
}

// Flow is one flow either split point has seen (the same fields, from either flow map).
type Flow = grosplit.FlowState

// ReadFlows lists the flows of an attachment: the XDP split's (full-path) or the tcx program's.
func ReadFlows(st *datapath.State) ([]Flow, error) {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		return nil, err
	}
	if ms.Config.SplitAt == SplitFullPath {
		var out []Flow
		for _, d := range ms.SplitDirs {
			fs, err := grosplit.ReadFlows(d)
			if err != nil {
				return nil, err
			}
			out = append(out, fs...)
		}
		return out, nil
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(datapath.ModePinDir(st.Target, Name), mapFlows), nil)
	if err != nil {
		return nil, fmt.Errorf("mflow: open flow map: %w", err)
	}
	defer m.Close()
	var out []Flow
	var k mfPrgFlow
	var v mfMfFlowState
	for it := m.Iterate(); it.Next(&k, &v); {
		out = append(out, grosplit.NewFlowState(k.Saddr, k.Daddr, k.Sport, k.Dport, k.Proto, grosplit.RawFlow{FirstNs: v.FirstNs,
			LastNs: v.LastNs, RatePps: v.RatePps, RateBps: v.RateBps, Pkts: v.Pkts, Bytes: v.Bytes, Seq: v.Seq,
			Batches: v.Batches, Elephant: v.Elephant, LastSlot: v.LastSlot, Promotions: v.Promotions, Demotions: v.Demotions}))
	}
	return out, nil
}

// Report is the status text: settings, split counters and batches per CPU, the split flows,
// drops in every queue mflow adds, and the receivers' reordering counters since attach.
func (mode) Report(st *datapath.State) (string, error) {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		return "", err
	}
	c := ms.Config
	var b strings.Builder
	thr := []string{}
	if c.ElephantPPS > 0 {
		thr = append(thr, fmt.Sprintf("%d pkt/s", c.ElephantPPS))
	}
	if c.ElephantBPS > 0 {
		thr = append(thr, fmt.Sprintf("%s bit/s", si(c.ElephantBPS)))
	}
	eleph := "every flow (no threshold)"
	if len(thr) > 0 {
		eleph = ">= " + strings.Join(thr, " or ") + " over " + c.Window.String()
	}
	mice := "pass (normal path)"
	if c.MiceAffine {
		mice = "flow-affine on the splitting CPUs"
	}
	guard := "off"
	if c.Guard > 0 {
		guard = fmt.Sprintf("%d out-of-order segments per window hold a flow on one path for %v (doubling)", c.Guard, c.GuardHold)
	}
	fmt.Fprintf(&b, "  mflow     split at %s on CPUs %v, batch %d, elephants %s, mice %s, merge %v, reorder guard %s\n",
		c.SplitAt, c.CPUs, c.Batch, eleph, mice, c.Merge, guard)
	for _, d := range ms.SplitDirs {
		s, err := grosplit.ReadStats(d)
		if err != nil {
			return b.String(), err
		}
		t := s.Sum()
		fmt.Fprintf(&b, "  irq split %s: redirected %d, passed %d (mice %d, not IP/VXLAN %d), batches %d: %s\n",
			filepath.Base(d), t.Redirected, t.Passed, t.Mice, t.Passed-min(t.Passed, t.Mice+t.Missed), t.Batches, perCPU(t.BatchToCPU))
		fmt.Fprintf(&b, "            drops: cpumap ring full %d; ring guard: diverted to another CPU %d, passed (every ring nearly full) %d; target missing (passed) %d\n",
			t.Dropped, t.Diverted, t.Overflow, t.Missed)
	}
	if c.SplitAt == SplitDevice || c.watchesPorts() {
		s, err := ReadSkbStats(st.Target)
		if err != nil {
			return b.String(), err
		}
		if c.SplitAt == SplitDevice {
			fmt.Fprintf(&b, "  dev split packets split %d, mice %d, untouched %d, batches %d: %s\n", s.Split, s.Mice, s.Passed, s.Batches, perCPU(s.BatchToCPU))
		}
		if c.Merge {
			fmt.Fprintf(&b, "  merge     packets of split flows merged %d: %s\n", s.Merged, perCPU(s.MergeToCPU))
		}
		if c.Guard > 0 {
			fmt.Fprintf(&b, "  guard     holds %d (flows put back on one path after reordering)\n", s.Holds)
		}
	}
	if sn, err := probe.ReadSoftnet(); err == nil && ms.SoftnetDropped != nil {
		var parts []string
		for _, r := range sn.PerCPU {
			parts = append(parts, fmt.Sprintf("cpu%d %d", r.CPU, r.Dropped-min(r.Dropped, ms.SoftnetDropped[r.CPU])))
		}
		fmt.Fprintf(&b, "            backlog (softnet) drops since attach, all traffic: %s\n", strings.Join(parts, ", "))
	}
	flows, err := ReadFlows(st)
	if err != nil {
		return b.String(), err
	}
	sort.Slice(flows, func(i, j int) bool { return flows[i].Packets > flows[j].Packets })
	n := 0
	for _, f := range flows {
		if f.Elephant {
			n++
		}
	}
	fmt.Fprintf(&b, "  flows     %d seen, %d split now (elephants)\n", len(flows), n)
	now := coarseNow()
	for i, f := range flows {
		if i == 8 {
			fmt.Fprintf(&b, "            ... %d more\n", len(flows)-i)
			break
		}
		state := "mouse   "
		if f.Elephant {
			state = "ELEPHANT"
		}
		if f.Elephant && f.HoldUntil > now {
			state = "HELD    "
		}
		fmt.Fprintf(&b, "            %s %s %s: %s pkt/s %s bit/s, %d pkts, %d split in %d batches, promoted %d demoted %d, out of order %d, holds %d\n",
			state, protoName(f.Proto), flowName(f), si(f.RatePPS), si(f.RateBPS), f.Packets, f.Split, f.Batches, f.Promotions, f.Demotions, f.OutOfOrder, f.Holds)
	}
	var nss []string
	for ns := range ms.Receivers {
		nss = append(nss, ns)
	}
	slices.Sort(nss)
	for _, ns := range nss {
		cs, err := probe.ReadNstat(ns)
		if err != nil {
			continue // the container is gone
		}
		now := pick(cs)
		var parts []string
		for _, name := range reorderCounters {
			_, short, _ := strings.Cut(name, ".")
			parts = append(parts, fmt.Sprintf("%s +%d", short, now[name]-ms.Receivers[ns][name]))
		}
		fmt.Fprintf(&b, "  reorder   %s: %s (since attach)\n", filepath.Base(ns), strings.Join(parts, ", "))
	}
	return b.String(), nil
}

func perCPU(m map[int]uint64) string {
	var cpus []int
	for c, v := range m {
		if v > 0 {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return "none yet"
	}
	slices.Sort(cpus)
	var parts []string
	for _, c := range cpus {
		parts = append(parts, fmt.Sprintf("cpu%d %d", c, m[c]))
	}
	return strings.Join(parts, ", ")
}

func flowName(f Flow) string {
	return fmt.Sprintf("%s > %s", netip.AddrPortFrom(f.Src, f.Sport), netip.AddrPortFrom(f.Dst, f.Dport))
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return fmt.Sprintf("proto%d", p)
}

func si(v uint64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.1fG", float64(v)/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", float64(v)/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", float64(v)/1e3)
	}
	return fmt.Sprint(v)
}

// coarseNow is CLOCK_MONOTONIC_COARSE, the clock of bpf_ktime_get_coarse_ns (the holds' clock).
func coarseNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return time.Duration(ts.Sec)*time.Second + time.Duration(ts.Nsec)
}
