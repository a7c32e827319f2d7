package stage

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/cilium/ebpf"
)

// DevKey names a device machine-wide: ifindex is unique only within a network namespace.
// The zero DevKey is the per-CPU backlog NAPI, which belongs to no device.
type DevKey struct {
	Netns   uint64 // network namespace inode (netnsutil.Inode)
	Ifindex uint32
}

// BacklogName is the Name given to the zero DevKey (the per-CPU backlog NAPI of netif_rx). It is
// counted even under a netns filter (it belongs to no namespace), so its polls are everyone's.
const BacklogName = "(backlog)"

// Counts are a device's counters on one CPU (or summed over CPUs). All are monotonic in a
// snapshot; Snapshot.Sub turns two snapshots into the work done between them.
type Counts struct {
	Packets   uint64 // skbs entering the stack on the device (netif_receive_skb); a GRO aggregate counts once
	Segs      uint64 // the same weighted by gso_segs: roughly wire packets
	Bytes     uint64 // skb->len at netif_receive_skb
	RxPackets uint64 // skbs queued to a CPU backlog for the device (netif_rx: veth, loopback, tunnels)
	RxBytes   uint64
	Polls     uint64 // NAPI polls of the device's NAPI instances
	PollWork  uint64 // packets those polls reported
	SoftirqNs uint64 // NET_RX softirq time attributed to the device (approximate; see the C source)
}

// Add returns c + o.
func (c Counts) Add(o Counts) Counts {
	return Counts{
		Packets: c.Packets + o.Packets, Segs: c.Segs + o.Segs, Bytes: c.Bytes + o.Bytes,
		RxPackets: c.RxPackets + o.RxPackets, RxBytes: c.RxBytes + o.RxBytes,
		Polls: c.Polls + o.Polls, PollWork: c.PollWork + o.PollWork, SoftirqNs: c.SoftirqNs + o.SoftirqNs,
	}
}

// sub returns c - o, clamped at zero (a device re-created under the same key restarts nothing,
// since entries are never deleted, but clamping keeps a bad pairing from wrapping around).
func (c Counts) sub(o Counts) Counts {
	d := func(a, b uint64) uint64 {
		if a < b {
			return 0
		}
		return a - b
	}
	return Counts{
		Packets: d(c.Packets, o.Packets), Segs: d(c.Segs, o.Segs), Bytes: d(c.Bytes, o.Bytes),
		RxPackets: d(c.RxPackets, o.RxPackets), RxBytes: d(c.RxBytes, o.RxBytes),
		Polls: d(c.Polls, o.Polls), PollWork: d(c.PollWork, o.PollWork), SoftirqNs: d(c.SoftirqNs, o.SoftirqNs),
	}
}

// DevCPU is one device's counters on one CPU.
type DevCPU struct {
	DevKey
	Name      string // device name when the probe first saw it, or as resolved by Annotate
	NetnsName string // named namespace ("" for unnamed or unresolved; "host" for the probe's own)
	CPU       int
	Counts
}

// CPUTotals is the NET_RX softirq time of one CPU. UnattributedNs is the part no counted device
// was charged with (tails of softirq runs, devices outside the netns filter).
type CPUTotals struct {
	CPU            int
	NetRxNs        uint64
	NetRxRuns      uint64
	UnattributedNs uint64
}

// Snapshot is the probe's counters at one moment. Devices is sorted by (Netns, Ifindex, CPU) and
// holds only entries that counted something.
type Snapshot struct {
	Taken   time.Time
	Devices []DevCPU
	CPUs    []CPUTotals
	// Missed is how many times the kernel skipped one of the probe's programs instead of
	// running it (the programs' recursion-miss counters, summed): events that happened but
	// were not counted. Non-zero means every count above may be short by up to this much.
	Missed uint64
}

