package doctor

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Bytes VXLAN adds to an inner frame on the wire: outer IPv4 (20) or IPv6 (40), UDP (8),
// VXLAN (8) and the inner Ethernet header (14), which the VXLAN device's MTU does not count.
const (
	vxlanOverhead4 = 50
	vxlanOverhead6 = 70
)

// maxGSO is the largest packet before BIG TCP (the IPv4 total length's range).
const maxGSO = 65536

// devInfo is what the overlay checks need of one device.
type devInfo struct {
	Dev     datapath.Dev
	MTU     int
	VtepDev int  // VXLAN: the underlay ifindex it was created on (0: by route)
	IPv6    bool // VXLAN: the underlay is IPv6 (local or group address)
	GSO     []uint32
}

func (l devInfo) String() string { return l.Dev.String() }

// OverlayChecks discover the overlay behind target and check its path: MTUs, the VXLAN
// devices' transmit checksum offload and BIG TCP. Without an overlay the path checks are
// skipped.
func OverlayChecks(t Target) []Check {
	label := t.Netns
	c := Check{Name: "overlay", Target: label}
	topo, err := datapath.Discover(t.Netns, t.Underlay)
	skip := func(why string) []Check {
		var out []Check
		for _, n := range []string{"mtu", "vxlan-tx-checksum", "big-tcp", "policy-events"} {
			out = append(out, Check{Name: n, Target: label, Status: Skip, Detail: why})
		}
		return out
	}
	if err != nil {
		c.Status, c.Detail = Fail, err.Error()
		if errors.Is(err, datapath.ErrNoOverlay) {
			c.Fix = "start the overlay (flannel's VXLAN backend, a Docker overlay network) or point --netns at the host namespace that has it"
		}
		return append([]Check{c}, skip("no overlay")...)
	}
	links, err := readLinks(topo)
	if err != nil {
		c.Status, c.Detail = Fail, err.Error()
		return append([]Check{c}, skip("devices unreadable")...)
	}
	c.Status, c.Detail = OK, describe(topo)
	if len(topo.Notes) > 0 {
		c.Status, c.Fix = Warn, strings.Join(topo.Notes, "; ")
	}
	k, _ := kernelVersion()
	return []Check{c, mtuCheck(label, links), txChecksumCheck(label, links, k), bigTCPCheck(label, links), policyEventsCheck(label, topo)}
}

func describe(t *datapath.Topology) string {
	names := func(stage string) string {
		var ns []string
		for _, d := range t.ByStage(stage) {
			ns = append(ns, d.Name)
		}
		if len(ns) == 0 {
			return "none"
		}
		return strings.Join(ns, ",")
	}
	return fmt.Sprintf("VXLAN %s (UDP %v), underlay %s, %d pod veth(s)", names(datapath.StageVXLAN), t.VXLANPorts,
		names(datapath.StageNIC), len(t.ByStage(datapath.StageVeth)))
}

// readLinks reads every device of the topology through netlink in its namespace.
func readLinks(t *datapath.Topology) ([]devInfo, error) {
	handles := map[string]*netlink.Handle{}
	defer func() {
		for _, h := range handles {
			h.Close()
		}
	}()
	var out []devInfo
	for _, d := range t.Devs {
		h, ok := handles[d.Netns]
		if !ok {
			nh, err := netnsutil.Handle(d.Netns)
			if err != nil {
				return nil, err
			}
			h, err = netlink.NewHandleAt(nh)
			nh.Close()
			if err != nil {
				return nil, fmt.Errorf("netlink in %s: %w", d.Netns, err)
			}
			handles[d.Netns] = h
		}
		l, err := h.LinkByIndex(d.Ifindex)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		a := l.Attrs()
		li := devInfo{Dev: d, MTU: a.MTU, GSO: []uint32{a.GSOMaxSize, a.GROMaxSize, a.GSOIPv4MaxSize, a.GROIPv4MaxSize}}
		if vx, ok := l.(*netlink.Vxlan); ok {
			li.VtepDev = vx.VtepDevIndex
			li.IPv6 = (vx.SrcAddr != nil && vx.SrcAddr.To4() == nil) || (vx.Group != nil && vx.Group.To4() == nil)
		}
		out = append(out, li)
	}
	return out, nil
}

