package deploy

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

const unitPath = "systemd/peregrine-agent.service"

// unitKeys reads a unit file's [Service] (and other) settings as section.key -> values (a key
// given twice keeps both).
func unitKeys(t *testing.T, b []byte) map[string][]string {
	out := map[string][]string{}
	sec := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			sec = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: line %q is not key=value", unitPath, line)
			}
			out[sec+"."+strings.TrimSpace(k)] = append(out[sec+"."+strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return out
}

func one(t *testing.T, u map[string][]string, key string) string {
	t.Helper()
	if len(u[key]) != 1 {
		t.Fatalf("%s: %s is set %d times, want once", unitPath, key, len(u[key]))
	}
	return u[key][0]
}

func TestSystemdUnitContract(t *testing.T) {
	u := unitKeys(t, read(t, unitPath))
	argv := strings.Fields(one(t, u, "Service.ExecStart"))
	if want := append([]string{hostBinary}, agentArgs...); !slices.Equal(argv, want) {
		t.Errorf("ExecStart %q, the contract's command line is %q", argv, want)
	}
	if r := strings.Fields(one(t, u, "Service.ExecReload")); len(r) != 3 || filepath.Base(r[0]) != "kill" || r[1] != "-HUP" || r[2] != "$MAINPID" {
		t.Errorf("ExecReload %q, want kill -HUP $MAINPID (the agent re-reads its config on SIGHUP)", r)
	}
	for k, want := range map[string]string{"Service.Restart": "always", "Service.Type": "notify", "Service.NotifyAccess": "main", "Service.KillSignal": "SIGTERM", "Service.RuntimeDirectory": "peregrine", "Service.RuntimeDirectoryPreserve": "yes"} {
		if got := one(t, u, k); got != want {
			t.Errorf("%s=%s, want %s", k, got, want)
		}
	}
	// The same capabilities as the DaemonSet: one list of what the agent needs.
	var caps []string
	for _, c := range strings.Fields(one(t, u, "Service.CapabilityBoundingSet")) {
		caps = append(caps, strings.TrimPrefix(c, "CAP_"))
	}
	sort.Strings(caps)
	if !slices.Equal(caps, capabilities) {
		t.Errorf("CapabilityBoundingSet %v, the agent needs %v", caps, capabilities)
	}
	// Settings that would break the agent: read-only /sys, no host network, no setns.
	if v := u["Service.ProtectKernelTunables"]; len(v) > 0 && v[0] != "no" {
		t.Error("ProtectKernelTunables makes /sys read-only: rps knobs could not be written")
	}
	if v := u["Service.PrivateNetwork"]; len(v) > 0 && v[0] != "no" {
		t.Error("PrivateNetwork hides the host's network namespace")
	}
	if v := u["Service.RestrictNamespaces"]; len(v) > 0 {
		ns := strings.Fields(v[0])
		if !slices.Contains(ns, "net") || !slices.Contains(ns, "mnt") {
			t.Errorf("RestrictNamespaces=%s: the agent enters net namespaces and makes a private mnt namespace", v[0])
		}
	}
}

var (
	buildOnce sync.Once
	built     string
	buildErr  error
	buildOut  []byte
)

// agentBinary builds peregrine the way the Containerfile does (static, CGO off) once per run.
func agentBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "prg-deploytest-")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "peregrine")
		cmd := exec.Command("go", "build", "-trimpath", "-o", built, "./cmd/peregrine")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("build peregrine: %v\n%s", buildErr, buildOut)
	}
	return built
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built != "" {
		os.RemoveAll(filepath.Dir(built))
	}
	os.Exit(code)
}

// TestStaticBinary: the image holds the binary alone, so it must need no loader or libc.
func TestStaticBinary(t *testing.T) {
	f, err := elf.Open(agentBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary has an ELF interpreter: it is not static and would not run FROM scratch")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("the binary links %v", libs)
	}
}

// verifyUnit runs systemd-analyze verify on a copy of the unit text whose ExecStart binary is
// bin (verify checks that it exists and is executable, and the installed path exists only on a
// node). verify exits 0 even for unknown keys and bad values, which it only prints, so any
// output is a failure too.
func verifyUnit(t *testing.T, text []byte, bin string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, filepath.Base(unitPath))
	text = bytes.ReplaceAll(text, []byte(hostBinary+" "), []byte(bin+" "))
	if err := os.WriteFile(p, text, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", p).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func TestSystemdAnalyzeVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	bin := agentBinary(t)
	unit := read(t, unitPath)
	if !bytes.Contains(unit, []byte("ExecStart="+hostBinary+" ")) {
		t.Fatalf("ExecStart does not start %s", hostBinary)
	}
	if out, err := verifyUnit(t, unit, bin); err != nil || out != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The check has teeth: a misspelt setting is reported.
	bad := bytes.Replace(unit, []byte("KillSignal="), []byte("KilSignal="), 1)
	if out, err := verifyUnit(t, bad, bin); err == nil && out == "" {
		t.Error("systemd-analyze verify passed a unit with a misspelt key: the check above proves nothing")
	}
}

// TestContainerfile: the image builds the static binary from this repository and carries the
// binary where the DaemonSet runs it and the config the ConfigMap replaces.
func TestContainerfile(t *testing.T) {
	b := string(read(t, "Containerfile"))
	var froms []string
	var logical []string
	cur := ""
	for _, line := range strings.Split(b, "\n") {
		s := strings.TrimSpace(line)
		if strings.HasPrefix(s, "#") {
			continue
		}
		if strings.HasSuffix(s, "\\") {
			cur += strings.TrimSuffix(s, "\\") + " "
			continue
		}
		cur += s
		if cur != "" {
			logical = append(logical, cur)
		}
		cur = ""
	}
	var build, final []string
	for _, l := range logical {
		if f := strings.Fields(l); f[0] == "FROM" {
			froms = append(froms, f[1])
		}
		if len(froms) == 1 {
			build = append(build, l)
		} else if len(froms) > 1 {
			final = append(final, l)
		}
	}
	if len(froms) != 2 {
		t.Fatalf("Containerfile stages %v, want a build stage and a final one", froms)
	}
	if last := froms[len(froms)-1]; last != "scratch" && !strings.Contains(last, "distroless/static") {
		t.Errorf("final image %s: want scratch or distroless static (the binary needs nothing else)", last)
	}
	joined := strings.Join(build, "\n")
	for _, want := range []string{"CGO_ENABLED=0 go build", "./cmd/peregrine", "cp deploy/config.yaml /out/rootfs" + configDir + "/" + configKey} {
		if !strings.Contains(joined, want) {
			t.Errorf("the build stage does not %q", want)
		}
	}
	fin := strings.Join(final, "\n")
	for _, want := range []string{
		"COPY --from=build /out/peregrine " + imageBinary,
		`ENTRYPOINT ["` + imageBinary + `"]`,
		`CMD ["` + strings.Join(agentArgs, `", "`) + `"]`,
	} {
		if !strings.Contains(fin, want) {
			t.Errorf("the final stage lacks %s", want)
		}
	}
}
