package prism

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/safefile"
)

// Option keys (declared on Config).
const (
	OptRules     = "rules"      // rules separated by ';' (see ParseRule)
	OptRulesFile = "rules_file" // a file of rules, one per line, '#' comments
	OptAgent     = "agent"      // false: no node agent (endpoints are frozen at attach, HP TCP stays on the normal path)
)

// Name is the mode's name.
const Name = "prism"

// Config is prism's settings: the declared options and the rules and CPU plan Complete derives
// from them (saved in the record as JSON).
type Config struct {
	RuleText     []string      `json:"rule_text,omitempty" opt:"rules" flag:"rule" help:"a high-priority rule, e.g. \"proto=tcp dport=11211\" (repeatable; see \"peregrine prism add --help\")"`
	RulesFile    string        `json:"rules_file,omitempty" opt:"rules_file" help:"a file of rules, one per line, '#' comments"`
	Agent        bool          `json:"agent" opt:"agent" default:"true" help:"run the node agent, which keeps the endpoint map current as containers come and go and marks the HP TCP flows' conntrack entries liberal (false: endpoints frozen at attach, HP TCP flows stay on the normal path)"`
	HPCPUs       string        `json:"hp_cpus,omitempty" opt:"hp_cpus" help:"a CPU list reserved for high-priority flows from the VXLAN stage on (RPS hash steering; LP gets --cpus or every other CPU), e.g. 1 or 2-3"`
	Conntrack    bool          `json:"conntrack" opt:"conntrack" default:"true" help:"keep conntrack on in the VXLAN devices' namespaces (an nftables table prg_prism, removed on detach): HP flows are redirected only once conntrack confirmed them, so where nothing else uses conntrack, false leaves every HP flow on the normal path"`
	Reverify     time.Duration `json:"reverify" opt:"reverify" default:"100ms" range:"10ms..10s" help:"one frame per HP flow takes the normal path this often; a flow the normal path stopped delivering to the pod leaves the redirect 3 intervals (at most 1 s) after the last frame it delivered"`
	NAPIThreaded bool          `json:"napi_threaded,omitempty" opt:"napi_threaded" help:"experimental, off by default: poll the underlay devices' NAPI (the NIC stage HP and bulk share) in kernel threads instead of softirqs (sysfs threaded=1, restored on detach); on 2 vCPUs it made HP p99 under bulk 7.5x worse (docs/results.md), so it waits for a many-core measurement"`

	Rules     []Rule     `json:"rules"`
	Isolation *isoConfig `json:"isolation,omitempty"` // hp_cpus; nil without it
}

var schema = option.Declare(Name, Config{})

// Complete reads the rules (text and file) and plans HP isolation against attach's --cpus.
func (c *Config) Complete(o datapath.Options) error {
	var err error
	if c.Rules, err = readRules(strings.Join(c.RuleText, ";"), c.RulesFile); err != nil {
		return err
	}
	c.Isolation, err = parseIsolation(o.CPUs, c.HPCPUs)
	return err
}

// ParseConfig reads prism's options; unknown keys, bad rules and bad CPU lists are refused.
func ParseConfig(cpus []int, extra map[string]string) (Config, error) {
	return configOf(datapath.Options{CPUs: cpus, Extra: extra})
}

func configOf(o datapath.Options) (Config, error) { return datapath.ConfigOf[Config](Name, o) }

type mode struct{}

func init() { datapath.Register(mode{}) }

func (mode) Name() string { return Name }

// Options declares prism's options (Config).
func (mode) Options() *option.Schema { return schema }
func (mode) Summary() string {
	return "PRISM sync mode: inner-header rules pick high-priority flows, which skip the bridge and veth backlog (bpf_redirect_peer)"
}

// piece is one device a prism program is attached to: a VXLAN device (prg_prism_vx) or, with
// --hp-cpus, an underlay device (prg_prism_nic).
type piece struct {
	Dev     datapath.Dev `json:"dev"`
	Inode   uint32       `json:"netns_inode"`
	Routed  bool         `json:"routed"`
	NIC     bool         `json:"nic,omitempty"`
	LinkPin string       `json:"link_pin"`
}

