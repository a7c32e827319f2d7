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
  [iptables]=iptables [nft]=nftables [conntrack]=conntrack [ipset]=ipset
  [etcd]=etcd-server
)
missing=()
for bin in "${!need[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${need[$bin]}")
done
[[ -f /usr/include/bpf/bpf_helpers.h ]] || missing+=(libbpf-dev)
# The real flannel lab's pods: CNI ADD/DEL through bridge and host-local.
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || missing+=(containernetworking-plugins)
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
# etcd-server's package starts a system etcd on 127.0.0.1:2379; the real flannel lab runs its
# own inside a namespace, so one we just installed is stopped again.
if [[ " ${missing[*]} " == *" etcd-server "* ]] && ! $check_only && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now etcd >/dev/null 2>&1 || true
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

# The real flannel lab (scripts/real-flannel.sh, internal/lab/realflannel): flanneld, the flannel
# CNI plugin and cnitool at pinned versions, built once from the Go module proxy and cached by
# version under /var/cache/peregrine; skipped when present. The versions and paths are also in
# internal/lab/realflannel/binaries.go (a unit test keeps the two in step).
cache=/var/cache/peregrine
flannel_v=v0.28.10 cniplugins_v=v0.9.1 cnitool_v=v1.3.1
flanneld_bin=$cache/flanneld-$flannel_v/flanneld
flannelcni_bin=$cache/cni-plugins-$cniplugins_v/flannel
cnitool_bin=$cache/cnitool-$cnitool_v/cnitool
# gobuild OUT MODULE@VERSION [EDIT [LDFLAGS]]: builds the main package of MODULE@VERSION into OUT in a
# temporary copy of the module (EDIT, a sed script, is applied to its main.go first), so a
# half-built binary never lands in the cache.
gobuild() {
  local out=$1 mod=$2 edit=${3:-} tmp dir
  tmp=$(mktemp -d /tmp/prg-setup.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  dir=$(cd "$tmp" && GOFLAGS=-modcacherw go mod download -json "$mod" | awk -F'"' '/"Dir"/{print $4}')
  [[ -d "$dir" ]] || die "could not fetch $mod from the module proxy"
  cp -r "$dir" "$tmp/src" && chmod -R u+w "$tmp/src"
  [[ -z "$edit" ]] || sed -i "$edit" "$tmp/src/main.go"
  (cd "$tmp/src" && GOFLAGS=-modcacherw go build -trimpath -ldflags "-s -w ${4:-}" -o "$tmp/bin" .) >"$tmp/log" 2>&1 ||
    { cat "$tmp/log" >&2; die "building $mod failed"; }
  install -D -m 0755 "$tmp/bin" "$out.part" && mv "$out.part" "$out"
}
want_bins=()
[[ -x $flanneld_bin ]] || want_bins+=("flanneld $flannel_v")
[[ -x $flannelcni_bin ]] || want_bins+=("flannel CNI $cniplugins_v")
[[ -x $cnitool_bin ]] || want_bins+=("cnitool $cnitool_v")
if ((${#want_bins[@]})); then
  if $check_only; then
    say "real flannel lab binaries missing: $(IFS=,; echo "${want_bins[*]}")"
  else
    say "building the real flannel lab's binaries into $cache (first time only, a few minutes)"
    t0=$(date +%s)
    # flanneld: the tencentvpc backend's SDK is refused by the module proxy; the lab uses VXLAN,
    # so that backend's import is dropped from main.go.
    [[ -x $flanneld_bin ]] || gobuild "$flanneld_bin" "github.com/flannel-io/flannel@$flannel_v" \
      '\#"github.com/flannel-io/flannel/pkg/backend/tencentvpc"#d' "-X github.com/flannel-io/flannel/pkg/version.Version=$flannel_v"
    # The plugins' flannel meta plugin and cnitool are packages inside their modules.
    for pair in "$flannelcni_bin plugins/meta/flannel github.com/containernetworking/plugins@$cniplugins_v" \
      "$cnitool_bin cnitool github.com/containernetworking/cni@$cnitool_v"; do
      read -r out pkg mod <<<"$pair"
      [[ -x $out ]] && continue
      tmp=$(mktemp -d /tmp/prg-setup.XXXXXX)
      (cd "$tmp" && GOFLAGS=-modcacherw GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "${mod%@*}/$pkg@${mod#*@}") >"$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; rm -rf "$tmp"; die "building ${mod%@*}/$pkg failed"; }
      install -D -m 0755 "$tmp/$(basename "$pkg")" "$out.part" && mv "$out.part" "$out"
      rm -rf "$tmp"
    done
    say "built in $(( $(date +%s) - t0 )) s"
  fi
fi
# The docker swarm lab (scripts/real-docker-overlay.sh): docker.io and busybox-static, installed
# with their services kept from starting (see setup-docker.sh).
if $check_only; then scripts/setup-docker.sh --check || true; else scripts/setup-docker.sh; fi
# The k8s lab (`peregrine lab up --style k8s`): Kubernetes, kube-router and pause built once into
# the same cache (a cold build takes minutes), and the packages a node needs (see setup-k8s.sh).
if $check_only; then scripts/setup-k8s.sh --check || true; else scripts/setup-k8s.sh; fi
$check_only || say "ready"
