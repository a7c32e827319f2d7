package fastpath

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// gsoIPv4 is a device's IPv4 GSO size, as netlink reports it.
func gsoIPv4(t *testing.T, ns, dev string) uint32 {
	t.Helper()
	var v uint32
	if err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err == nil {
			v = l.Attrs().GSOIPv4MaxSize
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// With big_tcp, attach raises the pods' GSO size (the pod's TCP then sends packets above 64
// KiB), a transfer of 48 MiB in such packets takes the fast path and arrives byte-exact, and
// detach puts every size back.
func TestLabBigTCP(t *testing.T) {
	spec := lab.Spec{Name: "fpbig", Style: lab.StyleFlannel, Containers: 1}
	l := labForTest(t, spec)
	hosts := []string{l.Hosts[0].Netns, l.Hosts[1].Netns}
	c1, c2 := l.Containers[0], l.Containers[1]
	before := gsoIPv4(t, c1.Netns, "eth0")
	if tso, err := tsoMax(c1.Netns, "eth0"); err != nil || tso <= bigTCPMin {
		t.Skipf("the lab's veths cannot carry BIG TCP on this kernel (tso_max_size %d, %v)", tso, err)
	}
	const size = 185000
	for _, h := range hosts {
		if _, err := datapath.Attach(context.Background(), h, Name, datapath.Options{Extra: map[string]string{"big_tcp": "185000"}}); err != nil {
			t.Fatalf("attach %s: %v", h, err)
		}
	}
	for _, c := range []lab.Node{c1, c2} {
		if got := gsoIPv4(t, c.Netns, "eth0"); got != size {
			t.Fatalf("%s eth0: gso_ipv4_max_size %d after attach, want %d", c.Netns, got, size)
		}
	}

	// A byte-exact transfer: a listener in the receiving pod, the sender in the other, sockets
	// made after attach (TCP takes its GSO size from the device when it connects).
	dst := strings.Split(c2.Addr, "/")[0]
	ln, err := netnsutil.Listen(c2.Netns, "tcp4", dst+":5310")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	payload := make([]byte, 48<<20)
	r := rand.NewChaCha8([32]byte{23})
	_, _ = r.Read(payload)
	want := sha256.Sum256(payload)
	got := make(chan [32]byte, 1)
	go func() {
		var sum [32]byte
		if c, err := ln.Accept(); err == nil {
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			h := sha256.New()
			n, _ := io.Copy(h, c)
			c.Close()
			if n == int64(len(payload)) {
				copy(sum[:], h.Sum(nil))
			}
		}
		got <- sum
	}()
	conn, err := netnsutil.DialContext(context.Background(), c1.Netns, &net.Dialer{Timeout: 5 * time.Second}, "tcp4", dst+":5310")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.Copy(conn, bytes.NewReader(payload)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if sum := <-got; sum != want {
		t.Fatal("the transfer did not arrive byte-exact with BIG TCP on")
	}
	v, err := Inspect(hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	// The fast path carried the big packets: no fallback for size, and fewer hits than 64 KiB
	// packets would need for the payload (the pod's TCP sent packets above 64 KiB).
	if eg := v.Egress["hit"]; eg == 0 || eg >= uint64(len(payload)/65536) || v.Egress["big"] > 0 || v.Egress["dropped"] > 0 {
		t.Errorf("the sender's node did not carry the transfer in packets above 64 KiB: %s", v.Format())
	}
	t.Logf("sender node: %s", v.Format())

	for _, h := range hosts {
		if _, err := datapath.Detach(context.Background(), h, Name); err != nil {
			t.Fatalf("detach %s: %v", h, err)
		}
	}
	for _, c := range []lab.Node{c1, c2} {
		if got := gsoIPv4(t, c.Netns, "eth0"); got != before {
			t.Errorf("%s eth0: gso_ipv4_max_size %d after detach, want %d back", c.Netns, got, before)
		}
	}
}
