package grosplit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Names of the pins under a PinDir. The maps keep their BPF names so bpftool output matches.
const (
	pinXDPLink   = "link_xdp"   // the XDP link: unpinning it detaches the program
	pinDropsLink = "link_drops" // tracing link of the cpumap drop counter
)

// pinDeq is the second-level cpumap program (mflow's ring guard), pinned (as every map and
// program, by its kernel name) so a live CPU-set change (SetCPUs, another process) can give new
// entries the same program.
const pinDeq = gsProgPrgGsDeq

// Attach loads the split, attaches the XDP program to cfg.Device in native (driver) mode inside
// cfg.Netns, fills the cpumap and pins everything under cfg.PinDir. It returns every pinned path
// (what Detach takes). On error nothing stays attached or pinned. The process may exit
// afterwards: the pins keep the split alive.
func Attach(cfg Config) (pins []string, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := Check(cfg.Netns, cfg.Device); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(cfg.PinDir, pinXDPLink)); err == nil {
		return nil, fmt.Errorf("grosplit: %s already holds an attached split: detach it first", cfg.PinDir)
	}
	spec, err := loadGs()
	if err != nil {
		return nil, fmt.Errorf("grosplit: %w", err)
	}
	// The cpumap is indexed by CPU id, so it needs an entry slot for every possible CPU.
	possible, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("grosplit: count possible CPUs: %w", err)
	}
	spec.Maps[gsMapPrgGsCpus].MaxEntries = uint32(possible)
	var objs gsObjects
	if err := bpfobj.Load("grosplit", spec, &objs, nil); err != nil {
		return nil, err
	}
	// Only the pins keep the split alive once Attach returns: close every fd of ours.
	defer objs.Close()

	var deq *ebpf.Program // mflow: counts what each split CPU takes off its ring
	if cfg.MFlow != nil {
		deq = objs.PrgGsDeq
	}
	if err := setCPUs(objs.PrgGsCpus, objs.PrgGsCfg, cfg, nil, deq); err != nil {
		return nil, err
	}
	undo := func(cause error) error {
		return errors.Join(cause, Detach(Pins(cfg.PinDir)))
	}
	if err := bpfobj.Pin("grosplit", cfg.PinDir, &objs); err != nil {
		return nil, undo(err)
	}
	pins = Pins(cfg.PinDir)

	// Drop counting is best effort: a kernel without the tracepoint still splits.
	if l, err := link.AttachTracing(link.TracingOptions{Program: objs.PrgGsDrops, AttachType: ebpf.AttachTraceRawTp}); err == nil {
		p := filepath.Join(cfg.PinDir, pinDropsLink)
		perr := l.Pin(p)
		l.Close()
		if perr != nil {
			return nil, undo(fmt.Errorf("grosplit: pin drop counter link: %w", perr))
		}
		pins = append(pins, p)
	}

	// The XDP link goes last: the moment it exists, frames are redirected, so the cpumap and
	// the config must already be complete.
	p := filepath.Join(cfg.PinDir, pinXDPLink)
	err = netnsutil.Do(cfg.Netns, func() error {
		// Both the ifindex and the kernel's lookup of it (BPF_LINK_CREATE) are per namespace.
		dev, err := netlink.LinkByName(cfg.Device)
		if err != nil {
			return fmt.Errorf("grosplit: device %s: %w", cfg.Device, err)
		}
		l, err := link.AttachXDP(link.XDPOptions{
			Program: objs.PrgGrosplit, Interface: dev.Attrs().Index, Flags: link.XDPDriverMode,
		})
		if err != nil {
			return fmt.Errorf("grosplit: attach XDP to %s in %s: %w", cfg.Device, netnsutil.Label(cfg.Netns), err)
		}
		defer l.Close()
		if err := l.Pin(p); err != nil {
			return fmt.Errorf("grosplit: pin XDP link: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, undo(err)
	}
	pins = append(pins, p)
	return pins, nil
}

// Detach removes pins (the paths Attach returned), the XDP link first so that no frame is
// redirected into a cpumap that is going away, then the directory if that left it empty.
// Missing pins are not an error, so Detach can be retried.
func Detach(pins []string) error {
	var errs []error
	ordered := make([]string, 0, len(pins))
	for _, p := range pins {
		if filepath.Base(p) == pinXDPLink {
			ordered = append([]string{p}, ordered...)
		} else {
			ordered = append(ordered, p)
		}
	}
	dirs := map[string]bool{}
	for _, p := range ordered {
		if strings.HasPrefix(filepath.Base(p), "link_") {
			errs = append(errs, bpfobj.DetachPin(p))
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("grosplit: unpin %s: %w", p, err))
		}
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		// Only if empty. Parents go too (PinRoot/<netns>, PinRoot) when empty, as the rest of
		// peregrine does, but never above PinRoot nor above a PinDir the caller chose elsewhere.
		if os.Remove(d) != nil {
			continue
		}
		for d = filepath.Dir(d); isUnder(d, PinRoot) && os.Remove(d) == nil; d = filepath.Dir(d) {
		}
	}
	return errors.Join(errs...)
}

// Pins lists the pinned objects an attached split has under pinDir (for a Detach from a
// process that did not keep Attach's answer): everything there, the directory is the split's.
func Pins(pinDir string) []string {
	entries, _ := os.ReadDir(pinDir)
	var out []string
	for _, e := range entries {
		out = append(out, filepath.Join(pinDir, e.Name()))
	}
	return out
}

// isUnder reports whether dir is root or inside it.
func isUnder(dir, root string) bool {
	rel, err := filepath.Rel(root, dir)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
