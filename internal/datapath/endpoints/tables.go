package endpoints

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Key is struct prg_pod_key (bpf/pod.h).
type Key struct {
	Netns  uint32
	Family uint32
	Addr   [4]uint32
}

// Entry is struct prg_pod (bpf/pod.h).
type Entry struct {
	Slot    uint32
	Ifindex uint32
	CtrMAC  [6]byte
	BrMAC   [6]byte
	Flags   uint32
	GoneNs  uint64
}

// FlagGone is PRG_POD_F_GONE: the pod vanished; the entry is a tombstone until TombstoneTTL.
const FlagGone = 1

// TombstoneTTL is how long a vanished pod's entry stays (programs see PRG_POD_GONE) before it is
// removed (then they see PRG_POD_MISS).
const TombstoneTTL = 60 * time.Second

// devmapVal is struct bpf_devmap_val.
type devmapVal struct {
	Ifindex uint32
	ProgFD  int32
}

// Tables are one program's pair of endpoint tables (PRG_POD_MAPS).
type Tables struct {
	EP   *ebpf.Map // key -> entry
	Port *ebpf.Map // DEVMAP_HASH slot -> veth
}

// Report says what one Sync changed. Changed lists the addresses whose entry was updated or
// removed (a cache keyed by pod address must forget them). Conflicts are the addresses refused
// because more than one pod claims them.
type Report struct {
	Live, Added, Updated, Gone, Expired int
	Changed                             []Key
	Conflicts                           []Conflict
}

// Conflict is an address that more than one pod (bridge-side veth) claims in one domain.
// Neither claim is used: the address has no entry, so programs leave its frames to the normal
// path, which delivers them wherever the host's own routing, neighbour and bridge state says.
type Conflict struct {
	Domain uint32   `json:"domain"`
	Addr   string   `json:"addr"`
	Veths  []string `json:"veths"` // "netns/veth" of each claimant, sorted
}

func (c Conflict) String() string {
	return fmt.Sprintf("%s claimed by %d pods (%s): refused, its traffic takes the normal path", c.Addr, len(c.Veths), strings.Join(c.Veths, ", "))
}

