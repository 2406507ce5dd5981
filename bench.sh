#!/usr/bin/env bash
# Regenerates BENCHMARKS.md: every figure beside its baseline, measured in this one run.
# Run as root for the lab rows (real namespaced hosts); takes hours on 2 cores (the
# utilization experiment alone is 70 min of wall time): run it on an otherwise quiet machine.
set -euo pipefail
cd "$(dirname "$0")"
cargo build --release --workspace --lib --bins --examples --quiet
# The production build (README, "Static build"): the two programs every remote call execs.
cargo rustc --release --quiet -p rsh-shim --bin rsh -- -C target-feature=+crt-static
cargo rustc --release --quiet -p agent --bin rb-subagent -- -C target-feature=+crt-static
# A broker of an older commit, built once from this clone's history into
# target/baseline-COMMIT; says so when it cannot be.
build_baseline() {
  local commit=$1 dir=target/baseline-$1
  if [ ! -x "$dir/release/rb-broker" ] && git cat-file -e "$commit^{commit}" 2>/dev/null; then
    rm -rf "$dir/src" && mkdir -p "$dir/src"
    git archive "$commit" | tar -x -C "$dir/src"
    cargo build --release --quiet --manifest-path "$dir/src/Cargo.toml" \
      --target-dir "$dir" -p broker --bin rb-broker ||
      echo "bench.sh: building $commit's rb-broker failed (see above)" >&2
  fi
  [ -x "$dir/release/rb-broker" ] ||
    echo "bench.sh: no rb-broker of $commit (not in this clone, or not built)" >&2
}
baseline_args=()
# The footprint's baseline: the broker whose footprint issue 15 quotes (rb-bench's
# policy::BEFORE_POLICY_FILES, policy compiled in).
before_policy_files=ba708db
build_baseline "$before_policy_files"
if [ -x "target/baseline-$before_policy_files/release/rb-broker" ]; then
  baseline_args+=(--broker-before-policy-files "target/baseline-$before_policy_files/release/rb-broker")
fi
# Issue 34's baseline (speed at scale): main before that work. Its footprint rows and the
# paired rows (both brokers at once) run it beside today's.
before_scale=52ad0fe
build_baseline "$before_scale"
if [ -x "target/baseline-$before_scale/release/rb-broker" ]; then
  baseline_args+=(--broker-compared "target/baseline-$before_scale/release/rb-broker"
    --broker-compared-label "$before_scale, before issue 34")
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  echo "# Benchmarks"
  echo
  echo "Regenerate with \`./bench.sh\` (as root for the lab rows). Generated $(date -u +%Y-%m-%dT%H:%MZ)."
  echo
  # shellcheck disable=SC1091  # /etc/os-release is the running system's, not ours to follow
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(free -g | awk '/Mem:/{print $2}') GiB, $(. /etc/os-release; echo "$PRETTY_NAME"), kernel $(uname -r); release build, shim and subagent static (README, \"Static build\")."
  echo
  ./target/release/rb-bench "${baseline_args[@]}" "$@"
  rsl/bench/run.sh
  # >= 1 M inputs per fuzz target (nightly + cargo-fuzz; says so when absent). Without
  # compare tracing unless asked: it is half of the CPU of the parser targets (policy_file,
  # jel_lines, policy_eval), and with it policy_file stops short of 1 M at run.sh's 30 min.
  TRACE_COMPARES=${TRACE_COMPARES:-no} bench/fuzz/run.sh
} > "$out"
mv "$out" BENCHMARKS.md
trap - EXIT
echo "wrote BENCHMARKS.md" >&2
# The fault-injection suite's long run (>= 100 broker kill points); regenerates RELIABILITY.md.
RB_FAULT_KILLS=${RB_FAULT_KILLS:-100} bench/faults/run.sh
