package pipedevice

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// buildLibpd builds libpd (the Makefile's libpd target, into a private directory so a parallel
// `make build` cannot race it) and returns that directory. No C compiler is a failure: libpd is
// part of the build.
func buildLibpd(t *testing.T) (out, root string) {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("no C compiler: `cc` is not on PATH (%v). libpd is C; install one (Debian: apt-get install gcc, or ./scripts/setup.sh)", err)
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("no make on PATH: %v", err)
	}
	root, err = filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out = t.TempDir()
	if b, err := exec.Command("make", "-s", "-C", root, "libpd", "PD_OUT="+out, "CC="+cc).CombinedOutput(); err != nil {
		t.Fatalf("make libpd: %v\n%s", err, b)
	}
	for _, f := range []string{"libpd.so", "libpd.a", "pd-example-server", "pd-example-client"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("make libpd did not build %s", f)
		}
	}
	return out, root
}

// buildCTest builds libpd, then the C test program libpd/test/<name>.c against pd.h and the
// libpd.so just built (found at run time by its rpath): the library's directory and the program.
func buildCTest(t *testing.T, name string) (out, prog string) {
	out, root := buildLibpd(t)
	prog = filepath.Join(out, name)
	// -nostdinc is not possible (pd.h needs libc headers); the include path has only libpd/
	cmd := exec.Command("cc", "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", "-D_DEFAULT_SOURCE",
		"-I", filepath.Join(root, "libpd"), "-o", prog, filepath.Join(root, "libpd", "test", name+".c"),
		"-L", out, "-lpd", "-Wl,-rpath,"+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s against pd.h and libpd.so: %v\n%s", name, err, b)
	}
	return out, prog
}

// A C program that includes only pd.h and links only libpd.so checks the API's errors, epoll,
// and a long transfer byte by byte, in both daemon modes; then the paper's Listing 1 examples
// (libpd/examples) move data between two processes with matching checksums.
func TestCLibrary(t *testing.T) {
	out, check := buildCTest(t, "pd_check")
	if b, err := exec.Command("sh", "-c", "ldd "+check+" | grep libpd.so").CombinedOutput(); err != nil || !strings.Contains(string(b), out) {
		t.Fatalf("pd_check does not load the libpd.so just built: %s", b)
	}
	for i, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := startDaemon(t, Config{Direct: direct})
			b, err := exec.Command(check, d.cfg.Socket, fmt.Sprint(8100+10*i), fmt.Sprint(48<<20)).CombinedOutput()
			if err != nil || !strings.HasPrefix(string(b), "OK ") {
				t.Fatalf("pd_check: %v\n%s", err, b)
			}
			if st := d.Status(); direct && st.BytesPublish < 48<<20 || !direct && st.BytesCopied < 48<<20 {
				t.Fatalf("the daemon moved %d copied / %d published bytes for a 48 MiB transfer", st.BytesCopied, st.BytesPublish)
			}

			// Listing 1: server and client, two processes
			env := append(os.Environ(), "PD_SOCKET="+d.cfg.Socket)
			port := fmt.Sprint(8101 + 10*i)
			srv := exec.Command(filepath.Join(out, "pd-example-server"), "127.0.0.1", port)
			srv.Env = env
			var sout strings.Builder
			srv.Stdout, srv.Stderr = &sout, &sout
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			defer srv.Process.Kill()
			eventually(t, "the example server listens", func() bool { return d.listensOn(uint16(8101 + 10*i)) })
			cl := exec.Command(filepath.Join(out, "pd-example-client"), "127.0.0.1", port, fmt.Sprint(20<<20), "65536")
			cl.Env = env
			cb, err := cl.CombinedOutput()
			if err != nil {
				t.Fatalf("example client: %v\n%s", err, cb)
			}
			if err := srv.Wait(); err != nil {
				t.Fatalf("example server: %v\n%s", err, sout.String())
			}
			sum := regexp.MustCompile(`byte sum (\d+)`)
			cs, ss := sum.FindStringSubmatch(string(cb)), sum.FindStringSubmatch(sout.String())
			if cs == nil || ss == nil || cs[1] != ss[1] || !strings.Contains(sout.String(), fmt.Sprintf("received %d bytes", 20<<20)) {
				t.Fatalf("Listing 1 examples disagree:\nclient: %s\nserver: %s", cb, sout.String())
			}
		})
	}
}

// listensOn says whether some client listens on port (any address, any namespace).
func (d *Daemon) listensOn(port uint16) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, s := range d.bound {
		if k.port == port && s.state() == SockListen {
			return true
		}
	}
	return false
}
