package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// The liberal marking (ctliberal.go) learns which TCP flows are due from the learners
// themselves: each TCP flow that becomes learned both ways, or whose egress is re-learned, is
// pushed into the ring prg_fastpath_learned (bpf/fastpath_learned.h), which the agent drains once
// a round. A round costs what was learned since the last one, not the size of the table. The
// table is still walked in full only where the ring cannot be trusted: at the agent's
// first round (what was learned before it ran), after the learners counted a record the ring had
// no room for (prg_fastpath_learned_lost), and where the ring cannot be read at all.

// learnedFeed is where a round's reported flows come from: the ring, or a test's fake.
type learnedFeed interface {
	// take returns the records of family fam (0: IPv4 keys, 1: IPv6 keys) reported since the
	// family's last take, and how many of that family's reports found the ring full (a count
	// that only grows).
	take(fam int) (recs [][]byte, lost uint64, err error)
}

// keySize is the length of a record of each family: the flow table's key.
var keySize = [2]int{binary.Size(fpFpKey{}), binary.Size(fpFpKey6{})}

// learnedRing reads prg_fastpath_learned for both families' marking loops: whichever takes
// first drains the ring and keeps the other family's records for it.
type learnedRing struct {
	mu      sync.Mutex
	rd      *ringbuf.Reader
	lostMap *ebpf.Map
	pending [2][][]byte
	rec     ringbuf.Record
}

func newLearnedRing(ring, lost *ebpf.Map) (*learnedRing, error) {
	if ring == nil || lost == nil {
		return nil, errors.New("the programs have no prg_fastpath_learned ring")
	}
	rd, err := ringbuf.NewReader(ring)
	if err != nil {
		return nil, fmt.Errorf("read prg_fastpath_learned: %w", err)
	}
	return &learnedRing{rd: rd, lostMap: lost}, nil
}

func (r *learnedRing) take(fam int) ([][]byte, uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The count before the drain: a record lost after it moves the next round's count.
	lost, err := r.lost(fam)
	if err != nil {
		return nil, 0, err
	}
	r.rd.SetDeadline(time.Now()) // what is there now, without waiting (the learners never wake us)
	for {
		err := r.rd.ReadInto(&r.rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("read prg_fastpath_learned: %w", err)
		}
		for f, n := range keySize {
			if len(r.rec.RawSample) == n {
				r.pending[f] = append(r.pending[f], append([]byte(nil), r.rec.RawSample...))
			}
		}
	}
	recs := r.pending[fam]
	r.pending[fam] = nil
	return recs, lost, nil
}

// lost sums family fam's per-CPU count of records the ring had no room for.
func (r *learnedRing) lost(fam int) (uint64, error) {
	var per []uint64
	if err := r.lostMap.Lookup(uint32(fam), &per); err != nil {
		return 0, fmt.Errorf("read prg_fastpath_learned_lost: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// learnedOnce opens the agent's one reader of the ring for both families' loops.
type learnedOnce struct {
	once sync.Once
	feed learnedFeed // nil where the ring cannot be read: every round walks, as before the ring
}

func (a *agent) learnedFeed() learnedFeed {
	a.lrn.once.Do(func() {
		r, err := newLearnedRing(a.p.PrgFastpathLearned, a.p.PrgFastpathLearnedLost)
		if err != nil {
			a.lg.Printf("liberal TCP tracking: %v (walking the flow tables every %v instead)", err, ctLiberalEvery)
			return
		}
		a.lrn.feed = r
	})
	return a.lrn.feed
}

// liberalRound is what the marking remembers from one round to the next.
type liberalRound struct {
	synced bool   // a walk marked what was learned before the ring's records
	lost   uint64 // the family's count of lost records at the last round
}

// dueFlow is the conntrack tuple of a TCP flow whose entry the marking makes liberal: learned
// both ways, not an alias, not closed by both FINs (through conntrack: nothing left to mark).
func (t flowTable[K, T]) dueFlow(k K, f *fpFpFlow) (T, bool) {
	tu, proto := t.tuple(k)
	if proto != 6 || f.Flags&fpFAlias != 0 || f.Flags&(fpFOut|fpFIn) != fpFOut|fpFIn || f.OutNs == 0 ||
		f.Flags&fDone == fDone {
		var zero T
		return zero, false
	}
	return tu, true
}

// family is the ring's family of the table's keys (0: IPv4, 1: IPv6).
func (t flowTable[K, T]) family() int {
	var k K
	if binary.Size(k) == keySize[0] {
		return 0
	}
	return 1
}

// due is one round's tuples to mark: those of the flows the feed reported, each once and only
// if still due (look: the flow now), or, where the feed cannot be trusted (its first round, a
// lost record, an error), those of every due flow of the table (walk; walked true).
func (t flowTable[K, T]) due(feed learnedFeed, st *liberalRound, look func(K) (fpFpFlow, bool),
	walk func(func(K, *fpFpFlow))) (todo []T, walked bool) {
	var recs [][]byte
	var lost uint64
	err := errors.New("no feed")
	if feed != nil {
		recs, lost, err = feed.take(t.family())
	}
	if err != nil || !st.synced || lost != st.lost {
		st.synced, st.lost = err == nil, lost
		walk(func(k K, f *fpFpFlow) { // the one walk
			if tu, ok := t.dueFlow(k, f); ok {
				todo = append(todo, tu)
			}
		})
		return todo, true
	}
	seen := make(map[K]bool, len(recs))
	for _, b := range recs {
		var k K
		if _, err := binary.Decode(b, binary.NativeEndian, &k); err != nil || seen[k] {
			continue
		}
		seen[k] = true
		if f, ok := look(k); ok {
			if tu, ok := t.dueFlow(k, &f); ok {
				todo = append(todo, tu)
			}
		}
	}
	return todo, false
}

// lookup is the flow of key k in the table now.
func (t flowTable[K, T]) lookup(k K) (fpFpFlow, bool) {
	var f fpFpFlow
	return f, t.m.Lookup(k, &f) == nil
}
