package stage

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Options selects what the probe counts.
type Options struct {
	// Netns lists network namespace inodes whose devices are counted. With Netns and NetnsNames
	// both empty, every device on the machine is counted.
	Netns []uint64
	// NetnsNames lists named namespaces (under /var/run/netns, or paths) to count, resolved to
	// inodes at Start. Use it to make a run see only the lab's namespaces.
	NetnsNames []string
}

// Probe is a loaded and attached stage probe. It is not pinned: closing it, or the process
// exiting, detaches and frees everything.
type Probe struct {
	objs     stageObjects
	links    []link.Link
	filtered bool
}

// Start loads the stage programs and attaches them to their tracepoints.
func Start(opts Options) (*Probe, error) {
	inodes := append([]uint64(nil), opts.Netns...)
	for _, name := range opts.NetnsNames {
		ino, err := netnsutil.Inode(netnsutil.Path(name))
		if err != nil {
			return nil, fmt.Errorf("stage probe: network namespace %q: %w", name, err)
		}
		inodes = append(inodes, ino)
	}

	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones ignore it.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, Explain(fmt.Errorf("stage probe: raise memlock limit: %w", err))
	}
	spec, err := loadStage()
	if err != nil {
		return nil, fmt.Errorf("stage probe: %w", err)
	}
	p := &Probe{filtered: len(inodes) > 0}
	if p.filtered {
		if err := spec.Variables[stageVarFilterNetns].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("stage probe: enable netns filter: %w", err)
		}
	}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		return nil, Explain(fmt.Errorf("stage probe: load: %w", err))
	}
	// Fill the filter before attaching, so no event of an unwanted namespace is ever counted.
	if err := p.AddNetns(inodes...); err != nil {
		p.Close()
		return nil, err
	}

	progs := []*ebpf.Program{
		p.objs.PrgStageSqin, p.objs.PrgStageSqout, p.objs.PrgStageNapi,
		p.objs.PrgStageRcv, p.objs.PrgStageRx,
	}
	for _, prog := range progs {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			p.Close()
			return nil, Explain(fmt.Errorf("stage probe: attach %s: %w", prog, err))
		}
		p.links = append(p.links, l)
	}
	return p, nil
}

// AddNetns adds namespaces (by inode) to the filter of a probe started with a filter. A probe
// started without one counts everything already, so adding to it is an error rather than a
// silent switch from "all" to "only these".
func (p *Probe) AddNetns(inodes ...uint64) error {
	if len(inodes) == 0 {
		return nil
	}
	if !p.filtered {
		return errors.New("stage probe: started without a netns filter; it counts all namespaces")
	}
	for _, ino := range inodes {
		if ino > 0xffffffff {
			return fmt.Errorf("stage probe: netns inode %d does not fit the kernel's 32-bit ns.inum", ino)
		}
		if err := p.objs.PrgStageNsf.Put(uint32(ino), uint8(1)); err != nil {
			return fmt.Errorf("stage probe: add netns %d to filter: %w", ino, err)
		}
	}
	return nil
}

// ProgramIDs returns the kernel IDs of the probe's programs (what `bpftool prog show id N` takes).
func (p *Probe) ProgramIDs() ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	for _, prog := range p.programs() {
		info, err := prog.Info()
		if err != nil {
			return nil, fmt.Errorf("stage probe: info of %s: %w", prog, err)
		}
		id, ok := info.ID()
		if !ok {
			return nil, fmt.Errorf("stage probe: kernel does not report the ID of %s", prog)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// programs returns the probe's loaded programs.
func (p *Probe) programs() []*ebpf.Program {
	var out []*ebpf.Program
	for _, prog := range []*ebpf.Program{
		p.objs.PrgStageRcv, p.objs.PrgStageRx, p.objs.PrgStageNapi,
		p.objs.PrgStageSqin, p.objs.PrgStageSqout,
	} {
		if prog != nil {
			out = append(out, prog)
		}
	}
	return out
}

// Close detaches the programs and frees programs and maps. It is safe to call more than once.
func (p *Probe) Close() error {
	var errs []error
	// Links first: a program stays attached as long as its link is open.
	for _, l := range p.links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stage probe: detach: %w", err))
		}
	}
	p.links = nil
	if err := p.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("stage probe: close objects: %w", err))
	}
	p.objs = stageObjects{}
	return errors.Join(errs...)
}