func byStage(links []devInfo, stage string) []devInfo {
	var out []devInfo
	for _, l := range links {
		if l.Dev.Stage == stage {
			out = append(out, l)
		}
	}
	return out
}

// vxlansOf are the VXLAN devices a pod veth's traffic crosses: the one enslaved to the same
// bridge (Docker), else the routed ones of the same namespace (flannel), else all of them.
func vxlansOf(links []devInfo, hostSide devInfo) []devInfo {
	vxs := byStage(links, datapath.StageVXLAN)
	var bridged, routed []devInfo
	for _, v := range vxs {
		if v.Dev.Netns != hostSide.Dev.Netns {
			continue
		}
		if v.Dev.Master != "" && v.Dev.Master == hostSide.Dev.Master {
			bridged = append(bridged, v)
		} else if v.Dev.Master == "" {
			routed = append(routed, v)
		}
	}
	switch {
	case len(bridged) > 0:
		return bridged
	case len(routed) > 0:
		return routed
	}
	return vxs
}

// underlaysOf are the underlay devices a VXLAN device sends on: the one it was created on,
// else every underlay discovery found (it routes by destination).
func underlaysOf(links []devInfo, vx devInfo) []devInfo {
	nics := byStage(links, datapath.StageNIC)
	for _, n := range nics {
		if vx.VtepDev != 0 && n.Dev.Ifindex == vx.VtepDev {
			return []devInfo{n}
		}
	}
	return nics
}

// mtuProblems lists what is wrong with the MTUs along the path, each with its fix: a VXLAN
// device whose MTU plus the encapsulation exceeds its underlay's (full-sized packets are
// dropped once encapsulated), and a pod veth whose MTU exceeds its VXLAN device's (the pod
// sends packets the overlay cannot carry; TCP stalls until PMTU discovery, if ever).
//
// A pod above only an IPv6-underlay VXLAN device's MTU, where an IPv4-underlay one beside it
// (the same routed host) carries it, is a note, not a problem: flannel's dual-stack VXLAN gives
// the pods flannel.1's MTU (1450) while flannel-v6.1 has 20 bytes less (1430), so every real
// dual-stack cluster over an IPv6 underlay has it. IPv4 fits; the kernel answers a larger IPv6
// packet with Packet Too Big, which the pod's TCP obeys. Failing the check would keep the node
// agent unready on every such cluster.
func mtuProblems(links []devInfo) (problems, fixes, notes []string) {
	for _, vx := range byStage(links, datapath.StageVXLAN) {
		over := vxlanOverhead4
		if vx.IPv6 {
			over = vxlanOverhead6
		}
		for _, u := range underlaysOf(links, vx) {
			if vx.MTU+over > u.MTU {
				problems = append(problems, fmt.Sprintf("%s MTU %d + %d bytes of VXLAN encapsulation = %d > underlay %s MTU %d",
					vx, vx.MTU, over, vx.MTU+over, u, u.MTU))
				fixes = append(fixes, fmt.Sprintf("lower the overlay MTU to %d (ip link set %s mtu %d, and the pods' with it: the CNI's MTU setting), or raise %s's MTU to %d",
					u.MTU-over, vx.Dev.Name, u.MTU-over, u.Dev.Name, vx.MTU+over))
			}
		}
	}
	hostSide := map[string]devInfo{}
	for _, l := range byStage(links, datapath.StageVethHost) {
		hostSide[l.Dev.String()] = l
	}
	for _, stage := range []string{datapath.StageVethHost, datapath.StageVeth} {
		for _, v := range byStage(links, stage) {
			hs := v
			if stage == datapath.StageVeth {
				h, ok := hostSide[v.Dev.Peer]
				if !ok {
					continue
				}
				hs = h
			}
			vxs := vxlansOf(links, hs)
			for _, vx := range vxs {
				if v.MTU <= vx.MTU {
					continue
				}
				if vx.IPv6 && fitsIPv4Overlay(vxs, v.MTU) {
					notes = append(notes, fmt.Sprintf("%s MTU %d > %s MTU %d (the IPv6 underlay's): IPv6 packets above %d get Packet Too Big, as flannel's dual-stack sets it up; a CNI MTU of %d avoids that",
						v, v.MTU, vx, vx.MTU, vx.MTU, vx.MTU))
					continue
				}
				problems = append(problems, fmt.Sprintf("%s MTU %d > %s MTU %d", v, v.MTU, vx, vx.MTU))
				fixes = append(fixes, fmt.Sprintf("set the pods' MTU (the CNI's MTU setting) to at most %d, the VXLAN device's", vx.MTU))
			}
		}
	}
	return problems, dedupe(fixes), notes
}