// modeState is prism's part of the attachment record: the installed rules are authoritative
// here (the maps mirror them), so `prism rules` and a new process agree.
type modeState struct {
	Rules  []Rule   `json:"rules"`
	Pieces []piece  `json:"pieces"`
	Notes  []string `json:"notes,omitempty"`
	// Isolation is the --hp-cpus plan; nil without it.
	Isolation *isoConfig `json:"isolation,omitempty"`
	// Firewall: the namespaces the firewall gate serves (the conntrack table).
	Firewall []fwNS `json:"firewall,omitempty"`
	// Pods: the pod devices carrying prg_prism_dlv, the gate's far end (deliver.go).
	Pods []podPin `json:"pods,omitempty"`
	// Conflicts: addresses more than one pod claims, refused (no endpoint) as of the last sync;
	// ConflictsSeen counts each such address once per time it became refused, since attach.
	Conflicts     []endpoints.Conflict `json:"conflicts,omitempty"`
	ConflictsSeen int                  `json:"conflicts_seen,omitempty"`
}

// readRules reads the rules given at attach: text, and a file's.
func readRules(text, f string) ([]Rule, error) {
	rs, err := ParseRules(text)
	if err != nil {
		return nil, fmt.Errorf("prism: %w", err)
	}
	if f != "" {
		// The file is read by root (the agent) and its errors reach /readyz and the status
		// file: a regular file only (a FIFO would block the agent's loop, /dev/zero never end),
		// at most maxRulesFile bytes, and no error repeats its text (rules_file: /etc/shadow
		// must not serve the file's first line to whoever reads /readyz).
		b, err := safefile.ReadRegular(f, maxRulesFile)
		if err != nil {
			return nil, fmt.Errorf("prism: rules_file: %w", err)
		}
		more, err := ParseRules(string(b))
		if err != nil {
			return nil, fmt.Errorf("prism: rules_file %s: %s (the file's text is not repeated in errors)", f, ruleNumber(err))
		}
		rs = append(rs, more...)
	}
	return mergeRules(nil, rs)
}

// maxRulesFile bounds a rules file: far more than the rule table holds.
const maxRulesFile = 1 << 20

// ruleNumber is ParseRules' error without the rule's text: "rule N does not parse".
func ruleNumber(err error) string {
	var n int
	if _, e := fmt.Sscanf(err.Error(), "rule %d", &n); e == nil {
		return fmt.Sprintf("rule %d (counting rules, not lines; '#' comments and blank lines are skipped) does not parse", n)
	}
	return "a rule does not parse"
}

// Knobs: the sync mode changes no sysfs knob; HP isolation (--hp-cpus) sets the VXLAN devices'
// RPS and napi_threaded the underlay's threaded NAPI. Bad rules and CPU lists are refused here,
// before anything is changed.
func (mode) Knobs(t *datapath.Topology, o datapath.Options) ([]datapath.Knob, error) {
	if err := bpfobj.CheckNoPins(Name, datapath.ModePinDir(t.Host, Name)); err != nil {
		return nil, err
	}
	c, err := configOf(o)
	if err != nil {
		return nil, err
	}
	var ks []datapath.Knob
	if c.Isolation != nil {
		if ks, err = isoKnobs(t, c.Isolation); err != nil {
			return nil, err
		}
	}
	if c.NAPIThreaded {
		nk, err := napiKnobs(t)
		if err != nil {
			return nil, err
		}
		ks = append(ks, nk...)
	}
	return ks, nil
}

