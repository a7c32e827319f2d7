package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// VerifyPort is the TCP and UDP port the connectivity check listens on in every endpoint.
const VerifyPort = 47999

// IsolationPort is the TCP port only tenant t's endpoints listen on during Verify in a lab with
// tenants: another tenant's endpoint that connects to it has reached tenant t.
func IsolationPort(t int) int { return VerifyPort + t }

// Verify proves the overlay works: every endpoint reaches every other of its tenant over TCP
// and UDP, and the reply comes back from the endpoint it was meant for (the echo names its
// node). With tenants it also proves isolation: no endpoint reaches another tenant's port (each
// tenant's endpoints listen on a port of their own, at the addresses every tenant shares). It
// runs in-process: a socket opened inside a namespace stays there, so no external tool is
// needed. It returns one error listing every failing pair.
func Verify(ctx context.Context, l *Lab) error {
	eps := l.Endpoints()
	tenants := l.Spec.TenantCount()
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	for _, ep := range eps {
		var tl, il net.Listener
		var ul net.PacketConn
		err := netnsutil.Do(ep.Netns, func() error {
			var err error
			if tl, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", ep.AddrOnly(), VerifyPort)); err != nil {
				return err
			}
			if tenants > 1 {
				if il, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", ep.AddrOnly(), IsolationPort(ep.TenantOf()))); err != nil {
					return err
				}
			}
			ul, err = net.ListenPacket("udp4", fmt.Sprintf("%s:%d", ep.AddrOnly(), VerifyPort))
			return err
		})
		for _, c := range []io.Closer{tl, il, ul} {
			if c != nil { // an interface holding no listener converts to a nil io.Closer
				closers = append(closers, c)
			}
		}
		if err != nil {
			return fmt.Errorf("verify: listen in %s: %w", ep.Netns, err)
		}
		go ServeTCPEcho(tl, ep.Name)
		go serveUDPEcho(ul, ep.Name)
		if il != nil {
			go ServeTCPEcho(il, ep.Name)
		}
		if ep.Addr6 != "" {
			cs, err := listen6(ep)
			closers = append(closers, cs...)
			if err != nil {
				return err
			}
		}
	}
	var mu sync.Mutex
	var failures []string
	fail := func(s string) {
		mu.Lock()
		failures = append(failures, s)
		mu.Unlock()
	}
	paths := 0
	var wg sync.WaitGroup
	for _, src := range eps {
		for _, dst := range eps {
			if src.Netns == dst.Netns {
				continue
			}
			if src.TenantOf() != dst.TenantOf() {
				paths++
				wg.Add(1)
				go func(src, dst Node) {
					defer wg.Done()
					if name, err := probeIsolated(ctx, src.Netns, dst.AddrOnly(), IsolationPort(dst.TenantOf())); err != nil {
						fail(fmt.Sprintf("%s (tenant %d) -> %s (tenant %d, %s): tenants are not isolated: %v (answered by %s)",
							src.Name, src.TenantOf(), dst.Name, dst.TenantOf(), dst.AddrOnly(), err, name))
					}
				}(src, dst)
				continue
			}
			paths += 2
			if src.Addr6 != "" && dst.Addr6 != "" {
				paths += 2
			}
			wg.Add(1)
			go func(src, dst Node) {
				defer wg.Done()
				for _, proto := range []string{"tcp4", "udp4"} {
					if err := probeEcho(ctx, src.Netns, proto, dst.AddrOnly(), dst.Name); err != nil {
						fail(fmt.Sprintf("%s -> %s (%s) %s: %v", src.Name, dst.Name, dst.AddrOnly(), proto[:3], err))
					}
				}
				if src.Addr6 == "" || dst.Addr6 == "" {
					return
				}
				for _, proto := range []string{"tcp6", "udp6"} { // dual-stack: the IPv6 half too
					if err := probeEcho(ctx, src.Netns, proto, dst.Addr6Only(), dst.Name); err != nil {
						fail(fmt.Sprintf("%s -> %s (%s) %s: %v", src.Name, dst.Name, dst.Addr6Only(), proto, err))
					}
				}
			}(src, dst)
		}
	}
	wg.Wait()
	if len(l.Services) > 0 {
		n, fs := verifyServices(ctx, l)
		paths += n
		failures = append(failures, fs...)
	}
	if len(failures) > 0 {
		sort.Strings(failures)
		return fmt.Errorf("overlay connectivity check failed for %d of %d paths:\n  %s",
			len(failures), paths, strings.Join(failures, "\n  "))
	}
	return nil
}

