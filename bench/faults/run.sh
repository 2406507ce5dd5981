#!/usr/bin/env bash
# The long run of the fault-injection suite (tests/tests/faults_lab.rs, issue 17) and the
# table it leaves in RELIABILITY.md. Root (the suite builds real namespaced hosts).
#
#   bench/faults/run.sh            # RB_FAULT_KILLS (default 100) faults per stream scenario
#   bench/faults/run.sh --render   # only turn target/faults/*.json into RELIABILITY.md
#
# RB_FAULT_SEED replays a run; each scenario's seed is in the table. Needs jq.
set -euo pipefail
cd "$(dirname "$0")/../.."
kills=${RB_FAULT_KILLS:-100}
profile=${RB_FAULT_PROFILE---release}   # RB_FAULT_PROFILE= (empty) for the debug build
profile_args=()
[ -n "$profile" ] && profile_args=("$profile")
if [ "${1:-}" != "--render" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "bench/faults/run.sh: the fault suite needs root (lab hosts); RELIABILITY.md left as it is" >&2
    exit 0
  fi
  rm -f target/faults/*.json
  # The lab's init is not among the binaries `cargo test` builds for the tests crate.
  cargo build "${profile_args[@]}" --quiet -p lab --bin rb-lab-init
  # The tests write their summaries whether they pass or not; the table says what broke.
  RB_FAULT_KILLS=$kills cargo test "${profile_args[@]}" --quiet -p tests --test faults_lab -- \
    --test-threads=1 --include-ignored >&2 || echo "bench/faults/run.sh: some scenarios failed (see the table)" >&2
fi
shopt -s nullglob
files=(target/faults/*.json)
if [ ${#files[@]} -eq 0 ]; then
  echo "bench/faults/run.sh: no summaries in target/faults/; nothing to render" >&2
  exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  echo "# Reliability"
  echo
  echo "Made by \`bench/faults/run.sh\` (called by \`./bench.sh\`; \`--render\` re-renders the last"
  echo "run) from the fault-injection suite \`tests/tests/faults_lab.rs\` (README, \"Fault injection\")."
  echo "Generated $(date -u +%Y-%m-%dT%H:%MZ): $(jq -s 'map(.faults.broker_kill // 0) | add' "${files[@]}") broker kill points and $(jq -s 'map(.injected) | add' "${files[@]}") faults in all."
  echo "Build: $(jq -s -r 'map(.build // "unknown") | unique | join(", ")' "${files[@]}"); $(jq -s -r 'map(.cpus // empty) | unique | map(tostring) | join(", ") | if . == "" then "cores unknown" else "\(.) core(s)" end' "${files[@]}"); 1-minute load average as each scenario ended: $(jq -s -r 'map(.loadavg // empty) | if length == 0 then "unknown" else "\(min)–\(max)" end' "${files[@]}") (a debug build or a loaded machine misses more deadlines)."
  echo "Replay a row with \`RB_FAULT_SEED=<seed> RB_FAULT_KILLS=<n> cargo test -p tests --test faults_lab <test>\`."
  echo
  echo "| scenario | seed | jobs | faults injected | survived | invariant violations | processes left behind |"
  echo "|---|---|---|---|---|---|---|"
  jq -r '"| \(.scenario) | \(.seed) | \(.jobs) | \(.injected) (\(.faults | to_entries | map("\(.key) \(.value)") | join(", "))) | \(.survived) | \(.violations | length) | \(.leftovers) |"' "${files[@]}"
  jq -s -r '"| **total** | | \(map(.jobs) | add) | \(map(.injected) | add) | \(map(.survived) | add) | \(map(.violations | length) | add) | \(map(.leftovers) | add) |"' "${files[@]}"
  echo
  echo "Faults: \`broker_kill\` SIGKILL of \`rb-broker\` and a restart on the same lab file and"
  echo "state dir; \`hostd_kill\`, \`subagent_kill\`, \`agent_kill\` SIGKILL of one such process;"
  echo "\`crash_during_reclaim\`, \`partition_during_reclaim\` a host crashed or cut off within the"
  echo "grace period of \`rb release\`; \`state_dir_full\` the state dir's file system filled;"
  echo "\`end\` the final check once every job has ended. A fault *survived* when every invariant"
  echo "held after it: no host in two live allocations, running jobs keep their hosts and queued"
  echo "requests, never two jobs' processes on one host, no process of an ended job on any host,"
  echo "every agent gone within 20 s of its app."
  # Each violation once, with how many checks saw it (a leftover is seen by every later check).
  violations=$(jq -s -r '[.[] | .scenario as $s | .violations[] | "\($s): \(sub("^after [^:]*: "; ""))"]
    | group_by(.) | map("- \(.[0]) (seen by \(length) check(s))") | .[]' "${files[@]}")
  if [ -n "$violations" ]; then
    echo
    echo "## Violations"
    echo
    printf '%s\n' "$violations"
  fi
  # Cases no scenario injects (hostile or careless input), kept by hand.
  if [ -f bench/faults/hand-kept.md ]; then
    echo
    cat bench/faults/hand-kept.md
  fi
} > "$out"
mv "$out" RELIABILITY.md
trap - EXIT
echo "wrote RELIABILITY.md" >&2
