package datapath

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// A namespace has many names: `prg-x-h1`, `/run/netns/prg-x-h1`, `/var/run/netns/prg-x-h1`,
// `/proc/PID/ns/net`. Records are filed under the name attach was given (stateKey), so every
// lookup of a target matches records by the namespace's identity too: otherwise a second
// attach under another name makes a second attachment, whose detach writes back the knobs the
// first one set (nf_conntrack_tcp_be_liberal stayed at 1 that way).

// NamespaceID is the identity of target's network namespace, "DEV:INODE" of its nsfs file;
// ok is false when it cannot be read (the namespace is gone, or the name is not one).
func NamespaceID(target string) (id string, ok bool) {
	var st unix.Stat_t
	if err := unix.Stat(netnsutil.Path(target), &st); err != nil {
		return "", false
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), true
}

// SameNamespace tells whether two targets name one namespace: the same string, or the same
// identity. A namespace that is gone matches only its own string.
func SameNamespace(a, b string) bool {
	if a == b {
		return true
	}
	ia, ok := NamespaceID(a)
	if !ok {
		return false
	}
	ib, ok := NamespaceID(b)
	return ok && ia == ib
}
