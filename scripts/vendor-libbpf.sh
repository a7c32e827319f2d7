#!/bin/sh
# Refresh bpf/include/bpf/ (the libbpf headers our eBPF programs include) from an installed
# libbpf-dev, so `go generate` compiles against headers the repository carries, not the host's.
#   usage: scripts/vendor-libbpf.sh [/usr/include/bpf]
# Then regenerate every object: go generate ./internal/... and run the BPF tests.
set -eu
src=${1:-/usr/include/bpf}
dst=$(dirname "$0")/../bpf/include/bpf
mkdir -p "$dst"
for h in bpf_helpers.h bpf_helper_defs.h bpf_endian.h bpf_tracing.h bpf_core_read.h; do
	cp "$src/$h" "$dst/$h"
done
ver=$(dpkg-query -W -f '${Version}' libbpf-dev 2>/dev/null || echo unknown)
{
	echo "The headers in this directory are libbpf's (https://github.com/libbpf/libbpf),"
	echo "copied from libbpf-dev $ver by scripts/vendor-libbpf.sh. They are dual-licensed"
	echo "LGPL-2.1 OR BSD-2-Clause (SPDX line at the top of each file); we use them under the"
	echo "BSD-2-Clause terms, whose text follows."
	echo
	sed -n '/^Files: *\*$/,/^License/p' /usr/share/doc/libbpf-dev/copyright | sed '1d; $d; s/^Copyright: */Copyright /; s/^ *\([0-9]\)/Copyright \1/'
	echo
	sed -n '/^License: *BSD-2-Clause/,/^$/p' /usr/share/doc/libbpf-dev/copyright | sed '1d; s/^ //; s/^\.$//'
} >"$dst/LICENSE"
echo "libbpf headers from libbpf-dev $ver; refresh with scripts/vendor-libbpf.sh (see LICENSE)." >"$dst/README"
