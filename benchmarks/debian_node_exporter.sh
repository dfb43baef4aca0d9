#!/usr/bin/env bash
# Debian's prometheus-node-exporter of another release, unpacked (not installed) into a folder, to run beside
# the daemon with daemon_vs_node_exporter.py --node-exporter: releases differ in the files they read (from
# 1.7 the infiniband collector reads the hw_counters/ of mlx5 ports, later releases those of more drivers,
# as the daemon does; 1.5, bookworm's, reads none).
# Usage: benchmarks/debian_node_exporter.sh SUITE DIR   (e.g. trixie /tmp/ne-trixie)
# Prints the binary's path. Needs curl, xz and dpkg-deb; reaches deb.debian.org (or $DEBIAN_MIRROR).
set -euo pipefail
suite=$1 dir=$2
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
arch=$(dpkg --print-architecture)
mkdir -p "$dir"
curl -fsS "$mirror/dists/$suite/main/binary-$arch/Packages.xz" | xz -d > "$dir/Packages"
file=$(awk '/^Package: /{p = ($2 == "prometheus-node-exporter")} p && /^Filename: /{print $2; exit}' "$dir/Packages")
[ -n "$file" ] || { echo "no prometheus-node-exporter in $suite" >&2; exit 1; }
curl -fsS -o "$dir/package.deb" "$mirror/$file"
dpkg-deb -x "$dir/package.deb" "$dir/root"
echo "$dir/root/usr/bin/prometheus-node-exporter"
