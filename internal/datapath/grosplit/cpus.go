package grosplit

import (
	"errors"
	"fmt"
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// SetCPUs changes the split CPUs of an attached split while traffic flows. queueSize is the
// ring size of CPUs that join (0 = DefaultQueueSize); CPUs that stay keep their ring.
// New cpumap entries exist before the config names them and old ones go only after it stopped
// naming them, so no frame is aimed at a missing entry (such a frame would pass, not drop).
// Flows whose hash bucket changes move CPU once, which can reorder a few packets at that moment.
func SetCPUs(pinDir string, cpus []int, queueSize int) error {
	if err := checkCPUs(cpus); err != nil {
		return err
	}
	if queueSize == 0 {
		queueSize = DefaultQueueSize
	}
	if queueSize < 1 || queueSize > MaxQueueSize {
		return fmt.Errorf("grosplit: queue size %d out of range 1..%d", queueSize, MaxQueueSize)
	}
	cpumap, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, gsMapPrgGsCpus), nil)
	if err != nil {
		return fmt.Errorf("grosplit: open cpumap of %s (is a split attached there?): %w", pinDir, err)
	}
	defer cpumap.Close()
	cfgMap, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, gsMapPrgGsCfg), nil)
	if err != nil {
		return fmt.Errorf("grosplit: open config of %s: %w", pinDir, err)
	}
	defer cfgMap.Close()
	var cur gsGsCfg
	if err := cfgMap.Lookup(uint32(0), &cur); err != nil {
		return fmt.Errorf("grosplit: read config: %w", err)
	}
	old := make([]int, 0, cur.N_cpus)
	for i := uint32(0); i < cur.N_cpus && i < MaxSplitCPUs; i++ {
		old = append(old, int(cur.Cpus[i]))
	}
	c := Config{CPUs: cpus, QueueSize: queueSize, Batch: int(cur.Batch),
		VXLANPorts: append([]uint16{}, flow.PortList(cur.VxlanPorts[:])...), MFlow: mflowOf(cur)}
	var deq *ebpf.Program
	if c.MFlow != nil {
		if deq, err = ebpf.LoadPinnedProgram(filepath.Join(pinDir, pinDeq), nil); err != nil {
			return fmt.Errorf("grosplit: open the ring guard's program: %w", err)
		}
		defer deq.Close()
	}
	return setCPUs(cpumap, cfgMap, c, old, deq)
}

// setCPUs moves the split from the old CPU set to c.CPUs (see SetCPUs for the order).
func setCPUs(cpumap, cfgMap *ebpf.Map, c Config, old []int, deq *ebpf.Program) error {
	info, err := cpumap.Info()
	if err != nil {
		return fmt.Errorf("grosplit: cpumap info: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return errors.New("grosplit: the kernel does not report the cpumap's id")
	}
	had := map[int]bool{}
	for _, cpu := range old {
		had[cpu] = true
	}
	keep := map[int]bool{}
	for _, cpu := range c.CPUs {
		keep[cpu] = true
		if had[cpu] {
			continue
		}
		// Fd 0: no second-level XDP program on the split CPU, it goes straight to the stack.
		v := gsBpfCpumapVal{Qsize: uint32(c.QueueSize)}
		if deq != nil {
			v.BpfProg.Fd = int32(deq.FD()) // runs on the split CPU for each frame it takes
		}
		if err := cpumap.Update(uint32(cpu), &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("grosplit: add CPU %d to the cpumap (qsize %d): %w", cpu, c.QueueSize, err)
		}
	}
	v := c.bpfCfg(uint32(id))
	if err := cfgMap.Update(uint32(0), &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("grosplit: write config: %w", err)
	}
	var errs []error
	for _, cpu := range old {
		if keep[cpu] {
			continue
		}
		if err := cpumap.Delete(uint32(cpu)); err != nil {
			errs = append(errs, fmt.Errorf("grosplit: remove CPU %d from the cpumap: %w", cpu, err))
		}
	}
	return errors.Join(errs...)
}
