package prism

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// tombstoneTTL is how long a vanished container's endpoint keeps dropping its HP frames before
// the entry is removed (then its frames take the normal path, which has no route to it either).
const tombstoneTTL = 60 * time.Second

// endpoint is one container address the program may redirect to.
type endpoint struct {
	Domain  uint32     // netns inode of the VXLAN device's namespace
	Addr    netip.Addr // the container's inner address
	Netns   string     // namespace of the bridge-side veth (= the VXLAN device's)
	Veth    string
	Ifindex int
	CtrMAC  net.HardwareAddr
	BrMAC   net.HardwareAddr
}

func (e endpoint) key() prsPrismEpKey {
	k := prsPrismEpKey{Netns: e.Domain, Family: 4, Addr: addrWords(e.Addr)}
	if e.Addr.Is6() {
		k.Family = 6
	}
	return k
}

// vxlanDev is one VXLAN device the program is attached to, with what it decides.
type vxlanDev struct {
	Dev    datapath.Dev
	Inode  uint32
	MAC    net.HardwareAddr
	Routed bool // no bridge master: flannel-like L3 forwarding to the container bridges
}

// discoverVXLAN reads the live state of the topology's VXLAN devices.
func discoverVXLAN(t *datapath.Topology) ([]vxlanDev, error) {
	var out []vxlanDev
	for _, d := range t.ByStage(datapath.StageVXLAN) {
		ino, err := netnsutil.Inode(netnsutil.Path(d.Netns))
		if err != nil {
			return nil, fmt.Errorf("prism: namespace of %s: %w", d, err)
		}
		v := vxlanDev{Dev: d, Inode: uint32(ino), Routed: d.Master == ""}
		err = netnsutil.Do(d.Netns, func() error {
			l, err := netlink.LinkByName(d.Name)
			if err != nil {
				return err
			}
			v.Dev.Ifindex = l.Attrs().Index
			v.MAC = l.Attrs().HardwareAddr
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("prism: %s: %w", d, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// discoverEndpoints lists the container addresses behind each VXLAN device: for every
// bridge-side veth in the device's namespace (on the device's bridge for the docker style, on
// any bridge for the routed style) its container peer's global unicast addresses.
func discoverEndpoints(t *datapath.Topology, vxs []vxlanDev) ([]endpoint, []string) {
	var out []endpoint
	var notes []string
	for _, vx := range vxs {
		for _, h := range t.ByStage(datapath.StageVethHost) {
			if h.Netns != vx.Dev.Netns || (!vx.Routed && h.Master != vx.Dev.Master) {
				continue
			}
			var peer *datapath.Dev
			for i := range t.Devs {
				if t.Devs[i].String() == h.Peer {
					peer = &t.Devs[i]
				}
			}
			if peer == nil {
				notes = append(notes, fmt.Sprintf("%s: container end not found, its container gets no fast path", h))
				continue
			}
			eps, err := readEndpoint(vx, h, *peer)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s: %v (no fast path for it)", h, err))
				continue
			}
			out = append(out, eps...)
		}
	}
	return out, notes
}

func readEndpoint(vx vxlanDev, h, peer datapath.Dev) ([]endpoint, error) {
	base := endpoint{Domain: vx.Inode, Netns: h.Netns, Veth: h.Name}
	err := netnsutil.Do(h.Netns, func() error {
		l, err := netlink.LinkByName(h.Name)
		if err != nil {
			return err
		}
		base.Ifindex = l.Attrs().Index
		if l.Attrs().MasterIndex == 0 {
			return fmt.Errorf("no longer on a bridge")
		}
		br, err := netlink.LinkByIndex(l.Attrs().MasterIndex)
		if err != nil {
			return fmt.Errorf("its bridge: %w", err)
		}
		base.BrMAC = br.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []endpoint
	err = netnsutil.Do(peer.Netns, func() error {
		l, err := netlink.LinkByName(peer.Name)
		if err != nil {
			return err
		}
		base.CtrMAC = l.Attrs().HardwareAddr
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || !ip.Unmap().IsGlobalUnicast() {
				continue // link-local and the like never come through the overlay
			}
			e := base
			e.Addr = ip.Unmap()
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// syncReport says what one endpoint sync changed.
type syncReport struct {
	Live, Added, Updated, Gone, Expired int
}

// syncEndpoints makes the endpoint and port maps match the discovered endpoints. A changed or
// new endpoint gets a fresh devmap slot, written before the endpoint entry points at it; an
// endpoint that is no longer discovered becomes a tombstone (its HP frames are dropped) and its
// slot is released.
func syncEndpoints(o *objects, want []endpoint, now time.Time) (syncReport, error) {
	var rep syncReport
	have := map[prsPrismEpKey]prsPrismEp{}
	used := map[uint32]bool{}
	var k prsPrismEpKey
	var v prsPrismEp
	it := o.Ep.Iterate()
	for it.Next(&k, &v) {
		have[k] = v
		if v.Flags&epGone == 0 {
			used[v.Slot] = true
		}
	}
	if err := it.Err(); err != nil {
		return rep, fmt.Errorf("prism: read endpoints: %w", err)
	}
	next := uint32(1)
	alloc := func() uint32 {
		for used[next] {
			next++
		}
		used[next] = true
		return next
	}
	wanted := map[prsPrismEpKey]bool{}
	var errs []error
	for _, e := range want {
		key := e.key()
		wanted[key] = true
		nv := prsPrismEp{Ifindex: uint32(e.Ifindex)}
		copy(nv.CtrMac[:], e.CtrMAC)
		copy(nv.BrMac[:], e.BrMAC)
		old, exists := have[key]
		if exists && old.Flags&epGone == 0 && old.Ifindex == nv.Ifindex && old.CtrMac == nv.CtrMac && old.BrMac == nv.BrMac &&
			portHolds(o, old.Slot, old.Ifindex) {
			rep.Live++
			continue
		}
		nv.Slot = alloc()
		// The devmap resolves the ifindex in the calling thread's namespace: the veth's.
		err := netnsutil.Do(e.Netns, func() error {
			return o.Port.Put(nv.Slot, prsBpfDevmapVal{Ifindex: nv.Ifindex})
		})
		if err != nil {
			delete(used, nv.Slot)
			errs = append(errs, fmt.Errorf("prism: hold %s/%s for %s: %w", e.Netns, e.Veth, e.Addr, err))
			continue
		}
		if err := o.Ep.Put(key, nv); err != nil {
			_ = o.Port.Delete(nv.Slot)
			errs = append(errs, fmt.Errorf("prism: endpoint %s: %w", e.Addr, err))
			continue
		}
		if exists {
			if old.Flags&epGone == 0 && old.Slot != nv.Slot {
				_ = o.Port.Delete(old.Slot)
			}
			rep.Updated++
		} else {
			rep.Added++
		}
		rep.Live++
	}
	for key, old := range have {
		if wanted[key] {
			continue
		}
		if old.Flags&epGone != 0 {
			if now.Sub(time.Unix(0, int64(old.GoneNs))) > tombstoneTTL {
				if err := o.Ep.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs = append(errs, err)
				}
				rep.Expired++
			}
			continue
		}
		old.Flags |= epGone
		old.GoneNs = uint64(now.UnixNano())
		if err := o.Ep.Put(key, old); err != nil {
			errs = append(errs, fmt.Errorf("prism: tombstone: %w", err))
		}
		if err := o.Port.Delete(old.Slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
		rep.Gone++
	}
	return rep, errors.Join(errs...)
}

// portHolds tells whether a devmap slot still holds the device it was given (the kernel
// removes the slot when the device is unregistered).
func portHolds(o *objects, slot, ifindex uint32) bool {
	var v prsBpfDevmapVal
	return o.Port.Lookup(slot, &v) == nil && v.Ifindex == ifindex
}

// EndpointView is one endpoint entry as `prism rules --endpoints` and status show it.
type EndpointView struct {
	Addr    string `json:"addr"`
	Ifindex uint32 `json:"ifindex"`
	MAC     string `json:"mac"`
	Gone    bool   `json:"gone,omitempty"`
	Held    bool   `json:"held"` // the devmap slot still holds the veth
}

func (o *objects) endpoints() ([]EndpointView, error) {
	var out []EndpointView
	var k prsPrismEpKey
	var v prsPrismEp
	it := o.Ep.Iterate()
	for it.Next(&k, &v) {
		var a netip.Addr
		if k.Family == 4 {
			a = netip.AddrFrom4([4]byte{byte(k.Addr[0]), byte(k.Addr[0] >> 8), byte(k.Addr[0] >> 16), byte(k.Addr[0] >> 24)})
		} else {
			var b [16]byte
			for i, w := range k.Addr {
				b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
			}
			a = netip.AddrFrom16(b)
		}
		out = append(out, EndpointView{Addr: a.String(), Ifindex: v.Ifindex, MAC: net.HardwareAddr(v.CtrMac[:]).String(),
			Gone: v.Flags&epGone != 0, Held: v.Flags&epGone == 0 && portHolds(o, v.Slot, v.Ifindex)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, it.Err()
}