// fitsIPv4Overlay: one of vxs is an IPv4-underlay VXLAN device whose MTU holds mtu.
func fitsIPv4Overlay(vxs []devInfo, mtu int) bool {
	for _, vx := range vxs {
		if !vx.IPv6 && mtu <= vx.MTU {
			return true
		}
	}
	return false
}

func dedupe(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func mtuCheck(label string, links []devInfo) Check {
	c := Check{Name: "mtu", Target: label}
	problems, fixes, notes := mtuProblems(links)
	if len(problems) > 0 {
		c.Status, c.Detail, c.Fix = Fail, strings.Join(problems, "; "), strings.Join(fixes, "; ")
		return c
	}
	if len(notes) > 0 {
		c.Status, c.Detail = Warn, strings.Join(notes, "; ")
		return c
	}
	var parts []string
	for _, vx := range byStage(links, datapath.StageVXLAN) {
		parts = append(parts, fmt.Sprintf("%s %d", vx.Dev.Name, vx.MTU))
	}
	for _, u := range byStage(links, datapath.StageNIC) {
		parts = append(parts, fmt.Sprintf("underlay %s %d", u.Dev.Name, u.MTU))
	}
	pods := byStage(links, datapath.StageVeth)
	if len(pods) > 0 {
		lo, hi := pods[0].MTU, pods[0].MTU
		for _, p := range pods {
			lo, hi = min(lo, p.MTU), max(hi, p.MTU)
		}
		if lo == hi {
			parts = append(parts, fmt.Sprintf("pods %d", lo))
		} else {
			parts = append(parts, fmt.Sprintf("pods %d-%d", lo, hi))
		}
	}
	c.Status, c.Detail = OK, strings.Join(parts, ", ")
	return c
}

// TxChecksumVerdict judges transmit checksum offload on a VXLAN device (a VXLAN device's only
// checksum feature is tx-checksum-ip-generic) on kernel k: on 6.12 and later it throttles a
// VXLAN device to 50-300 Mbit/s in the report (projectcalico/calico#11435), and before 5.7 it
// produced bad checksums with iptables MASQUERADE --random-fully (projectcalico/calico#3145).
func TxChecksumVerdict(on bool, k Version) (Status, string) {
	switch {
	case !on:
		return OK, ""
	case k.AtLeast(6, 12):
		return Warn, "on 6.12+ kernels it was reported to cut a VXLAN device's throughput to 50-300 Mbit/s (projectcalico/calico#11435)"
	case !k.AtLeast(5, 7):
		return Warn, "before 5.7 it breaks checksums with MASQUERADE --random-fully (projectcalico/calico#3145)"
	}
	return OK, ""
}

func txChecksumCheck(label string, links []devInfo, k Version) Check {
	c := Check{Name: "vxlan-tx-checksum", Target: label, Status: OK}
	var found, fixes []string
	for _, vx := range byStage(links, datapath.StageVXLAN) {
		on, err := txChecksum(vx.Dev.Netns, vx.Dev.Name)
		if err != nil {
			found = append(found, fmt.Sprintf("%s: %v", vx, err))
			if c.Status == OK {
				c.Status = Warn
			}
			continue
		}
		st, why := TxChecksumVerdict(on, k)
		state := map[bool]string{true: "on", false: "off"}[on]
		if st != OK {
			found = append(found, fmt.Sprintf("%s tx-checksum-ip-generic %s: %s", vx, state, why))
			fixes = append(fixes, ethtoolFix(vx.Dev))
			c.Status = st
		} else {
			found = append(found, fmt.Sprintf("%s tx-checksum-ip-generic %s", vx, state))
		}
	}
	c.Detail = strings.Join(found, "; ")
	if c.Status != OK {
		c.Fix = strings.Join(fixes, "; ")
		if len(fixes) > 0 {
			// A report, not a law: on a veth lab (6.18) turning it off cost a third of the
			// throughput, so measure before and after.
			c.Fix = "if pods' throughput across nodes is far below the underlay's, turn it off and measure again: " + c.Fix
		}
		if c.Fix == "" {
			c.Fix = "could not read the offload: check with ethtool -k DEV"
		}
	}
	return c
}

func ethtoolFix(d datapath.Dev) string {
	return inNetns(d.Netns, "ethtool -K "+d.Name+" tx-checksum-ip-generic off") + " (again whenever the overlay recreates the device)"
}

// inNetns writes a command line that runs cmd in a namespace given by name or path.
func inNetns(ns, cmd string) string {
	switch {
	case ns == "":
		return cmd
	case strings.Contains(ns, "/"):
		return "nsenter --net=" + ns + " " + cmd
	}
	return "ip netns exec " + ns + " " + cmd
}

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct{ Cmd, Data uint32 }

// ifreqData is struct ifreq with ifr_data: the name, then a pointer in the union.
type ifreqData struct {
	Name [unix.IFNAMSIZ]byte
	Data uintptr
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// txChecksum reads a device's transmit checksum offload with the ETHTOOL_GTXCSUM ioctl, which
// reports whether any checksum feature is on (for a VXLAN device: tx-checksum-ip-generic).
func txChecksum(ns, dev string) (bool, error) {
	var on bool
	err := netnsutil.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v := &ethtoolValue{Cmd: unix.ETHTOOL_GTXCSUM}
		ifr := &ifreqData{Data: uintptr(unsafe.Pointer(v))}
		if len(dev) >= unix.IFNAMSIZ {
			return fmt.Errorf("device name %q too long", dev)
		}
		copy(ifr.Name[:], dev)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(ifr)))
		runtime.KeepAlive(v)
		if errno != 0 {
			return fmt.Errorf("ETHTOOL_GTXCSUM: %w", errno)
		}
		on = v.Data != 0
		return nil
	})
	return on, err
}

