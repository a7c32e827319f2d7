package ezpath

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// The paper's order is mandatory: a host may tag a flow only once both switches hold its tunnel
// entries ("Reversing the steps could cause packet drop since there is no tunnel mapping
// entries in P4"), and a switch entry may go only after no host tags for it any more and the
// frames already tagged have drained:
//
//	offload:   ToR(a) and ToR(b) entries -> host(a) and host(b) tag rules
//	unoffload: host(a) and host(b) tag rules -> drain interval -> ToR entries no other pair needs
//
// The hosts' delivery side (pop the tag, hand to the pod) holds every local pod from attach on,
// so a tagged frame always finds its pod.

// entries lists the switch entries a pair needs (both directions).
func (r *rack) entries(a, b endpoint) []torEntry {
	t := a.Tenant // pairEnds: both ends are of one tenant
	return []torEntry{
		{ToR: a.Host, Tenant: t, Addr: b.Addr},              // ToR(a) tunnels to b
		{ToR: a.Host, Tenant: t, Addr: a.Addr, Decap: true}, // ToR(a) delivers a
		{ToR: b.Host, Tenant: t, Addr: a.Addr},
		{ToR: b.Host, Tenant: t, Addr: b.Addr, Decap: true},
	}
}

// pairEnds resolves a pair and checks it can be offloaded.
func (r *rack) pairEnds(src, dst string) (endpoint, endpoint, error) {
	a, err := r.endpoint(src)
	if err != nil {
		return a, a, err
	}
	b, err := r.endpoint(dst)
	if err != nil {
		return a, b, err
	}
	if a.Tenant != b.Tenant {
		return a, b, fmt.Errorf("%s (tenant %d) and %s (tenant %d) are in different tenants: tenants are isolated, there is no path between them to offload",
			a.Name, a.Tenant, b.Name, b.Tenant)
	}
	if a.Host == b.Host {
		return a, b, fmt.Errorf("%s and %s are on the same host: their traffic never reaches a switch", a.Name, b.Name)
	}
	for _, e := range []endpoint{a, b} {
		if !r.attached(e.Host) {
			return a, b, fmt.Errorf("ezpath is not attached to h%d (%s's host): run `peregrine attach ezpath --lab --name %s`", e.Host, e.Name, r.hw.Name())
		}
	}
	return a, b, nil
}

// Offload moves the pair src<->dst onto the switch path, in the mandatory order. A full switch
// table leaves the pair on the overlay, records why in the ledger and returns ErrTableFull.
func Offload(labName, src, dst, by string) error {
	r, err := openRack(labName)
	if err != nil {
		return err
	}
	a, b, err := r.pairEnds(src, dst)
	if err != nil {
		return err
	}
	return withLedger(labName, func(l *Ledger) error {
		for _, p := range l.Pairs {
			if p.same(a.Name, b.Name) {
				return nil // already offloaded
			}
		}
		err := r.install(a, b)
		l.Refused = dropPair(l.Refused, a.Name, b.Name)
		if errors.Is(err, ErrTableFull) {
			l.Refused = append(l.Refused, Pair{A: a.Name, B: b.Name, By: by, Since: time.Now(), Note: "stays on the overlay: " + err.Error()})
			_ = writeLedger(l)
			return fmt.Errorf("%s <-> %s stays on the overlay: %w", a.Name, b.Name, err)
		}
		if err != nil {
			return err
		}
		l.Pairs = append(l.Pairs, Pair{A: a.Name, B: b.Name, By: by, Since: time.Now()})
		return nil
	})
}

