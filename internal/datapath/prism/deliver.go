package prism

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The gate's far end: prg_prism_dlv at tcx ingress of every pod's own device (its eth0, the
// pod's end of the veth pair), where the normal path hands a frame to the pod after every
// netfilter hook, the bridge, tc and the qdiscs of the host's veth, and the veth itself. A
// redirected frame enters the pod at that very point (bpf_redirect_peer), so what the gate
// vouches for is exactly what the redirect skips. prg_prism_pod tells the program, per pod
// device, the endpoint domain and the bridge-side veth, which userspace reads from the host side
// (the pair's peer link), never from the pod.

// podPin is one pod device carrying prg_prism_dlv, as recorded.
type podPin struct {
	Netns       string `json:"netns"` // the pod's namespace
	Dev         string `json:"dev"`
	Ifindex     int    `json:"ifindex"`
	Inode       uint32 `json:"netns_inode"`
	Domain      uint32 `json:"domain"`       // the VXLAN device's namespace inode
	HostIfindex int    `json:"host_ifindex"` // the bridge-side veth
	HostVeth    string `json:"host_veth"`
	LinkPin     string `json:"link_pin"`
}

func (p podPin) key() prsPrgDevKey { return prsPrgDevKey{Netns: p.Inode, Ifindex: uint32(p.Ifindex)} }

// podID identifies a pod device across rescans: namespace inode, ifindex, name, and which
// bridge-side veth it pairs with (a pod device re-paired is a new one).
func (p podPin) id() string {
	return fmt.Sprintf("%d/%d/%s/%d/%d", p.Inode, p.Ifindex, p.Dev, p.Domain, p.HostIfindex)
}

// podPinsOf resolves the pods of the topology to what prg_prism_pod needs.
func podPinsOf(t *datapath.Topology, vxs []vxlanDev) ([]podPin, []string) {
	pods, notes := endpoints.Pods(t, vxs)
	var out []podPin
	for _, p := range pods {
		pp := podPin{Netns: p.Ctr.Netns, Dev: p.Ctr.Name, Domain: p.VX.Inode, HostVeth: p.Host.Name}
		err := netnsutil.Do(p.Host.Netns, func() error {
			l, err := netlink.LinkByName(p.Host.Name)
			if err == nil {
				pp.HostIfindex = l.Attrs().Index
			}
			return err
		})
		if err == nil {
			err = netnsutil.Do(p.Ctr.Netns, func() error {
				l, err := netlink.LinkByName(p.Ctr.Name)
				if err == nil {
					pp.Ifindex = l.Attrs().Index
				}
				return err
			})
		}
		if err == nil {
			var ino uint64
			ino, err = netnsutil.Inode(netnsutil.Path(p.Ctr.Netns))
			pp.Inode = uint32(ino)
		}
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: %v (its HP flows take the normal path)", p.Ctr, err))
			continue
		}
		out = append(out, pp)
	}
	return out, notes
}

// attachPod describes the pod device to the program and attaches prg_prism_dlv at its tcx
// ingress, inside the pod's namespace; the pinned link outlives this process.
func attachPod(o *objects, target string, p *podPin) error {
	if o.PrgPrismDlv == nil {
		return errors.New("prism: no prg_prism_dlv (objects opened without their programs)")
	}
	if err := o.PrgPrismPod.Put(p.key(), prsPrismPod{Domain: p.Domain, Ifindex: uint32(p.HostIfindex)}); err != nil {
		return fmt.Errorf("prism: %s/%s: pod map: %w", netnsutil.Label(p.Netns), p.Dev, err)
	}
	p.LinkPin = bpfobj.LinkPin(datapath.ModePinDir(target, Name), uint64(p.Inode), p.Ifindex, p.Dev, "dlv")
	if err := bpfobj.AttachTCX(o.PrgPrismDlv, p.Netns, p.Ifindex, false, p.LinkPin); err != nil {
		return fmt.Errorf("prism: %s/%s: %w", netnsutil.Label(p.Netns), p.Dev, err)
	}
	return nil
}

// followPods makes the recorded pod devices match want: new ones are described and attached,
// vanished ones forgotten (the kernel detached their links with the device). It returns the new
// record and whether it changed.
func followPods(o *objects, target string, want, have []podPin) ([]podPin, bool, error) {
	live := map[string]bool{}
	for _, p := range want {
		live[p.id()] = true
	}
	var out []podPin
	had := map[string]bool{}
	changed := false
	var errs []error
	for _, p := range have {
		if live[p.id()] {
			out, had[p.id()] = append(out, p), true
			continue
		}
		changed = true
		_ = o.PrgPrismPod.Delete(p.key())
		errs = append(errs, bpfobj.DetachPin(p.LinkPin))
	}
	for _, p := range want {
		if had[p.id()] {
			continue
		}
		changed = true
		if err := attachPod(o, target, &p); err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, p)
	}
	return out, changed, errors.Join(errs...)
}

// removePods detaches every recorded pod device's link (Unload; the maps go with the pins).
func removePods(ps []podPin) error {
	var errs []error
	for _, p := range ps {
		errs = append(errs, bpfobj.DetachPin(p.LinkPin))
	}
	return errors.Join(errs...)
}
