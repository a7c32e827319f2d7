package grosplit

import (
	"context"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// vethPeerChecksums refuses a veth whose peer leaves checksums to "hardware".
//
// A veth peer with tx checksum offload on (the default) hands over skbs with CHECKSUM_PARTIAL:
// the L4 checksum was never computed, and the skb's ip_summed is what says so. XDP sees only the
// bytes; the cpumap kthread builds a fresh skb (CHECKSUM_NONE) that the stack then verifies, and
// drops as a checksum error (UdpInCsumErrors / TcpInCsumErrors): every redirected TCP or UDP
// packet would vanish. A real NIC's wire carries complete checksums, so the emulation must too:
// `ethtool -K <peer> tx off` on the peer (which also turns TSO off there, so the peer sends
// MTU-sized frames, as a wire does).
//
// dev lives in netns. The peer's namespace is found among the named ones (nsid match); a peer in
// an unnamed namespace cannot be inspected and is let through.
func vethPeerChecksums(netns string, dev netlink.Link) error {
	veth, ok := dev.(*netlink.Veth)
	if !ok {
		return nil
	}
	peerIdx, err := netlink.VethPeerIndex(veth)
	if err != nil {
		return fmt.Errorf("grosplit: find the veth peer of %s: %w", dev.Attrs().Name, err)
	}
	peerNs := netns
	if id := dev.Attrs().NetNsID; id >= 0 {
		if peerNs, ok = namedNsWithID(id); !ok {
			return nil
		}
	}
	var peerName string
	err = netnsutil.Do(peerNs, func() error {
		l, err := netlink.LinkByIndex(peerIdx)
		if err == nil {
			peerName = l.Attrs().Name
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("grosplit: veth peer %d of %s in %s: %w", peerIdx, dev.Attrs().Name, netnsutil.Label(peerNs), err)
	}
	out, err := netnsutil.Run(context.Background(), peerNs, "ethtool", "-k", peerName)
	if err != nil {
		return fmt.Errorf("grosplit: read offloads of veth peer %s: %w", peerName, err)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "tx-checksumming: on") {
			where := ""
			if peerNs != "" {
				where = "ip netns exec " + peerNs + " "
			}
			return fmt.Errorf("grosplit: veth %s: its peer %s (%s) has tx checksum offload on, so it sends partial checksums "+
				"that only the original skb knows about; XDP-redirected frames would be dropped as checksum errors. "+
				"Make the peer send wire-like frames first: %sethtool -K %s tx off",
				dev.Attrs().Name, peerName, netnsutil.Label(peerNs), where, peerName)
		}
	}
	return nil
}

// namedNsWithID finds the named namespace whose nsid, as seen from the calling thread's
// namespace, is id (nsids are per namespace: call it from inside the device's namespace).
func namedNsWithID(id int) (string, bool) {
	names, err := netnsutil.List("")
	if err != nil {
		return "", false
	}
	for _, name := range names {
		h, err := netnsutil.Handle(name)
		if err != nil {
			continue
		}
		got, err := netlink.GetNetNsIdByFd(int(h))
		h.Close()
		if err == nil && got == id {
			return name, true
		}
	}
	return "", false
}