// install writes the switch entries, then the host rules; on failure it removes what it added.
func (r *rack) install(a, b endpoint) error {
	tors := map[int]*torTables{}
	defer func() {
		for _, t := range tors {
			t.Close()
		}
	}()
	var created []torEntry
	undo := func(cause error) error {
		errs := []error{cause}
		for _, e := range created {
			errs = append(errs, delEntry(tors[e.ToR], r, e))
		}
		return errors.Join(errs...)
	}
	for _, e := range r.entries(a, b) {
		if tors[e.ToR] == nil {
			t, err := openTorTables(r.torDir(e.ToR))
			if err != nil {
				return undo(err)
			}
			tors[e.ToR] = t
		}
		isNew, err := putEntry(tors[e.ToR], r, e)
		if err != nil {
			return undo(err)
		}
		if isNew {
			created = append(created, e)
		}
	}
	// Both switches are ready: now the hosts may tag.
	var tagged []endpoint
	for _, end := range [][2]endpoint{{a, b}, {b, a}} {
		if err := r.setTag(end[0], end[1], true); err != nil {
			for _, t := range tagged {
				_ = r.setTag(t, other(t, a, b), false)
			}
			return undo(err)
		}
		tagged = append(tagged, end[0])
	}
	return nil
}

func other(e, a, b endpoint) endpoint {
	if e.Name == a.Name {
		return b
	}
	return a
}

// setTag adds (or removes) host(from)'s rule that tags from's frames to to.
func (r *rack) setTag(from, to endpoint, on bool) error {
	ht, err := openHostTables(r.hostDir(from.Host))
	if err != nil {
		return err
	}
	defer ht.Close()
	port, err := r.portIfindex(from)
	if err != nil {
		return err
	}
	k := hostEzpEgressKey{Ifindex: uint32(port), Dst: nbo(to.Addr)}
	if on {
		relay, err := ifindexIn(r.hw.OverlayNs(from.Host, from.Tenant), RelayDev)
		if err != nil {
			return err
		}
		return ht.EzpHostEgress.Put(k, hostEzpEgressVal{Vid: uint32(r.vid(from.Tenant)), Relay: uint32(relay)})
	}
	if err := ht.EzpHostEgress.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// Unoffload moves the pair back to the overlay: host rules, a drain interval, switch entries.
func Unoffload(labName, src, dst string, drain time.Duration) error {
	r, err := openRack(labName)
	if err != nil {
		return err
	}
	a, err := r.endpoint(src)
	if err != nil {
		return err
	}
	b, err := r.endpoint(dst)
	if err != nil {
		return err
	}
	return withLedger(labName, func(l *Ledger) error {
		found := false
		for _, p := range l.Pairs {
			found = found || p.same(a.Name, b.Name)
		}
		if !found {
			l.Refused = dropPair(l.Refused, a.Name, b.Name)
			return fmt.Errorf("%s <-> %s is not offloaded (see `peregrine ezpath flows`)", a.Name, b.Name)
		}
		l.Pairs = dropPair(l.Pairs, a.Name, b.Name)
		return r.remove(a, b, l.Pairs, drain)
	})
}

// remove takes a pair off the switch path; keep are the pairs that stay offloaded (their switch
// entries stay). Hosts that are gone (detached) are skipped.
func (r *rack) remove(a, b endpoint, keep []Pair, drain time.Duration) error {
	var errs []error
	for _, end := range [][2]endpoint{{a, b}, {b, a}} {
		if r.attached(end[0].Host) {
			errs = append(errs, r.setTag(end[0], end[1], false))
		}
	}
	time.Sleep(drain) // frames already tagged cross the switches with their entries still there
	needed := r.entriesInUse(keep)
	for _, e := range r.entries(a, b) {
		if needed[e] || !r.attached(e.ToR) {
			continue
		}
		tt, err := openTorTables(r.torDir(e.ToR))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, delEntry(tt, r, e))
		tt.Close()
	}
	return errors.Join(errs...)
}

func dropPair(ps []Pair, a, b string) []Pair {
	var out []Pair
	for _, p := range ps {
		if !p.same(a, b) {
			out = append(out, p)
		}
	}
	return out
}

// entriesInUse is the set of switch entries the pairs need.
func (r *rack) entriesInUse(pairs []Pair) map[torEntry]bool {
	used := map[torEntry]bool{}
	for _, p := range pairs {
		a, err1 := r.endpoint(p.A)
		b, err2 := r.endpoint(p.B)
		if err1 == nil && err2 == nil {
			for _, e := range r.entries(a, b) {
				used[e] = true
			}
		}
	}
	return used
}
