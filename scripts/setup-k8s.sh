#!/usr/bin/env bash
# Installs and builds what the Kubernetes lab (`peregrine lab up --style k8s`, internal/lab/k8s)
# needs, idempotently:
#   - Debian packages: etcd-server, containerd, runc, busybox-static, ipset, openssl, gcc;
#   - Kubernetes v1.31.14 (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#     kube-proxy, kubectl) built from the k8s.io/kubernetes module on the Go module proxy;
#   - kube-router v2.1.0 (its NetworkPolicy controller only);
#   - a static pause binary (kubernetes' build/pause/linux/pause.c) for the sandbox image.
# Everything is cached by version under /var/cache/peregrine and built once; a SHA256SUMS file next
# to each set of binaries records what was built. flanneld and the flannel CNI plugin come from
# scripts/setup.sh (the real flannel lab's cache); bridge, host-local, loopback and portmap from
# Debian's containernetworking-plugins.
#   sudo scripts/setup-k8s.sh            # install/build what is missing
#   sudo scripts/setup-k8s.sh --check    # report what is missing, change nothing (exit 1 if any)
#   sudo scripts/setup-k8s.sh --no-packages   # build the binaries only
# The versions and paths are also in internal/lab/k8s/binaries.go (a unit test keeps them in step).
set -euo pipefail
check_only=false packages=true
case "${1:-}" in
  --check) check_only=true ;;
  --no-packages) packages=false ;;   # binaries only (e.g. while another apt-get run holds the lock)
  "") ;;
  *) printf 'usage: setup-k8s.sh [--check|--no-packages]\n' >&2; exit 2 ;;
esac

say() { printf '[setup-k8s] %s\n' "$*" >&2; }
die() { printf '[setup-k8s] error: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root"

cache=/var/cache/peregrine
k8s_v=v1.31.14 kuberouter_v=v2.1.0
k8s_dir=$cache/k8s-$k8s_v
kuberouter_dir=$cache/kube-router-$kuberouter_v
pause_dir=$cache/pause-3.10
k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

# --- Debian packages -------------------------------------------------------------------------
missing=()
[[ -x /usr/bin/etcd ]] || missing+=(etcd-server)
[[ -x /usr/bin/containerd && -x /usr/bin/ctr ]] || missing+=(containerd)
[[ -x /usr/sbin/runc ]] || missing+=(runc)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
command -v ipset >/dev/null 2>&1 || missing+=(ipset)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
# gcc -static of pause.c needs libc's static archive (gcc only recommends libc6-dev).
[[ -n "$(find /usr/lib -maxdepth 3 -name libc.a -print -quit 2>/dev/null)" ]] || missing+=(libc6-dev)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v conntrack >/dev/null 2>&1 || missing+=(conntrack)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback && -x /usr/lib/cni/portmap ]] ||
  missing+=(containernetworking-plugins)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')