func (m mode) Load(ctx context.Context, t *datapath.Topology, o datapath.Options, st *datapath.State) error {
	c, err := configOf(o)
	if err != nil {
		return err
	}
	rules, iso := c.Rules, c.Isolation
	objs, err := loadObjects()
	if err != nil {
		return err
	}
	defer objs.Close()
	dir := datapath.ModePinDir(st.Target, Name)
	if err := datapath.RecordThenCreate(st, dir, func() error { return objs.pin(dir) }); err != nil {
		return err
	}
	ms := modeState{Rules: rules}
	if err := datapath.SaveModeState(st, ms); err != nil {
		return err
	}
	if err := objs.PrgPrismCfg.Put(uint32(0), prsPrismCfg{}); err != nil {
		return fmt.Errorf("prism: init config: %w", err)
	}
	for _, r := range rules {
		if err := objs.resetCounters(r.ID); err != nil {
			return fmt.Errorf("prism: counters: %w", err)
		}
	}
	if err := objs.writeRules(rules); err != nil {
		return err
	}
	if err := objs.writeGate(c.Reverify); err != nil {
		return err
	}
	vxs, err := discoverVXLAN(t)
	if err != nil {
		return err
	}
	// Endpoints first, so the program finds them from its first packet.
	eps, notes := discoverEndpoints(t, vxs)
	rep, err := syncEndpoints(objs, eps, time.Now())
	if err != nil {
		return err
	}
	ms.Conflicts, ms.ConflictsSeen = rep.Conflicts, len(rep.Conflicts)
	// The gate's far end on every pod before any VXLAN device redirects.
	pods, podNotes := podPinsOf(t, vxs)
	notes = append(notes, podNotes...)
	ms.Pods, _, err = followPods(objs, st.Target, pods, nil)
	if serr := datapath.SaveModeState(st, ms); err != nil || serr != nil {
		return errors.Join(err, serr)
	}
	for _, vx := range vxs {
		p, err := attachPiece(objs, st.Target, vx)
		if err != nil {
			return err
		}
		ms.Pieces = append(ms.Pieces, p)
		if err := datapath.SaveModeState(st, ms); err != nil {
			return err
		}
	}
	ms.Firewall, err = followFirewall(vxs, nil, c.Conntrack)
	if serr := datapath.SaveModeState(st, ms); err != nil || serr != nil {
		return errors.Join(err, serr)
	}
	if !c.Agent {
		notes = append(notes, "agent=false: HP TCP flows stay on the normal path (the agent marks their conntrack entries liberal, which the gate waits for; status counts \"TCP entry not yet liberal\")")
	}
	if !c.Conntrack {
		notes = append(notes, "conntrack=false: HP flows are redirected only where something else keeps conntrack on in the VXLAN device's namespace (status counts \"no conntrack entry\" otherwise)")
	}
	if iso != nil {
		if err := attachIsolation(objs, t, st, &ms, iso); err != nil {
			return err
		}
	}
	ms.Notes = append(notes, unmatchedNotes(rules, eps)...)
	datapath.SetModeState(st, ms)
	if c.Agent {
		return agentKit.Start(st)
	}
	return nil
}

// attachPiece configures the program for a VXLAN device and attaches it at tcx ingress inside
// the device's namespace; the pinned link outlives this process.
func attachPiece(o *objects, target string, vx vxlanDev) (piece, error) {
	p := piece{Dev: vx.Dev, Inode: vx.Inode, Routed: vx.Routed}
	dv := prsPrismDev{}
	copy(dv.Mac[:], vx.MAC)
	if vx.Routed {
		dv.Routed = 1
	}
	if err := o.PrgPrismDev.Put(prsPrgDevKey{Netns: vx.Inode, Ifindex: uint32(vx.Dev.Ifindex)}, dv); err != nil {
		return p, fmt.Errorf("prism: %s: device map: %w", vx.Dev, err)
	}
	p.LinkPin = bpfobj.LinkPin(datapath.ModePinDir(target, Name), uint64(vx.Inode), vx.Dev.Ifindex, vx.Dev.Name, "")
	if err := bpfobj.AttachTCX(o.PrgPrismVx, vx.Dev.Netns, vx.Dev.Ifindex, false, p.LinkPin); err != nil {
		return p, fmt.Errorf("prism: %s: %w", vx.Dev, err)
	}
	return p, nil
}

// attachIsolation configures and attaches prg_prism_nic on every underlay device, recording each
// link as it goes (a crash leaves nothing detach cannot find).
func attachIsolation(objs *objects, t *datapath.Topology, st *datapath.State, ms *modeState, iso *isoConfig) error {
	ports, err := t.VXLANPortSet()
	if err != nil {
		return fmt.Errorf("prism: %w", err)
	}
	if err := objs.writeIso(iso, ports); err != nil {
		return err
	}
	ms.Isolation = iso
	for _, d := range t.ByStage(datapath.StageNIC) {
		p, err := attachNIC(objs, st.Target, d)
		if err != nil {
			return err
		}
		ms.Pieces = append(ms.Pieces, p)
		if err := datapath.SaveModeState(st, *ms); err != nil {
			return err
		}
	}
	return nil
}

// unmatchedNotes warns about rules whose destination covers no local container: they can
// never redirect anything on this host (the frames take the normal path, counted as misses).
func unmatchedNotes(rules []Rule, eps []endpoint) []string {
	var notes []string
	for _, r := range rules {
		if !r.Dst.IsValid() {
			continue
		}
		hit := false
		for _, e := range eps {
			if r.Dst.Contains(e.Addr) {
				hit = true
				break
			}
		}
		if !hit {
			notes = append(notes, fmt.Sprintf("rule %d (%s) matches no container on this host: its packets will take the normal path", r.ID, r))
		}
	}
	return notes
}

