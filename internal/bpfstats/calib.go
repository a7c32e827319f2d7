package bpfstats

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// CalibrationName is the empty program's kernel name (bpftool prog show name prg_cost_calib).
const CalibrationName = "prg_cost_calib"

// Calibration is an empty tcx ingress program attached beside the measured ones. Its cost per
// run is the statistics' own overhead plus the hook's dispatch of one more program; subtracting
// it from a program's cost per run leaves what the program's body costs (its "net" cost).
type Calibration struct {
	prog *ebpf.Program
	lnk  link.Link
	id   ebpf.ProgramID
}

// NewCalibrationProgram loads the empty program (returns TCX_NEXT: it decides nothing).
func NewCalibrationProgram() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    CalibrationName,
		Type:    ebpf.SchedCLS,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, -1), // TCX_NEXT
			asm.Return(),
		},
	})
}

// AttachCalibration attaches the empty program at tcx ingress of device in namespace netns
// ("" = the current one), last in the chain, so it runs once for every packet the device
// receives, like the programs it calibrates.
func AttachCalibration(netns, device string) (*Calibration, error) {
	prog, err := NewCalibrationProgram()
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", CalibrationName, err)
	}
	c := &Calibration{prog: prog}
	attach := func() error {
		l, err := netlink.LinkByName(device)
		if err != nil {
			return err
		}
		c.lnk, err = link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: prog, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
		return err
	}
	if netns == "" {
		err = attach()
	} else {
		err = netnsutil.Do(netns, attach)
	}
	if err != nil {
		prog.Close()
		return nil, fmt.Errorf("attach %s on %s/%s: %w", CalibrationName, netns, device, err)
	}
	if info, ierr := prog.Info(); ierr == nil {
		c.id, _ = info.ID()
	}
	return c, nil
}

// ID is the calibration program's id (for Read).
func (c *Calibration) ID() ebpf.ProgramID { return c.id }

// Close detaches and unloads it. Safe on nil.
func (c *Calibration) Close() error {
	if c == nil {
		return nil
	}
	var err error
	if c.lnk != nil {
		err = c.lnk.Close()
	}
	if c.prog != nil {
		c.prog.Close()
	}
	return err
}
