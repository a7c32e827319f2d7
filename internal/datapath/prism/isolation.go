package prism

import (
	"fmt"
	"slices"
	"strings"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// HP isolation (attach prism --hp-cpus LIST): prg_prism_nic at the underlay's ingress classifies
// the inner frame of every VXLAN frame and writes a hash that the VXLAN devices' RPS maps to a
// reserved CPU (HP) or to one of the other CPUs (everything else). See bpf/prism.bpf.c and the
// package documentation for what this isolates and what it cannot.

// OptHPCPUs is the option key of --hp-cpus: the CPUs reserved for HP flows ("1", "2-3").
const OptHPCPUs = "hp_cpus"

// maxIsoCPUs is the largest RPS set the program indexes (PR_MAX_CPUS).
const maxIsoCPUs = 256

// isoConfig is HP isolation's CPU plan.
type isoConfig struct {
	HP  []int `json:"hp_cpus"` // reserved for HP, ascending
	LP  []int `json:"lp_cpus"` // everything else goes here, ascending
	Set []int `json:"rps_set"` // HP ∪ LP, ascending: the VXLAN devices' RPS map
}

// parseIsolation reads --hp-cpus (nil: isolation off). LP gets the attach's --cpus without the
// reserved ones, or every other online CPU. Reserving every CPU is refused: LP traffic would then
// share the reserved CPUs' backlogs, which is exactly what isolation exists to prevent (without
// --hp-cpus, prism's sync mode alone is that configuration).
func parseIsolation(cpus []int, hpCPUs string) (*isoConfig, error) {
	v := strings.TrimSpace(hpCPUs)
	if v == "" {
		return nil, nil
	}
	hp, err := cpuset.Parse(v)
	if err != nil {
		return nil, fmt.Errorf("prism: --hp-cpus: %w", err)
	}
	if err := cpuset.CheckOnline(hp); err != nil {
		return nil, fmt.Errorf("prism: --hp-cpus: %w", err)
	}
	pool := slices.Clone(cpus)
	if len(pool) == 0 {
		if pool, err = cpuset.Online(); err != nil {
			return nil, fmt.Errorf("prism: --hp-cpus: %w", err)
		}
	}
	c := &isoConfig{HP: hp}
	for _, p := range pool {
		if !slices.Contains(hp, p) && !slices.Contains(c.LP, p) {
			c.LP = append(c.LP, p)
		}
	}
	slices.Sort(c.LP)
	if len(c.LP) == 0 {
		return nil, fmt.Errorf("prism: --hp-cpus %s reserves every CPU low-priority traffic may use (%s): nothing would be left for it; reserve fewer CPUs", v, cpuset.Format(pool))
	}
	c.Set = slices.Sorted(slices.Values(append(slices.Clone(c.HP), c.LP...)))
	if len(c.Set) > maxIsoCPUs {
		return nil, fmt.Errorf("prism: --hp-cpus: %d CPUs in the RPS set; at most %d", len(c.Set), maxIsoCPUs)
	}
	return c, nil
}

// idxStay is the recorded index of a packet kept on its CPU (PR_IDX_STAY).
const idxStay = 0xffff

// steer is prg_prism_nic's choice for a packet of flow hash fh whose NIC stage runs on cpu: its
// index into Set (the RPS map) and the hash it writes; idxStay and hash 0 when cpu is already
// of the packet's class (RPS then leaves it there).
func (c *isoConfig) steer(hp bool, fh uint32, cpu int) (idx, hash uint32) {
	class := c.LP
	if hp {
		class = c.HP
	}
	if slices.Contains(class, cpu) {
		return idxStay, 0
	}
	idx = uint32(datapath.RPSIndex(c.Set, class[fh%uint32(len(class))]))
	return idx, datapath.RPSHash(idx, uint32(len(c.Set)), fh)
}

// isoKnobs plans the VXLAN devices' RPS: the set as the map (so RPS indexes exactly what the
// program computed) and no RFS flow table (RFS would follow the application's CPU instead).
func isoKnobs(t *datapath.Topology, c *isoConfig) ([]datapath.Knob, error) {
	var ks []datapath.Knob
	mask := cpuset.Mask(c.Set)
	for _, d := range t.ByStage(datapath.StageVXLAN) {
		for _, kv := range [][2]string{{"rps_cpus", mask}, {"rps_flow_cnt", "0"}} {
			paths, err := datapath.RxQueueKnobs(d, kv[0])
			if err != nil {
				return nil, fmt.Errorf("prism: --hp-cpus: %w", err)
			}
			for _, p := range paths {
				ks = append(ks, datapath.Knob{Netns: d.Netns, Path: p, New: kv[1]})
			}
		}
	}
	if len(t.ByStage(datapath.StageNIC)) == 0 {
		return nil, fmt.Errorf("prism: --hp-cpus needs the underlay device behind the VXLAN devices, and discovery found none: pass --underlay")
	}
	return ks, nil
}

// writeIso configures prg_prism_nic.
func (o *objects) writeIso(c *isoConfig, ports []uint16) error {
	v := prsPrismIso{N: uint32(len(c.Set)), HpCount: uint32(len(c.HP)), LpCount: uint32(len(c.LP))}
	if len(ports) > len(v.VxlanPorts) {
		return fmt.Errorf("prism: --hp-cpus: %d distinct VXLAN ports; at most %d are supported", len(ports), len(v.VxlanPorts))
	}
	copy(v.VxlanPorts[:], ports)
	for i, cpu := range c.HP {
		v.HpIdx[i] = uint16(datapath.RPSIndex(c.Set, cpu))
	}
	for i, cpu := range c.LP {
		v.LpIdx[i] = uint16(datapath.RPSIndex(c.Set, cpu))
	}
	// Double-buffered: fill the slot the program does not read, then flip prg_prism_isoact to
	// it, so a packet sees either the old configuration or the new one, never a mix.
	var cur uint32
	if err := o.PrgPrismIsoact.Lookup(uint32(0), &cur); err != nil {
		return fmt.Errorf("prism: read active isolation slot: %w", err)
	}
	next := (cur & 1) ^ 1
	cls := make([]uint8, maxCPUID)
	for c, cpus := range map[uint8][]int{clsHP: c.HP, clsLP: c.LP} {
		for _, cpu := range cpus {
			if cpu < maxCPUID { // beyond the map: packets there are steered, never kept (still correct)
				cls[cpu] = c
			}
		}
	}
	for cpu, v := range cls {
		if err := o.PrgPrismCpucls.Put(next*maxCPUID+uint32(cpu), v); err != nil {
			return fmt.Errorf("prism: write CPU classes: %w", err)
		}
	}
	if err := o.PrgPrismIso.Put(next, v); err != nil {
		return fmt.Errorf("prism: write isolation config: %w", err)
	}
	if err := o.PrgPrismIsoact.Put(uint32(0), next); err != nil {
		return fmt.Errorf("prism: switch to the new isolation config: %w", err)
	}
	return nil
}

// CPU classes of prg_prism_cpucls (PR_CLS_*) and its size (PR_MAX_CPU_ID).
const (
	clsHP    = 1
	clsLP    = 2
	maxCPUID = 4096
)

// attachNIC puts prg_prism_nic on an underlay device (tcx ingress, in its namespace) and pins the
// link. The program returns "next", so other tcx programs on the underlay still run.
func attachNIC(o *objects, target string, d datapath.Dev) (piece, error) {
	p := piece{Dev: d, NIC: true}
	ino, err := netnsutil.Inode(netnsutil.Path(d.Netns))
	if err != nil {
		return p, fmt.Errorf("prism: namespace of %s: %w", d, err)
	}
	p.Inode = uint32(ino)
	p.LinkPin = bpfobj.LinkPin(datapath.ModePinDir(target, Name), ino, d.Ifindex, d.Name, "nic")
	if err := bpfobj.AttachTCX(o.PrgPrismNic, d.Netns, d.Ifindex, false, p.LinkPin); err != nil {
		return p, fmt.Errorf("prism: underlay %s: %w", d, err)
	}
	return p, nil
}
