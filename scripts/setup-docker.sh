#!/usr/bin/env bash
# Installs what the docker swarm lab (scripts/real-docker-overlay.sh) needs: Debian's docker.io
# (dockerd, containerd, runc, the docker client) and busybox-static (the only image the lab uses,
# imported from /bin/busybox: nothing is pulled from a registry). Idempotent.
#   sudo scripts/setup-docker.sh            # install what is missing
#   sudo scripts/setup-docker.sh --check    # report what is missing, change nothing
# The packages' own service is never started: a dockerd in the host namespace would rewrite the
# host's iptables and add docker0. The lab runs one dockerd per node namespace instead.
set -euo pipefail
check_only=false
[[ "${1:-}" == "--check" ]] && check_only=true

say() { printf '[setup-docker] %s\n' "$*" >&2; }
die() { printf '[setup-docker] error: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root"

missing=()
# /usr/bin/docker is docker.io's client; another docker on PATH (e.g. /usr/local/bin) does not count.
[[ -x /usr/sbin/dockerd && -x /usr/bin/docker ]] || missing+=(docker.io)
[[ -x /usr/bin/containerd && -x /usr/sbin/runc ]] || missing+=(docker.io)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

if ((${#missing[@]} == 0)); then
  say "docker.io and busybox-static present: $(/usr/sbin/dockerd --version)"
  exit 0
fi
if $check_only; then
  say "missing packages: ${missing[*]}"
  exit 1
fi

# Keep the packages' services from starting during the install (policy-rc.d 101 = "not allowed"),
# unless the machine already has a policy of its own, which is left as it is.
policy=/usr/sbin/policy-rc.d
ours=false
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  ours=true
fi
trap '$ours && rm -f "$policy"' EXIT

say "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null

# With systemd, the units may still have been enabled: stop and disable them so that no host
# dockerd touches the host's firewall.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
  systemctl disable --now docker.service docker.socket containerd.service >/dev/null 2>&1 || true
fi
say "installed: $(/usr/sbin/dockerd --version)"
