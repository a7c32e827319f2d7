package lab

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"runtime"

	"gopkg.in/yaml.v3"
)

var labNameRE = regexp.MustCompile(`^[a-z0-9]{1,12}$`)

// DefaultName is the lab name used when none is given.
const DefaultName = "lab"

// Defaults fills zero fields of the spec with the documented defaults.
func (s *Spec) Defaults() {
	if s.Name == "" {
		s.Name = DefaultName
	}
	if s.Style == "" {
		s.Style = StyleDocker
	}
	if s.Hosts == 0 {
		s.Hosts = 2
	}
	if s.Style == StyleLinux {
		s.Containers = 0 // applications run on the hosts; --containers has nothing to build
	}
	if s.Containers == 0 && !HostEndpoints(s.Style) {
		s.Containers = 1
	}
	if s.Underlay == "" {
		s.Underlay = UnderlayDirect
		if s.Hosts > 2 {
			s.Underlay = UnderlaySwitch
		}
	}
	if s.MTU == 0 {
		s.MTU = 1500
	}
	if s.GRO == nil {
		on := true
		s.GRO = &on
	}
	if s.WireFrames == nil {
		on := true
		s.WireFrames = &on
	}
	if s.UnderlayCIDR == "" {
		s.UnderlayCIDR = "198.18.0.0/24"
	}
	if s.OverlayCIDR == "" {
		s.OverlayCIDR = "198.19.0.0/16"
	}
	if s.VNI == 0 {
		s.VNI = 4096
		if s.Style == StyleFlannel {
			s.VNI = 1 // flannel's VXLAN backend always uses VNI 1
		}
	}
	if s.Tenants == 1 {
		s.Tenants = 0 // one tenant is stored as none: single-tenant records stay as they were
	}
	if s.ToR && len(s.ToRCPUs) == 0 {
		s.ToRCPUs = []int{runtime.NumCPU() - 1}
	}
	if s.Services && s.ProxyMode == "" {
		s.ProxyMode = ProxyIPTables // kube-proxy's default mode
	}
	if s.IPv6 && s.OverlayCIDR6 == "" {
		s.OverlayCIDR6 = DefaultOverlayCIDR6
	}
	if s.VXLANPort == 0 {
		s.VXLANPort = 4789
		if s.Style == StyleFlannel {
			s.VXLANPort = 8472 // flannel's (the Linux kernel's historical) default
		}
	}
}

// Validate checks the spec after Defaults; every error says what to change.
func (s *Spec) Validate() error {
	if !labNameRE.MatchString(s.Name) {
		return fmt.Errorf("lab name %q is invalid: use 1-12 lowercase letters or digits", s.Name)
	}
	switch s.Style {
	case StyleDocker, StyleFlannel, StyleNative, StyleLinux:
	default:
		return fmt.Errorf("unknown style %q: choose docker, flannel, linux or native", s.Style)
	}
	if s.Hosts < 2 {
		return fmt.Errorf("hosts must be at least 2 (got %d): an overlay needs a remote host", s.Hosts)
	}
	if s.Hosts > 200 {
		return fmt.Errorf("hosts must be at most 200 (got %d)", s.Hosts)
	}
	if s.Containers < 0 || s.Containers > 200 {
		return fmt.Errorf("containers per host must be between 1 and 200 (got %d)", s.Containers)
	}
	if !HostEndpoints(s.Style) && s.Containers < 1 {
		return fmt.Errorf("the %s style needs at least 1 container per host", s.Style)
	}
	switch s.Underlay {
	case UnderlayDirect:
		if s.Hosts != 2 {
			return fmt.Errorf("a direct underlay joins exactly 2 hosts (got %d): use --underlay switch", s.Hosts)
		}
	case UnderlaySwitch:
	default:
		return fmt.Errorf("unknown underlay %q: choose direct or switch", s.Underlay)
	}
	if s.MTU < 1280 || s.MTU > 9000 {
		return fmt.Errorf("MTU %d out of range: use 1280..9000", s.MTU)
	}
	for _, c := range s.RxCPUs {
		if c < 0 || c >= runtime.NumCPU() {
			return fmt.Errorf("rx CPU %d does not exist: this machine has CPUs 0-%d", c, runtime.NumCPU()-1)
		}
	}
	if s.NAPIThread && (len(s.RxCPUs) == 0 || s.GRO == nil || !*s.GRO) {
		return fmt.Errorf("napi_thread pins the underlay's NAPI thread to the rx CPUs: it needs rx CPUs (--rx-cpus) and GRO on (veth NAPI mode)")
	}
	for _, c := range s.ToRCPUs {
		if c < 0 || c >= runtime.NumCPU() {
			return fmt.Errorf("ToR CPU %d does not exist: this machine has CPUs 0-%d", c, runtime.NumCPU()-1)
		}
	}
	u, err := netip.ParsePrefix(s.UnderlayCIDR)
	if err != nil || !u.Addr().Is4() || u.Bits() > 24 {
		return fmt.Errorf("underlay CIDR %q invalid: need an IPv4 prefix of /24 or larger", s.UnderlayCIDR)
	}
	o, err := netip.ParsePrefix(s.OverlayCIDR)
	if err != nil || !o.Addr().Is4() || o.Bits() > 16 {
		return fmt.Errorf("overlay CIDR %q invalid: need an IPv4 prefix of /16 or larger (a /24 per host)", s.OverlayCIDR)
	}
	if u.Overlaps(o) {
		return fmt.Errorf("underlay %s and overlay %s overlap", s.UnderlayCIDR, s.OverlayCIDR)
	}
	if s.VNI < 1 || s.VNI > 1<<24-1 {
		return fmt.Errorf("VNI %d out of range 1..16777215", s.VNI)
	}
	if s.ToR && s.Hosts > MaxToRHosts {
		return fmt.Errorf("a --tor lab has at most %d hosts (got %d): the ToR addresses take the top of the underlay /24", MaxToRHosts, s.Hosts)
	}
	if s.VXLANPort < 1 || s.VXLANPort > 65535 {
		return fmt.Errorf("VXLAN port %d out of range", s.VXLANPort)
	}
	if err := s.validateIPv6(); err != nil {
		return err
	}
	if err := s.validateServices(); err != nil {
		return err
	}
	return s.validateTenants()
}

// LoadSpec reads a YAML topology file.
func LoadSpec(path string) (Spec, error) {
	var s Spec
	b, err := os.ReadFile(path)
	if err != nil {
		return s, fmt.Errorf("read topology file: %w", err)
	}
	dec := yaml.NewDecoder(bytesReader(b))
	dec.KnownFields(true) // a typo in a key is an error, not a silent default
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("topology file %s is malformed: %w", path, err)
	}
	return s, nil
}
