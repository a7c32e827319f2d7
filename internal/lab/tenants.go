package lab

import (
	"fmt"
	"strconv"
	"strings"
)

// Tenants (--tenants N, docker style): every host gets one overlay per tenant.
//
//	tenant 1:  overlay namespace h<i>-ov,     containers h<i>-c<j>     VNI vni     (as without tenants)
//	tenant t:  overlay namespace h<i>-t<t>-ov, containers h<i>-t<t>-c<j> VNI vni+t-1
//
// Each tenant's VXLAN device is made in the host namespace (its UDP socket stays there, port
// shared, told apart by VNI) and moved into the tenant's overlay namespace with its bridge, as
// Docker does for every overlay network. Tenant t's containers get exactly the addresses and
// MACs of tenant 1's (overlapping subnets): only the VNI keeps them apart. The bridge-side veths
// of tenant t >= 2 get the ifindex TenantPortIndex(t, j), so no two tenants of a host share one
// (EZPath's host tables key a container's port by ifindex; see bpf/ezpath_host.bpf.c).

// MaxTenants caps --tenants (EZPath gives tenant t the VID 100+t-1 on each host-ToR link).
const MaxTenants = 16

// ContainerName is the short name of container j of tenant t on host i (all from 1): h1-c1 for
// tenant 1 (the name without tenants), h1-t2-c1 for tenant 2.
func ContainerName(i, t, j int) string {
	if t <= 1 {
		return fmt.Sprintf("h%d-c%d", i, j)
	}
	return fmt.Sprintf("h%d-t%d-c%d", i, t, j)
}

// OverlayName is the short name of tenant t's overlay namespace on host i (docker style).
func OverlayName(i, t int) string {
	if t <= 1 {
		return fmt.Sprintf("h%d-ov", i)
	}
	return fmt.Sprintf("h%d-t%d-ov", i, t)
}

// ParseContainerName reads a container's short name back: host i, tenant t (1 when the name has
// none) and container j. ok is false for anything that is not a container name.
func ParseContainerName(name string) (i, t, j int, ok bool) {
	parts := strings.Split(name, "-")
	num := func(s, prefix string) int {
		if !strings.HasPrefix(s, prefix) {
			return 0
		}
		n, err := strconv.Atoi(s[len(prefix):])
		if err != nil || n < 1 || strconv.Itoa(n) != s[len(prefix):] {
			return 0
		}
		return n
	}
	switch len(parts) {
	case 2:
		i, t, j = num(parts[0], "h"), 1, num(parts[1], "c")
	case 3:
		i, t, j = num(parts[0], "h"), num(parts[1], "t"), num(parts[2], "c")
		if t == 1 {
			return 0, 0, 0, false // tenant 1's containers have no tenant part: one name each
		}
	default:
		return 0, 0, 0, false
	}
	if i == 0 || t == 0 || j == 0 {
		return 0, 0, 0, false
	}
	return i, t, j, true
}

// TenantCount is the number of tenants (1 for a spec, or a lab record, without the key).
func (s *Spec) TenantCount() int {
	if s.Tenants < 1 {
		return 1
	}
	return s.Tenants
}

// TenantVNI is tenant t's VNI: the lab's VNI for tenant 1, the next ones for the others.
func (s *Spec) TenantVNI(t int) int { return s.VNI + t - 1 }

// TenantPortIndex is the ifindex of the bridge-side veth of tenant t's container j (t >= 2) in
// its overlay namespace; tenant 1's ports take whatever the kernel gives (low numbers).
func TenantPortIndex(t, j int) int { return 1000*t + j }

func (s *Spec) validateTenants() error {
	if s.Tenants < 0 || s.Tenants > MaxTenants {
		return fmt.Errorf("tenants must be between 1 and %d (got %d)", MaxTenants, s.Tenants)
	}
	if s.TenantCount() == 1 {
		return nil
	}
	if s.Style != StyleDocker {
		return fmt.Errorf("--tenants %d needs the docker style (got %s): tenants are separate overlay namespaces with their own VXLAN device and VNI; the %s style has one overlay per host",
			s.Tenants, s.Style, s.Style)
	}
	if s.VNI+s.Tenants-1 > 1<<24-1 {
		return fmt.Errorf("VNI %d leaves no room for %d tenants (tenant t uses VNI %d+t-1, at most 16777215)", s.VNI, s.Tenants, s.VNI)
	}
	return nil
}
