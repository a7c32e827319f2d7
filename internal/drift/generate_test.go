package drift

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/testutil"
)

// pinnedClang is the clang the committed BPF objects (bpf2go's *_bpfel.o and .go) were generated
// with: Debian bookworm's, what scripts/setup.sh installs. Another clang emits other bytes from
// the same sources and flags, so byte equality is only a drift check with this one. Regenerating
// every object with another clang (`go generate ./...`) and changing this pin is how to move on.
const pinnedClang = "14.0.6"

// `go generate ./...` must leave the tree unchanged: every committed object and its Go wrapper
// are what the .bpf.c sources, the headers and the flags in the //go:generate lines make now. The
// tree (tracked and new files, as they are in the working copy) is copied to a temporary
// directory and regenerated there with the flags in those lines only (BPF2GO_* unset); a file
// that differs, or one that generation adds, fails the test, named.
func TestGenerateLeavesTreeUnchanged(t *testing.T) {
	clang, err := exec.Command("clang", "--version").Output()
	if err != nil {
		t.Fatalf("no clang (%v): the BPF objects are generated with it; install it (./scripts/setup.sh)", err)
	}
	v := regexp.MustCompile(`clang version (\d+\.\d+\.\d+)`).FindSubmatch(clang)
	if v == nil || string(v[1]) != pinnedClang {
		msg := "clang here is " + strings.SplitN(string(clang), "\n", 2)[0] + "; the committed objects are clang " + pinnedClang +
			"'s, and another clang makes other bytes from the same sources, so this check cannot tell drift from a compiler change." +
			" Install clang " + pinnedClang + " (Debian bookworm's), or regenerate everything with yours and change pinnedClang"
		if os.Getenv(testutil.RootEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v (the check copies the files git knows of)", root, err)
	}
	tmp := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		src := filepath.Join(root, f)
		st, err := os.Lstat(src)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the working copy, or a link
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(tmp, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}

	gen := exec.Command("go", "generate", "./...")
	gen.Dir = tmp
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "BPF2GO_") {
			gen.Env = append(gen.Env, e)
		}
	}
	if b, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("go generate ./... (in a copy of the tree): %v\n%s", err, b)
	}

	var changed, added []string
	n := 0
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(tmp, p)
		n++
		got, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		want, err := os.ReadFile(filepath.Join(root, rel))
		switch {
		case os.IsNotExist(err):
			added = append(added, rel)
		case err != nil:
			return err
		case !bytes.Equal(got, want):
			changed = append(changed, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(changed)
	sort.Strings(added)
	for _, f := range changed {
		t.Errorf("%s differs from what `go generate` makes from the sources now: run `go generate ./%s/` and commit the result", f, filepath.Dir(f))
	}
	for _, f := range added {
		t.Errorf("%s is made by `go generate` but not in the tree: generate and commit it", f)
	}
	t.Logf("%d files after go generate, %d differ, %d new (clang %s)", n, len(changed), len(added), pinnedClang)
}
