#!/usr/bin/env bash
# The test command (README, CI): installs what is missing, then runs every test, unit and
# integration (namespaces, eBPF), as root. Packages run one at a time (-p 1): the integration
# tests build labs and load programs, and `lab down --all` must not meet another package's lab.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
go vet ./...
go test -p 1 -count=1 -timeout 30m "$@" ./...
