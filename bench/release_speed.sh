#!/usr/bin/env bash
# Times a full release of what builds here: serial, with `doit -n 2`, the no-op
# re-run of an unchanged release, and a clean rebuild served by a warm ccache.
# Usage: bench/release_speed.sh [config]   (runs in a fresh copy under /tmp)
set -euo pipefail
config=${1:-configs/release-local.toml}
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/coli-release-bench.XXXX)
git clone -q "$src" "$work/p"
cd "$work/p"
doit() { "$src/.venv/bin/python" -m doit "$@" >/dev/null 2>&1; }
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$e - $s" | bc; }
clean() { rm -rf build dist; }
echo "machine: $(nproc) cores, $(uname -m); config: $config; revision: $(git rev-parse --short HEAD)"
clean; serial=$(t doit release "config=$config")
clean; par=$(t doit -n 2 release "config=$config")
noop=()
for _ in 1 2 3; do noop+=("$(t doit release "config=$config")"); done
export COLI_CACHE=ccache COLI_CACHE_DIR="$work/ccache"
clean; cold=$(t doit -n 2 release "config=$config")
clean; warm=$(t doit -n 2 release "config=$config")
median=$(printf '%s\n' "${noop[@]}" | sort -n | sed -n 2p)
printf 'full release, serial:            %6.1f s\n' "$serial"
printf 'full release, doit -n 2:         %6.1f s  (%.2fx)\n' "$par" "$(echo "$serial / $par" | bc -l)"
printf 'unchanged re-run (median of 3):  %6.2f s  (%.1f%% of serial)\n' "$median" "$(echo "100 * $median / $serial" | bc -l)"
printf 'clean, ccache cold, -n 2:        %6.1f s\n' "$cold"
printf 'clean, ccache warm, -n 2:        %6.1f s  (%.2fx)\n' "$warm" "$(echo "$cold / $warm" | bc -l)"
rm -rf "$work"
