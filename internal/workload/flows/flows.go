// Package flows is many concurrent UDP flows between one client and one server: how a datapath
// with per-flow state (a flow cache, conntrack) copes with the number of flows a node carries.
// Flows are distinct port pairs: the server listens on up to MaxServerPorts ports, the client
// sends from as many sockets as it needs (flow i: client socket i/ports to server port
// Base+i%ports). Each flow is opened by an exchange (a probe the server echoes, so that a cache
// which learns a flow from both directions learns it), then the client sends datagrams to the
// flows in turn as fast as it can for Duration and the server counts what it receives. Both
// ends run in the calling process, their sockets made in their namespaces; the ports are fixed,
// so repeated runs reuse the same flows (a cache keeps them across repetitions).
package flows

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

const (
	// MaxFlows is the most flows one run opens.
	MaxFlows = 200000
	// MaxServerPorts is how many ports the server listens on (flows share them by client port).
	MaxServerPorts = 250
	// ServerBase and ClientBase are the first server and client ports.
	ServerBase = 9400
	ClientBase = 42000

	probe = 1 // first payload byte: echo this datagram
	data  = 2 // count it
)

// Config is one run.
type Config struct {
	ServerNS, ServerAddr string
	ClientNS             string
	Flows                int // concurrent flows, 1..MaxFlows
	Size                 int // datagram payload bytes (at least 16)
	Duration             time.Duration
	Opened               func() // called once the flows are open, before the measured sending
}

// Result is one run's outcome.
type Result struct {
	Flows     int     `json:"flows"`
	Opened    int     `json:"opened"` // flows whose probe was echoed (opened both ways)
	Sent      uint64  `json:"sent"`   // datagrams sent while measuring
	Received  uint64  `json:"received"`
	DurationS float64 `json:"duration_s"`
	PPS       float64 `json:"delivered_pps"` // received per second
	OpenS     float64 `json:"open_s"`        // time the opening exchanges took
}

// Run opens the flows and measures. Flows that never opened are counted, not fatal.
func Run(ctx context.Context, c Config) (Result, error) {
	res := Result{Flows: c.Flows}
	if c.Flows < 1 || c.Flows > MaxFlows {
		return res, fmt.Errorf("flows: %d flows, want 1..%d", c.Flows, MaxFlows)
	}
	if c.Size < 16 || c.Size > 1400 {
		return res, fmt.Errorf("flows: datagram size %d, want 16..1400", c.Size)
	}
	ports := min(c.Flows, MaxServerPorts)
	nCli := (c.Flows + ports - 1) / ports
	srvIP := net.ParseIP(c.ServerAddr)
	if srvIP == nil {
		return res, fmt.Errorf("flows: server address %q is not an IP address", c.ServerAddr)
	}
	srv, err := sockets(c.ServerNS, srvIP, ServerBase, ports)
	if err != nil {
		return res, fmt.Errorf("flows: server: %w", err)
	}
	defer closeAll(srv)
	cli, err := sockets(c.ClientNS, nil, ClientBase, nCli)
	if err != nil {
		return res, fmt.Errorf("flows: client: %w", err)
	}
	defer closeAll(cli)

	var received atomic.Uint64
	var wg sync.WaitGroup
	for _, s := range srv { // echo probes, count data
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 2048)
			for {
				n, from, err := s.ReadFromUDPAddrPort(b)
				if err != nil {
					return
				}
				if n > 0 && b[0] == probe {
					_, _ = s.WriteToUDPAddrPort(b[:n], from)
				} else {
					received.Add(1)
				}
			}
		}()
	}
	opened := make([]atomic.Bool, c.Flows)
	for ci, s := range cli { // probe echoes: flow = client socket * ports + flow number in the probe
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 2048)
			for {
				n, err := s.Read(b)
				if err != nil {
					return
				}
				if n >= 5 && b[0] == probe {
					if i := int(binary.LittleEndian.Uint32(b[1:])); i < c.Flows && i/ports == ci {
						opened[i].Store(true)
					}
				}
			}
		}()
	}
	defer func() { closeAll(srv); closeAll(cli); wg.Wait() }()

	addrs := make([]*net.UDPAddr, ports)
	for p := range addrs {
		addrs[p] = &net.UDPAddr{IP: srvIP, Port: ServerBase + p}
	}
	buf := make([]byte, c.Size)
	t0 := time.Now()
	for round := 0; round < 6 && ctx.Err() == nil; round++ { // probes, resent to the unanswered
		left := 0
		for i := range c.Flows {
			if opened[i].Load() {
				continue
			}
			left++
			buf[0] = probe
			binary.LittleEndian.PutUint32(buf[1:], uint32(i))
			_, _ = cli[i/ports].WriteToUDP(buf, addrs[i%ports])
			if i%256 == 255 {
				time.Sleep(time.Millisecond) // a burst the veths and socket buffers take
			}
		}
		if left == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	res.OpenS = time.Since(t0).Seconds()
	for i := range opened {
		if opened[i].Load() {
			res.Opened++
		}
	}
	if res.Opened == 0 {
		return res, errors.New("flows: no flow answered its probe (is the server reachable?)")
	}

	if c.Opened != nil {
		c.Opened()
	}
	buf[0] = data
	ctx, cancel := context.WithTimeout(ctx, c.Duration)
	defer cancel()
	r0 := received.Load()
	start := time.Now()
	var sent uint64
	for i := 0; ctx.Err() == nil; i++ {
		if i == c.Flows {
			i = 0
		}
		if _, err := cli[i/ports].WriteToUDP(buf, addrs[i%ports]); err == nil {
			sent++
		}
	}
	el := time.Since(start)
	time.Sleep(50 * time.Millisecond) // what is still in flight
	res.Sent, res.Received, res.DurationS = sent, received.Load()-r0, el.Seconds()
	res.PPS = float64(res.Received) / el.Seconds()
	return res, nil
}

// sockets opens n UDP sockets on ports base.. in namespace ns (ip nil: any address).
func sockets(ns string, ip net.IP, base, n int) ([]*net.UDPConn, error) {
	h, err := netnsutil.Open(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var out []*net.UDPConn
	err = h.Do(func() error {
		for p := range n {
			s, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip, Port: base + p})
			if err != nil {
				return fmt.Errorf("port %d: %w", base+p, err)
			}
			_ = s.SetReadBuffer(4 << 20)
			out = append(out, s)
		}
		return nil
	})
	if err != nil {
		closeAll(out)
		return nil, err
	}
	return out, nil
}

func closeAll(cs []*net.UDPConn) {
	for _, c := range cs {
		c.Close()
	}
}