// BigTCP reports which of a device's GSO/GRO size limits exceed 64 KiB (BIG TCP).
func BigTCP(gso []uint32) []string {
	names := []string{"gso_max_size", "gro_max_size", "gso_ipv4_max_size", "gro_ipv4_max_size"}
	var out []string
	for i, v := range gso {
		if i < len(names) && v > maxGSO {
			out = append(out, fmt.Sprintf("%s %d", names[i], v))
		}
	}
	sort.Strings(out)
	return out
}

func bigTCPCheck(label string, links []devInfo) Check {
	c := Check{Name: "big-tcp", Target: label, Status: OK}
	var found, fixes []string
	for _, vx := range byStage(links, datapath.StageVXLAN) {
		big := BigTCP(vx.GSO)
		if len(big) == 0 {
			found = append(found, fmt.Sprintf("%s off (gso_max_size %d)", vx, vx.GSO[0]))
			continue
		}
		c.Status = Warn
		found = append(found, fmt.Sprintf("%s %s", vx, strings.Join(big, ", ")))
		fixes = append(fixes, inNetns(vx.Dev.Netns, "ip link set "+vx.Dev.Name+" gso_max_size 65536 gro_max_size 65536 gso_ipv4_max_size 65536 gro_ipv4_max_size 65536"))
	}
	c.Detail = strings.Join(found, "; ")
	if c.Status != OK {
		c.Fix = "peregrine's programs were built and measured for packets up to 64 KiB (an IPv4 BIG TCP packet carries no total length); keep BIG TCP off the overlay unless you have measured it: " + strings.Join(fixes, "; ")
	}
	return c
}
