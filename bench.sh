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
# The footprint's baseline: the broker whose footprint issue 15 quotes (rb-bench's
# policy::BEFORE_POLICY_FILES, policy compiled in), built once from this clone's history.
before_policy_files=ba708db
before_dir=target/baseline-$before_policy_files
baseline_args=()
if [ ! -x "$before_dir/release/rb-broker" ] && git cat-file -e "$before_policy_files^{commit}" 2>/dev/null; then
  rm -rf "$before_dir/src" && mkdir -p "$before_dir/src"
  git archive "$before_policy_files" | tar -x -C "$before_dir/src"
  cargo build --release --quiet --manifest-path "$before_dir/src/Cargo.toml" \
    --target-dir "$before_dir" -p broker --bin rb-broker ||
    echo "bench.sh: building $before_policy_files's rb-broker failed (see above)" >&2
fi
if [ -x "$before_dir/release/rb-broker" ]; then
  baseline_args=(--broker-before-policy-files "$before_dir/release/rb-broker")
else
  echo "bench.sh: no rb-broker of $before_policy_files (not in this clone, or not built): the footprint runs without its baseline" >&2
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
