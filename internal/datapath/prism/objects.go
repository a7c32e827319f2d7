package prism

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
)

// Pin layout under datapath.PinDir(target)/prism: maps and the program by their kernel names
// (what bpftool shows) and one tcx link per VXLAN device in links/.
const (
	pinSub   = "prism"
	linksSub = "links"
)

func pinDir(target string) string { return filepath.Join(datapath.PinDir(target), pinSub) }

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

// objects are the loaded (or re-opened pinned) maps and program of one attachment.
type objects struct {
	Cfg, Rule, Dev, Ep, Port, Stat, Rcnt *ebpf.Map
	Iso, Last, Cpucls                    *ebpf.Map // HP isolation (isolation.go)
	Vx                                   *ebpf.Program
	Nic                                  *ebpf.Program // HP isolation's underlay program
}

func (o *objects) maps() map[string]**ebpf.Map {
	return map[string]**ebpf.Map{"prg_prism_cfg": &o.Cfg, "prg_prism_rule": &o.Rule, "prg_prism_dev": &o.Dev,
		"prg_prism_ep": &o.Ep, "prg_prism_port": &o.Port, "prg_prism_stat": &o.Stat, "prg_prism_rcnt": &o.Rcnt,
		"prg_prism_iso": &o.Iso, "prg_prism_last": &o.Last, "prg_prism_cpucls": &o.Cpucls}
}

// Close releases this process's references (pinned objects stay).
func (o *objects) Close() {
	for _, m := range o.maps() {
		if *m != nil {
			(*m).Close()
		}
	}
	for _, p := range []*ebpf.Program{o.Vx, o.Nic} {
		if p != nil {
			p.Close()
		}
	}
}

// loadObjects loads the program and maps fresh (unpinned).
func loadObjects() (*objects, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("prism: raise memlock limit: %w", err)
	}
	var po prsObjects
	if err := loadPrsObjects(&po, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("prism: verifier rejected the program: %+v", verr)
		}
		return nil, fmt.Errorf("prism: load eBPF objects (needs Linux 6.2+ with BTF: kfuncs, bpf_loop, tcx on 6.6+): %w", err)
	}
	return &objects{Cfg: po.PrgPrismCfg, Rule: po.PrgPrismRule, Dev: po.PrgPrismDev, Ep: po.PrgPrismEp,
		Port: po.PrgPrismPort, Stat: po.PrgPrismStat, Rcnt: po.PrgPrismRcnt, Iso: po.PrgPrismIso, Last: po.PrgPrismLast, Cpucls: po.PrgPrismCpucls,
		Vx: po.PrgPrismVx, Nic: po.PrgPrismNic}, nil
}

func (o *objects) pin(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, linksSub), 0o700); err != nil {
		return fmt.Errorf("prism: create pin directory (is bpffs mounted on /sys/fs/bpf?): %w", err)
	}
	for name, m := range o.maps() {
		if err := (*m).Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("prism: pin %s: %w", name, err)
		}
	}
	for name, p := range map[string]*ebpf.Program{"prg_prism_vx": o.Vx, "prg_prism_nic": o.Nic} {
		if err := p.Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("prism: pin %s: %w", name, err)
		}
	}
	return nil
}

// openPinned re-opens an attachment's pinned maps.
func openPinned(target string) (*objects, error) {
	dir := pinDir(target)
	o := &objects{}
	for name, m := range o.maps() {
		var err error
		if *m, err = ebpf.LoadPinnedMap(filepath.Join(dir, name), nil); err != nil {
			o.Close()
			return nil, fmt.Errorf("prism: open pinned %s (is prism attached to %s?): %w", name, label(target), err)
		}
	}
	return o, nil
}

// addrWords puts an address in the program's layout: the raw bytes, IPv4 in word 0.
func addrWords(a netip.Addr) [4]uint32 { return endpoints.AddrWords(a) }

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
	if err := o.Cfg.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("prism: read config: %w", err)
	}
	next := (cfg.Set & 1) ^ 1
	for i, r := range rules {
		if err := o.Rule.Put(next*MaxRules+uint32(i), encodeRule(r)); err != nil {
			return fmt.Errorf("prism: write rule %d: %w", r.ID, err)
		}
	}
	// Two updates, so a reader never sees the new half with the old length.
	cfg.N[next] = uint32(len(rules))
	if err := o.Cfg.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("prism: write config: %w", err)
	}
	cfg.Set = next
	if err := o.Cfg.Put(uint32(0), cfg); err != nil {
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
	return o.Rcnt.Put(uint32(id), make([]prsPrismRcnt, n))
}

// RuleCount is one rule's HP packets and bytes since it was installed.
type RuleCount struct{ Packets, Bytes uint64 }

func (o *objects) ruleCount(id int) (RuleCount, error) {
	var per []prsPrismRcnt
	if err := o.Rcnt.Lookup(uint32(id), &per); err != nil {
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
}

func (o *objects) stats() (Stats, error) {
	var s Stats
	fields := []*uint64{&s.Seen, &s.Unparsed, &s.Frag, &s.LP, &s.HP, &s.Redirected, &s.Miss, &s.Gone, &s.Stale, &s.L2, &s.TTL, &s.Err, &s.NoDev,
		&s.IsoVXLAN, &s.IsoHP, &s.IsoLP, &s.IsoOff, &s.IsoStay}
	for i, f := range fields {
		var per []uint64
		if err := o.Stat.Lookup(uint32(i), &per); err != nil {
			return s, fmt.Errorf("prism: read counters: %w", err)
		}
		for _, v := range per {
			*f += v
		}
	}
	return s, nil
}
