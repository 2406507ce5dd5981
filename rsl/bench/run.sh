#!/usr/bin/env bash
# rsl/bench/run.sh -- parse throughput of the `rsl` crate against the real
# libglobus-rsl on the same inputs, in the same run. Run from the repo root:
#
#     rsl/bench/run.sh            # prints a markdown section on stdout
#
# Environment: RUNS (default 11) timed runs per input; CARGO_TARGET_DIR is
# honoured. Needs cc and libglobus-rsl-dev for the C column (otherwise the
# C column reads "n/a"). Progress goes to stderr, the report to stdout.
set -euo pipefail

RUNS=${RUNS:-11}
root=$(pwd)
if [[ ! -f "$root/rsl/Cargo.toml" ]]; then
    echo "run.sh: run from the repository root (rsl/Cargo.toml not found)" >&2
    exit 2
fi
target=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d "${TMPDIR:-/tmp}/rsl-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "building the Rust benchmark (release)..." >&2
cargo build --quiet --release -p rsl --example rsl_bench >&2
ours="$target/release/examples/rsl_bench"

theirs=""
if pkg-config --exists globus-rsl 2>/dev/null && command -v cc >/dev/null; then
    # shellcheck disable=SC2046
    cc -O2 -o "$work/bench-c" "$root/rsl/oracle/bench.c" \
        $(pkg-config --cflags --libs globus-rsl) -lglobus_common
    theirs="$work/bench-c"
else
    echo "libglobus-rsl-dev not found: C column will be n/a" >&2
fi

# Inputs: huge.rsl from the GCT RSL size test (3501 substitution pairs),
# then generated multi-requests of growing size.
awk '/^=== CASE rsl_size_test\/huge.rsl$/ {f=1}
     f && /^<<<$/ {g=1; next}
     g && /^>>>$/ {exit}
     g {print}' "$root/rsl/tests/data/peer-cases.txt" > "$work/huge.rsl"
inputs=("huge.rsl")
for n in 100 1000 10000 30000; do
    "$ours" gen "$n" > "$work/gen-$n.rsl"
    inputs+=("gen-$n.rsl")
done

# Pick ITERS so one run parses about 4 MB, at least once.
iters_for() { local bytes=$1; local it=$(( 4000000 / bytes )); (( it < 1 )) && it=1; echo "$it"; }
us() { awk -v ns="$1" 'BEGIN { printf "%.1f", ns / 1000 }'; }
mbs() { awk -v b="$1" -v ns="$2" 'BEGIN { printf "%.0f", b / ns * 1000 }'; }

rows=()
for name in "${inputs[@]}"; do
    file="$work/$name"
    bytes=$(wc -c < "$file")
    iters=$(iters_for "$bytes")
    echo "timing $name ($bytes bytes, $RUNS runs x $iters parses)..." >&2
    read -r omin omed omax < <("$ours" time "$file" "$RUNS" "$iters")
    if [[ -n "$theirs" ]]; then
        read -r cmin cmed cmax < <("$theirs" "$file" "$RUNS" "$iters")
        c_col="$(us "$cmed") ($(us "$cmin")–$(us "$cmax"))"
        c_tp="$(mbs "$bytes" "$cmed")"
        speedup=$(awk -v c="$cmed" -v o="$omed" 'BEGIN { printf "%.2f×", c / o }')
    else
        c_col="n/a"; c_tp="n/a"; speedup="n/a"
    fi
    rows+=("| \`$name\` | $bytes | $(us "$omed") ($(us "$omin")–$(us "$omax")) | $(mbs "$bytes" "$omed") | $c_col | $c_tp | $speedup |")
done

cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
cat <<REPORT
## RSL parser

Parse throughput of the \`rsl\` crate (compatible mode, tree built and dropped)
against libglobus-rsl's \`globus_rsl_parse\` + \`globus_rsl_free_recursive\` on
the same inputs in the same run. Times are per parse: median of $RUNS runs with
(min–max); each run parses the input enough times to cover about 4 MB.
\`huge.rsl\` is GCT's RSL size test (3501 \`rsl_substitution\` pairs); \`gen-N\`
are generated multi-requests with N relations (quoted and unquoted literals,
comments, variables, concatenation, nested sequences). Constant MB/s across
sizes means linear growth.

* Machine: $(nproc) CPUs, ${cpu:-unknown CPU}; $(uname -sr)
* Toolchain: $(rustc --version); $(cc --version 2>/dev/null | head -n1 || echo "no cc")
* libglobus-rsl: $(dpkg-query -W -f '${Version}' libglobus-rsl2 2>/dev/null || echo "n/a")

| input | bytes | rsl µs median (min–max) | rsl MB/s | libglobus-rsl µs median (min–max) | libglobus-rsl MB/s | speed-up |
|---|---:|---:|---:|---:|---:|---:|
REPORT
printf '%s\n' "${rows[@]}"
