package fastpath

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// BIG TCP (option big_tcp): GSO and GRO packets above 64 KiB through the overlay, so a bulk
// flow pays each per-packet cost (the stack, the VXLAN device, the fast path's programs) for
// up to 8x more bytes. The kernel's IPv4 BIG TCP writes tot_len 0 in such packets and segments
// them where a device cannot carry them; each device on the way must allow the size:
//   - the pods' veths (both ends): the pod's TCP builds packets up to its device's
//     gso_ipv4_max_size; GRO at either end may merge up to gro_ipv4_max_size;
//   - the bridge and the VXLAN device: a flow's first packets and its re-learn packets take the
//     normal path, where the VXLAN device encapsulates them whole (the fast path carries the
//     rest, bpf/fastpath.h parse_big);
//   - the underlay: its GSO sizes let a big encapsulated packet leave whole where the NIC
//     segments it. Its GRO sizes stay: the receive fast path leaves frames above 64 KiB to the
//     normal path, whose gro_cells and veth backlog queue them, so the small packets of the
//     same flow the fast path delivers at once would overtake them (reordering). At 64 KiB
//     every frame of a flow takes one path.
// gso sizes cannot exceed a device's tso_max_size (the kernel refuses); a device that cannot
// carry more than 64 KiB makes attach refuse, naming it, rather than half-apply.

// bigTCPMin is the smallest useful size: BIG TCP is about packets above the legacy 64 KiB.
const bigTCPMin = 65536

var bigTCPAttrs = []string{"gso_max_size", "gso_ipv4_max_size", "gro_max_size", "gro_ipv4_max_size"}

// bigTCPKnobs are the link knobs setting size on every device of the overlay path: the
// topology's devices (underlay, VXLAN device, both ends of the pod veths) and the bridges
// they are enslaved to.
func bigTCPKnobs(t *datapath.Topology, size int) ([]datapath.Knob, error) {
	if size == 0 {
		return nil, nil
	}
	if size <= bigTCPMin {
		return nil, fmt.Errorf("fastpath: big_tcp %d: BIG TCP is a size above 64 KiB (%d), up to 524280; 0 leaves it off", size, bigTCPMin)
	}
	type nd struct {
		ns, name string
		nic      bool
	}
	var devs []nd
	seen := map[nd]bool{}
	add := func(d nd) {
		if d.name != "" && !seen[d] {
			seen[d] = true
			devs = append(devs, d)
		}
	}
	for _, d := range t.Devs {
		switch d.Stage {
		case datapath.StageNIC, datapath.StageVXLAN, datapath.StageVethHost, datapath.StageVeth:
			add(nd{d.Netns, d.Name, d.Stage == datapath.StageNIC})
			if d.Master != "" {
				add(nd{d.Netns, d.Master, false})
			}
		}
	}
	var ks []datapath.Knob
	for _, d := range devs {
		tso, err := tsoMax(d.ns, d.name)
		if err != nil {
			return nil, fmt.Errorf("fastpath: big_tcp: %s/%s: %w", netnsutil.Label(d.ns), d.name, err)
		}
		if tso == 0 {
			return nil, fmt.Errorf("fastpath: big_tcp: %s/%s: the kernel reports no tso_max_size or gso_ipv4_max_size (IPv4 BIG TCP needs Linux 6.3 or later)", netnsutil.Label(d.ns), d.name)
		}
		if int(tso) <= bigTCPMin {
			return nil, fmt.Errorf("fastpath: big_tcp: %s/%s: tso_max_size %d: the device cannot carry GSO packets above 64 KiB, so BIG TCP cannot cross it", netnsutil.Label(d.ns), d.name, tso)
		}
		gso := min(size, int(tso))
		for _, a := range bigTCPAttrs {
			v := size
			if strings.HasPrefix(a, "gso") {
				v = gso
			} else if d.nic {
				continue
			}
			ks = append(ks, datapath.Knob{Netns: d.ns, Path: datapath.LinkKnobPath(d.name, a), New: strconv.Itoa(v)})
		}
	}
	return ks, nil
}

// tsoMax is a device's tso_max_size, 0 where the kernel does not report it or the IPv4 sizes.
func tsoMax(ns, dev string) (uint32, error) {
	var tso uint32
	err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		a := l.Attrs()
		if a.GSOIPv4MaxSize != 0 {
			tso = a.TSOMaxSize
		}
		return nil
	})
	return tso, err
}
