package pipedevice

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Limits cap what one client and one network namespace may take from the daemon. The defaults
// fit a 4096-connection workload (a server holding 4096 accepted connections and a listener, a
// client holding 4096 connected sockets, both in one namespace) with rings up to 256 KiB; an
// attacker gets no more than that from any number of processes of its namespace.
type Limits struct {
	ClientsPerNS   int   // control connections (including callers not yet past hello) per namespace
	SocksPerClient int   // a client's socket table (ids), pending connections to its listeners included
	SocksPerNS     int   // sockets charged to one namespace (a connection's two ends go to the connector)
	MaxQDepth      int   // the deepest submission/completion queue a client may ask for
	BytesPerNS     int64 // shared memory of a namespace: rings, send pools, control pages (nominal sizes)
	HugePerNS      int   // 2 MiB hugepages a namespace may hold; beyond it its rings get normal pages
	PendingPerProc int   // unaccepted connections waiting on one client's listeners (the rest of its ids stay its own)
}

// DefaultLimits are `pd daemon`'s defaults.
var DefaultLimits = Limits{ClientsPerNS: 256, SocksPerClient: DefaultMaxSock, SocksPerNS: 16384, MaxQDepth: 4096,
	BytesPerNS: 4 << 30, HugePerNS: 512, PendingPerProc: DefaultMaxSock / 2}

func (l *Limits) defaults() {
	d := DefaultLimits
	for _, f := range []struct{ v, def *int }{{&l.ClientsPerNS, &d.ClientsPerNS}, {&l.SocksPerClient, &d.SocksPerClient},
		{&l.SocksPerNS, &d.SocksPerNS}, {&l.MaxQDepth, &d.MaxQDepth}, {&l.HugePerNS, &d.HugePerNS}, {&l.PendingPerProc, &d.PendingPerProc}} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if l.BytesPerNS == 0 {
		l.BytesPerNS = d.BytesPerNS
	}
}

func (l *Limits) check() error {
	if l.ClientsPerNS < 1 || l.SocksPerClient < 2 || l.SocksPerClient > 1<<16 || l.SocksPerNS < 2 || l.BytesPerNS < 1<<20 || l.HugePerNS < 0 || l.PendingPerProc < 1 {
		return fmt.Errorf("limits out of range: %+v (sockets per client 2..65536, bytes per namespace >= 1 MiB)", *l)
	}
	if l.MaxQDepth < 64 || l.MaxQDepth > 65536 || l.MaxQDepth&(l.MaxQDepth-1) != 0 {
		return fmt.Errorf("max queue depth %d: want a power of two in 64..65536", l.MaxQDepth)
	}
	return nil
}

// usage is what a namespace holds now (d.mu).
type usage struct {
	Conns int   `json:"control_connections"`
	Socks int   `json:"sockets"`
	Bytes int64 `json:"shared_bytes"`
	Huge  int   `json:"hugepages"`
}

// charge takes socks sockets and bytes of shared memory from ns's quota, or says which errno
// refuses them (d.mu held): ENOBUFS for memory, EMFILE for sockets, as BSD sockets report them.
func (d *Daemon) charge(ns string, socks int, bytes int64) unix.Errno {
	u := d.usage[ns]
	if u == nil {
		u = &usage{}
		d.usage[ns] = u
	}
	if u.Socks+socks > d.cfg.Limits.SocksPerNS {
		d.refused.Add(1)
		return unix.EMFILE
	}
	if u.Bytes+bytes > d.cfg.Limits.BytesPerNS || d.fdsLeft() < socks {
		d.refused.Add(1)
		return unix.ENOBUFS
	}
	u.Socks += socks
	u.Bytes += bytes
	return 0
}

// uncharge gives back what charge took (and huge hugepages); a namespace that holds nothing
// any more is forgotten with its cached addresses and domain (d.mu held).
func (d *Daemon) uncharge(ns string, socks int, bytes int64, huge int) {
	u := d.usage[ns]
	if u == nil {
		return
	}
	u.Socks -= socks
	u.Bytes -= bytes
	u.Huge -= huge
	d.evictIfIdle(ns)
}

func (d *Daemon) evictIfIdle(ns string) {
	if u := d.usage[ns]; u != nil && u.Conns <= 0 && u.Socks <= 0 && u.Bytes <= 0 {
		delete(d.usage, ns)
		delete(d.nsAddrs, ns)
		delete(d.domains, ns)
	}
}

// hugeOK says whether ns may put n more hugepages in a memfd (d.mu held).
func (d *Daemon) hugeOK(ns string, n int) bool {
	u := d.usage[ns]
	return u != nil && u.Huge+n <= d.cfg.Limits.HugePerNS
}

func (d *Daemon) addHuge(ns string, n int) {
	if u := d.usage[ns]; u != nil {
		u.Huge += n
	}
}

// fdsLeft is how many more memfds the daemon may open: its descriptor limit less what it holds
// and a reserve for control connections, so that one namespace filling the table leaves the
// daemon able to answer (and refuse) everyone else.
func (d *Daemon) fdsLeft() int {
	return d.fdLimit - fdReserve - int(d.ringsLive.Load()) - 4*len(d.procs) - 2*d.conns
}

const fdReserve = 1024

// raiseFDLimit lifts the soft descriptor limit to the hard one and returns it.
func raiseFDLimit() int {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return 1024
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &r)
		unix.Getrlimit(unix.RLIMIT_NOFILE, &r)
	}
	if r.Cur > 1<<24 {
		return 1 << 24
	}
	return int(r.Cur)
}