// ServeTCPEcho greets every connection with name and a newline, then echoes, until l is closed
// (the lab's verification, and tests that need to know which endpoint answered); a connection
// gets 5 s.
func ServeTCPEcho(l net.Listener, name string) { ServeTCPEchoFor(l, name, 5*time.Second) }

// ServeTCPEchoFor is ServeTCPEcho with each connection given limit (0: no limit; a long
// stream through a Service backend).
func ServeTCPEchoFor(l net.Listener, name string, limit time.Duration) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if limit > 0 {
				_ = c.SetDeadline(time.Now().Add(limit))
			}
			if _, err := io.WriteString(c, name+"\n"); err != nil {
				return
			}
			_, _ = io.Copy(c, c)
		}()
	}
}

// serveUDPEcho answers every datagram with the node's name, a newline and the datagram.
func serveUDPEcho(pc net.PacketConn, name string) {
	buf := make([]byte, 2048)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(append([]byte(name+"\n"), buf[:n]...), addr)
	}
}

// probeIsolated connects from inside src to dst:port, which only another tenant listens on: a
// refused or unanswered connection is isolation; one that is accepted names who answered.
func probeIsolated(ctx context.Context, src, dst string, port int) (string, error) {
	var conn net.Conn
	err := netnsutil.Do(src, func() error {
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp4", fmt.Sprintf("%s:%d", dst, port))
		conn = c
		return err
	})
	if err != nil {
		return "", nil // refused (the own tenant's endpoint has no such port) or dropped
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), errors.New("connected to another tenant's port")
}

// probeEcho sends a token from inside src and expects it back from the node named want. UDP
// retries a few times because the first datagram may race neighbour resolution.
func probeEcho(ctx context.Context, src, proto, dst, want string) error {
	var conn net.Conn
	err := netnsutil.Do(src, func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.DialContext(ctx, proto, net.JoinHostPort(dst, strconv.Itoa(VerifyPort)))
		conn = c
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	token := []byte("peregrine-verify " + src)
	greeting := []byte(want + "\n")
	buf := make([]byte, len(token))
	tries := 1
	udp := strings.HasPrefix(proto, "udp")
	if udp {
		tries = 5
	} else {
		// TCP: the greeting comes first, on its own.
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		line, err := bufio.NewReader(io.LimitReader(conn, int64(len(greeting)+64))).ReadString('\n')
		if err != nil {
			return fmt.Errorf("no greeting: %w", err)
		}
		if line != string(greeting) {
			return fmt.Errorf("answered by %q, not %s", strings.TrimSpace(line), want)
		}
	}
	var lastErr error
	for i := 0; i < tries; i++ {
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write(token); err != nil {
			lastErr = err
			continue
		}
		if udp {
			dgram := make([]byte, 2048)
			n, err := conn.Read(dgram)
			if err != nil {
				lastErr = err
				continue
			}
			name, rest, _ := strings.Cut(string(dgram[:n]), "\n")
			if name != want {
				return fmt.Errorf("answered by %q, not %s", name, want)
			}
			if rest != string(token) {
				return errors.New("echo came back corrupted")
			}
			return nil
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

// listen6 starts the TCP and UDP echo of a dual-stack endpoint's IPv6 address.
func listen6(ep Node) ([]io.Closer, error) {
	var tl net.Listener
	var ul net.PacketConn
	err := netnsutil.Do(ep.Netns, func() error {
		var err error
		hp := net.JoinHostPort(ep.Addr6Only(), strconv.Itoa(VerifyPort))
		if tl, err = net.Listen("tcp6", hp); err != nil {
			return err
		}
		ul, err = net.ListenPacket("udp6", hp)
		return err
	})
	var cs []io.Closer
	if tl != nil {
		cs = append(cs, tl)
		go ServeTCPEcho(tl, ep.Name)
	}
	if ul != nil {
		cs = append(cs, ul)
		go serveUDPEcho(ul, ep.Name)
	}
	if err != nil {
		return cs, fmt.Errorf("verify: listen on %s in %s: %w", ep.Addr6Only(), ep.Netns, err)
	}
	return cs, nil
}
