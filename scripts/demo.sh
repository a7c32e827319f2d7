#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build peregrine, build a Docker-style
# overlay lab, show it, attach and detach the rps baseline, run the quick characterization
# study, and remove the lab again (also on failure or Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
make build
pg=./bin/peregrine
lab=demo
cleanup() { $pg detach --lab --name "$lab" >/dev/null 2>&1 || true; $pg lab down --name "$lab" || true; }
trap cleanup EXIT

echo "== building a docker-style overlay lab: 2 hosts x 2 containers"
$pg lab up --name "$lab" --containers 2
echo
echo "== the usual tuning (RPS on every stage device), recorded and restored"
$pg attach rps --lab --name "$lab"
$pg status
$pg detach --lab --name "$lab"
if $pg bench --help >/dev/null 2>&1; then
  echo
  echo "== quick characterization study (native vs docker vs flannel)"
  $pg bench study --quick --out results/demo
fi
