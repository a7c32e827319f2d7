package fastpath

import (
	"errors"

	"github.com/cilium/ebpf"
)

// walkFlows calls fn with every entry of the flow map, read in batches (BPF_MAP_LOOKUP_BATCH:
// one system call per walkChunk entries, where Iterate makes one per entry, which with a full
// map cost the agent tens of milliseconds a walk); a kernel or map without batch lookups is
// iterated. An entry changed or deleted during the walk may be seen in either state.
func walkFlows(m *ebpf.Map, fn func(k fpFpKey, f *fpFpFlow)) { walkTable(m, fn) }

// walkTable is walkFlows for a flow table of either family (key type K).
func walkTable[K any](m *ebpf.Map, fn func(k K, f *fpFpFlow)) {
	const walkChunk = 4096
	keys := make([]K, walkChunk)
	vals := make([]fpFpFlow, walkChunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(keys[i], &vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return // the end
		}
		if err != nil {
			if n == 0 && errors.Is(err, ebpf.ErrNotSupported) {
				var k K
				var f fpFpFlow
				it := m.Iterate()
				for it.Next(&k, &f) {
					fn(k, &f)
				}
			}
			return
		}
	}
}
