package fastpath

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/testutil/labtest"
)

// swarmLab builds scripts/handbuilt-swarm.sh's layout (two nodes, two Docker-style overlays
// each, their namespaces as files under a per-node exec-root) and tears it down after the test.
func swarmLab(t *testing.T, name string) (script string, hosts []string) {
	t.Helper()
	script, hosts, _ = labtest.ScriptLab(t, "../../../scripts/handbuilt-swarm.sh", name, 2, func() {
		if left, _ := filepath.Glob("/run/prg-" + name + "-*"); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	})
	return script, hosts
}

// overlayOf finds the view of the overlay with VNI vni.
func overlayOf(t *testing.T, v *View, vni int) OverlayView {
	t.Helper()
	for _, o := range v.Overlays {
		if o.VNI == vni {
			return o
		}
	}
	t.Fatalf("%s: no overlay with VNI %d:\n%s", v.Target, vni, v.Format())
	return OverlayView{}
}

func hasPod(o OverlayView, addr string) bool {
	return slices.ContainsFunc(o.Pods, func(p PodView) bool { return p.Addr == addr })
}

// TestSwarmLikeOverlays: both overlays of each node get the fast path with no --underlay (the
// VXLAN devices name neither dev nor local address: the route to their FDB's remote VTEPs
// tells), their namespaces found where dockerd keeps them; a container added after attach shows
// in status within a second and takes the fast path, a deleted one leaves status.
func TestSwarmLikeOverlays(t *testing.T) {
	const name = "fsw"
	script, hosts := swarmLab(t, name)
	attachAll(t, hosts)
	for i, h := range hosts {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Overlays) != 2 {
			t.Fatalf("%s: %d overlays, want 2:\n%s", h, len(v.Overlays), v.Format())
		}
		for _, vni := range []int{4096, 4097} {
			o := overlayOf(t, v, vni)
			wantVTEP := "10.251.0." + string(rune('1'+i))
			if o.Layout != LayoutBridged || o.Underlay != h+"/eth0" || o.VTEP != wantVTEP || !strings.HasPrefix(o.VXLAN, "/run/"+h+"/netns/1-ov") || len(o.Pods) != 1 {
				t.Fatalf("%s vni %d: %+v (want bridged over %s/eth0, vtep %s, one pod)\n%s", h, vni, o, h, wantVTEP, v.Format())
			}
		}
	}
	// Traffic on both overlays: each takes the fast path, counted on its own overlay.
	run(t, "prg-fsw-n1-c0", "ping", "-c", "10", "-i", "0.05", "-w", "5", "10.0.0.21")
	run(t, "prg-fsw-n1-c1", "ping", "-c", "10", "-i", "0.05", "-w", "5", "10.0.1.21")
	for _, h := range hosts {
		v, err := Inspect(h)
		if err != nil {
			t.Fatal(err)
		}
		for _, vni := range []int{4096, 4097} {
			if o := overlayOf(t, v, vni); o.Egress["hit"] == 0 || o.Ingress["hit"] == 0 || o.Egress["dropped"]+o.Ingress["dropped"] > 0 {
				t.Fatalf("%s vni %d: no fast path both ways (or drops):\n%s", h, vni, v.Format())
			}
		}
	}

	// A container joins the user overlay on node 2 after attach.
	if out, err := exec.Command(script, "addpod", name, "2", "1", "5").CombinedOutput(); err != nil {
		t.Fatalf("addpod: %v\n%s", err, out)
	}
	added := time.Now()
	for {
		v, err := Inspect(hosts[1])
		if err != nil {
			t.Fatal(err)
		}
		if hasPod(overlayOf(t, v, 4097), "10.0.1.25") {
			t.Logf("new pod in status after %v", time.Since(added).Round(time.Millisecond))
			break
		}
		if time.Since(added) > time.Second {
			t.Fatalf("the new pod is not in status 1 s after it was added:\n%s", v.Format())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The record the CLI's device list comes from follows too.
	if st, _ := datapath.LoadState(hosts[1], Name); st == nil || !slices.ContainsFunc(st.Topology.Devs, func(d datapath.Dev) bool { return d.Netns == "prg-fsw-n2-c1-5" }) {
		t.Fatalf("the record's devices do not list the new pod's eth0")
	}
	before, err := Inspect(hosts[1])
	if err != nil {
		t.Fatal(err)
	}
	run(t, "prg-fsw-n1-c1", "ping", "-c", "10", "-i", "0.05", "-w", "5", "10.0.1.25")
	after, err := Inspect(hosts[1])
	if err != nil {
		t.Fatal(err)
	}
	b, a := overlayOf(t, before, 4097), overlayOf(t, after, 4097)
	if a.Ingress["hit"] <= b.Ingress["hit"] || a.Egress["hit"] <= b.Egress["hit"] {
		t.Fatalf("the new pod's traffic did not take the fast path: before %v/%v after %v/%v\n%s", b.Egress, b.Ingress, a.Egress, a.Ingress, after.Format())
	}
	if overlayOf(t, after, 4096).Ingress["hit"] != overlayOf(t, before, 4096).Ingress["hit"] {
		t.Fatalf("the user overlay's traffic was counted on the ingress overlay")
	}

	// It leaves: gone from status within a second.
	if out, err := exec.Command(script, "delpod", name, "2", "1", "5").CombinedOutput(); err != nil {
		t.Fatalf("delpod: %v\n%s", err, out)
	}
	gone := time.Now()
	for {
		v, err := Inspect(hosts[1])
		if err != nil {
			t.Fatal(err)
		}
		if !hasPod(overlayOf(t, v, 4097), "10.0.1.25") {
			break
		}
		if time.Since(gone) > time.Second {
			t.Fatalf("the deleted pod is still in status 1 s later:\n%s", v.Format())
		}
		time.Sleep(20 * time.Millisecond)
	}
	labtest.DetachGone(t, Name, hosts...)
}

// TestSwarmLikeVXLANDev: option vxlan_dev limits the fast path to the named overlay; a name
// that is not there is refused before anything changes.
func TestSwarmLikeVXLANDev(t *testing.T) {
	const name = "fsv"
	_, hosts := swarmLab(t, name)
	h := hosts[0]
	bad := datapath.Options{Extra: map[string]string{OptVXLANDev: "vxlan9"}}
	if _, err := datapath.Attach(context.Background(), h, Name, bad); err == nil || !strings.Contains(err.Error(), "vxlan9") || !strings.Contains(err.Error(), "1-ov1/vxlan0") {
		t.Fatalf("attach with an unknown vxlan_dev: %v", err)
	}
	if st, _ := datapath.LoadState(h, Name); st != nil {
		t.Fatalf("a refused attach left a record")
	}
	user := "/run/" + h + "/netns/1-ov1/vxlan0"
	if _, err := datapath.Attach(context.Background(), h, Name, datapath.Options{Extra: map[string]string{OptVXLANDev: user}}); err != nil {
		t.Fatal(err)
	}
	v, err := Inspect(h)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Overlays) != 1 || v.Overlays[0].VXLAN != user || v.Overlays[0].VNI != 4097 {
		t.Fatalf("vxlan_dev=%s:\n%s", user, v.Format())
	}
}

