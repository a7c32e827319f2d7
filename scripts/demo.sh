#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build peregrine, build a Flannel-style
# overlay lab, attach the fast path and show what it did, detach, run the quick characterization
# study, and remove the lab again (also on failure or Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
make build
pg=./bin/peregrine
lab=demo
cleanup() { $pg detach --lab --name "$lab" >/dev/null 2>&1 || true; $pg lab down --name "$lab" || true; }
trap cleanup EXIT

echo "== building a flannel-style overlay lab: 2 hosts x 2 containers"
$pg lab up --name "$lab" --style flannel --containers 2
echo
echo "== the overlay fast path: learned from the normal path, then the VXLAN device, bridge and veth backlog are skipped"
$pg attach fastpath --lab --name "$lab"
$pg lab exec --name "$lab" h1-c1 -- ping -c 5 -i 0.2 198.19.2.2
$pg status
$pg detach --lab --name "$lab"
if $pg bench --help >/dev/null 2>&1; then
  echo
  echo "== quick characterization study (native vs Linux overlay vs docker vs flannel)"
  $pg bench study --quick --out results/demo
fi
