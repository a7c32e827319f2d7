package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Logf receives progress lines while a lab is built or removed; nil discards them.
type Logf func(format string, args ...any)

// builder holds the open namespace handles of a lab being built.
type builder struct {
	s    *Spec
	ctx  context.Context
	log  Logf
	open map[string]*nsLinks
}

func (b *builder) at(short string) (*nsLinks, error) {
	ns := b.s.ns(short)
	if h, ok := b.open[ns]; ok {
		return h, nil
	}
	h, err := openNs(ns)
	if err != nil {
		return nil, err
	}
	b.open[ns] = h
	return h, nil
}

func (b *builder) newNs(short string) (*nsLinks, error) {
	if err := netnsutil.Create(b.s.ns(short)); err != nil {
		return nil, err
	}
	h, err := b.at(short)
	if err != nil {
		return nil, err
	}
	if b.s.IPv6 {
		if err := b.noDAD(short); err != nil {
			return nil, err
		}
	}
	return h, h.up("lo")
}

// Up builds the lab described by spec and proves it works. On any failure it removes what it
// built, so a failed `lab up` leaves the machine as it was.
func Up(ctx context.Context, spec Spec, log Logf) (*Lab, error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	spec.Defaults()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := Preflight(); err != nil {
		return nil, err
	}
	if existing, _ := netnsutil.List(NsPrefix(spec.Name)); len(existing) > 0 {
		return nil, fmt.Errorf("lab %q is already up (namespaces %s exist): run `peregrine lab down --name %s` first, or pick another --name",
			spec.Name, strings.Join(existing, ", "), spec.Name)
	}
	if _, err := readRecord(spec.Name); err == nil {
		return nil, fmt.Errorf("lab %q has a stale record but no namespaces: run `peregrine lab down --name %s` to clear it", spec.Name, spec.Name)
	}
	// Record first: if we are killed halfway, `lab down` still knows the lab existed.
	if err := writeRecord(&spec); err != nil {
		return nil, err
	}
	b := &builder{s: &spec, ctx: ctx, log: log, open: map[string]*nsLinks{}}
	err := b.build()
	for _, h := range b.open {
		h.Close()
	}
	if err == nil {
		if spec.TenantCount() > 1 {
			log("verifying overlay connectivity (TCP and UDP, every pair of endpoints of each tenant) and that no tenant reaches another")
		} else {
			log("verifying overlay connectivity (TCP and UDP, every pair of endpoints)")
		}
		if spec.Services {
			log("verifying that a client on every host reaches every Service, and every backend answers")
		}
		var l *Lab
		l, err = Status(spec.Name)
		if err == nil {
			err = Verify(ctx, l)
		}
		if err == nil {
			return l, nil
		}
	}
	log("build failed, removing what was built: %v", err)
	if derr := Down(spec.Name, nil, nil); derr != nil {
		err = errors.Join(err, fmt.Errorf("cleanup after failure: %w", derr))
	}
	return nil, err
}

