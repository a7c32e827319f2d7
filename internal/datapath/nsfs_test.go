package datapath

import (
	"slices"
	"testing"
)

// NsfsMounts finds namespace files bind-mounted anywhere (dockerd's exec-root/netns), skips
// iproute2's directory (listed by name), /proc and other filesystems, and undoes escapes.
func TestNsfsMounts(t *testing.T) {
	info := `22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
601 25 0:4 net:[4026532321] /run/docker/netns/1-abc rw shared:5 - nsfs nsfs rw
602 25 0:4 net:[4026532400] /var/run/netns/prg-x-h1 rw shared:5 - nsfs nsfs rw
603 25 0:4 net:[4026532401] /run/prg\040sp/netns/ingress_sbox rw - nsfs nsfs rw
604 25 0:4 mnt:[4026532402] /proc/1/ns/mnt rw - nsfs nsfs rw
605 25 0:30 / /run/docker/netns rw - tmpfs tmpfs rw
bad line
606 25 0:4 net:[4026532403] /run/exec/netns/lb_x rw master:1 propagate_from:1 - nsfs nsfs rw`
	got := NsfsMounts(info)
	want := []string{"/run/docker/netns/1-abc", "/run/prg sp/netns/ingress_sbox", "/run/exec/netns/lb_x"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