// TestSwarmLikeNoUnderlay: with no remote VTEP in the FDB and no default route, nothing tells
// the underlay of a vxlan0 without dev/local: attach says to pass --underlay, and does with it.
func TestSwarmLikeNoUnderlay(t *testing.T) {
	const name = "fsu"
	_, hosts := swarmLab(t, name)
	h := hosts[0]
	for _, k := range []string{"0", "1"} {
		ns := "/run/" + h + "/netns/1-ov" + k
		out, err := exec.Command("nsenter", "--net="+ns, "bridge", "fdb", "flush", "dev", "vxlan0", "self", "permanent").CombinedOutput()
		if err != nil {
			t.Fatalf("flush the FDB of %s: %v\n%s", ns, err, out)
		}
	}
	_, err := datapath.Attach(context.Background(), h, Name, datapath.Options{})
	if err == nil || !strings.Contains(err.Error(), "--underlay") || !strings.Contains(err.Error(), "vxlan0") {
		t.Fatalf("attach with an undiscoverable underlay: %v", err)
	}
	if st, _ := datapath.LoadState(h, Name); st != nil {
		t.Fatal("a refused attach left a record")
	}
	if _, err := datapath.Attach(context.Background(), h, Name, datapath.Options{Underlay: "eth0"}); err != nil {
		t.Fatal(err)
	}
	v, err := Inspect(h)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range v.Overlays {
		if o.Underlay != h+"/eth0" || o.VTEP != "10.251.0.1" {
			t.Fatalf("--underlay eth0: %+v", o)
		}
	}
}