func (b *builder) build() error {
	s := b.s
	b.log("creating %d hosts (%s style, %s underlay, MTU %d, ToRs %v)", s.Hosts, s.Style, s.Underlay, s.MTU, s.ToR)
	if s.TenantCount() > 1 {
		b.log("%d tenants: an overlay namespace, VXLAN device (VNI %d-%d) and containers each, with the same addresses",
			s.TenantCount(), s.TenantVNI(1), s.TenantVNI(s.TenantCount()))
	}
	for i := 1; i <= s.Hosts; i++ {
		if _, err := b.newNs(hostName(i)); err != nil {
			return err
		}
		if _, err := netnsutil.Sysctl(s.ns(hostName(i)), "net.ipv4.ip_forward", "1"); err != nil {
			return fmt.Errorf("enable forwarding on %s: %w", s.ns(hostName(i)), err)
		}
	}
	if err := b.underlay(); err != nil {
		return err
	}
	for i := 1; i <= s.Hosts; i++ {
		var err error
		switch s.Style {
		case StyleDocker:
			err = b.dockerHost(i)
		case StyleFlannel:
			err = b.flannelHost(i)
		case StyleLinux:
			err = b.linuxHost(i)
		}
		if err != nil {
			return err
		}
	}
	if s.Services {
		cidrs := ServiceCIDR
		if s.IPv6 {
			cidrs += " and " + ServiceCIDR6
		}
		b.log("writing Services as kube-proxy's %s mode does (ClusterIPs from %s) in every host namespace", s.ProxyMode, cidrs)
		for i := 1; i <= s.Hosts; i++ {
			if err := b.writeServices(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// underlay joins the hosts' eth0 devices and makes them NIC-like.
func (b *builder) underlay() error {
	s := b.s
	switch {
	case s.ToR:
		if err := b.torUnderlay(); err != nil {
			return err
		}
	case s.Underlay == UnderlayDirect:
		h1, err := b.at(hostName(1))
		if err != nil {
			return err
		}
		h2, err := b.at(hostName(2))
		if err != nil {
			return err
		}
		if err := h1.veth("eth0", s.UnderlayMAC(1), h2, "eth0", s.UnderlayMAC(2), s.MTU); err != nil {
			return err
		}
	case s.Underlay == UnderlaySwitch:
		err := b.switchNs(func(i int, sw *nsLinks, port string) error {
			h, err := b.at(hostName(i))
			if err != nil {
				return err
			}
			return h.veth("eth0", s.UnderlayMAC(i), sw, port, nil, s.MTU)
		})
		if err != nil {
			return err
		}
	}
	for i := 1; i <= s.Hosts; i++ {
		h, err := b.at(hostName(i))
		if err != nil {
			return err
		}
		if err := h.addr("eth0", s.HostAddr(i)); err != nil {
			return err
		}
		if err := h.up("eth0"); err != nil {
			return err
		}
		if err := h.queue("eth0"); err != nil {
			return err
		}
		// GRO on a veth switches it to NAPI mode: packets then arrive through a NAPI poll
		// with GRO, as from a real NIC, instead of the per-CPU backlog.
		if *s.GRO {
			if err := ethtool(b.ctx, s.ns(hostName(i)), "eth0", "gro", "on"); err != nil {
				return err
			}
		}
		if *s.WireFrames {
			if err := ethtool(b.ctx, s.ns(hostName(i)), "eth0", "tx", "off"); err != nil {
				return err
			}
		}
		if len(s.RxCPUs) > 0 {
			if err := SetRPS(s.ns(hostName(i)), "eth0", s.RxCPUs); err != nil {
				return err
			}
		}
		if s.NAPIThread {
			if err := SetNAPIThread(s.ns(hostName(i)), "eth0", s.RxCPUs); err != nil {
				return err
			}
		}
		// Static ARP for the other hosts: nothing in the benchmarks should wait on resolution.
		// Behind ToRs the other hosts are reached through the ToR's MAC (it routes).
		for k := 1; k <= s.Hosts; k++ {
			if k != i {
				if err := h.neigh("eth0", s.HostAddr(k).Addr(), s.hostNeighbourMAC(i, k)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// SetRPS writes the RPS mask of every receive queue of a device in a namespace.
func SetRPS(ns, dev string, cpus []int) error {
	mask := CPUMask(cpus)
	return netnsutil.WithSysfs(ns, func() error {
		qs, err := os.ReadDir("/sys/class/net/" + dev + "/queues")
		if err != nil {
			return fmt.Errorf("%s/%s: %w", ns, dev, err)
		}
		for _, q := range qs {
			if !strings.HasPrefix(q.Name(), "rx-") {
				continue
			}
			p := "/sys/class/net/" + dev + "/queues/" + q.Name() + "/rps_cpus"
			if err := os.WriteFile(p, []byte(mask), 0o644); err != nil {
				return fmt.Errorf("%s: write %s: %w (kernel without CONFIG_RPS?)", ns, p, err)
			}
		}
		return nil
	})
}

// CPUMask renders a CPU list as the hex bitmap sysfs expects (comma-separated 32-bit words).
func CPUMask(cpus []int) string {
	max := 0
	for _, c := range cpus {
		if c > max {
			max = c
		}
	}
	words := make([]uint32, max/32+1)
	for _, c := range cpus {
		words[c/32] |= 1 << (c % 32)
	}
	var parts []string
	for i := len(words) - 1; i >= 0; i-- {
		if i == len(words)-1 {
			parts = append(parts, fmt.Sprintf("%x", words[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%08x", words[i]))
		}
	}
	return strings.Join(parts, ",")
}

// switchNs builds the switch namespace: a bridge whose port p<i> plug(i) joins to host i's
// side (a host's eth0, or with --tor its ToR's uplink).
func (b *builder) switchNs(plug func(i int, sw *nsLinks, port string) error) error {
	sw, err := b.newNs("sw")
	if err != nil {
		return err
	}
	if err := sw.bridge("br0", b.s.MTU); err != nil {
		return err
	}
	for i := 1; i <= b.s.Hosts; i++ {
		port := fmt.Sprintf("p%d", i)
		if err := plug(i, sw, port); err != nil {
			return err
		}
		if err := sw.master(port, "br0"); err != nil {
			return err
		}
		if err := sw.up(port); err != nil {
			return err
		}
	}
	return sw.up("br0")
}
