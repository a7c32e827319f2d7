package ezpath

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Counters of the host programs (enum in bpf/ezpath_host.bpf.c).
const (
	hostTagged = iota
	hostRelayed
	hostUpTagged
	hostDelivered
	hostMissVID
	hostMissPod
	hostNotIP
	hostErr
	hostUntagged
	hostToOverlay
	hostGateUnseen
	hostGateElsewhere
	hostGateProbe
	hostGateFrag
	hostDlv
	hostDlvNoPod
	hostStatN
)

var hostStatNames = [hostStatN]string{"tagged", "relayed", "up_tagged", "delivered", "miss_vid", "miss_pod", "not_ip", "errors", "untagged", "to_overlay",
	"gate_unseen", "gate_elsewhere", "gate_reverify", "gate_fragment", "gate_delivered", "gate_unknown_pod"}

// The gate (bpf/ezpath_host.bpf.c, ezp_gate): one frame per offloaded flow per gateVerify takes
// the overlay's normal path, and a flow goes straight to its pod only while the normal path
// delivered it there at most gateWindow ago (issue 28, rule a: at most 1 s).
const (
	gateVerify = 100 * time.Millisecond
	gateWindow = 300 * time.Millisecond
)

// RelayDev names both ends of the veth pair attach adds between a host's overlay namespace and
// the host namespace (the docker layout's stand-in for OVS's port on the NIC). With tenants
// each tenant's overlay namespace has its own pair, whose host end is RelayHostDev(t).
const RelayDev = "ezp0"

// createRelay adds a relay pair (hostDev in the host ns, RelayDev in the overlay ns), up, with
// the underlay's MTU.
func createRelay(hostNs, hostDev, ovNs string, mtu int) error {
	return netnsutil.Do(hostNs, func() error {
		ov, err := netnsutil.Handle(ovNs)
		if err != nil {
			return err
		}
		defer ov.Close()
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU = hostDev, mtu
		v := &netlink.Veth{LinkAttrs: la, PeerName: RelayDev, PeerNamespace: netlink.NsFd(int(ov))}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("ezpath: create relay veth %s in %s: %w", hostDev, hostNs, err)
		}
		l, err := netlink.LinkByName(hostDev)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		h, err := netlink.NewHandleAt(ov)
		if err != nil {
			return err
		}
		defer h.Close()
		pl, err := h.LinkByName(RelayDev)
		if err != nil {
			return err
		}
		return h.LinkSetUp(pl)
	})
}

// deleteRelay removes a relay pair by its host end (both ends go with one); absent is fine.
func deleteRelay(hostNs, hostDev string) error {
	if !netnsutil.Exists(hostNs) {
		return nil
	}
	return netnsutil.Do(hostNs, func() error {
		l, err := netlink.LinkByName(hostDev)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return err
		}
		return netlink.LinkDel(l)
	})
}

// hostStats reads a host's counters by name.
func hostStats(ht *hostTables) (map[string]uint64, error) {
	return namedCounters(ht.PrgEzpHstat, hostStatNames[:])
}
