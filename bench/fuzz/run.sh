#!/usr/bin/env bash
# bench/fuzz/run.sh -- the long fuzz run of issue 17: every cargo-fuzz target of the
# repository (the listeners' input, the lab file, RSL, policy files, JEL) under libFuzzer
# with the nightly toolchain, RUNS inputs each (default 1 000 000), at most 1 s of CPU per
# input (bench/fuzz/slowest.rs checks it: at nice 10 on a shared machine wall time says
# more about the other users than about the input; libFuzzer's wall-clock -timeout stays,
# at 10 s, for hangs).
# Run from the repository root:
#
#     bench/fuzz/run.sh                           # prints a markdown section on stdout
#     RUNS=20000 TARGETS="broker_tcp" bench/fuzz/run.sh
#     MAX_SECONDS=60 bench/fuzz/run.sh            # each target stops after 60 s (default 1800)
#     SANITIZER=address bench/fuzz/run.sh         # AddressSanitizer (default: none)
#     JOBS=1 bench/fuzz/run.sh                    # one target at a time (default: 2 at once)
#     TRACE_COMPARES=no bench/fuzz/run.sh         # no compare tracing (default: yes)
#
# No sanitizer by default: the fuzzed code is safe Rust (no `unsafe` on any fuzzed path), so
# what this run hunts is panics (overflow checks and debug assertions are on) and inputs
# over 1 s, which need no sanitizer; under AddressSanitizer (the earlier default)
# policy_file ran tens of inputs per second. SANITIZER=address still runs it. The time
# column includes cargo's up-to-date check (and a rebuild, if a source changed meanwhile).
#
# Each target starts from its committed seeds (*/fuzz/seeds/TARGET) in a fresh corpus, so
# runs compare. A panic or an input over 1 s stops that target's run (libFuzzer stops at
# the first); the table shows it and the input is kept under target/fuzz-artifacts/.
# MAX_SECONDS bounds one target, so a slow one cannot hold ./bench.sh for hours; a target
# it stops before RUNS inputs is marked "short of RUNS" in the table, never silently.
# All fuzz crates build first, into one target directory (target/fuzz), so the dependencies
# they share are built once; then JOBS targets fuzz at a time (libFuzzer uses one core each).
# policy_file's inputs are capped at 4 KiB (-max_len): its biggest seeds are 20-75 KiB
# nesting probes, libFuzzer would otherwise grow inputs to that size, and CEL's parser takes
# time in proportion; 4 KiB still nests 60 times deeper than the policy parser's cap, and
# `cargo test -p tests --test fuzz_smoke` replays those seeds whole.
# TRACE_COMPARES=no builds without libFuzzer's compare tracing (`--no-trace-compares`, into
# target/fuzz-notrace): every integer comparison of the fuzzed code then stops calling into
# libFuzzer, which was half of policy_file's CPU time (perf: the ANTLR parser compares a
# lot); libFuzzer then learns less from comparisons (its table of recent compares and value
# profile), so the default keeps it, and the section says which it was. Without a nightly toolchain (and none installable) the section says
# so: nothing is faked. Progress goes to stderr, the report to stdout.
set -euo pipefail

RUNS=${RUNS:-1000000}
MAX_SECONDS=${MAX_SECONDS:-1800}
SANITIZER=${SANITIZER:-none}
JOBS=${JOBS:-2}
TRACE_COMPARES=${TRACE_COMPARES:-yes}
root=$(pwd)
if [[ ! -f "$root/bench/fuzz/run.sh" ]]; then
    echo "run.sh: run from the repository root (bench/fuzz/run.sh not found)" >&2
    exit 2
fi

