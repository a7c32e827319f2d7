package netnsutil

import (
	"context"
	"net"
	"net/http"
	"time"
)

// DialContext dials addr from inside namespace ns with d: the socket is created there (and
// stays there), the calling goroutine's thread is back in its own namespace when it returns.
func DialContext(ctx context.Context, ns string, d *net.Dialer, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := Do(ns, func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens on addr inside namespace ns (the socket stays there).
func Listen(ns, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := Do(ns, func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// HTTPClient is an HTTP client whose connections are made inside namespace ns (a listener
// that is only there: etcd in a lab's underlay, an agent's endpoint in a host namespace). It
// keeps no idle connection, so nothing outlives a request in ns; timeout bounds each request,
// a dial takes two seconds at most.
func HTTPClient(ns string, timeout time.Duration) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return DialContext(ctx, ns, &net.Dialer{Timeout: 2 * time.Second}, network, addr)
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
}
