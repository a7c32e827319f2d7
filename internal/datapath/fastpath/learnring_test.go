package fastpath

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

// fakeFeed is a learnedFeed a test fills: records per family, a lost count, an error.
type fakeFeed struct {
	recs  [2][][]byte
	lost  [2]uint64
	err   error
	takes int
}

func (f *fakeFeed) take(fam int) ([][]byte, uint64, error) {
	f.takes++
	r := f.recs[fam]
	f.recs[fam] = nil
	return r, f.lost[fam], f.err
}

// The marking marks what the ring delivers (each flow once a round, only if still due), and
// walks the whole table only at its first round and when the ring's lost count moved or the
// ring failed: once per such event, not every round.
func TestLiberalRoundsFromFeed(t *testing.T) {
	tcp := func(lport uint16) fpFpKey { return fpFpKey{Local: 1, Remote: 2, Lport: lport, Rport: 80, Proto: 6} }
	both := fpFpFlow{Flags: fOut | fIn, OutNs: 5}
	table := map[fpFpKey]fpFpFlow{
		tcp(1): both,
		tcp(2): both,
		tcp(3): {Flags: fOut, OutNs: 5},                  // learned one way
		tcp(4): {Flags: fOut | fIn | fDone, OutNs: 5},    // closed through conntrack
		tcp(5): {Flags: fOut | fIn | fpFAlias, OutNs: 5}, // an alias
		{Local: 1, Remote: 2, Lport: 6, Rport: 53, Proto: 17}: both, // UDP
	}
	walks := 0
	walk := func(fn func(fpFpKey, *fpFpFlow)) {
		walks++
		for k, f := range table {
			fn(k, &f)
		}
	}
	look := func(k fpFpKey) (fpFpFlow, bool) { f, ok := table[k]; return f, ok }
	rec := func(k fpFpKey) []byte { b, _ := binary.Append(nil, binary.NativeEndian, k); return b }
	ports := func(ts []ctTuple) []uint16 {
		var p []uint16
		for _, tu := range ts {
			p = append(p, tu.sport)
		}
		slices.Sort(p)
		return p
	}
	tab := table4Of()
	feed := &fakeFeed{}
	var st liberalRound
	round := func(what string, wantWalk bool, want ...uint16) {
		t.Helper()
		before := walks
		todo, walked := tab.due(feed, &st, look, walk)
		if walked != wantWalk || walks-before != map[bool]int{true: 1, false: 0}[wantWalk] {
			t.Fatalf("%s: walked %v (%d walks), want %v", what, walked, walks-before, wantWalk)
		}
		if got := ports(todo); !slices.Equal(got, want) {
			t.Fatalf("%s: marks ports %v, want %v", what, got, want)
		}
	}

	round("first round", true, 1, 2) // what was learned before the agent ran
	round("nothing reported", false)
	feed.recs[0] = [][]byte{rec(tcp(2)), rec(tcp(2)), rec(tcp(3)), rec(tcp(4)), rec(tcp(5)), rec(tcp(9)), {1, 2, 3}}
	round("reports", false, 2) // once; not the one-way, closed, alias, gone or malformed ones
	feed.lost[0] = 3
	feed.recs[0] = [][]byte{rec(tcp(1))}
	round("a lost record", true, 1, 2)
	round("after the walk", false)
	feed.lost[1] = 7 // the other family's loss is not this table's
	round("IPv6 lost", false)
	feed.err = errors.New("ring gone")
	round("a failing ring", true, 1, 2)
	round("still failing", true, 1, 2)
	feed.err = nil
	round("back", true, 1, 2)
	round("back, steady", false)
	if r, _ := tab.due(nil, &liberalRound{synced: true}, look, walk); len(r) != 2 {
		t.Fatalf("no feed: marks %d, want a walk's 2", len(r))
	}
}

func table4Of() flowTable[fpFpKey, ctTuple] {
	return flowTable[fpFpKey, ctTuple]{tuple: tuple4}
}

// The ring's records tell the families apart by length: the two tables' keys.
func TestLearnedKeySizes(t *testing.T) {
	if keySize != [2]int{16, 40} {
		t.Fatalf("key sizes %v, want 16 (struct fp_key) and 40 (struct fp_key6)", keySize)
	}
	if table4Of().family() != 0 || (flowTable[fpFpKey6, ctTuple6]{}).family() != 1 {
		t.Fatal("families of the tables' keys")
	}
}
