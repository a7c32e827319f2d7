package datapath

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Watch is the node agents' watch loop, configured by a mode: it follows link (and, when asked,
// neighbour/FDB and route) changes in a set of namespaces over netlink and runs the mode's Sync
// shortly after a burst of changes, and at least every Every as a backstop (namespaces created
// after the start, events lost). A subscription that ends with an error (the socket's buffer
// overran, the namespace went away) is made again, with a Sync, since events were lost meanwhile.
type Watch struct {
	Neighs bool // follow neighbour and FDB changes too
	Routes bool // follow route changes too
	// Event sees each update (netlink.LinkUpdate, NeighUpdate or RouteUpdate) from namespace ns
	// in that subscription's goroutine and says whether it calls for a Sync; nil: every update
	// does.
	Event func(ns string, u any) bool
	// NeighsSubscribed runs after each (re)subscription to the neighbour changes of ns, so the
	// mode can read the current entries and compare the next update with them.
	NeighsSubscribed func(ns string)
	Debounce         time.Duration // a Sync runs this long after the first event of a burst
	Every            time.Duration // and at least this often (required, > 0)
	SyncFirst        bool          // and once at the start, before any event
	// Sync brings the mode up to date. ErrNotAttached (the record is gone) ends Run with it;
	// other errors are logged and the loop goes on.
	Sync func(ctx context.Context) error
	Log  Logger // required: subscription trouble and Sync errors go here
}

// resubscribeAfter is the first wait before a failed subscription is tried again; it doubles
// up to Every or resubscribeMax, whichever is shorter.
const (
	resubscribeAfter = 100 * time.Millisecond
	resubscribeMax   = 5 * time.Second
)

// Run watches namespaces nss (duplicates are watched once) until ctx ends (nil) or Sync
// reports ErrNotAttached.
func (w Watch) Run(ctx context.Context, nss []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the subscriptions end with the loop
	kick := make(chan struct{}, 1)
	seen := map[string]bool{}
	for _, ns := range nss {
		if seen[ns] {
			continue
		}
		seen[ns] = true
		go follow(ctx, w, ns, "link", kick, func(ch chan netlink.LinkUpdate, done chan struct{}, h *netns.NsHandle, cb func(error)) error {
			return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: h, ErrorCallback: cb})
		})
		if w.Neighs {
			go follow(ctx, w, ns, "neighbour", kick, func(ch chan netlink.NeighUpdate, done chan struct{}, h *netns.NsHandle, cb func(error)) error {
				return netlink.NeighSubscribeWithOptions(ch, done, netlink.NeighSubscribeOptions{Namespace: h, ErrorCallback: cb})
			})
		}
		if w.Routes {
			go follow(ctx, w, ns, "route", kick, func(ch chan netlink.RouteUpdate, done chan struct{}, h *netns.NsHandle, cb func(error)) error {
				return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{Namespace: h, ErrorCallback: cb})
			})
		}
	}
	every := time.NewTicker(w.Every)
	defer every.Stop()
	var due <-chan time.Time // the pending (debounced) Sync
	if w.SyncFirst {
		due = time.After(0)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
			if due == nil {
				due = time.After(w.Debounce)
			}
		case <-every.C:
			if due == nil {
				due = time.After(0)
			}
		case <-due:
			due = nil
			if err := w.Sync(ctx); errors.Is(err, ErrNotAttached) {
				return err
			} else if err != nil {
				w.Log.Printf("sync: %v", err)
			}
		}
	}
}

func poke(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// follow keeps one subscription (one group of one namespace) alive until ctx ends, passing its
// updates through w.Event and kicking the loop.
func follow[U any](ctx context.Context, w Watch, ns, what string, kick chan<- struct{},
	subscribe func(chan U, chan struct{}, *netns.NsHandle, func(error)) error) {
	wait, failing := resubscribeAfter, false
	for ctx.Err() == nil {
		ch := make(chan U, 256)
		done := make(chan struct{})
		var last atomic.Value // the error that ended the subscription (set before ch closes)
		err := subscribeIn(ns, func(h *netns.NsHandle) error {
			return subscribe(ch, done, h, func(err error) { last.Store(err) })
		})
		if err != nil {
			if !failing {
				w.Log.Printf("no %s events from %s (syncing every %s meanwhile): %v", what, netnsutil.Label(ns), w.Every, err)
			}
			failing = true
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait = min(2*wait, max(resubscribeAfter, min(w.Every, resubscribeMax)))
			continue
		}
		if failing {
			w.Log.Printf("%s events from %s again", what, netnsutil.Label(ns))
			poke(kick) // what happened meanwhile was not seen
		}
		failing, wait = false, resubscribeAfter
		if what == "neighbour" && w.NeighsSubscribed != nil {
			w.NeighsSubscribed(ns)
		}
		stop := context.AfterFunc(ctx, func() { close(done) })
		for u := range ch { // drained to the end: the library's goroutine must not block on it
			if ctx.Err() == nil && (w.Event == nil || w.Event(ns, u)) {
				poke(kick)
			}
		}
		if stop() { // ended by an error, not by ctx: close the failed socket
			close(done)
		}
		if ctx.Err() == nil {
			w.Log.Printf("%s events from %s ended (%v): subscribing again", what, netnsutil.Label(ns), last.Load())
			poke(kick)
			select {
			case <-ctx.Done():
			case <-time.After(resubscribeAfter):
			}
		}
	}
}

// subscribeIn runs subscribe with a handle of namespace ns (the socket is made inside it and
// keeps it; the handle is closed after).
func subscribeIn(ns string, subscribe func(*netns.NsHandle) error) error {
	h, err := netnsutil.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return subscribe(&h)
}
