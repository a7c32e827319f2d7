package lab

import (
	"fmt"
	"net/netip"
	"regexp"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Status reads the lab's record and inspects every namespace it names.
func Status(name string) (*Lab, error) {
	spec, err := readRecord(name)
	if err != nil {
		return nil, err
	}
	s := *spec
	l := &Lab{Spec: s, Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Services: s.LabServices()}
	tenant := 0 // 0 in a single-tenant lab: Node.Tenant stays out of the JSON
	add := func(set *[]Node, short, role, host, addr string) error {
		n := Node{Name: short, Netns: s.ns(short), Role: role, Host: host, Addr: addr}
		if role == "container" || role == "overlay" {
			n.Tenant = tenant
		}
		if !netnsutil.Exists(n.Netns) {
			return fmt.Errorf("lab %q is broken: namespace %s is missing; run `peregrine lab down --name %s` and build it again", s.Name, n.Netns, s.Name)
		}
		devs, err := inspect(n.Netns)
		if err != nil {
			return err
		}
		n.Devices = devs
		*set = append(*set, n)
		return nil
	}
	if s.TenantCount() > 1 {
		tenant = 1
	}
	for i := 1; i <= s.Hosts; i++ {
		addr := s.HostAddr(i).String()
		if s.Style == StyleLinux {
			addr = s.LinuxAddr(i).String() // applications use the overlay address
		}
		if err := add(&l.Hosts, hostName(i), "host", "", addr); err != nil {
			return nil, err
		}
		if s.Style == StyleDocker {
			if err := add(&l.Overlays, overlayName(i), "overlay", hostName(i), ""); err != nil {
				return nil, err
			}
		}
		if !HostEndpoints(s.Style) {
			for j := 1; j <= s.Containers; j++ {
				if err := add(&l.Containers, containerName(i, j), "container", hostName(i), s.ContainerAddr(i, j).String()); err != nil {
					return nil, err
				}
				if s.IPv6 {
					l.Containers[len(l.Containers)-1].Addr6 = s.ContainerAddr6(i, j).String()
				}
			}
		}
	}
	// The other tenants' overlays and containers come after tenant 1's, so the nodes of a
	// single-tenant lab keep their order (tools index l.Containers).
	for tenant = 2; tenant <= s.TenantCount(); tenant++ {
		for i := 1; i <= s.Hosts; i++ {
			if err := add(&l.Overlays, OverlayName(i, tenant), "overlay", hostName(i), ""); err != nil {
				return nil, err
			}
			for j := 1; j <= s.Containers; j++ {
				if err := add(&l.Containers, ContainerName(i, tenant, j), "container", hostName(i), s.ContainerAddr(i, j).String()); err != nil {
					return nil, err
				}
			}
		}
	}
	if s.ToR {
		for i := 1; i <= s.Hosts; i++ {
			if err := add(&l.ToRs, ToRName(i), "tor", hostName(i), netip.PrefixFrom(s.ToRAddr(i), 32).String()); err != nil {
				return nil, err
			}
		}
	}
	if s.Underlay == UnderlaySwitch {
		var sw []Node
		if err := add(&sw, "sw", "switch", "", ""); err != nil {
			return nil, err
		}
		l.Switch = &sw[0]
	}
	return l, nil
}

// inspect lists a namespace's devices (all but loopback) and names their receive-path stage.
func inspect(ns string) ([]Device, error) {
	nl, err := openNs(ns)
	if err != nil {
		return nil, err
	}
	defer nl.Close()
	links, err := nl.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("%s: list links: %w", ns, err)
	}
	byIndex := map[int]string{}
	for _, lk := range links {
		byIndex[lk.Attrs().Index] = lk.Attrs().Name
	}
	var devs []Device
	for _, lk := range links {
		a := lk.Attrs()
		if a.Name == "lo" {
			continue
		}
		d := Device{Name: a.Name, Kind: lk.Type(), MAC: a.HardwareAddr.String(), MTU: a.MTU, Master: byIndex[a.MasterIndex]}
		if addrs, err := nl.h.AddrList(lk, netlink.FAMILY_V4); err == nil {
			for _, ad := range addrs {
				d.Addrs = append(d.Addrs, ad.IPNet.String())
			}
		}
		if v, ok := lk.(*netlink.Vxlan); ok {
			d.VNI, d.Port = v.VxlanId, v.Port
		}
		d.Stage = stageOf(ns, d)
		devs = append(devs, d)
	}
	return devs, nil
}

var torNsRE = regexp.MustCompile(`-tor[0-9]+$`)

func stageOf(ns string, d Device) string {
	switch {
	case strings.HasSuffix(ns, "-sw"):
		return "switch"
	case torNsRE.MatchString(ns):
		return "tor"
	case d.Kind == "vxlan":
		return "vxlan"
	case d.Kind == "bridge":
		return "bridge"
	case d.Kind == "veth" && d.Master != "":
		return "veth-host"
	case d.Kind == "veth" && d.Name == "eth0" && strings.Contains(ns, "-c"):
		return "veth"
	case d.Kind == "veth" && d.Name == "eth0":
		return "nic"
	}
	return ""
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// KernelRelease is the running kernel's release string.
func KernelRelease() string { return kernelRelease() }