# crate:target:longest input (empty: libFuzzer's default, the longest seed or 4096):what it
# reads. The slowest targets first, so the two lanes end close together.
ALL_TARGETS=(
    "policies:policy_file:4096:policy files (TOML, CEL hooks, load-time check)"
    "jel:jel_lines::JEL pool (members' lines over several connections, agent inputs)"
    "policies:policy_eval::shipped policies on arbitrary host, job, user, lab and time facts"
    "proto:broker_tcp::broker TCP port (handshake; host daemon, agent and rb messages)"
    "proto:control_socket::broker control socket (hello, requests)"
    "agent:shim_socket::agent socket (shim requests, preload \`resolved\` hint)"
    "agent:subagent::agent's subagent port (handshake, subagent messages)"
    "config:lab_file::lab file"
    "rsl:parse::RSL job specifications"
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
# The same flags for build and run, or `cargo fuzz run` rebuilds.
case $TRACE_COMPARES in
    yes) flags=(-O -a -s "$SANITIZER" --target-dir "$root/target/fuzz") ;;
    no) flags=(-O -a -s "$SANITIZER" --no-trace-compares --target-dir "$root/target/fuzz-notrace") ;;
    *)
        echo "run.sh: TRACE_COMPARES must be yes or no, not '$TRACE_COMPARES'" >&2
        exit 64
        ;;
esac
# "1234567" -> "1 234 567".
thousands() {
    echo "$1" | sed -e ':a' -e 's/\([0-9]\)\([0-9]\{3\}\)\($\| \)/\1 \2\3/' -e 'ta'
}

# One target (built already): writes its table row to $work/TARGET.row, and a line to
# $work/TARGET.failed or $work/TARGET.short when it failed or was stopped short.
run_target() {
    local crate=$1 target=$2 max_len=$3 what=$4
    local dir="$root/$crate/fuzz" log="$work/$target.log" slowest="$work/$target.slowest"
    local extra=()
    [[ -n $max_len ]] && extra=(-max_len="$max_len")
    mkdir -p "$work/corpus/$target" "$work/artifacts/$target"
    echo "fuzzing $crate/$target: $RUNS inputs or $MAX_SECONDS s ($(date -u +%H:%M:%S))..." >&2
    local status=0 started=$SECONDS
    (cd "$dir" && RB_FUZZ_SLOWEST="$slowest" RB_FUZZ_LAST="$work/$target.last" cargo +nightly fuzz run "${flags[@]}" "$target" \
        "$work/corpus/$target" "seeds/$target" -- \
        -runs="$RUNS" -max_total_time="$MAX_SECONDS" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        "${extra[@]}" -artifact_prefix="$work/artifacts/$target/") >"$log" 2>&1 || status=$?
    local took=$((SECONDS - started))
    local inputs rate panics=0 slow=0 slowest_ms="n/a" count
    inputs=$(awk '/stat::number_of_executed_units/ {n = $NF} END {print n}' "$log")
    rate=$(awk '/stat::average_exec_per_sec/ {n = $NF} END {print n}' "$log")
    grep -q -e 'ALARM: working on the last Unit' -e 'rb-fuzz-slow-input' "$log" && slow=1
    if [[ $status -ne 0 && $slow -eq 0 ]]; then panics=1; fi
    if [[ $slow -eq 1 ]]; then
        slowest_ms="over 1 s"
    elif [[ -s $slowest ]]; then
        slowest_ms=$(awk '{printf "%.1f ms", $1 / 1000}' "$slowest")
    fi
    local note=""
    if [[ -z $inputs ]]; then
        # Killed before its final statistics: the last progress line says how far it got.
        inputs=$(grep -o '^#[0-9]*' "$log" | tail -n 1 | tr -d '#')
        note=" (at least: the fuzzer died without its statistics)"
    fi
    count="$(thousands "${inputs:-?}")$note"
    if [[ $status -eq 0 && ${inputs:-0} -lt $RUNS ]]; then
        echo "$target" >"$work/$target.short"
        count="$count (**short of $(thousands "$RUNS")**: stopped at $MAX_SECONDS s)"
    fi
    if [[ $status -ne 0 ]]; then
        echo "$target" >"$work/$target.failed"
        mkdir -p "$kept/$target"
        cp "$work/artifacts/$target/"* "$kept/$target/" 2>/dev/null || true
        cp "$log" "$kept/$target/libfuzzer.log"
        # The corpus too: a fuzzer killed by a signal its handler could not catch (a stack
        # overflow on libFuzzer's main thread, which has no alternate signal stack) writes
        # no input, and the corpus is what can find it again.
        cp -r "$work/corpus/$target" "$kept/$target/corpus"
        if grep -q 'exited with signal' "$log"; then
            # A target that calls slowest::keep_last wrote each input before running it.
            local kept_last="no input kept"
            if [[ -f $work/$target.last ]]; then
                cp "$work/$target.last" "$kept/$target/last-input"
                kept_last="its last input kept as last-input"
            fi
            count="$count ($(grep -o 'exited with signal: [0-9]* ([A-Z]*)' "$log" | head -n 1), $kept_last)"
        fi
        grep -q 'libFuzzer: out-of-memory' "$log" && count="$count (out of memory)"
        echo "run.sh: $target FAILED (exit $status): see $kept/$target/" >&2
    fi
    [[ -n $max_len ]] && what="$what; inputs up to $max_len bytes"
    echo "run.sh: $target: ${inputs:-?} inputs in $took s" >&2
    echo "| \`$target\` | $what | $count | ${rate:-?} | $took s | $panics | $slow | $slowest_ms |" \
        >"$work/$target.row"
}