// Dedup splits want into the endpoints whose address exactly one pod claims and the conflicts:
// an address claimed through two or more bridge-side veths of one domain (a pod that added a
// neighbour's address to its own eth0, say) is refused for every claimant, since a pod's own
// word cannot tell the rightful one.
func Dedup(want []Endpoint) ([]Endpoint, []Conflict) {
	by := map[Key]map[string]bool{}
	for _, e := range want {
		k := e.Key()
		if by[k] == nil {
			by[k] = map[string]bool{}
		}
		by[k][fmt.Sprintf("%s/%s#%d", e.Netns, e.Veth, e.Ifindex)] = true
	}
	var keep []Endpoint
	var out []Conflict
	done := map[Key]bool{}
	for _, e := range want {
		k := e.Key()
		if len(by[k]) == 1 {
			keep = append(keep, e)
			continue
		}
		if done[k] {
			continue
		}
		done[k] = true
		c := Conflict{Domain: k.Netns, Addr: e.Addr.String()}
		for v := range by[k] {
			c.Veths = append(c.Veths, v[:strings.LastIndexByte(v, '#')])
		}
		sort.Strings(c.Veths)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return keep, out
}

// Sync makes the tables match want. An address more than one pod claims is refused (Dedup): its
// entry is removed outright, not made a tombstone (a tombstone drops; a refused address goes to
// the normal path). A changed or new endpoint gets a fresh devmap slot, written before the entry
// points at it; an endpoint no longer wanted becomes a tombstone and its slot is released;
// tombstones older than TombstoneTTL are removed.
func Sync(tb Tables, want []Endpoint, now time.Time) (Report, error) {
	var rep Report
	want, rep.Conflicts = Dedup(want)
	refused := map[Key]bool{}
	for _, c := range rep.Conflicts {
		a, err := netip.ParseAddr(c.Addr)
		if err != nil {
			continue
		}
		refused[Endpoint{Domain: c.Domain, Addr: a}.Key()] = true
	}
	have := map[Key]Entry{}
	used := map[uint32]bool{}
	var k Key
	var v Entry
	it := tb.EP.Iterate()
	for it.Next(&k, &v) {
		have[k] = v
		if v.Flags&FlagGone == 0 {
			used[v.Slot] = true
		}
	}
	if err := it.Err(); err != nil {
		return rep, fmt.Errorf("read endpoints: %w", err)
	}
	next := uint32(1)
	alloc := func() uint32 {
		for used[next] {
			next++
		}
		used[next] = true
		return next
	}
	wanted := map[Key]bool{}
	var errs []error
	for _, e := range want {
		key := e.Key()
		wanted[key] = true
		nv := Entry{Ifindex: uint32(e.Ifindex)}
		copy(nv.CtrMAC[:], e.CtrMAC)
		copy(nv.BrMAC[:], e.BrMAC)
		old, exists := have[key]
		if exists && old.Flags&FlagGone == 0 && old.Ifindex == nv.Ifindex && old.CtrMAC == nv.CtrMAC && old.BrMAC == nv.BrMAC &&
			Holds(tb, old.Slot, old.Ifindex) {
			rep.Live++
			continue
		}
		nv.Slot = alloc()
		// The devmap resolves the ifindex in the calling thread's namespace: the veth's.
		err := netnsutil.Do(e.Netns, func() error {
			return tb.Port.Put(nv.Slot, devmapVal{Ifindex: nv.Ifindex})
		})
		if err != nil {
			delete(used, nv.Slot)
			errs = append(errs, fmt.Errorf("hold %s/%s for %s: %w", e.Netns, e.Veth, e.Addr, err))
			continue
		}
		if err := tb.EP.Put(key, nv); err != nil {
			_ = tb.Port.Delete(nv.Slot)
			errs = append(errs, fmt.Errorf("endpoint %s: %w", e.Addr, err))
			continue
		}
		if exists {
			if old.Flags&FlagGone == 0 && old.Slot != nv.Slot {
				_ = tb.Port.Delete(old.Slot)
			}
			rep.Updated++
			rep.Changed = append(rep.Changed, key)
		} else {
			rep.Added++
		}
		rep.Live++
	}
	for key, old := range have {
		if wanted[key] {
			continue
		}
		if refused[key] {
			if err := tb.EP.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("refuse %s: %w", WordsAddr(key.Family, key.Addr), err))
			}
			if old.Flags&FlagGone == 0 {
				if err := tb.Port.Delete(old.Slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs = append(errs, err)
				}
			}
			rep.Changed = append(rep.Changed, key)
			continue
		}
		if old.Flags&FlagGone != 0 {
			if now.Sub(time.Unix(0, int64(old.GoneNs))) > TombstoneTTL {
				if err := tb.EP.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs = append(errs, err)
				}
				rep.Expired++
			}
			continue
		}
		old.Flags |= FlagGone
		old.GoneNs = uint64(now.UnixNano())
		if err := tb.EP.Put(key, old); err != nil {
			errs = append(errs, fmt.Errorf("tombstone: %w", err))
		}
		if err := tb.Port.Delete(old.Slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
		rep.Gone++
		rep.Changed = append(rep.Changed, key)
	}
	return rep, errors.Join(errs...)
}

// Holds tells whether a devmap slot still holds the device it was given (the kernel removes the
// slot when the device is unregistered).
func Holds(tb Tables, slot, ifindex uint32) bool {
	var v devmapVal
	return tb.Port.Lookup(slot, &v) == nil && v.Ifindex == ifindex
}

// View is one endpoint entry as status shows it.
type View struct {
	Domain  uint32 `json:"domain"` // netns inode of the bridge-side veth (Endpoint.Domain)
	Addr    string `json:"addr"`
	Ifindex uint32 `json:"ifindex"`
	MAC     string `json:"mac"`
	Gone    bool   `json:"gone,omitempty"`
	Held    bool   `json:"held"` // the devmap slot still holds the veth
}

// List reads the endpoint table, sorted by address.
func List(tb Tables) ([]View, error) {
	var out []View
	var k Key
	var v Entry
	it := tb.EP.Iterate()
	for it.Next(&k, &v) {
		out = append(out, View{Domain: k.Netns, Addr: WordsAddr(k.Family, k.Addr).String(), Ifindex: v.Ifindex, MAC: net.HardwareAddr(v.CtrMAC[:]).String(),
			Gone: v.Flags&FlagGone != 0, Held: v.Flags&FlagGone == 0 && Holds(tb, v.Slot, v.Ifindex)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, it.Err()
}
