package grosplit

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Check says whether device (in netns) can carry a split: it exists, has no XDP program yet,
// a veth's peer sends complete checksums (see vethPeerChecksums), and it accepts a native
// (driver mode) XDP program. The last is tried for real with a trivial
// XDP_PASS program attached and detached at once (a driver's own feature flags are not enough:
// veth, for one, also refuses when its peer's MTU is too large). The trial passes every frame,
// so it is harmless, but on some drivers (not veth) attaching XDP resets the queues briefly.
func Check(netns, device string) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("grosplit: raise memlock limit: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "prg_gs_check",
		Type:         ebpf.XDP,
		Flags:        unix.BPF_F_XDP_HAS_FRAGS, // as prg_grosplit: multi-buffer frames allowed
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return fmt.Errorf("grosplit: this kernel cannot load an XDP program (need CAP_BPF/root): %w", err)
	}
	defer prog.Close()
	return netnsutil.Do(netns, func() error {
		dev, err := netlink.LinkByName(device)
		if err != nil {
			return fmt.Errorf("grosplit: device %s in %s: %w", device, netnsutil.Label(netns), err)
		}
		if x := dev.Attrs().Xdp; x != nil && x.Attached {
			return fmt.Errorf("grosplit: device %s in %s already has an XDP program (id %d): one program per device, detach it first",
				device, netnsutil.Label(netns), x.ProgId)
		}
		if err := vethPeerChecksums(netns, dev); err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: dev.Attrs().Index, Flags: link.XDPDriverMode})
		if err != nil {
			why := err.Error()
			if errors.Is(err, unix.EOPNOTSUPP) {
				why = "the driver (" + dev.Type() + ") has no XDP support in driver mode; generic (skb) XDP cannot redirect before skb allocation, which is the point"
			}
			return fmt.Errorf("device %s has no native XDP support: %s", device, why)
		}
		return l.Close()
	})
}
