package grosplit

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
)

// Limits of the BPF side (bpf/grosplit.bpf.c): keep them in step with its GS_MAX_* constants.
const (
	MaxSplitCPUs = 64                 // CPUs in one split set (GS_MAX_SLOTS)
	MaxCPUID     = 255                // highest CPU id the per-target counters cover (GS_MAX_CPUS-1)
	MaxPorts     = flow.VXLANMaxPorts // VXLAN ports (PRG_VXLAN_MAX_PORTS)
	MaxQueueSize = 16384              // the kernel's cpumap qsize limit
)

// Defaults applied by Attach to zero fields.
const DefaultQueueSize = 2048

// DefaultVXLANPorts are the IANA port (Linux vxlan default, Docker overlay) and the Linux legacy
// port that Flannel uses.
var DefaultVXLANPorts = flow.DefaultVXLANPorts

// PinRoot is where peregrine pins eBPF objects; the default PinDir lives under it.
var PinRoot = "/sys/fs/bpf/peregrine"

// Config describes one split: which device's receive stage to cut and where the halves go.
type Config struct {
	Netns  string // named network namespace (or path) of Device; "" = the current one
	Device string // underlay device that runs the XDP program (native mode)
	CPUs   []int  // split CPUs: the cpumap entries whose kthreads build skbs and run GRO
	// PinDir holds every pinned object. "" = PinRoot/<netns>/grosplit-<device>.
	PinDir string
	// QueueSize is each split CPU's cpumap ring size in frames (0 = DefaultQueueSize).
	QueueSize int
	// VXLANPorts are the UDP destination ports whose frames hash on the inner 5-tuple
	// (nil = DefaultVXLANPorts; an empty non-nil slice disables inner hashing).
	VXLANPorts []uint16
	// Batch 0 keeps flow affinity (no reordering). B > 0 is MFLOW's micro-flow mode: batches of
	// B consecutive packets of a flow rotate round-robin over CPUs, which reorders across batches.
	Batch int
	// MFlow, if set, turns on MFLOW's elephant-gated micro-flows (see mflow.go); Batch must be 0.
	MFlow *MFlow
}

// withDefaults returns a copy with zero fields filled and everything checked.
func (c Config) withDefaults() (Config, error) {
	if c.Device == "" {
		return c, errors.New("grosplit: no device given")
	}
	if c.PinDir == "" {
		c.PinDir = DefaultPinDir(c.Netns, c.Device)
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.VXLANPorts == nil {
		c.VXLANPorts = DefaultVXLANPorts
	}
	if c.QueueSize < 1 || c.QueueSize > MaxQueueSize {
		return c, fmt.Errorf("grosplit: queue size %d out of range 1..%d", c.QueueSize, MaxQueueSize)
	}
	if len(c.VXLANPorts) > MaxPorts {
		return c, fmt.Errorf("grosplit: %d VXLAN ports given, at most %d", len(c.VXLANPorts), MaxPorts)
	}
	for _, p := range c.VXLANPorts {
		if p == 0 {
			return c, errors.New("grosplit: VXLAN port 0 is not a port")
		}
	}
	if c.Batch < 0 || c.Batch > 1<<30 {
		return c, fmt.Errorf("grosplit: batch %d out of range (0 = flow affinity, B > 0 = micro-flows)", c.Batch)
	}
	if err := c.MFlow.check(c.Batch); err != nil {
		return c, err
	}
	return c, checkCPUs(c.CPUs)
}

// DefaultPinDir is where Attach pins a split when Config.PinDir is empty.
func DefaultPinDir(netns, device string) string {
	key := "root"
	if netns != "" {
		key = strings.ReplaceAll(strings.TrimPrefix(netns, "/"), "/", "_")
	}
	return filepath.Join(PinRoot, key, "grosplit-"+device)
}

// checkCPUs wants a non-empty set of distinct, online CPUs the BPF side can count.
func checkCPUs(cpus []int) error {
	if len(cpus) == 0 {
		return errors.New("grosplit: no split CPUs given")
	}
	if len(cpus) > MaxSplitCPUs {
		return fmt.Errorf("grosplit: %d split CPUs given, at most %d", len(cpus), MaxSplitCPUs)
	}
	possible, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("grosplit: count possible CPUs: %w", err)
	}
	online, err := cpuset.Online()
	if err != nil {
		return fmt.Errorf("grosplit: %w", err)
	}
	seen := map[int]bool{}
	for _, c := range cpus {
		switch {
		case c < 0 || c > MaxCPUID || c >= possible:
			return fmt.Errorf("grosplit: CPU %d out of range (this machine has %d possible CPUs, grosplit counts up to %d)", c, possible, MaxCPUID)
		case !slices.Contains(online, c):
			return fmt.Errorf("grosplit: CPU %d is offline", c)
		case seen[c]:
			return fmt.Errorf("grosplit: CPU %d listed twice (a flow's CPU is a hash bucket: duplicates would skew the split)", c)
		}
		seen[c] = true
	}
	return nil
}

// bpfCfg is the prg_gs_cfg entry for a (defaulted) config.
func (c Config) bpfCfg(cpumapID uint32) gsGsCfg {
	v := gsGsCfg{
		N_cpus:   uint32(len(c.CPUs)),
		Batch:    uint32(c.Batch),
		CpumapId: cpumapID,
	}
	copy(v.VxlanPorts[:], c.VXLANPorts)
	for i, cpu := range c.CPUs {
		v.Cpus[i] = uint32(cpu)
	}
	c.MFlow.fill(&v)
	if c.MFlow != nil {
		// Leave room for the frames in flight between the guard's check and the enqueue (bulks
		// of 8 per CPU, several XDP CPUs on a veth underlay).
		v.RingGuard = uint32(c.QueueSize - min(128, c.QueueSize/2))
	}
	return v
}
