package prism

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/flow"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Pin layout under datapath.ModePinDir: maps and programs by their kernel names (what bpftool
// shows) and one tcx link per device in links/.

// Rule criteria bits and endpoint flags, as in bpf/prism.bpf.c.
const (
	rProto = 1 << iota
	rSPort
	rDPort
	rSrc
	rDst
	rDSCP
)

const epGone = 1

// objects are bpf2go's objects of one attachment, loaded fresh or re-opened from the pins.
type objects = prsObjects

// loadObjects loads the programs and maps fresh (unpinned).
func loadObjects() (*objects, error) { return bpfobj.New[objects](Name, loadPrs, nil) }

func (o *objects) pin(dir string) error { return bpfobj.Pin(Name, dir, o) }

// openPinned re-opens an attachment's pinned maps and programs.
func openPinned(target string) (*objects, error) {
	o, err := bpfobj.Open[objects](Name, datapath.ModePinDir(target, Name), true)
	if err != nil {
		return nil, fmt.Errorf("%w (is prism attached to %s?)", err, netnsutil.Label(target))
	}
	return o, nil
}

// addrWords puts an address in the program's layout: the raw bytes, IPv4 in word 0.
func addrWords(a netip.Addr) [4]uint32 { return flow.AddrWords(a) }

// maskWords is the netmask of a prefix in the same layout.
func maskWords(p netip.Prefix) [4]uint32 {
	n := 16
	if p.Addr().Is4() {
		n = 4
	}
	b := make([]byte, 16)
	for i := 0; i < p.Bits(); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	var w [4]uint32
	for i := 0; i < n/4; i++ {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w
}

// encodeRule renders a rule for the program.
func encodeRule(r Rule) prsPrismRule {
	v := prsPrismRule{Id: uint32(r.ID), Family: uint8(r.Family)}
	if r.Proto >= 0 {
		v.Flags |= rProto
		v.Proto = uint8(r.Proto)
	}
	if r.DSCP >= 0 {
		v.Flags |= rDSCP
		v.Dscp = uint8(r.DSCP)
	}
	if !r.SPort.any() {
		v.Flags |= rSPort
		v.SportLo, v.SportHi = r.SPort.Lo, r.SPort.Hi
	}
	if !r.DPort.any() {
		v.Flags |= rDPort
		v.DportLo, v.DportHi = r.DPort.Lo, r.DPort.Hi
	}
	if r.Src.IsValid() {
		v.Flags |= rSrc
		v.Src, v.Smask = addrWords(r.Src.Masked().Addr()), maskWords(r.Src)
	}
	if r.Dst.IsValid() {
		v.Flags |= rDst
		v.Dst, v.Dmask = addrWords(r.Dst.Masked().Addr()), maskWords(r.Dst)
	}
	return v
}

// writeRules installs rules atomically for the program: it fills the inactive half of the
// rule table, publishes its length, then flips the active half.
func (o *objects) writeRules(rules []Rule) error {
	if len(rules) > MaxRules {
		return fmt.Errorf("prism: %d rules; at most %d", len(rules), MaxRules)
	}
	var cfg prsPrismCfg
	if err := o.PrgPrismCfg.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("prism: read config: %w", err)
	}
	next := (cfg.Set & 1) ^ 1
	for i, r := range rules {
		if err := o.PrgPrismRule.Put(next*MaxRules+uint32(i), encodeRule(r)); err != nil {
			return fmt.Errorf("prism: write rule %d: %w", r.ID, err)
		}
	}
	// Two updates, so a reader never sees the new half with the old length.
	cfg.N[next] = uint32(len(rules))
	if err := o.PrgPrismCfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("prism: write config: %w", err)
	}
	cfg.Set = next
	if err := o.PrgPrismCfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("prism: write config: %w", err)
	}
	return nil
}

// resetCounters zeroes a rule's counters (its ID is new or reused).
func (o *objects) resetCounters(id int) error {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	return o.PrgPrismRcnt.Put(uint32(id), make([]prsPrismRcnt, n))
}

// RuleCount is one rule's HP packets and bytes since it was installed.
type RuleCount struct{ Packets, Bytes uint64 }

func (o *objects) ruleCount(id int) (RuleCount, error) {
	var per []prsPrismRcnt
	if err := o.PrgPrismRcnt.Lookup(uint32(id), &per); err != nil {
		return RuleCount{}, err
	}
	var c RuleCount
	for _, p := range per {
		c.Packets += p.Packets
		c.Bytes += p.Bytes
	}
	return c, nil
}

// Stats are the program's counters summed over CPUs (see bpf/prism.bpf.c for each).
type Stats struct {
	Seen, Unparsed, Frag, LP, HP, Redirected, Miss, Gone, Stale, L2, TTL, Err, NoDev uint64
	// HP isolation, at the underlay: VXLAN frames seen, HP (to a reserved CPU) and LP (to the
	// others), left alone (isolation off), and of HP+LP those kept on the CPU they were on.
	IsoVXLAN, IsoHP, IsoLP, IsoOff, IsoStay uint64
	// Learn: HP frames left on the normal path because the fast path stacked under prism is
	// learning their flow there (the flow's later frames take the fast path).
	Learn uint64
	// The firewall gate: HP frames left to the normal path because they are not TCP/UDP, have no
	// conntrack entry, an entry not confirmed (or TCP without a reply), no delivery by the normal
	// path within the window, or are the flow's periodic re-verification; Delivered counts HP
	// frames prg_prism_dlv saw the normal path deliver to a pod.
	NoTCPUDP, NoCT, CTNew, Unseen, Probe, Delivered uint64
	// Elsewhere: HP frames left to the normal path because it delivered their flow through
	// another veth or with another MAC than the endpoint table says (a pod claiming an address
	// that is not its own). DlvNoPod: tagged frames at a pod device prism has no record of.
	Elsewhere, DlvNoPod uint64
	// Strict: HP TCP frames left to the normal path because their conntrack entry still tracks
	// windows strictly (the gate asked the agent to mark it liberal: ctliberal.go); AskLost: asks
	// that found prg_prism_ask full (no agent reading it).
	Strict, AskLost uint64
}

func (o *objects) stats() (Stats, error) {
	var s Stats
	fields := []*uint64{&s.Seen, &s.Unparsed, &s.Frag, &s.LP, &s.HP, &s.Redirected, &s.Miss, &s.Gone, &s.Stale, &s.L2, &s.TTL, &s.Err, &s.NoDev,
		&s.IsoVXLAN, &s.IsoHP, &s.IsoLP, &s.IsoOff, &s.IsoStay, &s.Learn,
		&s.NoTCPUDP, &s.NoCT, &s.CTNew, &s.Unseen, &s.Probe, &s.Delivered, &s.Elsewhere, &s.DlvNoPod,
		&s.Strict, &s.AskLost}
	for i, f := range fields {
		var per []uint64
		if err := o.PrgPrismStat.Lookup(uint32(i), &per); err != nil {
			return s, fmt.Errorf("prism: read counters: %w", err)
		}
		for _, v := range per {
			*f += v
		}
	}
	return s, nil
}
