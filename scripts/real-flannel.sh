#!/usr/bin/env bash
# The real flannel lab: N node namespaces on one underlay, one etcd, flanneld (VXLAN) per node,
# K pods per node made by CNI ADD (flannel CNI plugin -> bridge + host-local). The work is done by
# `peregrine lab real-flannel` (internal/lab/realflannel), which the tests use too; this script
# builds peregrine and calls it. scripts/setup.sh installs or builds the binaries it runs.
#
#   sudo scripts/real-flannel.sh up [NAME] [--nodes N] [--pods K]   # default NAME rf, 2 x 1
#   sudo scripts/real-flannel.sh down [NAME]                         # leaves nothing
# Namespaces: prg-NAME-ul (underlay bridge, etcd), prg-NAME-nI (nodes), prg-NAME-nI-pJ (pods).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: $0 up|down [NAME] [--nodes N] [--pods K]" >&2; exit 2; }
cmd=${1:-}
[[ $cmd == up || $cmd == down ]] || usage
shift
args=()
if [[ -n ${1:-} && ${1:-} != -* ]]; then args+=("$1"); shift; fi
[[ $cmd == up || $# -eq 0 ]] || usage
make -s build >/dev/null
exec ./bin/peregrine lab real-flannel "$cmd" "${args[@]}" "$@"
