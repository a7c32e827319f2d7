#!/usr/bin/env bash
# Builds Cilium (the peer of issue 27 item 5) from the Go module proxy, once, into a cache.
# Opt-in: scripts/setup.sh and CI never call it. Nothing is installed outside the cache except
# clang-19/llvm-19 from Debian (Cilium 1.20 compiles its datapath at agent start and wants
# clang+LLVM >= 18.1; Debian 12's default clang is 14).
#
#   sudo scripts/setup-cilium.sh            # build what is missing (slow: ~10 min on 2 vCPUs)
#   sudo scripts/setup-cilium.sh --check    # say what is cached, change nothing
#
# Cache: /var/cache/peregrine/cilium-v1.20.2/{bin/,src/,SHA256SUMS,build.log}
#   bin/cilium-agent     ./daemon
#   bin/cilium-operator  ./operator, tag ipam_provider_operator (upstream's "operator-generic"):
#                        v1.20.2 does NOT build from the proxy (sigs.k8s.io/mcs-api/controllers
#                        v0.5.2 is refused); the lab applies the CRDs itself and runs without it
#   bin/cilium-cni       ./plugins/cilium-cni
#   bin/cilium-health    ./cilium-health (the agent's health endpoint responder; optional at run)
#   bin/cilium-dbg       ./cilium-dbg (the "cilium" CLI inside the agent pod)
#   src/                 the module, writable, with the gobgp replace; its bpf/ is what the agent
#                        compiles at start (the agent's --lib-dir points at it)
set -euo pipefail

VERSION=v1.20.2
MODULE=github.com/cilium/cilium
# v1.20.2's go.mod pins gobgp/v4 at a pseudo-version the module proxy refuses; v4.7.0 is served
# and API-compatible for the agent's BGP control plane (which the lab never enables).
GOBGP_REPLACE='github.com/osrg/gobgp/v4=github.com/osrg/gobgp/v4@v4.7.0'
MODULE_SUM='h1:dqiEGIcXc+gqCLYG/l7VCFJ8GHyb4HUrwbZOpkX5dL8='
CACHE=${PRG_CILIUM_CACHE:-/var/cache/peregrine/cilium-$VERSION}
CLANG_PKGS=(clang-19 llvm-19)

say() { printf '[setup-cilium] %s\n' "$*" >&2; }
die() { printf '[setup-cilium] error: %s\n' "$*" >&2; exit 1; }

check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
  *) die "unknown argument '$1' (use --check or nothing)" ;;
esac
[[ $(id -u) -eq 0 ]] || die "run as root: it writes $CACHE and may apt-get install ${CLANG_PKGS[*]}"
command -v go >/dev/null || die "go is missing: run scripts/setup.sh first"

targets=(cilium-agent:./daemon cilium-cni:./plugins/cilium-cni cilium-operator:./operator
  cilium-dbg:./cilium-dbg cilium-health:./cilium-health)

if $check_only; then
  for t in "${targets[@]}"; do
    n=${t%%:*}; [[ -x $CACHE/bin/$n ]] && say "cached: $n" || say "missing: $n"
  done
  command -v clang-19 >/dev/null && say "clang-19 present" || say "missing: clang-19 (Debian ${CLANG_PKGS[*]})"
  exit 0
fi

if ! command -v clang-19 >/dev/null || ! command -v llc-19 >/dev/null; then
  say "installing ${CLANG_PKGS[*]} (Cilium 1.20 needs clang+LLVM >= 18.1 at agent start)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${CLANG_PKGS[@]}" >/dev/null
fi

mkdir -p "$CACHE/bin"
if [[ ! -f $CACHE/src/go.mod ]]; then
  json=$(go mod download -json "$MODULE@$VERSION")
  dir=$(sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p' <<<"$json")
  sum=$(sed -n 's/^\s*"Sum": "\(.*\)",$/\1/p' <<<"$json")
  [[ $sum == "$MODULE_SUM" ]] || die "module sum $sum, want $MODULE_SUM"
  rm -rf "$CACHE/src.tmp"
  cp -r "$dir" "$CACHE/src.tmp" && chmod -R u+w "$CACHE/src.tmp"
  (cd "$CACHE/src.tmp" && go mod edit -replace "$GOBGP_REPLACE")
  # No `go mod download all`: some of its tool-only dependencies (cilium/controller-tools
  # v0.21.0-1, sigs.k8s.io/mcs-api/conformance) are not served; `go build` fetches what it needs.
  mv "$CACHE/src.tmp" "$CACHE/src"
fi

# One `go build` per binary, niced and on at most two threads so a shared machine keeps moving.
# The linker of the agent peaks at ~3 GB.
export GOMAXPROCS=${GOMAXPROCS:-2} CGO_ENABLED=0 GOFLAGS=-mod=mod
ldflags="-s -w -X $MODULE/pkg/version.ciliumVersion=${VERSION#v}"
for t in "${targets[@]}"; do
  n=${t%%:*}; pkg=${t#*:}
  [[ -x $CACHE/bin/$n ]] && { say "cached: $n"; continue; }
  tags=""; [[ $n == cilium-operator ]] && tags="-tags ipam_provider_operator"
  say "building $n ($pkg)"
  start=$(date +%s)
  (cd "$CACHE/src" && /usr/bin/time -f "$n: %e s wall, %M KB peak" nice -n 19 \
    go build $tags -p 2 -ldflags "$ldflags" -o "$CACHE/bin/$n.tmp" "$pkg") 2>>"$CACHE/build.log" \
    || { tail -5 "$CACHE/build.log" >&2
         # The agent and its CNI plugin are what the lab runs; the rest is optional here.
         # cilium-operator v1.20.2 imports sigs.k8s.io/mcs-api/controllers v0.5.2, which the
         # module proxy refuses (403): it does not build from the proxy alone.
         case $n in cilium-agent|cilium-cni) die "building $n failed (log: $CACHE/build.log)" ;; esac
         say "warning: $n did not build (log: $CACHE/build.log); going on without it"; continue; }
  mv "$CACHE/bin/$n.tmp" "$CACHE/bin/$n"
  say "built $n in $(( $(date +%s) - start )) s"
done
(cd "$CACHE/bin" && sha256sum cilium-* >"$CACHE/SHA256SUMS")
say "done: $CACHE/bin ($(du -sh "$CACHE/bin" | cut -f1)); times in $CACHE/build.log"
