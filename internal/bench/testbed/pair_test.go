package testbed

import (
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/lab"
)

// pairLab is a lab as Status describes a 2-host x 2-container flannel lab with Services,
// without building it (pickPair only reads the description).
func pairLab(ipv6 bool) *lab.Lab {
	s := lab.Spec{Name: "x", Style: lab.StyleFlannel, Hosts: 2, Containers: 2, Services: true, IPv6: ipv6}
	s.Defaults()
	l := &lab.Lab{Spec: s, Services: s.LabServices()}
	for _, n := range []string{"h1-c1", "h1-c2", "h2-c1", "h2-c2"} {
		l.Containers = append(l.Containers, lab.Node{Name: n, Netns: "prg-x-" + n, Role: "container", Host: n[:2]})
	}
	return l
}

// Through a Service: the receiver is default/one's backend; a dual-stack bed connects to the
// IPv6 ClusterIP, and a lab without one is refused with a reason.
func TestPickPairService(t *testing.T) {
	for _, c := range []struct {
		ipv6, labV6 bool
		connect     string
		err         string
	}{
		{false, false, "198.18.255.1:80", ""},
		{true, true, "[fd70:7267:2::1]:80", ""},
		{true, false, "", "no IPv6 ClusterIP"},
	} {
		l := pairLab(c.labV6)
		tb := &Testbed{Lab: l, Sender: l.Containers[0]}
		err := tb.pickPair(Spec{Config: "flannel/vanilla", Style: lab.StyleFlannel, ProxyMode: lab.ProxyIPTables, IPv6: c.ipv6})
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: %v, want %q", c, err, c.err)
			}
		case err != nil || tb.Connect != c.connect || tb.Receiver.Name != "h2-c1" || tb.ServerPort != lab.VerifyPort:
			t.Errorf("%+v: connect %q receiver %s port %d (%v)", c, tb.Connect, tb.Receiver.Name, tb.ServerPort, err)
		}
	}
}

// Same node through a Service: the sender becomes the backend's node mate, so the ClusterIP's
// translation lands on a pod of the sender's own node (both families).
func TestPickPairSameNodeService(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		l := pairLab(ipv6)
		tb := &Testbed{Lab: l, Sender: l.Containers[0]}
		err := tb.pickPair(Spec{Config: "flannel/vanilla", Style: lab.StyleFlannel, ProxyMode: lab.ProxyIPTables, IPv6: ipv6, SameNode: true})
		if err != nil || tb.Sender.Name != "h2-c2" || tb.Receiver.Name != "h2-c1" || tb.Sender.Host != tb.Receiver.Host || tb.Connect == "" {
			t.Errorf("ipv6 %v: sender %s receiver %s connect %q (%v)", ipv6, tb.Sender.Name, tb.Receiver.Name, tb.Connect, err)
		}
	}
}
