package lab

import (
	"strings"
	"testing"
)

func TestIPv6Addressing(t *testing.T) {
	s := Spec{Style: StyleFlannel, IPv6: true}
	s.Defaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ got, want string }{
		{s.HostSubnet6(2).String(), "fd70:7267:0:2::/64"},
		{s.GatewayAddr6(1).String(), "fd70:7267:0:1::1/64"},
		{s.ContainerAddr6(2, 1).String(), "fd70:7267:0:2::2/64"},
		{s.ContainerAddr6(1, 3).String(), "fd70:7267:0:1::4/64"},
		{s.FlannelAddr6(2).String(), "fd70:7267:0:2::/128"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}

func TestIPv6Refused(t *testing.T) {
	for _, c := range []struct {
		s    Spec
		want string
	}{
		{Spec{Style: StyleDocker, IPv6: true}, "flannel style only"},
		{Spec{Style: StyleFlannel, IPv6: true, OverlayCIDR6: "10.0.0.0/8"}, "IPv6 overlay CIDR"},
		{Spec{Style: StyleFlannel, IPv6: true, OverlayCIDR6: "fd00::/56"}, "IPv6 overlay CIDR"},
		{Spec{Style: StyleFlannel, OverlayCIDR6: "fd00::/48"}, "without ipv6"},
		{Spec{Style: StyleFlannel, IPv6: true, ToR: true}, "does not combine"},
	} {
		c.s.Defaults()
		err := c.s.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error with %q", c.s, err, c.want)
		}
	}
}