// Snapshot reads all counters. It does not stop counting: entries are read one at a time.
func (p *Probe) Snapshot() (Snapshot, error) {
	if p.objs.PrgStageDev == nil {
		return Snapshot{}, errors.New("stage probe: snapshot of a closed probe")
	}
	s := Snapshot{Taken: time.Now()}

	var (
		key  stagePrgDevKey
		vals []stageStageDevVal
	)
	it := p.objs.PrgStageDev.Iterate()
	for it.Next(&key, &vals) {
		k := DevKey{Netns: uint64(key.Netns), Ifindex: key.Ifindex}
		name := p.deviceName(key)
		for cpu, v := range vals {
			c := Counts{
				Packets: v.RcvPkts, Segs: v.RcvSegs, Bytes: v.RcvBytes,
				RxPackets: v.RxPkts, RxBytes: v.RxBytes,
				Polls: v.Polls, PollWork: v.PollWork, SoftirqNs: v.SoftirqNs,
			}
			if c == (Counts{}) {
				continue
			}
			s.Devices = append(s.Devices, DevCPU{DevKey: k, Name: name, CPU: cpu, Counts: c})
		}
	}
	if err := it.Err(); err != nil {
		return Snapshot{}, fmt.Errorf("stage probe: read %s: %w", stageMapPrgStageDev, err)
	}
	sortDevices(s.Devices)

	var cpus []stageStageCpu
	if err := p.objs.PrgStageCpu.Lookup(uint32(0), &cpus); err != nil {
		return Snapshot{}, fmt.Errorf("stage probe: read %s: %w", stageMapPrgStageCpu, err)
	}
	for cpu, v := range cpus {
		s.CPUs = append(s.CPUs, CPUTotals{CPU: cpu, NetRxNs: v.NetrxNs, NetRxRuns: v.NetrxRuns, UnattributedNs: v.UnattrNs})
	}
	for _, prog := range p.programs() {
		st, err := prog.Stats()
		if err != nil {
			return Snapshot{}, fmt.Errorf("stage probe: stats of %s: %w", prog, err)
		}
		s.Missed += st.RecursionMisses
	}
	return s, nil
}

func (p *Probe) deviceName(key stagePrgDevKey) string {
	if key == (stagePrgDevKey{}) {
		return BacklogName
	}
	var n stageStageDevName
	if err := p.objs.PrgStageNames.Lookup(key, &n); err != nil {
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Sprintf("(error: %v)", err)
		}
		return ""
	}
	b := make([]byte, 0, len(n.Name))
	for _, c := range n.Name {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// Sub returns the work done between prev and s: per (device, CPU) and per CPU differences.
// Entries with no activity in between are dropped.
func (s Snapshot) Sub(prev Snapshot) Snapshot {
	type dk struct {
		DevKey
		cpu int
	}
	old := make(map[dk]Counts, len(prev.Devices))
	for _, d := range prev.Devices {
		old[dk{d.DevKey, d.CPU}] = d.Counts
	}
	out := Snapshot{Taken: s.Taken, Missed: satSub(s.Missed, prev.Missed)}
	for _, d := range s.Devices {
		d.Counts = d.Counts.sub(old[dk{d.DevKey, d.CPU}])
		if d.Counts != (Counts{}) {
			out.Devices = append(out.Devices, d)
		}
	}
	oldCPU := make(map[int]CPUTotals, len(prev.CPUs))
	for _, c := range prev.CPUs {
		oldCPU[c.CPU] = c
	}
	for _, c := range s.CPUs {
		o := oldCPU[c.CPU]
		out.CPUs = append(out.CPUs, CPUTotals{
			CPU:            c.CPU,
			NetRxNs:        satSub(c.NetRxNs, o.NetRxNs),
			NetRxRuns:      satSub(c.NetRxRuns, o.NetRxRuns),
			UnattributedNs: satSub(c.UnattributedNs, o.UnattributedNs),
		})
	}
	return out
}

// Device returns a device's counters summed over CPUs.
func (s Snapshot) Device(k DevKey) Counts {
	var c Counts
	for _, d := range s.Devices {
		if d.DevKey == k {
			c = c.Add(d.Counts)
		}
	}
	return c
}

// ByDevice returns every device's counters summed over CPUs.
func (s Snapshot) ByDevice() map[DevKey]Counts {
	m := make(map[DevKey]Counts)
	for _, d := range s.Devices {
		m[d.DevKey] = m[d.DevKey].Add(d.Counts)
	}
	return m
}

func satSub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func sortDevices(ds []DevCPU) {
	sort.Slice(ds, func(i, j int) bool {
		a, b := ds[i], ds[j]
		if a.Netns != b.Netns {
			return a.Netns < b.Netns
		}
		if a.Ifindex != b.Ifindex {
			return a.Ifindex < b.Ifindex
		}
		return a.CPU < b.CPU
	})
}
