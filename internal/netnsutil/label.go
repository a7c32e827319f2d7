package netnsutil

import "strings"

// Label names a namespace (a name, a path, or "" for the one peregrine runs in) in messages and
// logs, the same way everywhere: "this node", or its name (a path under RunDir by its name).
func Label(ns string) string {
	if ns == "" {
		return "this node"
	}
	return strings.TrimPrefix(ns, RunDir+"/")
}