// TestSwarmLikeOverlayLater: docker makes an overlay's namespace when the node's first container
// joins it, often after attach: the agent gives it a slot and its programs within a second or
// so, its traffic takes the fast path, and when it goes its slot is turned off.
func TestSwarmLikeOverlayLater(t *testing.T) {
	const name = "fsl"
	script, hosts := swarmLab(t, name)
	sw := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(script, append(args[:1:1], append([]string{name}, args[1:]...)...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	sw("deloverlay", "1", "1")
	attachAll(t, hosts)
	if v, err := Inspect(hosts[0]); err != nil || len(v.Overlays) != 1 {
		t.Fatalf("before the overlay comes: %v %+v", err, v)
	}
	pinsBefore, err := linkPins(hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	sw("addoverlay", "1", "1")
	added := time.Now()
	var o OverlayView
	for {
		v, err := Inspect(hosts[0])
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Overlays) == 2 {
			o = overlayOf(t, v, 4097)
			if o.On && len(o.Pods) == 1 {
				t.Logf("new overlay served after %v", time.Since(added).Round(time.Millisecond))
				break
			}
		}
		if time.Since(added) > 2*time.Second {
			t.Fatalf("the new overlay is not served 2 s after it appeared:\n%s", v.Format())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if o.Index == 0 || !strings.HasSuffix(o.VXLAN, "/1-ov1/vxlan0") {
		t.Fatalf("new overlay: %+v", o)
	}
	run(t, "prg-fsl-n1-c1", "ping", "-c", "10", "-i", "0.05", "-w", "5", "10.0.1.21")
	v, err := Inspect(hosts[0])
	if err != nil {
		t.Fatal(err)
	}
	if o := overlayOf(t, v, 4097); o.Egress["hit"] == 0 || o.Ingress["hit"] == 0 {
		t.Fatalf("the new overlay's traffic did not take the fast path:\n%s", v.Format())
	}
	sw("deloverlay", "1", "1")
	gone := time.Now()
	for {
		v, err := Inspect(hosts[0])
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Overlays) == 1 {
			var c fpFpCfg
			p, err := openPinned(hosts[0])
			if err != nil {
				t.Fatal(err)
			}
			err = p.PrgFastpathCfg.Lookup(uint32(o.Index), &c)
			p.Close()
			if err != nil || c.Flags != 0 {
				t.Fatalf("the gone overlay's slot %d is still configured: %+v %v", o.Index, c, err)
			}
			if pins, _ := linkPins(hosts[0]); len(pins) == len(pinsBefore) {
				break // its dead links' pins pruned too
			}
		}
		if time.Since(gone) > 2*time.Second {
			pins, _ := linkPins(hosts[0])
			t.Fatalf("the gone overlay is still listed (or its links pinned: %q, before %q) 2 s later:\n%s", pins, pinsBefore, v.Format())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
