package udpsink

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/testutil"
	"github.com/peregrine-net/peregrine/internal/workload/inject"
)

const sinkNs = "prg-tsink-a"

// TestSinkAccounting sends a scripted sequence over loopback inside a namespace: two flows from
// two source ports, with a gap, a swap, a duplicate, and one foreign datagram.
func TestSinkAccounting(t *testing.T) {
	testutil.RequireRoot(t)
	_ = netnsutil.Delete(sinkNs)
	t.Cleanup(func() {
		if err := netnsutil.Delete(sinkNs); err != nil {
			t.Log(err)
		}
		testutil.AssertClean(t, "prg-tsink-")
	})
	if err := netnsutil.Create(sinkNs); err != nil {
		t.Fatal(err)
	}
	if _, err := netnsutil.Run(context.Background(), sinkNs, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	zero := 0
	s, err := Listen(Config{Netns: sinkNs, Port: 5002, Duration: 5 * time.Second, IdleTimeout: 300 * time.Millisecond, CPU: &zero})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan Stats, 1)
	go func() {
		st, err := s.Run(context.Background())
		if err != nil {
			t.Error(err)
		}
		done <- st
	}()

	// flow 0 from port 7000: 0 1 3 2 4 4 6   -> lost 1 (5), reordered 1 (2, distance 1), duplicate 1
	// flow 0 from port 7001: 0 1 2           -> a different sender: its own sequence space
	send := []struct {
		sport int
		seq   uint64
	}{{7000, 0}, {7000, 1}, {7000, 3}, {7000, 2}, {7000, 4}, {7000, 4}, {7000, 6}, {7001, 0}, {7001, 1}, {7001, 2}}
	err = netnsutil.Do(sinkNs, func() error {
		socks := map[int]int{}
		for _, p := range []int{7000, 7001} {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
				return err
			}
			socks[p] = fd
		}
		dst := &unix.SockaddrInet4{Port: 5002, Addr: [4]byte{127, 0, 0, 1}}
		buf := make([]byte, 100)
		for _, m := range send {
			inject.PutPayloadHeader(buf, m.seq, 0)
			if err := unix.Sendto(socks[m.sport], buf, 0, dst); err != nil {
				return err
			}
		}
		return unix.Sendto(socks[7000], []byte("not ours"), 0, dst)
	})
	if err != nil {
		t.Fatal(err)
	}
	st := <-done
	js, _ := json.Marshal(st)
	t.Logf("%s", js)
	if st.Received != 11 || st.Bytes != 10*100+8 || st.Foreign != 1 || st.Flows != 2 {
		t.Errorf("received %d bytes %d foreign %d flows %d", st.Received, st.Bytes, st.Foreign, st.Flows)
	}
	if st.Lost != 1 || st.Reordered != 1 || st.Duplicates != 1 || st.Expected != 7+3 {
		t.Errorf("lost %d reordered %d duplicates %d expected %d", st.Lost, st.Reordered, st.Duplicates, st.Expected)
	}
	if st.ReorderHist[0].Count != 1 {
		t.Errorf("histogram %+v", st.ReorderHist)
	}
	if st.RcvBuf < DefaultRcvBuf || st.SocketDrops != 0 || st.CPU != 0 {
		t.Errorf("rcvbuf %d socket drops %d cpu %d", st.RcvBuf, st.SocketDrops, st.CPU)
	}
	for _, k := range []string{`"received"`, `"lost"`, `"reordered"`, `"duplicates"`, `"rcvbuf_errors"`, `"socket_drops"`, `"pps"`, `"reorder_histogram"`} {
		if !strings.Contains(string(js), k) {
			t.Errorf("JSON lacks %s", k)
		}
	}
	if _, err := s.Run(context.Background()); err == nil {
		t.Error("second Run accepted")
	}
}

func TestSinkConfigValidation(t *testing.T) {
	for name, c := range map[string]Config{
		"no port":     {Duration: time.Second},
		"no duration": {Port: 1},
		"batch":       {Port: 1, Duration: time.Second, Batch: 5000},
	} {
		if _, err := Listen(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
