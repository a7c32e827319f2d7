package k8s

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

// Images without a registry: each is one layer written here and packed as a docker-archive
// (what `docker save` writes), which `ctr images import` loads into a node's containerd. Pods
// use them with imagePullPolicy Never; the sandbox image is the pause binary setup-k8s.sh built.

const (
	PauseImage     = "registry.k8s.io/pause:" + PauseVersion
	BusyboxImage   = "localhost/busybox:1.35"
	PeregrineImage = "localhost/peregrine:lab" // the lab overlay's image (deploy/kubernetes-lab)
	// PeregrineImage2 is the same agent under a second tag with another version string: a
	// DaemonSet rolling update to it replaces every agent.
	PeregrineImage2 = "localhost/peregrine:lab2"
)

// imageFile is one entry of an image's only layer.
type imageFile struct {
	path string // inside the image, no leading slash
	mode int64
	data []byte // regular file
	link string // symlink target
	dir  bool
}

type image struct {
	ref        string
	files      []imageFile
	entrypoint []string
	cmd        []string
}

// layer is the image's layer tar: deterministic (sorted, mtime 0, root-owned).
func (im image) layer() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	fs := append([]imageFile(nil), im.files...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].path < fs[j].path })
	for _, f := range fs {
		h := &tar.Header{Name: f.path, Mode: f.mode, Format: tar.FormatPAX}
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, f.path+"/"
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.data); err != nil {
				return nil, err
			}
		}
	}
	err := tw.Close()
	return buf.Bytes(), err
}

// writeArchive writes the image as a docker-archive to w.
func (im image) writeArchive(w io.Writer) error {
	layer, err := im.layer()
	if err != nil {
		return err
	}
	sum := sha256.Sum256(layer)
	diffID := hex.EncodeToString(sum[:])
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
		"config": map[string]any{
			"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Entrypoint": im.entrypoint, "Cmd": im.cmd, "WorkingDir": "/",
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
		"history": []map[string]string{{"created": "1970-01-01T00:00:00Z", "created_by": "peregrine lab (internal/lab/k8s)"}},
	})
	csum := sha256.Sum256(cfg)
	cfgName := hex.EncodeToString(csum[:]) + ".json"
	layerName := diffID + "/layer.tar"
	manifest, _ := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{im.ref}, "Layers": []string{layerName}}})
	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{{cfgName, cfg}, {layerName, layer}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func pauseImage(b Binaries) (image, error) {
	data, err := os.ReadFile(b.Pause)
	if err != nil {
		return image{}, err
	}
	return image{ref: PauseImage, files: []imageFile{{path: "pause", mode: 0o755, data: data}}, entrypoint: []string{"/pause"}}, nil
}

// busyboxImage packs Debian's busybox-static with a link per applet.
func busyboxImage(b Binaries) (image, error) {
	data, err := os.ReadFile(b.Busybox)
	if err != nil {
		return image{}, err
	}
	out, err := exec.Command(b.Busybox, "--list").Output()
	if err != nil {
		return image{}, fmt.Errorf("busybox --list: %w", err)
	}
	fs := []imageFile{
		{path: "bin", mode: 0o755, dir: true}, {path: "etc", mode: 0o755, dir: true}, {path: "tmp", mode: 0o1777, dir: true},
		{path: "bin/busybox", mode: 0o755, data: data},
		{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n")},
		{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			fs = append(fs, imageFile{path: "bin/" + a, mode: 0o777, link: "busybox"})
		}
	}
	return image{ref: BusyboxImage, files: fs, cmd: []string{"sh"}}, nil
}

// peregrineImage is what deploy/Containerfile builds: the static binary, its default config
// and /tmp, nothing else. The binary must be static (CGO_ENABLED=0): the image has no libc.
func peregrineImage(ref, binary, config string) (image, error) {
	if err := checkStatic(binary); err != nil {
		return image{}, err
	}
	data, err := os.ReadFile(binary)
	if err != nil {
		return image{}, err
	}
	cfg, err := os.ReadFile(config)
	if err != nil {
		return image{}, err
	}
	return image{ref: ref, files: []imageFile{
		{path: "etc", mode: 0o755, dir: true}, {path: "etc/peregrine", mode: 0o755, dir: true}, {path: "tmp", mode: 0o1777, dir: true},
		{path: "etc/peregrine/config.yaml", mode: 0o644, data: cfg},
		{path: "peregrine", mode: 0o755, data: data},
	}, entrypoint: []string{"/peregrine"}, cmd: []string{"agent", "--config", "/etc/peregrine/config.yaml"}}, nil
}

// checkStatic refuses a dynamically linked binary (one with an ELF interpreter).
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("agent binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("agent binary %s is dynamically linked; the image has no libc: build it with CGO_ENABLED=0 go build -o %s ./cmd/peregrine", path, path)
		}
	}
	return nil
}