// Unload stops the agent and removes the tcx links (pins); the framework removes the rest of
// the pin directory afterwards.
func (mode) Unload(_ context.Context, st *datapath.State) error {
	errs := []error{agentKit.Stop(st)}
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range ms.Pieces {
		if err := bpfobj.DetachPin(p.LinkPin); err != nil {
			errs = append(errs, fmt.Errorf("prism: %s: %w", p.Dev, err))
		}
	}
	errs = append(errs, removeFirewall(ms.Firewall), removePods(ms.Pods))
	for _, p := range bpfobj.LinkPins(datapath.ModePinDir(st.Target, Name)) { // pinned by an attach that crashed before recording them
		errs = append(errs, bpfobj.DetachPin(p))
	}
	return errors.Join(errs...)
}

// View is what `prism rules` and `status` show: the rules with their HP counters, the
// program's counters and the endpoints.
type View struct {
	Target    string         `json:"target"`
	Rules     []RuleView     `json:"rules"`
	Stats     Stats          `json:"stats"`
	Endpoints []EndpointView `json:"endpoints"`
	Agent     string         `json:"agent"`
	Notes     []string       `json:"notes,omitempty"`
	// Isolation is the --hp-cpus plan, nil without it.
	Isolation *isoConfig `json:"isolation,omitempty"`
	// Conflicts are the addresses refused because several pods claim them (as of the agent's
	// last sync); ConflictsSeen counts them since attach.
	Conflicts     []endpoints.Conflict `json:"conflicts,omitempty"`
	ConflictsSeen int                  `json:"conflicts_seen"`
	// Pods is how many pod devices carry the gate's far end (prg_prism_dlv).
	Pods int `json:"pods"`
}

// RuleView is one rule with its counters.
type RuleView struct {
	ID      int    `json:"id"`
	Rule    string `json:"rule"`
	Packets uint64 `json:"hp_packets"`
	Bytes   uint64 `json:"hp_bytes"`
}

// Inspect reads the live view of prism on target.
func Inspect(target string) (*View, error) {
	st, ms, err := datapath.LoadAttached[modeState](target, Name)
	if err != nil {
		return nil, err
	}
	objs, err := openPinned(target)
	if err != nil {
		return nil, err
	}
	defer objs.Close()
	v := &View{Target: target, Notes: ms.Notes, Agent: agentKit.Status(st), Isolation: ms.Isolation,
		Conflicts: ms.Conflicts, ConflictsSeen: ms.ConflictsSeen, Pods: len(ms.Pods)}
	for _, r := range ms.Rules {
		c, err := objs.ruleCount(r.ID)
		if err != nil {
			return nil, fmt.Errorf("prism: counters of rule %d: %w", r.ID, err)
		}
		v.Rules = append(v.Rules, RuleView{ID: r.ID, Rule: r.String(), Packets: c.Packets, Bytes: c.Bytes})
	}
	if v.Stats, err = objs.stats(); err != nil {
		return nil, err
	}
	if v.Endpoints, err = objs.endpoints(); err != nil {
		return nil, err
	}
	return v, nil
}

// Report implements datapath.Reporter for `peregrine status`.
func (mode) Report(st *datapath.State) (string, error) {
	v, err := Inspect(st.Target)
	if err != nil {
		return "", err
	}
	return v.Format(), nil
}