status=0
if ((${#missing[@]})) && $packages; then
  if $check_only; then
    say "missing packages: ${missing[*]}"; status=1
  else
    # Keep the packages' services (a host etcd, a host containerd) from starting during the
    # install: the lab runs its own per node namespace. An existing policy is left as it is.
    policy=/usr/sbin/policy-rc.d ours=false
    if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; ours=true; fi
    trap '$ours && rm -f "$policy"' EXIT
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    if command -v systemctl >/dev/null 2>&1; then
      for u in etcd containerd; do systemctl disable --now "$u" >/dev/null 2>&1 || true; done
    fi
  fi
fi

# --- what is cached --------------------------------------------------------------------------
have_all() { local d=$1; shift; for b in "$@"; do [[ -x $d/$b ]] || return 1; done; [[ -f $d/SHA256SUMS ]]; }
want=()
have_all "$k8s_dir" "${k8s_cmds[@]}" || want+=("kubernetes $k8s_v")
have_all "$kuberouter_dir" kube-router || want+=("kube-router $kuberouter_v")
have_all "$pause_dir" pause || want+=("pause 3.10")
if ((${#want[@]} == 0)); then
  say "Kubernetes lab binaries present in $cache ($k8s_v, kube-router $kuberouter_v, pause 3.10)"
  exit $status
fi
if $check_only; then
  say "Kubernetes lab binaries missing: $(IFS=,; echo "${want[*]}") (sudo scripts/setup-k8s.sh builds them, ~10 min cold)"
  exit 1
fi

# Low priority: the build takes minutes of both CPUs and must not starve whatever else runs.
nice_run() { nice -n 19 ionice -c3 "$@"; }
# seal DIR: record checksums, then move DIR.part into place, so a half-built set never counts.
seal() { (cd "$1.part" && sha256sum -- * >SHA256SUMS) && rm -rf "$1" && mv "$1.part" "$1"; }
tmp=$(mktemp -d /tmp/prg-setup-k8s.XXXXXX)
trap 'rm -rf "$tmp"; ${ours:-false} && rm -f /usr/sbin/policy-rc.d' EXIT
export GOFLAGS=-modcacherw
t0=$(date +%s)

# k8s.io/kubernetes's module zip has no staging/ or vendor/: its go.mod replaces every
# k8s.io/X with ./staging/src/k8s.io/X. Point each at the published k8s.io/X module of the same
# minor (v0.31.14, or the highest v0.31.x the proxy serves); the sample-* modules are test-only and
# not served, so they are dropped.
k8s_src=""
k8s_fetch() {
  local dir
  dir=$(cd "$tmp" && go mod download -json "k8s.io/kubernetes@$k8s_v" | awk -F'"' '/"Dir"/{print $4}')
  [[ -d "$dir" ]] || die "could not fetch k8s.io/kubernetes@$k8s_v from the module proxy"
  k8s_src=$tmp/kubernetes
  cp -r "$dir" "$k8s_src" && chmod -R u+w "$k8s_src"
  rm -rf "$k8s_src/vendor" "$k8s_src"/go.work*
}
if ! have_all "$k8s_dir" "${k8s_cmds[@]}"; then
  say "building Kubernetes $k8s_v from the Go module proxy into $k8s_dir (cold: ~5-10 min, 1.6 GB peak)"
  k8s_fetch
  staging_v=v0.${k8s_v#v1.} minor0=v0.$(echo "$k8s_v" | cut -d. -f2)
  for m in $(sed -n 's#^\s*k8s.io/\([a-z0-9-]*\) => ./staging/src/k8s.io/.*#\1#p' "$k8s_src/go.mod"); do
    mv_=""
    if (cd "$tmp" && go mod download "k8s.io/$m@$staging_v") >/dev/null 2>&1; then mv_=$staging_v
    else mv_=$(cd "$tmp" && go list -m -versions "k8s.io/$m" 2>/dev/null | tr ' ' '\n' | grep -E "^${minor0//./\\.}\.[0-9]+$" | sort -V | tail -1 || true); fi
    if [[ -n $mv_ ]]; then
      sed -i -E "s#^(\s*)k8s.io/$m => ./staging/src/k8s.io/$m\$#\1k8s.io/$m => k8s.io/$m $mv_#" "$k8s_src/go.mod"
    else
      say "  k8s.io/$m is not served (test-only): dropped"
      sed -i -E "\#^\s*k8s.io/$m( =>| v0.0.0)#d" "$k8s_src/go.mod"
    fi
  done
  minor=$(echo "$k8s_v" | cut -d. -f2)
  ldf="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=$k8s_v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  rm -rf "$k8s_dir.part"; mkdir -p "$k8s_dir.part"
  for c in "${k8s_cmds[@]}"; do
    say "  $c"
    (cd "$k8s_src" && CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw" nice_run go build -trimpath -ldflags "$ldf" -o "$k8s_dir.part/$c" "./cmd/$c") \
      >"$tmp/log" 2>&1 || { tail -40 "$tmp/log" >&2; die "building $c failed"; }
  done
  seal "$k8s_dir"
fi

# pause: the sandbox image's only binary, a static build of kubernetes' own pause.c.
if ! have_all "$pause_dir" pause; then
  [[ -n $k8s_src ]] || k8s_fetch
  rm -rf "$pause_dir.part"; mkdir -p "$pause_dir.part"
  gcc -Os -Wall -Werror -static -DVERSION=v3.10-peregrine -o "$pause_dir.part/pause" "$k8s_src/build/pause/linux/pause.c" ||
    die "building pause failed (gcc -static needs libc6-dev)"
  strip "$pause_dir.part/pause"
  seal "$pause_dir"
fi

# kube-router: only its NetworkPolicy controller runs in the lab (iptables + ipset).
if ! have_all "$kuberouter_dir" kube-router; then
  say "building kube-router $kuberouter_v into $kuberouter_dir"
  rm -rf "$kuberouter_dir.part"; mkdir -p "$kuberouter_dir.part"
  (cd "$tmp" && CGO_ENABLED=0 GOBIN="$kuberouter_dir.part" nice_run go install -trimpath -ldflags "-s -w" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$kuberouter_v") >"$tmp/log" 2>&1 ||
    { tail -40 "$tmp/log" >&2; die "building kube-router failed"; }
  seal "$kuberouter_dir"
fi
say "built in $(( $(date +%s) - t0 )) s"
exit $status
