package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// TestLabCTFilterInKernel: the agent's DESTROY subscription (subscribeCT) is not woken for the
// entries the programs expired at a fast-path close, nor for TCP entries in TIME_WAIT or CLOSE:
// of six entries deleted in a namespace (TCP SYN_RECV marked IPS_FIXED_TIMEOUT, the same
// unmarked, UDP marked, TCP TIME_WAIT, ESTABLISHED, CLOSE), the socket receives the unmarked
// SYN_RECV, the UDP and the ESTABLISHED one only. Without the socket filter it receives all
// six. (The kernel layout check of ctfilter.go: the deletions are the kernel's own messages.)
func TestLabCTFilterInKernel(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fmt.Sprintf("prg-ctf-%d", os.Getpid())
	if err := netnsutil.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netnsutil.Delete(ns); err != nil {
			t.Errorf("remove %s: %v", ns, err)
		}
	})
	f, ferr, err := subscribeCT(ns)
	if err != nil || ferr != nil {
		t.Fatal(err, ferr)
	}
	defer f.Close()
	entries := []struct {
		argv  []string
		sport uint16
	}{
		{[]string{"-p", "tcp", "--sport", "40001", "--dport", "80", "--state", "SYN_RECV", "-u", "SEEN_REPLY,FIXED_TIMEOUT"}, 40001},
		{[]string{"-p", "tcp", "--sport", "40002", "--dport", "80", "--state", "SYN_RECV", "-u", "SEEN_REPLY"}, 40002},
		{[]string{"-p", "udp", "--sport", "40003", "--dport", "53", "-u", "FIXED_TIMEOUT"}, 40003},
		{[]string{"-p", "tcp", "--sport", "40004", "--dport", "80", "--state", "TIME_WAIT", "-u", "SEEN_REPLY,ASSURED"}, 40004},
		{[]string{"-p", "tcp", "--sport", "40005", "--dport", "80", "--state", "ESTABLISHED", "-u", "SEEN_REPLY,ASSURED"}, 40005},
		{[]string{"-p", "tcp", "--sport", "40006", "--dport", "80", "--state", "CLOSE", "-u", "SEEN_REPLY"}, 40006},
	}
	for _, e := range entries {
		run(t, ns, append([]string{"conntrack", "-I", "-s", "10.1.0.1", "-d", "10.1.0.2", "-t", "60"}, e.argv...)...)
	}
	run(t, ns, "conntrack", "-F")

	got := map[uint16]bool{}
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	f.SetReadDeadline(time.Now().Add(time.Second))
	for {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		})
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil || rerr != nil {
			t.Fatalf("read: %v %v", err, rerr)
		}
		for b := buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < unix.SizeofNlMsghdr || l > len(b) {
				break
			}
			if e, ok := parseCTEvent(b[unix.SizeofNlMsghdr:l]); ok {
				got[htons(e.orig.sport)] = true // the tuple holds network order
			}
			b = b[min(len(b), (l+3)&^3):]
		}
	}
	want := map[uint16]bool{40002: true, 40003: true, 40005: true}
	if len(got) != len(want) || !got[40002] || !got[40003] || !got[40005] {
		t.Fatalf("DESTROY events received for source ports %v, want %v (40001: expired at a fast-path close, 40004 and 40006: ended through conntrack, filtered in the kernel)", got, want)
	}
}
