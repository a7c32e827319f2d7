package pipedevice

import (
	"net/netip"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Tenancy. A listener is reachable from the caller's own namespace (any address it binds), and
// from other namespaces only inside the caller's tenant domain: the L2 segments its interfaces
// attach to. This is the datapath's rule for overlapping tenants (tenants are told apart by the
// overlay their containers' veths sit on, not by address): two containers are in one domain when
// the far ends of their veths hang on the same bridge (or are the same interface). An address
// held by two namespaces of the caller's domain is ambiguous and refused, as is one held only
// outside it (kernel TCP would not reach it either).

// domainKey names one L2 segment: a bridge (or a veth end without one) in some namespace.
type domainKey struct {
	ns      uint64 // the namespace's inode
	ifindex int
}

// nsView is what a look into a namespace found: its IPv4 addresses and its domain.
type nsView struct {
	addrs []netip.Addr
	ok    bool // the addresses could be read
	dom   []domainKey
}

// lookNS looks into the namespace open at nsfd (netlink, other namespaces). It runs without d.mu
// (it takes it only briefly to list the clients' namespaces): a caller that makes it slow, for
// instance with many interfaces, slows only its own request. At hello, bind and listen, not per
// connection.
func (d *Daemon) lookNS(nsfd int) nsView {
	var v nsView
	if addrs, err := nsAddrs(nsfd); err == nil {
		v.addrs, v.ok = addrs, true
	}
	v.dom = d.domainOf(nsfd)
	return v
}

// remember caches a view of p's namespace (d.mu held); forgotten when the namespace's last
// client goes (evictIfIdle).
func (d *Daemon) remember(p *proc, v nsView) {
	if v.ok {
		d.nsAddrs[p.id.ns] = v.addrs
	}
	d.domains[p.id.ns] = v.dom
}

// addrOK: a caller binds only 0.0.0.0, loopback, or an address of its own network namespace.
func (d *Daemon) addrOK(p *proc, ip netip.Addr) bool {
	if ip.IsUnspecified() || ip.IsLoopback() {
		return true
	}
	for _, a := range d.nsAddrs[p.id.ns] {
		if a == ip {
			return true
		}
	}
	return false
}

func (d *Daemon) listening(ns string, a [4]byte, port uint16) *sock {
	if l := d.bound[bindKey{ns, a, port}]; l != nil && l.state() == SockListen {
		return l
	}
	if l := d.bound[bindKey{ns, [4]byte{}, port}]; l != nil && l.state() == SockListen {
		return l
	}
	return nil
}

// findListener applies the rule above; the errno says why there is none.
func (d *Daemon) findListener(p *proc, a [4]byte, port uint16) (*sock, unix.Errno) {
	ip := netip.AddrFrom4(a)
	own := ip.IsLoopback() || ip.IsUnspecified()
	for _, x := range d.nsAddrs[p.id.ns] {
		own = own || x == ip
	}
	if own {
		if l := d.listening(p.id.ns, a, port); l != nil {
			return l, 0
		}
		return nil, unix.ECONNREFUSED
	}
	var holders []string
	for ns, addrs := range d.nsAddrs {
		if ns == p.id.ns || !d.sameDomain(p.id.ns, ns) {
			continue
		}
		for _, x := range addrs {
			if x == ip {
				holders = append(holders, ns)
				break
			}
		}
	}
	if len(holders) != 1 {
		if len(holders) > 1 {
			d.refused.Add(1) // ambiguous: more than one namespace of the domain holds it
		}
		return nil, unix.ECONNREFUSED
	}
	if l := d.listening(holders[0], a, port); l != nil {
		return l, 0
	}
	return nil, unix.ECONNREFUSED
}

func (d *Daemon) sameDomain(a, b string) bool {
	for _, x := range d.domains[a] {
		for _, y := range d.domains[b] {
			if x == y {
				return true
			}
		}
	}
	return false
}

// domainOf lists the L2 segments the namespace open at nsfd attaches to: for a veth whose peer
// is in another namespace, the peer's bridge there (or the peer itself); for an interface with a
// bridge of its own namespace, that bridge. Peer namespaces are found among the named ones
// (ip netns, docker), the host's and the daemon's clients'. An empty list: reachable from nowhere
// but itself.
func (d *Daemon) domainOf(nsfd int) []domainKey {
	nl, err := netlink.NewHandleAt(netns.NsHandle(nsfd))
	if err != nil {
		return nil
	}
	defer nl.Close()
	links, err := nl.LinkList()
	if err != nil {
		return nil
	}
	self := nsInode(nsfd)
	var cands []int
	defer func() {
		for _, fd := range cands {
			unix.Close(fd)
		}
	}()
	var out []domainKey
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&unix.IFF_LOOPBACK != 0 {
			continue
		}
		switch {
		case a.MasterIndex != 0:
			out = append(out, domainKey{self, a.MasterIndex})
		case l.Type() == "veth" && a.NetNsID >= 0:
			if cands == nil {
				cands = d.candidateNamespaces()
			}
			for _, fd := range cands {
				if id, err := nl.GetNetNsIdByFd(fd); err == nil && id == a.NetNsID {
					out = append(out, peerSegment(domainKey{self, a.Index}, fd, a.ParentIndex))
					break
				}
			}
		}
	}
	return out
}

// peerSegment is the segment of a veth whose near end is near and whose far end is ifindex in the
// namespace open at fd: the far end's bridge, or (a plain pair) the pair itself, named by the
// lesser of its two ends so that both namespaces name it alike.
func peerSegment(near domainKey, fd, ifindex int) domainKey {
	far := domainKey{nsInode(fd), ifindex}
	if nl, err := netlink.NewHandleAt(netns.NsHandle(fd)); err == nil {
		l, err := nl.LinkByIndex(ifindex)
		nl.Close()
		if err == nil && l.Attrs().MasterIndex != 0 {
			return domainKey{far.ns, l.Attrs().MasterIndex}
		}
	}
	if near.ns < far.ns || (near.ns == far.ns && near.ifindex < far.ifindex) {
		return near
	}
	return far
}

// candidateNamespaces opens the namespaces a veth's far end may be in (caller closes them; called
// without d.mu).
func (d *Daemon) candidateNamespaces() []int {
	paths := []string{"/proc/1/ns/net", "/proc/self/ns/net"}
	for _, dir := range []string{"/run/netns", "/var/run/docker/netns"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*"))
		paths = append(paths, m...)
	}
	var fds []int
	for _, p := range paths {
		if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			fds = append(fds, fd)
		}
	}
	d.mu.Lock()
	for p := range d.procs {
		if fd, err := unix.Dup(p.id.nsfd); err == nil {
			fds = append(fds, fd)
		}
	}
	d.mu.Unlock()
	return fds
}

func nsInode(fd int) uint64 {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	return st.Ino
}