// Format renders the view as status lines.
func (v *View) Format() string {
	var b strings.Builder
	s := v.Stats
	gone, live := 0, 0
	for _, e := range v.Endpoints {
		if e.Gone || !e.Held {
			gone++
		} else {
			live++
		}
	}
	fmt.Fprintf(&b, "  prism: %d rules, %d endpoints (%d gone), %d refused as claimed by several pods (%d since attach), %d pods gated, agent %s\n",
		len(v.Rules), live, gone, len(v.Conflicts), v.ConflictsSeen, v.Pods, v.Agent)
	fmt.Fprintf(&b, "  prism: seen %d, HP %d (redirected %d), LP %d, unparsed %d, fragments %d\n", s.Seen, s.HP, s.Redirected, s.LP, s.Unparsed, s.Frag)
	fmt.Fprintf(&b, "  prism: HP to the normal path: no endpoint %d, L2 %d, TTL %d, fast path learning %d; HP dropped: vanished %d, stale %d, errors %d\n",
		s.Miss, s.L2, s.TTL, s.Learn, s.Gone, s.Stale, s.Err)
	fmt.Fprintf(&b, "  prism: firewall gate, HP to the normal path: not TCP/UDP %d, no conntrack entry %d, not yet accepted by the normal path (conntrack %d, not delivered within the window %d), delivered through another veth or MAC than the endpoint's %d, re-verification %d, TCP entry not yet liberal %d (asks lost %d); HP frames the normal path delivered to a pod %d\n",
		s.NoTCPUDP, s.NoCT, s.CTNew, s.Unseen, s.Elsewhere, s.Probe, s.Strict, s.AskLost, s.Delivered)
	for _, c := range v.Conflicts {
		fmt.Fprintf(&b, "    conflict: %s\n", c)
	}
	if s.NoCT > 0 && s.Redirected == 0 && s.Delivered == 0 {
		b.WriteString("    note: no HP flow has a conntrack entry yet: is conntrack on in the VXLAN device's namespace? (attach with conntrack=true turns it on)\n")
	}
	if iso := v.Isolation; iso != nil {
		fmt.Fprintf(&b, "  prism: HP isolation: HP on CPUs %s, the rest on %s (VXLAN RPS set %s); underlay VXLAN frames %d: HP %d, LP %d (kept on their CPU %d), untouched %d\n",
			cpuset.Format(iso.HP), cpuset.Format(iso.LP), cpuset.Format(iso.Set), s.IsoVXLAN, s.IsoHP, s.IsoLP, s.IsoStay, s.IsoOff)
	}
	for _, r := range v.Rules {
		fmt.Fprintf(&b, "    rule %-2d %-40s HP packets %d, bytes %d\n", r.ID, r.Rule, r.Packets, r.Bytes)
	}
	for _, n := range v.Notes {
		fmt.Fprintf(&b, "    note: %s\n", n)
	}
	return b.String()
}

// changeRules applies fn to the installed rules under the record's lock and installs the result.
func changeRules(target string, fn func([]Rule) ([]Rule, error)) ([]Rule, error) {
	var out []Rule
	err := datapath.UpdateState(target, Name, 3*time.Second, func(st *datapath.State) error {
		if st.Mode != Name {
			return fmt.Errorf("%s has mode %s attached, not prism", netnsutil.Label(target), st.Mode)
		}
		ms, err := datapath.LoadModeState[modeState](st)
		if err != nil {
			return err
		}
		next, err := fn(ms.Rules)
		if err != nil {
			return err
		}
		objs, err := openPinned(target)
		if err != nil {
			return err
		}
		defer objs.Close()
		old := map[int]bool{}
		for _, r := range ms.Rules {
			old[r.ID] = true
		}
		for _, r := range next {
			if !old[r.ID] {
				if err := objs.resetCounters(r.ID); err != nil {
					return err
				}
			}
		}
		if err := objs.writeRules(next); err != nil {
			return err
		}
		ms.Rules, out = next, next
		datapath.SetModeState(st, ms)
		return nil
	})
	if errors.Is(err, datapath.ErrNotAttached) {
		err = datapath.NotAttached(target, Name)
	}
	return out, err
}

// AddRules parses text (rules separated by ';' or newlines) and appends them, live.
func AddRules(target, text string) ([]Rule, error) {
	add, err := ParseRules(text)
	if err != nil {
		return nil, err
	}
	if len(add) == 0 {
		return nil, fmt.Errorf("no rule given")
	}
	return changeRules(target, func(have []Rule) ([]Rule, error) { return mergeRules(have, add) })
}

// ReplaceRules installs exactly the rules in text, live (IDs of unchanged rules are kept).
func ReplaceRules(target, text string) ([]Rule, error) {
	want, err := ParseRules(text)
	if err != nil {
		return nil, err
	}
	return changeRules(target, func(have []Rule) ([]Rule, error) {
		var keep []Rule
		for _, h := range have {
			for _, w := range want {
				if h.same(w) {
					keep = append(keep, h)
				}
			}
		}
		var add []Rule
		for _, w := range want {
			found := false
			for _, k := range keep {
				found = found || k.same(w)
			}
			if !found {
				add = append(add, w)
			}
		}
		return mergeRules(keep, add)
	})
}

// DelRules removes rules by ID or by text, live; it returns the removed IDs.
func DelRules(target string, which []string) ([]int, error) {
	var ids []int
	_, err := changeRules(target, func(have []Rule) ([]Rule, error) {
		out, removed, err := removeRules(have, which)
		ids = removed
		return out, err
	})
	return ids, err
}

// Example shows the mode in `attach --help`.
func (mode) Example() string {
	return `  sudo peregrine attach prism --lab --rule "proto=tcp dport=11211"
  sudo peregrine attach prism --rules-file hp.rules --hp-cpus 1   # HP flows on a reserved CPU`
}
