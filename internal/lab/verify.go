package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// VerifyPort is the TCP and UDP port the connectivity check listens on in every endpoint.
const VerifyPort = 47999

// Verify proves the overlay works: every endpoint reaches every other over TCP and UDP, and
// the reply comes back. It runs in-process: a socket opened inside a namespace stays there,
// so no external tool is needed. It returns one error listing every failing pair.
func Verify(ctx context.Context, l *Lab) error {
	eps := l.Endpoints()
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	for _, ep := range eps {
		var tl net.Listener
		var ul net.PacketConn
		err := netnsutil.Do(ep.Netns, func() error {
			var err error
			if tl, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", ep.AddrOnly(), VerifyPort)); err != nil {
				return err
			}
			ul, err = net.ListenPacket("udp4", fmt.Sprintf("%s:%d", ep.AddrOnly(), VerifyPort))
			return err
		})
		if tl != nil {
			closers = append(closers, tl)
		}
		if ul != nil {
			closers = append(closers, ul)
		}
		if err != nil {
			return fmt.Errorf("verify: listen in %s: %w", ep.Netns, err)
		}
		go serveTCPEcho(tl)
		go serveUDPEcho(ul)
	}
	var mu sync.Mutex
	var failures []string
	var wg sync.WaitGroup
	for _, src := range eps {
		for _, dst := range eps {
			if src.Netns == dst.Netns {
				continue
			}
			wg.Add(1)
			go func(src, dst Node) {
				defer wg.Done()
				for _, proto := range []string{"tcp4", "udp4"} {
					if err := probeEcho(ctx, src.Netns, proto, dst.AddrOnly()); err != nil {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("%s -> %s (%s) %s: %v", src.Name, dst.Name, dst.AddrOnly(), proto[:3], err))
						mu.Unlock()
					}
				}
			}(src, dst)
		}
	}
	wg.Wait()
	if len(failures) > 0 {
		return fmt.Errorf("overlay connectivity check failed for %d of %d paths:\n  %s",
			len(failures), 2*len(eps)*(len(eps)-1), strings.Join(failures, "\n  "))
	}
	return nil
}

func serveTCPEcho(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.Copy(c, c)
		}()
	}
}

func serveUDPEcho(pc net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(buf[:n], addr)
	}
}

// probeEcho sends a token from inside src and expects it back. UDP retries a few times
// because the first datagram may race neighbour resolution.
func probeEcho(ctx context.Context, src, proto, dst string) error {
	var conn net.Conn
	err := netnsutil.Do(src, func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.DialContext(ctx, proto, fmt.Sprintf("%s:%d", dst, VerifyPort))
		conn = c
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	token := []byte("peregrine-verify " + src)
	buf := make([]byte, len(token))
	tries := 1
	if strings.HasPrefix(proto, "udp") {
		tries = 5
	}
	var lastErr error
	for i := 0; i < tries; i++ {
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write(token); err != nil {
			lastErr = err
			continue
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			lastErr = err
			continue
		}
		if string(buf) != string(token) {
			return errors.New("echo came back corrupted")
		}
		return nil
	}
	return fmt.Errorf("no echo: %w", lastErr)
}
