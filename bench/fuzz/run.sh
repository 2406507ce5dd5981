#!/usr/bin/env bash
# bench/fuzz/run.sh -- the long fuzz run of issue 17: every cargo-fuzz target of the
# repository (the listeners' input, the lab file, RSL, policy files, JEL) under libFuzzer
# with the nightly toolchain, RUNS inputs each (default 1 000 000), 1 s timeout per input. Run from the
# repository root:
#
#     bench/fuzz/run.sh                           # prints a markdown section on stdout
#     RUNS=20000 TARGETS="broker_tcp" bench/fuzz/run.sh
#     MAX_SECONDS=60 bench/fuzz/run.sh            # each target stops after 60 s (default 300)
#
# Each target starts from its committed seeds (*/fuzz/seeds/TARGET) in a fresh corpus, so
# runs compare. A panic or an input over 1 s stops that target's run (libFuzzer stops at
# the first); the table shows it and the input is kept under target/fuzz-artifacts/.
# Without a nightly toolchain (and none installable) the section says so: nothing is faked.
# Progress goes to stderr, the report to stdout.
set -euo pipefail

RUNS=${RUNS:-1000000}
# A bound per target, so one slow target cannot hold ./bench.sh for hours (policy_file loads
# a whole policy per input: tens of inputs per second under AddressSanitizer).
MAX_SECONDS=${MAX_SECONDS:-300}
root=$(pwd)
if [[ ! -f "$root/bench/fuzz/run.sh" ]]; then
    echo "run.sh: run from the repository root (bench/fuzz/run.sh not found)" >&2
    exit 2
fi

# crate:target:what it reads
ALL_TARGETS=(
    "proto:broker_tcp:broker TCP port (handshake; host daemon, agent and rb messages)"
    "proto:control_socket:broker control socket (hello, requests)"
    "agent:shim_socket:agent socket (shim requests, preload \`resolved\` hint)"
    "agent:subagent:agent's subagent port (handshake, subagent messages)"
    "config:lab_file:lab file"
    "rsl:parse:RSL job specifications"
    "policies:policy_file:policy files (TOML, CEL hooks, load-time check)"
    "policies:policy_eval:shipped policies on arbitrary host, job, user, lab and time facts"
    "jel:jel_lines:JEL pool (members' lines over several connections, agent inputs)"
)

section() {
    echo "## Fuzzing"
    echo
}

not_run() {
    section
    echo "Not run: $1. \`bench/fuzz/run.sh\` needs a nightly toolchain and cargo-fuzz"
    echo "(README, \"Fuzzing\"); \`cargo test\` still replays every seed corpus on stable."
    echo "run.sh: fuzzing not run: $1" >&2
    exit 0
}

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "no nightly toolchain: trying rustup toolchain install nightly" >&2
    rustup toolchain install nightly --profile minimal >&2 ||
        not_run "no nightly toolchain on this machine, and none could be installed"
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz missing: cargo install cargo-fuzz" >&2
    cargo install cargo-fuzz --locked >&2 || not_run "cargo-fuzz missing and could not be installed"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rb-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
kept="$root/target/fuzz-artifacts"
rows=()
failures=0

# One target: prints its table row.
run_target() {
    local crate=$1 target=$2 what=$3
    local dir="$root/$crate/fuzz" log="$work/$target.log" slowest="$work/$target.slowest"
    mkdir -p "$work/corpus/$target" "$work/artifacts/$target"
    echo "fuzzing $crate/$target: $RUNS inputs..." >&2
    (cd "$dir" && cargo +nightly fuzz build -O -a "$target" >&2)
    local status=0
    (cd "$dir" && RB_FUZZ_SLOWEST="$slowest" cargo +nightly fuzz run -O -a "$target" \
        "$work/corpus/$target" "seeds/$target" -- \
        -runs="$RUNS" -max_total_time="$MAX_SECONDS" -timeout=1 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/$target/") >"$log" 2>&1 || status=$?
    local inputs panics=0 slow=0 slowest_ms="n/a"
    inputs=$(awk '/stat::number_of_executed_units/ {n = $NF} END {print n}' "$log")
    grep -q 'ALARM: working on the last Unit' "$log" && slow=1
    if [[ $status -ne 0 && $slow -eq 0 ]]; then panics=1; fi
    if [[ $slow -eq 1 ]]; then
        slowest_ms="over 1 s"
    elif [[ -s $slowest ]]; then
        slowest_ms=$(awk '{printf "%.1f ms", $1 / 1000}' "$slowest")
    fi
    if [[ $status -ne 0 ]]; then
        failures=$((failures + 1))
        mkdir -p "$kept/$target"
        cp "$work/artifacts/$target/"* "$kept/$target/" 2>/dev/null || true
        cp "$log" "$kept/$target/libfuzzer.log"
        echo "run.sh: $target FAILED (exit $status): see $kept/$target/" >&2
    fi
    rows+=("| \`$target\` | $what | ${inputs:-?} | $panics | $slow | $slowest_ms |")
}

for entry in "${ALL_TARGETS[@]}"; do
    IFS=: read -r crate target what <<<"$entry"
    if [[ -n ${TARGETS:-} && " $TARGETS " != *" $target "* ]]; then
        continue
    fi
    run_target "$crate" "$target" "$what"
done

section
echo "Every outside input under libFuzzer (\`bench/fuzz/run.sh\`; $(rustc +nightly --version)," \
    "AddressSanitizer, debug assertions): $RUNS inputs per target from the committed seeds" \
    "or $MAX_SECONDS s, whichever comes first (the inputs column says how many ran)," \
    "1 s timeout per input. Must read 0 and 0; the slowest input is timed around the harness."
echo
echo "| target | input | inputs | panics | inputs over 1 s | slowest input |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if [[ $failures -gt 0 ]]; then
    echo
    echo "**$failures target(s) failed**: the inputs are in \`target/fuzz-artifacts/\`."
fi