selected=()
for entry in "${ALL_TARGETS[@]}"; do
    IFS=: read -r crate target max_len what <<<"$entry"
    if [[ -z ${TARGETS:-} || " $TARGETS " == *" $target "* ]]; then
        selected+=("$entry")
    fi
done

total_started=$SECONDS
# Build every selected crate first (one at a time: they share the target directory).
declare -A built_crates=()
for entry in "${selected[@]}"; do
    IFS=: read -r crate target max_len what <<<"$entry"
    [[ -n ${built_crates[$crate]:-} ]] && continue
    echo "building $crate/fuzz ($(date -u +%H:%M:%S))..." >&2
    (cd "$root/$crate/fuzz" && cargo +nightly fuzz build "${flags[@]}" >&2)
    built_crates[$crate]=1
done
# Then fuzz, JOBS targets at a time.
for entry in "${selected[@]}"; do
    IFS=: read -r crate target max_len what <<<"$entry"
    while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do
        wait -n || true
    done
    run_target "$crate" "$target" "$max_len" "$what" &
done
wait
total=$((SECONDS - total_started))
rows=()
for entry in "${selected[@]}"; do
    IFS=: read -r crate target max_len what <<<"$entry"
    if [[ -f "$work/$target.row" ]]; then
        rows+=("$(cat "$work/$target.row")")
    else
        rows+=("| \`$target\` | $what | not run: run.sh itself failed (see its stderr) | | | | | |")
    fi
done
failures=$(find "$work" -maxdepth 1 -name '*.failed' | wc -l)
short=$(find "$work" -maxdepth 1 -name '*.short' | wc -l)

if [[ $SANITIZER == none ]]; then
    built="no sanitizer (safe Rust: panics and slow inputs are the hunt), overflow checks and debug assertions on"
else
    built="sanitizer $SANITIZER, overflow checks and debug assertions on"
fi
if [[ $TRACE_COMPARES == no ]]; then
    built="$built, without compare tracing (TRACE_COMPARES=no)"
fi
section
echo "Every outside input under libFuzzer (\`bench/fuzz/run.sh\`; $(rustc +nightly --version)," \
    "$(cargo +nightly fuzz --version); $built): $(thousands "$RUNS") inputs per target from the" \
    "committed seeds, or $MAX_SECONDS s, whichever comes first (a target stopped by the time" \
    "bound is marked short), at most 1 s of CPU per input (10 s of wall time for hangs); $((total / 60)) min in all, builds included," \
    "$JOBS target(s) at a time on $(nproc) cores at nice $(nice). Must read 0 and 0; the" \
    "slowest input is the CPU time of the harness on it."
echo
echo "| target | input | inputs | inputs/s | time | panics | inputs over 1 s | slowest input |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if [[ $failures -gt 0 ]]; then
    echo
    echo "**$failures target(s) failed**: the inputs are in \`target/fuzz-artifacts/\`."
fi
if [[ $short -gt 0 ]]; then
    echo
    echo "**$short target(s) short of $(thousands "$RUNS") inputs** (stopped by MAX_SECONDS=$MAX_SECONDS)."
fi
