#!/usr/bin/env bash
# device-pack.sh: everything scripts/device-bench.sh needs on a bare machine, in one ignored folder.
#
# The device machine (the `device` tool's 16-core box) has no package registry and none of our tools.
# This script, run HERE (Debian/Ubuntu, root or not, with network to the distribution's mirror),
# builds DIR (default .devpack, ignored by git) holding DIR/pack.tar.gz (gzip: every machine can
# unpack it; it halves what travels) and DIR/MANIFEST (packages, versions, sizes). The tarball holds:
#   peregrine          a static, stripped peregrine (CGO off)
#   bin/TOOL           one wrapper per tool: it runs libexec/TOOL through the carried loader with
#                      --library-path lib, so only our tools see our libraries (the machine's own
#                      programs keep theirs: no global LD_LIBRARY_PATH)
#   libexec/, lib/     the tools and every shared library they load, glibc and its loader included,
#                      from the Debian packages (apt-get download, dpkg-deb -x) of the versions
#                      installed here (the mirror's, where it no longer has those)
# scripts/device-bench.sh unpacks it into a temporary folder and puts bin/ first on PATH.
# Tools: iproute2 (ip tc ss nstat bridge), ethtool, ping, nft, iperf3, sockperf, wrk, nginx,
# taskset, chrt. The tools must be installed here (scripts/setup.sh): which libraries a tool loads,
# and so which packages to fetch, is read off the installed binary with ldd.
#
# Usage: scripts/device-pack.sh [--out DIR] [--limit-mib N]
#   --limit-mib: fail when DIR plus the tracked tree exceed N MiB (default 64, the device tool's carry
#   limit; the working tree travels too).
# Then: the device tool's run with carry [".devpack"] and the command scripts/device-bench.sh prints
# with --help (docs/bench.md, "The device run").
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=.devpack
LIMIT_MIB=64
while [ $# -gt 0 ]; do
	case "$1" in
	--out) OUT=$2; shift 2 ;;
	--limit-mib) LIMIT_MIB=$2; shift 2 ;;
	-h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "device-pack: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case "$OUT" in /*) ;; *) OUT=$ROOT/$OUT ;; esac
DEST=$OUT

TOOLS="ip tc ss nstat bridge ethtool ping nft iperf3 sockperf wrk nginx taskset chrt"
LOADER=ld-linux-x86-64.so.2

