package testbed

import (
	"maps"
	"slices"
	"testing"
)

func TestParseEthtoolK(t *testing.T) {
	txt := "Features for eth0:\nrx-checksumming: on\ngeneric-receive-offload: off [fixed]\nrx-gro-list: on [requested off]\nhighdma: on\n"
	got := parseEthtoolK(txt)
	want := map[string]bool{"rx-csum": true, "gro": false, "gro-list": true}
	if !maps.Equal(got, want) {
		t.Errorf("parseEthtoolK = %v, want %v", got, want)
	}
}

// Given namespaces are measured as found: their namespaces are the pair's, there is no lab of
// ours to attach a calibration program to, and tearing down removes nothing.
func TestExistingIsNotOurs(t *testing.T) {
	tb := Existing("given:a->b", "prg-none-a", "prg-none-b", "198.18.0.2")
	if ns := tb.Namespaces(); !slices.Equal(ns, []string{"prg-none-a", "prg-none-b"}) {
		t.Errorf("namespaces %v", ns)
	}
	if tb.ReceiveHostNetns() != "" || tb.Receiver.AddrOnly() != "198.18.0.2" {
		t.Errorf("receive host %q, receiver %+v", tb.ReceiveHostNetns(), tb.Receiver)
	}
	if err := tb.Teardown(); err != nil {
		t.Errorf("teardown of given namespaces: %v", err)
	}
}
