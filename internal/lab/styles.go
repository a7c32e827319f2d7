package lab

// dockerHost builds Docker's overlay driver layout on host i: the VXLAN device is created in
// the host namespace (so its UDP socket and underlay stay there) and then moved into a separate
// overlay namespace with the bridge; containers hang off the bridge. Remote containers are known
// statically (FDB: MAC -> VTEP; neighbour: IP -> MAC with ARP proxying), as Docker's control
// plane programs them.
func (b *builder) dockerHost(i int) error {
	for t := 1; t <= b.s.TenantCount(); t++ {
		if err := b.dockerTenant(i, t); err != nil {
			return err
		}
	}
	return nil
}

// dockerTenant builds tenant t's overlay on host i (tenant 1: the only one without --tenants):
// its overlay namespace, VXLAN device (the tenant's VNI), bridge and containers, and the static
// entries for the same tenant's containers on the other hosts.
func (b *builder) dockerTenant(i, t int) error {
	s := b.s
	host, err := b.at(hostName(i))
	if err != nil {
		return err
	}
	ov, err := b.newNs(OverlayName(i, t))
	if err != nil {
		return err
	}
	if err := host.vxlan(vxlanConf{name: "vxlan0", vni: s.TenantVNI(t), port: s.VXLANPort, local: s.HostAddr(i).Addr(),
		dev: "eth0", mtu: s.OverlayMTU(), mac: s.VTEPMAC(i), proxy: true}); err != nil {
		return err
	}
	if err := host.moveTo("vxlan0", ov); err != nil {
		return err
	}
	if err := ov.bridge("br0", s.OverlayMTU()); err != nil {
		return err
	}
	if err := ov.master("vxlan0", "br0"); err != nil {
		return err
	}
	if err := ov.up("br0", "vxlan0"); err != nil {
		return err
	}
	for j := 1; j <= s.Containers; j++ {
		index := 0
		if t > 1 {
			index = TenantPortIndex(t, j)
		}
		if _, err := b.bridgedContainer(ov, "br0", ContainerName(i, t, j), i, j, index); err != nil {
			return err
		}
	}
	for k := 1; k <= s.Hosts; k++ {
		if k == i {
			continue
		}
		for j := 1; j <= s.Containers; j++ {
			if err := ov.fdb("vxlan0", s.ContainerMAC(k, j), s.HostAddr(k).Addr()); err != nil {
				return err
			}
			if err := ov.neigh("vxlan0", s.ContainerAddr(k, j).Addr(), s.ContainerMAC(k, j)); err != nil {
				return err
			}
		}
	}
	return nil
}

// bridgedContainer creates container j of host i in namespace name: its eth0 (the container's MAC
// and overlay address, up) is a veth whose peer vethJ sits in n, enslaved to bridge br and up, as
// Docker's overlay driver and the CNI bridge plugin wire a container. index is the ifindex of
// vethJ (0: the kernel picks).
func (b *builder) bridgedContainer(n *nsLinks, br, name string, i, j, index int) (*nsLinks, error) {
	s := b.s
	c, err := b.newNs(name)
	if err != nil {
		return nil, err
	}
	port := BridgePort(j)
	if err := n.vethAt(port, index, nil, c, "eth0", s.ContainerMAC(i, j), s.OverlayMTU()); err != nil {
		return nil, err
	}
	if err := n.master(port, br); err != nil {
		return nil, err
	}
	if err := n.up(port); err != nil {
		return nil, err
	}
	if err := c.addr("eth0", s.ContainerAddr(i, j)); err != nil {
		return nil, err
	}
	if err := c.up("eth0"); err != nil {
		return nil, err
	}
	return c, nil
}

// flannelHost builds flannel's VXLAN backend on host i: flannel.1 in the host namespace, the cni0
// bridge with the host's /24, and for each remote host a route to its /24 via its flannel.1
// address, a permanent neighbour for that address and an FDB entry to its VTEP (flannel programs
// these from its subnet leases instead of letting the kernel learn).
func (b *builder) flannelHost(i int) error {
	s := b.s
	host, err := b.at(hostName(i))
	if err != nil {
		return err
	}
	if err := host.vxlan(vxlanConf{name: "flannel.1", vni: s.VNI, port: s.VXLANPort, local: s.HostAddr(i).Addr(),
		dev: "eth0", mtu: s.OverlayMTU(), mac: s.VTEPMAC(i)}); err != nil {
		return err
	}
	if err := host.addr("flannel.1", s.FlannelAddr(i)); err != nil {
		return err
	}
	if err := host.bridge("cni0", s.OverlayMTU()); err != nil {
		return err
	}
	if err := host.addr("cni0", s.GatewayAddr(i)); err != nil {
		return err
	}
	if err := host.up("flannel.1", "cni0"); err != nil {
		return err
	}
	for j := 1; j <= s.Containers; j++ {
		c, err := b.bridgedContainer(host, "cni0", containerName(i, j), i, j, 0)
		if err != nil {
			return err
		}
		if err := c.route("eth0", netipPrefixZero, s.GatewayAddr(i).Addr(), false); err != nil {
			return err
		}
	}
	for k := 1; k <= s.Hosts; k++ {
		if k == i {
			continue
		}
		gw := s.FlannelAddr(k).Addr()
		if err := host.neigh("flannel.1", gw, s.VTEPMAC(k)); err != nil {
			return err
		}
		if err := host.fdb("flannel.1", s.VTEPMAC(k), s.HostAddr(k).Addr()); err != nil {
			return err
		}
		if err := host.route("flannel.1", s.HostSubnet(k), gw, true); err != nil {
			return err
		}
	}
	if s.IPv6 {
		return b.flannelHost6(i)
	}
	return nil
}

// LinuxVXLAN is the name of the linux style's VXLAN device in each host namespace.
const LinuxVXLAN = "vxlan0"

// linuxHost builds the dissertation's "Linux overlay" on host i: one VXLAN device attached to
// the host interface (eth0), made with iproute2's defaults plus static entries, carrying an
// overlay address in the host namespace. No bridge, no veth, no container: applications on the
// host talk to the other hosts' overlay addresses, so a packet meets two receive stages (NIC,
// VXLAN) in one namespace. Remote hosts are known statically (neighbour: overlay IP -> VTEP
// MAC; FDB: MAC -> underlay address), like the other styles, so nothing waits on learning.
func (b *builder) linuxHost(i int) error {
	s := b.s
	host, err := b.at(hostName(i))
	if err != nil {
		return err
	}
	if err := host.vxlan(vxlanConf{name: LinuxVXLAN, vni: s.VNI, port: s.VXLANPort, local: s.HostAddr(i).Addr(),
		dev: "eth0", mtu: s.OverlayMTU(), mac: s.LinuxMAC(i)}); err != nil {
		return err
	}
	if err := host.addr(LinuxVXLAN, s.LinuxAddr(i)); err != nil {
		return err
	}
	if err := host.up(LinuxVXLAN); err != nil {
		return err
	}
	for k := 1; k <= s.Hosts; k++ {
		if k == i {
			continue
		}
		if err := host.fdb(LinuxVXLAN, s.LinuxMAC(k), s.HostAddr(k).Addr()); err != nil {
			return err
		}
		if err := host.neigh(LinuxVXLAN, s.LinuxAddr(k).Addr(), s.LinuxMAC(k)); err != nil {
			return err
		}
	}
	return nil
}
