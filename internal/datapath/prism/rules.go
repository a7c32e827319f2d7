package prism

import (
	"bufio"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// MaxRules is how many rules one attachment holds (the eBPF rule table's half).
const MaxRules = 64

// PortRange is an inclusive L4 port range; the zero value means "any port".
type PortRange struct{ Lo, Hi uint16 }

func (p PortRange) any() bool { return p.Lo == 0 && p.Hi == 0 }

func (p PortRange) String() string {
	if p.Lo == p.Hi {
		return strconv.Itoa(int(p.Lo))
	}
	return fmt.Sprintf("%d-%d", p.Lo, p.Hi)
}

// Rule classifies inner packets as high priority. Every criterion given must hold; criteria
// left out match anything. The first matching rule counts the packet.
type Rule struct {
	ID     int          `json:"id"`               // counter slot, assigned when installed (0..MaxRules-1)
	Family int          `json:"family,omitempty"` // 0 any, 4, 6
	Proto  int          `json:"proto"`            // -1 any, else the IP protocol number
	Src    netip.Prefix `json:"src,omitempty"`    // invalid = any
	Dst    netip.Prefix `json:"dst,omitempty"`
	SPort  PortRange    `json:"sport,omitempty"`
	DPort  PortRange    `json:"dport,omitempty"`
	DSCP   int          `json:"dscp"` // -1 any, else 0..63
	All    bool         `json:"all,omitempty"`
}

var protoNames = map[string]int{"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "gre": 47, "esp": 50}

var dscpNames = map[string]int{"be": 0, "cs0": 0, "cs1": 8, "cs2": 16, "cs3": 24, "cs4": 32, "cs5": 40, "cs6": 48, "cs7": 56,
	"af11": 10, "af12": 12, "af13": 14, "af21": 18, "af22": 20, "af23": 22, "af31": 26, "af32": 28, "af33": 30,
	"af41": 34, "af42": 36, "af43": 38, "ef": 46}

func protoName(p int) string {
	best := ""
	for n, v := range protoNames {
		if v == p && (best == "" || len(n) < len(best)) {
			best = n
		}
	}
	if best == "" {
		return strconv.Itoa(p)
	}
	return best
}

// ParseRule reads one rule: "key=value" criteria separated by spaces or commas, e.g.
// "proto=tcp dport=11211", "dst=198.19.2.0/24,dscp=ef", "proto=udp sport=5000-5999", or "all".
// Keys: proto (tcp, udp, sctp, icmp, icmpv6 or a number), sport, dport (port or lo-hi),
// src, dst (address or CIDR, IPv4 or IPv6), dscp (0-63 or a name: ef, af41, cs5...), family
// (ipv4 or ipv6). A rule that cannot match anything is an error.
func ParseRule(s string) (Rule, error) {
	r := Rule{Proto: -1, DSCP: -1}
	fields := strings.FieldsFunc(s, func(c rune) bool { return c == ' ' || c == ',' || c == '\t' })
	if len(fields) == 0 {
		return r, fmt.Errorf("empty rule: give criteria such as \"proto=tcp dport=11211\" (or \"all\" to make everything high priority)")
	}
	seen := map[string]bool{}
	for _, f := range fields {
		if f == "all" {
			r.All = true
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return r, fmt.Errorf("%q: want key=value (keys: proto, sport, dport, src, dst, dscp, family) or \"all\"", f)
		}
		k = strings.ToLower(k)
		if seen[k] {
			return r, fmt.Errorf("%q: %s given twice in one rule (write two rules to match either)", f, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "proto", "protocol":
			r.Proto, err = parseProto(v)
		case "sport":
			r.SPort, err = parsePorts(v)
		case "dport", "port":
			r.DPort, err = parsePorts(v)
		case "src":
			r.Src, err = parsePrefix(v)
		case "dst":
			r.Dst, err = parsePrefix(v)
		case "dscp":
			r.DSCP, err = parseDSCP(v)
		case "family":
			switch strings.ToLower(v) {
			case "4", "ipv4", "inet":
				r.Family = 4
			case "6", "ipv6", "inet6":
				r.Family = 6
			default:
				err = fmt.Errorf("unknown family %q: use ipv4 or ipv6", v)
			}
		default:
			return r, fmt.Errorf("%q: unknown key %q (keys: proto, sport, dport, src, dst, dscp, family)", f, k)
		}
		if err != nil {
			return r, fmt.Errorf("%s=%s: %w", k, v, err)
		}
	}
	if r.All && len(fields) > 1 {
		return r, fmt.Errorf("\"all\" matches every packet: it takes no other criteria")
	}
	return r, r.check()
}

// check rejects rules that can never match a packet.
func (r *Rule) check() error {
	fam := r.Family
	for _, p := range []netip.Prefix{r.Src, r.Dst} {
		if !p.IsValid() {
			continue
		}
		pf := 4
		if p.Addr().Is6() {
			pf = 6
		}
		if fam != 0 && fam != pf {
			return fmt.Errorf("matches nothing: it mixes IPv4 and IPv6 (%s)", r)
		}
		fam = pf
	}
	switch r.Proto {
	case 1:
		if fam == 6 {
			return fmt.Errorf("matches nothing: icmp is IPv4's; IPv6 uses proto=icmpv6 (%s)", r)
		}
		fam = 4
	case 58:
		if fam == 4 {
			return fmt.Errorf("matches nothing: icmpv6 is IPv6's; IPv4 uses proto=icmp (%s)", r)
		}
		fam = 6
	}
	if (!r.SPort.any() || !r.DPort.any()) && r.Proto >= 0 && r.Proto != 6 && r.Proto != 17 && r.Proto != 132 {
		return fmt.Errorf("matches nothing: %s has no ports (ports apply to tcp, udp and sctp)", protoName(r.Proto))
	}
	r.Family = fam
	return nil
}

func parseProto(v string) (int, error) {
	if p, ok := protoNames[strings.ToLower(v)]; ok {
		return p, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("unknown protocol %q: use tcp, udp, sctp, icmp, icmpv6 or a number 0-255", v)
	}
	if n < 0 || n > 255 {
		return 0, fmt.Errorf("protocol number %d out of range 0-255", n)
	}
	return n, nil
}

func parsePort(v string) (uint16, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("port %q is not a number", v)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %d out of range 1-65535", n)
	}
	return uint16(n), nil
}

func parsePorts(v string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(v, "-")
	a, err := parsePort(lo)
	if err != nil {
		return PortRange{}, err
	}
	b := a
	if isRange {
		if b, err = parsePort(hi); err != nil {
			return PortRange{}, err
		}
		if b < a {
			return PortRange{}, fmt.Errorf("port range %d-%d is empty (low end first)", a, b)
		}
	}
	return PortRange{a, b}, nil
}

func parsePrefix(v string) (netip.Prefix, error) {
	if !strings.Contains(v, "/") {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("bad address %q: want an IPv4/IPv6 address or CIDR", v)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(v)
	if err != nil {
		return p, fmt.Errorf("bad CIDR %q: want e.g. 198.19.2.0/24 or fd00::/64", v)
	}
	if p.Addr().Is4In6() {
		return p, fmt.Errorf("bad CIDR %q: IPv4-mapped IPv6 prefixes never appear in packets; write the IPv4 prefix", v)
	}
	if p.Masked() != p {
		return p, fmt.Errorf("CIDR %q has host bits set: did you mean %s?", v, p.Masked())
	}
	return p, nil
}

func parseDSCP(v string) (int, error) {
	if d, ok := dscpNames[strings.ToLower(v)]; ok {
		return d, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("unknown DSCP %q: use 0-63 or a name (ef, af11..af43, cs0..cs7)", v)
	}
	if n < 0 || n > 63 {
		return 0, fmt.Errorf("DSCP %d out of range 0-63", n)
	}
	return n, nil
}

// String is the rule in the syntax ParseRule reads (canonical order).
func (r Rule) String() string {
	if r.All {
		return "all"
	}
	var parts []string
	if r.Family != 0 && !r.Src.IsValid() && !r.Dst.IsValid() && r.Proto != 1 && r.Proto != 58 {
		parts = append(parts, fmt.Sprintf("family=ipv%d", r.Family))
	}
	if r.Proto >= 0 {
		parts = append(parts, "proto="+protoName(r.Proto))
	}
	if r.Src.IsValid() {
		parts = append(parts, "src="+r.Src.String())
	}
	if !r.SPort.any() {
		parts = append(parts, "sport="+r.SPort.String())
	}
	if r.Dst.IsValid() {
		parts = append(parts, "dst="+r.Dst.String())
	}
	if !r.DPort.any() {
		parts = append(parts, "dport="+r.DPort.String())
	}
	if r.DSCP >= 0 {
		parts = append(parts, "dscp="+strconv.Itoa(r.DSCP))
	}
	return strings.Join(parts, " ")
}

// same tells whether two rules match the same packets (IDs aside).
func (r Rule) same(o Rule) bool { return r.String() == o.String() }

// ParseRules reads rules separated by ';' or newlines; blank entries and '#' comments are
// skipped. Errors name the rule's position.
func ParseRules(s string) ([]Rule, error) {
	var out []Rule
	n := 0
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		for _, part := range strings.Split(line, ";") {
			if strings.TrimSpace(part) == "" {
				continue
			}
			n++
			r, err := ParseRule(part)
			if err != nil {
				return nil, fmt.Errorf("rule %d (%q): %w", n, strings.TrimSpace(part), err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// mergeRules appends add to have, assigning free IDs, rejecting duplicates and overflow.
func mergeRules(have, add []Rule) ([]Rule, error) {
	used := map[int]bool{}
	out := append([]Rule{}, have...)
	for _, r := range have {
		used[r.ID] = true
	}
	for _, r := range add {
		for _, h := range out {
			if h.same(r) {
				return nil, fmt.Errorf("rule %q is already installed (id %d)", r, h.ID)
			}
		}
		if len(out) >= MaxRules {
			return nil, fmt.Errorf("too many rules: at most %d (delete some with `peregrine prism del`)", MaxRules)
		}
		id := 0
		for used[id] {
			id++
		}
		used[id] = true
		r.ID = id
		out = append(out, r)
	}
	return out, nil
}

// removeRules drops the rules named by ID ("3") or by text (as `prism rules` prints them).
func removeRules(have []Rule, which []string) ([]Rule, []int, error) {
	drop := map[int]bool{}
	for _, w := range which {
		w = strings.TrimSpace(w)
		found := false
		if id, err := strconv.Atoi(w); err == nil {
			for _, r := range have {
				if r.ID == id {
					drop[id], found = true, true
				}
			}
		} else if want, err := ParseRule(w); err == nil {
			for _, r := range have {
				if r.same(want) {
					drop[r.ID], found = true, true
				}
			}
		} else {
			return nil, nil, fmt.Errorf("%q is neither a rule id nor a valid rule: %w", w, err)
		}
		if !found {
			return nil, nil, fmt.Errorf("no installed rule is %q (see `peregrine prism rules`)", w)
		}
	}
	var out []Rule
	var ids []int
	for _, r := range have {
		if drop[r.ID] {
			ids = append(ids, r.ID)
			continue
		}
		out = append(out, r)
	}
	sort.Ints(ids)
	return out, ids, nil
}
