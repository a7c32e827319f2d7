#!/usr/bin/env bash
# The test command (README, CI): installs what is missing, then runs every test, unit and
# integration (namespaces, eBPF), as root. Packages run one at a time (-p 1): the integration
# tests build labs, load programs and measure, and must not compete for the CPUs.
# PEREGRINE_TEST_ROOT=1 makes a test that wants root fail instead of skip (plain `go test ./...`
# as a user skips them, saying why): this suite tests everything or fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
	echo "scripts/test.sh runs the integration tests too: run it as root (sudo)" >&2
	exit 1
fi
./scripts/setup.sh
go vet ./...
go vet -tags peregrine_crashtest ./internal/datapath/ # the crash points (test builds only)
PEREGRINE_TEST_ROOT=1 go test -p 1 -count=1 -timeout 30m "$@" ./...
