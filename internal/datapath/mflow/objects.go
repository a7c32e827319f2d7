package mflow

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Pin layout under datapath.PinDir(target)/mflow: the skb-level maps by their kernel names,
// one tcx link per device in links/, and the XDP split of each underlay in xdp-<device>/.
const (
	pinSub   = "mflow"
	linksSub = "links"
	mapCfg   = "prg_mf_cfg"
	mapStats = "prg_mf_stats"
	mapFlows = "prg_mf_flows"
)

func pinDir(target string) string { return filepath.Join(datapath.PinDir(target), pinSub) }

func splitDir(target, dev string) string {
	return filepath.Join(pinDir(target), "xdp-"+sanitize(dev))
}

// loadObjects loads prg_mflow_dev/port and their maps. flows, if not nil, is the flow map to use
// instead of a new one (the XDP split's, so the merge program sees its elephants).
func loadObjects(flows *ebpf.Map) (*mfObjects, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("mflow: raise memlock limit: %w", err)
	}
	spec, err := loadMf()
	if err != nil {
		return nil, fmt.Errorf("mflow: %w", err)
	}
	opts := &ebpf.CollectionOptions{}
	if flows != nil {
		opts.MapReplacements = map[string]*ebpf.Map{mapFlows: flows}
	}
	var o mfObjects
	if err := spec.LoadAndAssign(&o, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("mflow: verifier rejected the programs: %+v", verr)
		}
		return nil, fmt.Errorf("mflow: load eBPF objects (needs Linux 6.6+ for tcx): %w", err)
	}
	return &o, nil
}

// writeConfig fills prg_mf_cfg.
func writeConfig(m *ebpf.Map, c Config, ports []uint16) error {
	if len(ports) > len(mfMfCfg{}.VxlanPorts) {
		return fmt.Errorf("mflow: %d VXLAN ports, at most %d", len(ports), len(mfMfCfg{}.VxlanPorts))
	}
	v := mfMfCfg{N_cpus: uint32(len(c.CPUs))}
	copy(v.VxlanPorts[:], ports)
	cpus := slices.Sorted(slices.Values(c.CPUs)) // the RPS map's order
	for i, cpu := range cpus {
		v.Cpus[i] = uint32(cpu)
	}
	if c.Merge {
		v.Merge = 1
	}
	if c.MiceAffine {
		v.MiceAffine = 1
	}
	v.Mf.Batch = uint32(c.Batch)
	v.Mf.ElephPps = c.ElephantPPS
	v.Mf.ElephBps = c.ElephantBPS
	v.Mf.WindowNs = uint64(c.Window.Nanoseconds())
	if err := m.Put(uint32(0), v); err != nil {
		return fmt.Errorf("mflow: write config: %w", err)
	}
	return nil
}

// pinMaps pins the skb-level maps under dir (the flow map only when it is our own).
func pinMaps(o *mfObjects, dir string, ownFlows bool) error {
	if err := os.MkdirAll(filepath.Join(dir, linksSub), 0o700); err != nil {
		return fmt.Errorf("mflow: create pin directory (is bpffs mounted on /sys/fs/bpf?): %w", err)
	}
	ms := map[string]*ebpf.Map{mapCfg: o.PrgMfCfg, mapStats: o.PrgMfStats}
	if ownFlows {
		ms[mapFlows] = o.PrgMfFlows
	}
	for name, m := range ms {
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("mflow: pin %s: %w", name, err)
		}
	}
	return nil
}

// attachTCX puts prog on a device (inside its namespace) and pins the link; the pin path is
// returned even on a failed pin, so the caller's record can clean it up.
func attachTCX(prog *ebpf.Program, at ebpf.AttachType, d datapath.Dev, dir string) (string, error) {
	pin := filepath.Join(dir, linksSub, fmt.Sprintf("%s_%d_%s", sanitize(d.Netns), d.Ifindex, sanitize(d.Name)))
	var l link.Link
	err := netnsutil.Do(d.Netns, func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: d.Ifindex, Program: prog, Attach: at})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("mflow: attach tcx to %s: %w (tcx needs Linux 6.6+)", d, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return "", fmt.Errorf("mflow: pin link of %s: %w", d, err)
	}
	return pin, nil
}

// detachTCX detaches a pinned tcx link at once and removes the pin.
func detachTCX(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mflow: open pinned link %s: %w", pin, err)
	}
	derr := l.Detach()
	l.Close()
	if derr != nil && !errors.Is(derr, ebpf.ErrNotSupported) {
		return fmt.Errorf("mflow: detach %s: %w", pin, derr)
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// vxlanPorts lists the UDP ports of the topology's VXLAN devices.
func vxlanPorts(t *datapath.Topology) ([]uint16, error) {
	var out []uint16
	for _, d := range t.ByStage(datapath.StageVXLAN) {
		err := netnsutil.Do(d.Netns, func() error {
			l, err := netlink.LinkByName(d.Name)
			if err != nil {
				return err
			}
			vx, ok := l.(*netlink.Vxlan)
			if !ok {
				return fmt.Errorf("%s is not a VXLAN device", d)
			}
			port := uint16(vx.Port)
			if port == 0 {
				port = 8472 // the kernel's default
			}
			if !slices.Contains(out, port) {
				out = append(out, port)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("mflow: VXLAN port of %s: %w", d, err)
		}
	}
	if len(out) == 0 {
		out = slices.Clone(grosplit.DefaultVXLANPorts)
	}
	return out, nil
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '/' || c == '.' || c == ' ' {
			b[i] = '_'
		}
	}
	return string(b)
}
