package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Knob is one file (sysfs or procfs, as seen inside Netns) a mode changes. Old is read before
// anything is written, so detach writes back exactly what was there.
type Knob struct {
	Netns string `json:"netns"`
	Path  string `json:"path"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

func (k Knob) String() string { return fmt.Sprintf("%s:%s", nsLabel(k.Netns), k.Path) }

// rxQueueKnobs lists a device's per-queue receive knob files (e.g. rps_cpus) inside its namespace.
func rxQueueKnobs(d Dev, file string) ([]string, error) {
	var paths []string
	err := netnsutil.WithSysfs(d.Netns, func() error {
		dir := "/sys/class/net/" + d.Name + "/queues"
		qs, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		for _, q := range qs {
			if strings.HasPrefix(q.Name(), "rx-") {
				p := filepath.Join(dir, q.Name(), file)
				if _, err := os.Stat(p); err != nil {
					return fmt.Errorf("%s: %s is missing: the kernel lacks RPS (CONFIG_RPS)", d, p)
				}
				paths = append(paths, p)
			}
		}
		return nil
	})
	return paths, err
}

// readKnobs fills Old for every knob; it changes nothing.
func readKnobs(ks []Knob) error {
	for i := range ks {
		s, err := knobRead(ks[i])
		if err != nil {
			return fmt.Errorf("read %s: %w", ks[i], err)
		}
		ks[i].Old = s
	}
	return nil
}

// writeKnobs sets New (or Old when restore is true) on every knob, carrying on past errors so
// a restore puts back as much as it can, and returns every failure.
func writeKnobs(ks []Knob, restore bool) []error {
	var errs []error
	for _, k := range ks {
		v := k.New
		if restore {
			v = k.Old
		}
		if err := checkKnobPath(k.Path); err != nil {
			errs = append(errs, fmt.Errorf("refusing to write %s: %w", k, err))
			continue
		}
		if k.Netns != "" && !netnsutil.Exists(k.Netns) {
			continue // the namespace is gone, and its knobs with it
		}
		if err := knobWrite(k, v); err != nil {
			if restore && (errors.Is(err, os.ErrNotExist) || strings.HasPrefix(k.Path, linkKnobPrefix)) && deviceGone(k) {
				continue // the device was removed (a container went away), and its knob with it
			}
			errs = append(errs, fmt.Errorf("write %q to %s: %w", v, k, err))
		}
	}
	return errs
}

// deviceGone tells whether the device a /sys/class/net knob belongs to no longer exists.
func deviceGone(k Knob) bool {
	if dev, _, isLink, err := parseLinkKnob(k.Path); isLink {
		return err == nil && linkGone(k.Netns, dev)
	}
	rest, ok := strings.CutPrefix(k.Path, "/sys/class/net/")
	if !ok {
		return false
	}
	dev, _, _ := strings.Cut(rest, "/")
	gone := false
	_ = netnsutil.WithSysfs(k.Netns, func() error {
		_, err := os.Stat("/sys/class/net/" + dev)
		gone = errors.Is(err, os.ErrNotExist)
		return nil
	})
	return gone
}

// CurrentValue reads a knob's live value.
func CurrentValue(k Knob) string {
	s, err := knobRead(k)
	if err != nil {
		return "?(" + err.Error() + ")"
	}
	return s
}

// SameValue compares a live knob value with a set one (CPU masks compare by value).
func SameValue(live, set string) bool { return live == set || cpuset.SameMask(live, set) }
