package testutil

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Flood is what a flood of requests got back: 200s, 503s (refused by a bound) and anything
// else (an error is counted as other).
type Flood struct{ OK, Busy, Other int64 }

// FloodGET has clients goroutines GET url back to back for period, each with its own client
// (newClient), and counts the answers. It returns when every client has stopped.
func FloodGET(clients int, period time.Duration, newClient func() *http.Client, url string) Flood {
	var ok, busy, other atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(period)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient()
			for time.Now().Before(end) {
				switch statusOf(c, url) {
				case http.StatusOK:
					ok.Add(1)
				case http.StatusServiceUnavailable:
					busy.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return Flood{OK: ok.Load(), Busy: busy.Load(), Other: other.Load()}
}

// statusOf GETs url and reads the whole body (so the connection can be reused); 0 on error.
func statusOf(c *http.Client, url string) int {
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
