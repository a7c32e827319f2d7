package lab

import (
	"context"
	"os"
	"strings"
	"testing"
)

func TestTenantNames(t *testing.T) {
	cases := []struct {
		i, t, j int
		name    string
		ov      string
	}{
		{1, 1, 1, "h1-c1", "h1-ov"},
		{2, 1, 3, "h2-c3", "h2-ov"},
		{1, 2, 1, "h1-t2-c1", "h1-t2-ov"},
		{12, 16, 200, "h12-t16-c200", "h12-t16-ov"},
	}
	for _, c := range cases {
		if got := ContainerName(c.i, c.t, c.j); got != c.name {
			t.Errorf("ContainerName(%d, %d, %d) = %s, want %s", c.i, c.t, c.j, got, c.name)
		}
		if got := OverlayName(c.i, c.t); got != c.ov {
			t.Errorf("OverlayName(%d, %d) = %s, want %s", c.i, c.t, got, c.ov)
		}
		i, tn, j, ok := ParseContainerName(c.name)
		if !ok || i != c.i || tn != c.t || j != c.j {
			t.Errorf("ParseContainerName(%s) = %d %d %d %v", c.name, i, tn, j, ok)
		}
	}
	for _, bad := range []string{"h1", "h1-ov", "h1-t2-ov", "h1-t1-c1", "h0-c1", "h1-c0", "hx-c1", "h1-c01", "h1-t2-c1-x", "tor1", "sw", "h1-t-c1", "h1-c+1"} {
		if i, tn, j, ok := ParseContainerName(bad); ok {
			t.Errorf("ParseContainerName(%q) = %d %d %d, want not a container", bad, i, tn, j)
		}
	}
}

func TestTenantSpec(t *testing.T) {
	d := Spec{}
	d.Defaults()
	if d.Tenants != 0 || d.TenantCount() != 1 || d.TenantVNI(1) != 4096 {
		t.Fatalf("default: tenants %d, VNI %d", d.Tenants, d.TenantVNI(1))
	}
	if old := (Spec{}); old.TenantCount() != 1 {
		t.Fatal("a record without the key has one tenant")
	}
	one := Spec{Tenants: 1}
	one.Defaults()
	if err := one.Validate(); err != nil || one.Tenants != 0 {
		t.Fatalf("--tenants 1 is the default (stored as 0 so records stay as before): %+v %v", one.Tenants, err)
	}
	two := Spec{Tenants: 2, ToR: true}
	two.Defaults()
	if err := two.Validate(); err != nil {
		t.Fatalf("2 tenants, docker style: %v", err)
	}
	if two.TenantVNI(2) != 4097 {
		t.Fatalf("tenant 2 VNI = %d", two.TenantVNI(2))
	}
	cases := map[string]Spec{
		"needs the docker style":   {Tenants: 2, Style: StyleFlannel},
		"linux style has one":      {Tenants: 2, Style: StyleLinux},
		"between 1 and 16":         {Tenants: 17},
		"tenants must be between":  {Tenants: -1},
		"leaves no room for 2":     {Tenants: 2, VNI: 1<<24 - 1},
		"native style has one ove": {Tenants: 3, Style: StyleNative},
	}
	for want, s := range cases {
		s.Defaults()
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("spec %+v: error %v, want it to mention %q", s, err, want)
		}
	}
	if TenantPortIndex(2, 1) == TenantPortIndex(3, 1) || TenantPortIndex(2, 200) >= TenantPortIndex(3, 1) {
		t.Fatal("tenants' port indexes must not overlap")
	}
}

func TestTenantsYAMLKey(t *testing.T) {
	path := t.TempDir() + "/topo.yaml"
	if err := os.WriteFile(path, []byte("name: tt\ntor: true\ntenants: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := LoadSpec(path)
	if err != nil || s.Tenants != 2 || !s.ToR {
		t.Fatalf("LoadSpec: %+v %v", s, err)
	}
}

// Two tenants with the same container addresses: each tenant's pairs reach each other (and the
// echo names the node that answered, so a reply from the other tenant's twin fails), no tenant
// reaches the other's port, and the layout is the documented one.
func TestTwoTenantsOverlapButAreIsolated(t *testing.T) {
	l := upForTest(t, Spec{Name: "tten", Style: StyleDocker, Containers: 1, ToR: true, Tenants: 2})
	if len(l.Containers) != 4 || len(l.Overlays) != 4 {
		t.Fatalf("want 4 containers and 4 overlay namespaces, got %d and %d", len(l.Containers), len(l.Overlays))
	}
	// Tenant 1 first, in the order a single-tenant lab has.
	wantNames := []string{"h1-c1", "h2-c1", "h1-t2-c1", "h2-t2-c1"}
	for k, c := range l.Containers {
		if c.Name != wantNames[k] || c.Netns != "prg-tten-"+wantNames[k] || c.Tenant != 1+k/2 {
			t.Fatalf("container %d: %+v, want %s of tenant %d", k, c, wantNames[k], 1+k/2)
		}
	}
	a, _ := l.Node("h1-c1")
	b, _ := l.Node("h1-t2-c1")
	if a.Addr != b.Addr || a.Device("eth0").MAC != b.Device("eth0").MAC {
		t.Fatalf("tenants should overlap: %s %s vs %s %s", a.Addr, a.Device("eth0").MAC, b.Addr, b.Device("eth0").MAC)
	}
	for _, c := range []struct {
		ov  string
		vni int
	}{{"h1-ov", 4096}, {"h1-t2-ov", 4097}, {"h2-t2-ov", 4097}} {
		ov, err := l.Node(c.ov)
		if err != nil {
			t.Fatal(err)
		}
		if vx := ov.Device("vxlan0"); vx == nil || vx.VNI != c.vni || vx.Master != "br0" {
			t.Fatalf("%s should hold vxlan0 with VNI %d on br0: %+v", c.ov, c.vni, ov.Devices)
		}
	}
	if err := Verify(context.Background(), l); err != nil {
		t.Fatalf("tenants: %v", err)
	}
	// The check can fail: pretend h2-t2-c1 were tenant 1's. h1-c1's probe of its address is
	// answered by h2-c1 (its own tenant's twin), which Verify must call out.
	bad := *l
	bad.Containers = append([]Node{}, l.Containers...)
	bad.Containers[3].Tenant = 1
	err := Verify(context.Background(), &bad)
	if err == nil || !strings.Contains(err.Error(), `h1-c1 -> h2-t2-c1 (198.19.2.2) tcp: answered by "h2-c1"`) {
		t.Fatalf("a reply from the other tenant's twin should fail the check, got %v", err)
	}
}
