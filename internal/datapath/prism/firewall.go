package prism

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// The firewall gate (bpf/prism_gate.h, accepted): an HP frame is redirected past the normal path
// only when conntrack in the VXLAN device's namespace confirmed the flow (TCP: reply seen) and
// prg_prism_dlv, at the pod's own device (deliver.go), saw the normal path deliver one of the
// flow's frames there within the window. This file keeps conntrack on in each VXLAN device's
// namespace, unless told not to.

// ctTable is prism's nftables table: one regular chain (no hook, so no packet ever runs it) with
// a rule on ct state. The rule alone makes the kernel track connections in the namespace
// (nf_ct_netns_get), so the gate has entries to read where nothing else uses conntrack; where
// something does, it only adds a reference. Detach deletes the table.
const ctTable = "prg_prism"

// fwNS is one namespace the gate serves, as recorded. Pins are the netfilter links of an
// attachment made before the gate moved to the pods' devices (prg_prism_fwd): detach removes
// them; nothing adds them any more.
type fwNS struct {
	Netns string   `json:"netns"`
	Inode uint32   `json:"netns_inode"`
	Pins  []string `json:"link_pins,omitempty"`
	// Conntrack: prism added ctTable here (removed on detach).
	Conntrack bool `json:"conntrack,omitempty"`
}

// defaultVerify is how often one frame of an HP flow takes the normal path to re-verify it; the
// window is windowFactor times that (two re-verifications may be lost in the network), and never
// more than maxWindow: a redirect follows a delivery of the normal path at most 1 s old.
const (
	defaultVerify = 100 * time.Millisecond
	windowFactor  = 3
	maxWindow     = time.Second
)

// gateWindow is how long one delivery by the normal path vouches for a flow.
func gateWindow(verify time.Duration) time.Duration { return min(verify*windowFactor, maxWindow) }

// writeGate stores the re-verification interval and window in the config word the rules share.
func (o *objects) writeGate(verify time.Duration) error {
	var cfg prsPrismCfg
	if err := o.PrgPrismCfg.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("prism: read config: %w", err)
	}
	cfg.VerifyNs = uint64(verify)
	cfg.WindowNs = uint64(gateWindow(verify))
	if err := o.PrgPrismCfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("prism: write config: %w", err)
	}
	return nil
}

// followFirewall turns conntrack on (ctTable) in every namespace of vxs not yet in have, unless
// conntrack is false; it returns have plus the new namespaces (recorded as far as they got, so
// detach finds a half-done one).
func followFirewall(vxs []vxlanDev, have []fwNS, conntrack bool) ([]fwNS, error) {
	seen := map[uint32]bool{}
	for _, f := range have {
		seen[f.Inode] = true
	}
	var errs []error
	for _, vx := range vxs {
		if seen[vx.Inode] {
			continue
		}
		seen[vx.Inode] = true
		f := fwNS{Netns: vx.Dev.Netns, Inode: vx.Inode}
		if conntrack {
			err := addCtTable(f.Netns)
			if err == nil {
				f.Conntrack = true
			}
			errs = append(errs, err)
		}
		have = append(have, f)
	}
	return have, errors.Join(errs...)
}

// addCtTable creates ctTable in ns (nft); an existing one is replaced by the same content.
func addCtTable(ns string) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("prism: nft (nftables) is not installed, so conntrack cannot be turned on; install nftables, or attach with conntrack=false where conntrack is already in use")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	script := fmt.Sprintf("table inet %[1]s {}\ndelete table inet %[1]s\ntable inet %[1]s {\n chain track {\n  ct state established counter\n }\n}\n", ctTable)
	cmd := netnsutil.Command(ctx, ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("prism: %s: nft: %w: %s", netnsutil.Label(ns), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeFirewall undoes followFirewall for every recorded namespace; a namespace that is gone
// took its hooks and table with it.
func removeFirewall(fs []fwNS) error {
	var errs []error
	for _, f := range fs {
		for _, p := range f.Pins {
			errs = append(errs, bpfobj.DetachPin(p))
		}
		if f.Conntrack && netnsutil.Exists(f.Netns) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := netnsutil.Run(ctx, f.Netns, "nft", "delete", "table", "inet", ctTable)
			cancel()
			if err != nil && !strings.Contains(out, "No such file") {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