say() { echo "[device-pack] $*" >&2; }
die() { echo "device-pack: $*" >&2; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "the device machine is x86-64; this machine is $(uname -m): pack on an x86-64 host"
for t in apt-get dpkg-deb dpkg-query ldd go; do
	command -v "$t" >/dev/null || die "$t not found (a Debian/Ubuntu host with Go is needed; scripts/setup.sh)"
done

# pkg_of FILE: the Debian package that installed FILE (usrmerge: /usr/sbin/ip is registered as /sbin/ip
# or /bin/ip).
pkg_of() {
	local f=$1 p
	for cand in "$f" "${f#/usr}" "/bin/$(basename "$f")" "/sbin/$(basename "$f")" "/usr/bin/$(basename "$f")" "/usr/sbin/$(basename "$f")"; do
		p=$(dpkg-query -S "$cand" 2>/dev/null | head -1 | cut -d: -f1) || true
		if [ -n "$p" ]; then echo "$p"; return 0; fi
	done
	# A library may be registered under its other (merged) lib path.
	case "$f" in
	/lib/*) pkg_of_plain "/usr$f" ;;
	/usr/lib/*) pkg_of_plain "${f#/usr}" ;;
	*) return 1 ;;
	esac
}
pkg_of_plain() { dpkg-query -S "$1" 2>/dev/null | head -1 | cut -d: -f1; }

declare -A PKGS=() BINPATH=()
for t in $TOOLS; do
	p=$(command -v "$t") || die "$t is not installed here: run scripts/setup.sh first"
	real=$(readlink -f "$p")
	BINPATH[$t]=$real
	pkg=$(pkg_of "$real") || die "cannot tell which package installed $real"
	PKGS[$pkg]=1
	while read -r lib; do
		[ -n "$lib" ] || continue
		lp=$(pkg_of "$(readlink -f "$lib")") || pkg_of "$lib" >/dev/null || die "cannot tell which package installed $lib (needed by $t)"
		lp=${lp:-$(pkg_of "$lib")}
		PKGS[$lp]=1
	done < <(ldd "$real" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}')
done

WORK=$(mktemp -d /tmp/prg-devpack.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/debs" "$WORK/root"
say "fetching ${#PKGS[@]} packages (the installed versions) into $WORK"
specs=()
for p in "${!PKGS[@]}"; do
	v=$(dpkg-query -W -f='${Version}' "$p")
	specs+=("$p=$v")
done
# One call for all; where the mirror no longer has an installed version (a security update moved
# on), that package alone is fetched at the mirror's version: the soname, which is what the tools
# load, is the same.
if ! (cd "$WORK/debs" && apt-get download "${specs[@]}" >/dev/null 2>"$WORK/apt.err"); then
	for s in "${specs[@]}"; do
		p=${s%%=*}; p=${p%%:*}
		ls "$WORK/debs/${p}_"*.deb >/dev/null 2>&1 && continue
		(cd "$WORK/debs" && { apt-get download "$s" >/dev/null 2>&1 || apt-get download "$p" >/dev/null 2>"$WORK/apt.err"; }) ||
			die "apt-get download $p failed: $(grep -v '^W:' "$WORK/apt.err" | tail -2)"
	done
fi
for d in "$WORK"/debs/*.deb; do dpkg-deb -x "$d" "$WORK/root"; done

OUT=$WORK/pack
mkdir -p "$OUT/bin" "$OUT/libexec" "$OUT/lib"
# find_in_root NAME: the file NAME (a library's soname or a binary's path) inside the unpacked packages.
find_lib() {
	local name=$1
	for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64 usr/lib64 lib usr/lib; do
		if [ -e "$WORK/root/$d/$name" ]; then readlink -f "$WORK/root/$d/$name"; return 0; fi
	done
	return 1
}
for t in $TOOLS; do
	src=$WORK/root${BINPATH[$t]}
	[ -e "$src" ] || src=$WORK/root${BINPATH[$t]#/usr}
	[ -e "$src" ] || die "$t: ${BINPATH[$t]} is not in its package (unpacked under $WORK/root)"
	cp "$src" "$OUT/libexec/$t"
	chmod 0755 "$OUT/libexec/$t"
	# Every library the installed binary loads, by soname, from the unpacked packages.
	while read -r soname; do
		[ -e "$OUT/lib/$soname" ] && continue
		f=$(find_lib "$soname") || die "$t needs $soname, which no fetched package holds"
		cp "$f" "$OUT/lib/$soname"
	done < <(ldd "${BINPATH[$t]}" | awk '/=> \//{print $1} /^\t\/.*ld-linux/{n=split($1,a,"/"); print a[n]}')
	# The wrapper: the carried loader runs the tool with the carried libraries only. Children
	# (ip netns exec iperf3 ...) find the other wrappers through PATH. No external command in it:
	# PATH may hold nothing but the pack.
	cat >"$OUT/bin/$t" <<EOF
#!/bin/sh
d="\${0%/*}/.."
exec "\$d/lib/$LOADER" --library-path "\$d/lib" --argv0 $t "\$d/libexec/$t" "\$@"
EOF
	chmod 0755 "$OUT/bin/$t"
done
[ -e "$OUT/lib/$LOADER" ] || die "the loader $LOADER was not packed"
chmod 0755 "$OUT/lib/$LOADER"

say "building a static peregrine"
(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$OUT/peregrine" ./cmd/peregrine)

# Every wrapper must run here, from the pack alone.
for t in $TOOLS; do
	case $t in
	ip|tc|bridge) a="-V" ;; ss|nstat) a="-V" ;; ethtool) a="--version" ;; ping) a="-V" ;; nft) a="--version" ;;
	iperf3) a="--version" ;; sockperf) a="--version" ;; wrk) a="-v" ;; nginx) a="-v" ;; taskset|chrt) a="--version" ;;
	esac
	if ! out=$(env -i PATH="$OUT/bin" "$OUT/bin/$t" $a 2>&1) && ! echo "$out" | grep -qiE 'version|wrk [0-9]|usage'; then
		die "packed $t does not run here: $out"
	fi
done

rm -rf "$DEST"
mkdir -p "$DEST"
tar -C "$OUT" -czf "$DEST/pack.tar.gz" peregrine bin lib libexec
pack_kib=$(du -sk "$DEST" | cut -f1)
tree_kib=$(cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
total_mib=$(( (pack_kib + tree_kib + 1023) / 1024 ))
{
	echo "# device pack, built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
	for d in "$WORK"/debs/*.deb; do echo "package $(dpkg-deb -f "$d" Package) $(dpkg-deb -f "$d" Version)"; done | sort
	echo "tools $TOOLS"
	echo "pack_kib $pack_kib (gzip; unpacked $(du -sk "$OUT" | cut -f1))"
	echo "peregrine_kib $(du -k "$OUT/peregrine" | cut -f1)"
	echo "tree_kib $tree_kib"
	echo "carry_total_mib $total_mib of $LIMIT_MIB"
} >"$DEST/MANIFEST"
say "packed into $DEST/pack.tar.gz: $((pack_kib / 1024)) MiB (peregrine $(( $(du -k "$OUT/peregrine" | cut -f1) / 1024 )) MiB); with the working tree $total_mib MiB of the $LIMIT_MIB MiB carry limit"
[ "$total_mib" -le "$LIMIT_MIB" ] || die "the pack and the working tree ($total_mib MiB) exceed the carry limit of $LIMIT_MIB MiB"
