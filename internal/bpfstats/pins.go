package bpfstats

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// PinnedPrograms returns the ids of every program pinned under dir, directly or as the program
// of a pinned link: peregrine pins what it attaches (datapath.PinDir), so this finds exactly the
// programs one attachment runs, and no one else's. A missing dir yields none.
func PinnedPrograms(dir string) ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		if id, ok := pinnedProgramID(path); ok && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
		return nil
	})
	slices.Sort(ids)
	return ids, err
}

// pinnedProgramID opens a pin as a program, else as a link, and returns the program's id. Maps
// (and anything else) are skipped.
func pinnedProgramID(path string) (ebpf.ProgramID, bool) {
	if p, err := ebpf.LoadPinnedProgram(path, nil); err == nil {
		defer p.Close()
		if info, err := p.Info(); err == nil {
			return info.ID()
		}
		return 0, false
	}
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		defer l.Close()
		if info, err := l.Info(); err == nil && info.Program != 0 {
			return info.Program, true
		}
	}
	return 0, false
}
