#!/usr/bin/env bash
# Installs everything peregrine needs on a fresh Debian/Ubuntu machine, idempotently, and mounts
# the kernel filesystems it uses. Safe to run again: it only installs what is missing.
#   sudo scripts/setup.sh            # everything
#   sudo scripts/setup.sh --check    # report what is missing, change nothing
set -euo pipefail

cd "$(dirname "$0")/.."
check_only=false
[[ "${1:-}" == "--check" ]] && check_only=true

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (sudo scripts/setup.sh): packages, bpffs and namespaces need it"

# binary -> Debian package that provides it
declare -A need=(
  [clang]=clang [llc]=llvm [bpftool]=bpftool [ip]=iproute2 [tc]=iproute2 [ethtool]=ethtool
  [iperf3]=iperf3 [sockperf]=sockperf [memcached]=memcached [memcslap]=libmemcached-tools
  [nginx]=nginx-light [wrk]=wrk [tcpdump]=tcpdump [taskset]=util-linux [nstat]=iproute2
  [make]=make [git]=git [ping]=iputils-ping [cc]=gcc
  [nft]=nftables [conntrack]=conntrack [iptables]=iptables
)
missing=()
for bin in "${!need[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${need[$bin]}")
done
[[ -f /usr/include/bpf/bpf_helpers.h ]] || missing+=(libbpf-dev)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

if ((${#missing[@]})); then
  if $check_only; then
    say "missing packages: ${missing[*]}"
  else
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  say "all packages present"
fi
# nginx-light's package starts a system nginx on port 80; the lab runs its own, so stop it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
  $check_only || systemctl disable --now nginx >/dev/null 2>&1 || true
fi

# Go: the module needs the version in go.mod. If the machine's Go is missing or older, fetch
# that toolchain through the Go module proxy (golang.org/toolchain), the same way `go` itself
# switches toolchains.
want=$(awk '/^go /{print $2; exit}' go.mod)
have=$(go env GOVERSION 2>/dev/null | sed 's/^go//' || true)
ver_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" == "$2" ]]; }
if [[ -z "$have" ]] || ! ver_ge "$have" "$want"; then
  if $check_only; then
    say "Go $want needed (have: ${have:-none})"
  else
    command -v go >/dev/null 2>&1 || { apt-get update -q >/dev/null; apt-get install -y -q golang-go >/dev/null; }
    say "fetching Go $want toolchain through the module proxy"
    tmp=$(mktemp -d)
    dir=$(cd "$tmp" && GOFLAGS=-modcacherw go mod download -json "golang.org/toolchain@v0.0.1-go${want}.linux-$(dpkg --print-architecture)" | awk -F'"' '/"Dir"/{print $4}')
    rm -rf "$tmp"
    [[ -x "$dir/bin/go" ]] || die "could not fetch Go $want"
    ln -sf "$dir/bin/go" /usr/local/bin/go
    ln -sf "$dir/bin/gofmt" /usr/local/bin/gofmt
    say "Go $(go env GOVERSION) installed as /usr/local/bin/go"
  fi
fi

# Kernel filesystems: bpffs for pinned maps, tracefs for the stage probe's tracepoints.
mountpoint -q /sys/fs/bpf || { $check_only && say "bpffs not mounted" || mount -t bpf bpf /sys/fs/bpf; }
if ! mountpoint -q /sys/kernel/tracing; then
  $check_only && say "tracefs not mounted" || mount -t tracefs tracefs /sys/kernel/tracing
fi
[[ -r /sys/kernel/btf/vmlinux ]] || say "warning: no BTF at /sys/kernel/btf/vmlinux: eBPF programs (CO-RE) will not load on this kernel"
$check_only || say "ready"
