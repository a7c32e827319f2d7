package fastpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// linkPin names the pin of one tcx link: <netns inode>_<ifindex>_<device>_<in|eg>.
func linkPin(target string, inode uint32, ifindex int, dev, dir string) string {
	return filepath.Join(datapath.ModePinDir(target, Name), linksSub, fmt.Sprintf("%d_%d_%s_%s", inode, ifindex,
		strings.NewReplacer("/", "_", ".", "_").Replace(dev), dir))
}

// attachTCX attaches prog to a device (in namespace ns) and pins the link; an existing pin
// means it is already attached.
func attachTCX(prog *ebpf.Program, ns string, ifindex int, at ebpf.AttachType, pin string) (bool, error) {
	if _, err := os.Stat(pin); err == nil {
		return false, nil
	}
	var l link.Link
	err := netnsutil.Do(ns, func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
		return err
	})
	if err != nil {
		return false, err
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		_ = l.Close()
		return false, err
	}
	return true, nil
}

// attachOverlay attaches the receive program and the transmit learner: on the underlay
// (routed layout) or on the VXLAN device (bridged layout).
func attachOverlay(p *pinned, target string, ov *overlay) error {
	pp := p.progs(ov.Index)
	if pp == nil {
		return fmt.Errorf("fastpath: the programs of overlay %d (%s) are not open", ov.Index, ov.VX.Dev)
	}
	rx, lrn, dev, inode := pp.PrgFastpathRx, pp.PrgFastpathLrnTx, ov.Underlay, ov.VX.Inode
	if ov.Layout == LayoutBridged {
		rx, lrn, dev = pp.PrgFastpathDrx, pp.PrgFastpathDlrnTx, ov.VX.Dev
	} else {
		ino, err := netnsutil.Inode(netnsutil.Path(target))
		if err != nil {
			return err
		}
		inode = uint32(ino)
	}
	if _, err := attachTCX(rx, dev.Netns, dev.Ifindex, ebpf.AttachTCXIngress, linkPin(target, inode, dev.Ifindex, dev.Name, "in")); err != nil {
		return fmt.Errorf("fastpath: attach tcx ingress to %s: %w (tcx needs Linux 6.6+)", dev, err)
	}
	if _, err := attachTCX(lrn, dev.Netns, dev.Ifindex, ebpf.AttachTCXEgress, linkPin(target, inode, dev.Ifindex, dev.Name, "eg")); err != nil {
		return fmt.Errorf("fastpath: attach tcx egress to %s: %w", dev, err)
	}
	return nil
}

// attachPods attaches the pods' side of overlay ov (its copy of the programs) to every
// bridge-side veth of eps that lacks it: the transmit program at ingress (what the pod sends),
// the receive learner at egress.
func attachPods(p *pinned, target string, ov *overlay, eps []endpoints.Endpoint) (int, error) {
	pp := p.progs(ov.Index)
	if pp == nil {
		return 0, fmt.Errorf("fastpath: the programs of overlay %d (%s) are not open", ov.Index, ov.VX.Dev)
	}
	tx := pp.PrgFastpathTx
	if ov.Layout == LayoutBridged {
		tx = pp.PrgFastpathDtx
	}
	n := 0
	seen := map[int]bool{}
	var errs []error
	for _, e := range eps {
		if seen[e.Ifindex] {
			continue
		}
		seen[e.Ifindex] = true
		added, err := attachTCX(tx, e.Netns, e.Ifindex, ebpf.AttachTCXIngress, linkPin(target, e.Domain, e.Ifindex, e.Veth, "in"))
		if err == nil {
			var a2 bool
			a2, err = attachTCX(pp.PrgFastpathLrnRx, e.Netns, e.Ifindex, ebpf.AttachTCXEgress, linkPin(target, e.Domain, e.Ifindex, e.Veth, "eg"))
			added = added || a2
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("fastpath: attach to %s/%s: %w", e.Netns, e.Veth, err))
			continue
		}
		if added {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// pruneLinks removes the pins of links whose device is gone (the kernel detached them) and
// returns how many.
func pruneLinks(target string, nsByInode map[uint32]string) int {
	dir := filepath.Join(datapath.ModePinDir(target, Name), linksSub)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		f := strings.SplitN(e.Name(), "_", 3)
		if len(f) != 3 {
			continue
		}
		ino, _ := strconv.ParseUint(f[0], 10, 32)
		idx, _ := strconv.Atoi(f[1])
		ns, ok := nsByInode[uint32(ino)]
		if !ok {
			// A namespace no overlay is in any more (a docker overlay that went away): its
			// links went with their devices.
			if !bpfobj.LinkAlive(filepath.Join(dir, e.Name())) && os.Remove(filepath.Join(dir, e.Name())) == nil {
				n++
			}
			continue
		}
		alive := false
		_ = netnsutil.Do(ns, func() error {
			l, err := netlink.LinkByIndex(idx)
			alive = err == nil && strings.HasPrefix(f[2], strings.NewReplacer("/", "_", ".", "_").Replace(l.Attrs().Name)+"_")
			return nil
		})
		if !alive && os.Remove(filepath.Join(dir, e.Name())) == nil {
			n++
		}
	}
	return n
}
