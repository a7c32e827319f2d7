package datapath

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// A link knob is a device attribute that only netlink sets (no sysfs file takes a write): the
// GSO/GRO size limits BIG TCP raises. Its Path is "link:DEV/ATTR"; it is recorded, read, set
// and restored like a file knob.
const linkKnobPrefix = "link:"

// Link attributes a knob may name, with how each is read and set.
var linkAttrs = map[string]struct {
	get func(*netlink.LinkAttrs) uint32
	set func(*netlink.Handle, netlink.Link, int) error
}{
	"gso_max_size":      {func(a *netlink.LinkAttrs) uint32 { return a.GSOMaxSize }, (*netlink.Handle).LinkSetGSOMaxSize},
	"gro_max_size":      {func(a *netlink.LinkAttrs) uint32 { return a.GROMaxSize }, (*netlink.Handle).LinkSetGROMaxSize},
	"gso_ipv4_max_size": {func(a *netlink.LinkAttrs) uint32 { return a.GSOIPv4MaxSize }, (*netlink.Handle).LinkSetGSOIPv4MaxSize},
	"gro_ipv4_max_size": {func(a *netlink.LinkAttrs) uint32 { return a.GROIPv4MaxSize }, (*netlink.Handle).LinkSetGROIPv4MaxSize},
}

var linkKnobRe = regexp.MustCompile(`^link:([^/\s]{1,15})/([a-z0-9_]+)$`)

// LinkKnobPath is the knob path of a device's link attribute.
func LinkKnobPath(dev, attr string) string { return linkKnobPrefix + dev + "/" + attr }

// parseLinkKnob splits a link knob path; ok is false for any other path, err for a link knob
// path naming no known attribute.
func parseLinkKnob(p string) (dev, attr string, ok bool, err error) {
	if !strings.HasPrefix(p, linkKnobPrefix) {
		return "", "", false, nil
	}
	m := linkKnobRe.FindStringSubmatch(p)
	if m == nil {
		return "", "", true, fmt.Errorf("link knob %q is not link:DEV/ATTR", p)
	}
	if _, known := linkAttrs[m[2]]; !known {
		return "", "", true, fmt.Errorf("link knob %q: unknown attribute %q", p, m[2])
	}
	return m[1], m[2], true, nil
}

// withLink runs fn with a netlink handle in the knob's namespace and its device.
func withLink(netns, dev string, fn func(h *netlink.Handle, l netlink.Link) error) error {
	nsh, err := netnsutil.Handle(netns)
	if err != nil {
		return err
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	return fn(h, l)
}

// readLinkKnob returns the attribute's live value.
func readLinkKnob(netns, dev, attr string) (string, error) {
	var v uint32
	err := withLink(netns, dev, func(_ *netlink.Handle, l netlink.Link) error {
		v = linkAttrs[attr].get(l.Attrs())
		return nil
	})
	return strconv.FormatUint(uint64(v), 10), err
}

// writeLinkKnob sets the attribute; the value must be a size in bytes (the kernel bounds it).
func writeLinkKnob(netns, dev, attr, value string) error {
	n, err := strconv.ParseUint(value, 10, 32)
	if err != nil || n == 0 {
		return fmt.Errorf("%s of %s: %q is not a size in bytes", attr, dev, value)
	}
	return withLink(netns, dev, func(h *netlink.Handle, l netlink.Link) error {
		return linkAttrs[attr].set(h, l, int(n))
	})
}

// linkGone tells whether a link knob's device no longer exists.
func linkGone(netns, dev string) bool {
	err := withLink(netns, dev, func(*netlink.Handle, netlink.Link) error { return nil })
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// knobRead and knobWrite read and set a knob of either kind.
func knobRead(k Knob) (string, error) {
	dev, attr, isLink, err := parseLinkKnob(k.Path)
	if isLink {
		if err != nil {
			return "", err
		}
		return readLinkKnob(k.Netns, dev, attr)
	}
	s, err := netnsutil.ReadFileIn(k.Netns, k.Path)
	return strings.TrimSpace(s), err
}

func knobWrite(k Knob, v string) error {
	dev, attr, isLink, err := parseLinkKnob(k.Path)
	if isLink {
		if err != nil {
			return err
		}
		return writeLinkKnob(k.Netns, dev, attr, v)
	}
	return netnsutil.WriteFileIn(k.Netns, k.Path, v)
}
