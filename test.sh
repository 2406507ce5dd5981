#!/usr/bin/env bash
# The whole ResourceBroker test suite: unit tests, local integration (virtual hosts) and,
# when run as root, the lab tier (real namespaced hosts with sshd, rshd, PVM, LAM).
# As root it first installs the Debian packages the lab needs (idempotent: nothing is
# fetched when they are already installed). As another user the lab tests are skipped,
# each printing why.
set -euo pipefail
cd "$(dirname "$0")"

LAB_PACKAGES=(
  openssh-server openssh-client rsh-server rsh-client openbsd-inetd
  pvm pvm-dev lam-runtime lam4-dev libglobus-rsl-dev
  openmpi-bin libopenmpi-dev mpich libmpich-dev
  iproute2 util-linux psmisc procps gcc parallel pdsh rsync strace
  slurmctld slurmd slurm-client munge
  dbus
  prometheus chromium
  man-db adduser
)

# Debian's elogind for the logind lab tests (a real logind inside a lab host), unpacked
# there, not installed: it conflicts with the machine's systemd package (apt would remove
# systemd), and the hosts only need its files (tests/src/logind.rs).
ELOGIND_DIR=target/lab-elogind

unpack_elogind() {
  [ -x "$ELOGIND_DIR/lib/elogind/elogind" ] && return 0
  local debs
  debs=$(mktemp -d)
  chmod 755 "$debs"   # apt's download sandbox user writes there
  if ! (cd "$debs" && apt-get download -qq elogind); then
    echo "test.sh: cannot download elogind: the logind lab tests will fail" >&2
    rm -rf "$debs"
    return 0
  fi
  mkdir -p "$ELOGIND_DIR"
  dpkg -x "$debs"/elogind_*.deb "$ELOGIND_DIR"
  rm -rf "$debs"
  echo "test.sh: unpacked elogind into $ELOGIND_DIR"
}

install_packages() {
  local missing=()
  for p in "${LAB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "test.sh: lab packages already installed"
    return
  fi
  echo "test.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Never start the packages' own services (sshd on :22, inetd on :514): the lab runs its own.
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created_policy=1
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ "$created_policy" = 1 ] && rm -f "$policy"
  return 0
}

# The lab's hosts bind their own /tmp and /run over the machine's (LAB-NOTES): binaries in a
# checkout under either are invisible there, and every host's rb-hostd would exit 127.
lab_hides_checkout() {
  case "$(pwd -P)/" in
    /tmp/* | /run/*) return 0 ;;
    *) return 1 ;;
  esac
}

if [ "$(id -u)" = 0 ]; then
  if lab_hides_checkout; then
    echo "test.sh: error: this checkout is under $(pwd -P), which the lab's hosts replace with" >&2
    echo "  their own /tmp or /run: they could not run its binaries (rb-hostd would exit 127)." >&2
    echo "help: clone the repository elsewhere (e.g. under /work or /srv) and run ./test.sh there" >&2
    exit 2
  fi
  install_packages
  unpack_elogind
else
  echo "test.sh: not root: lab-tier tests will be skipped (they need network namespaces)"
fi

# The book (docs/) is built and link-checked by tests/tests/book_local.rs with mdBook, pinned.
MDBOOK_VERSION=0.4.40
if [ "$(mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ] &&
   [ "$("$HOME/.cargo/bin/mdbook" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
  echo "test.sh: installing mdbook $MDBOOK_VERSION"
  cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features --quiet
fi
export PATH="$HOME/.cargo/bin:$PATH"

# Tear down labs left behind by an earlier run that was killed before its cleanup.
cargo build --workspace --quiet   # every binary and the job preload library
if [ "$(id -u)" = 0 ]; then
  ./target/debug/rb lab down --stale || true
fi

# The code's own checks, as STYLE.md asks of every change: formatted, clippy without a
# warning, the crates' API docs (private items too: they are for the next engineer) without
# a broken link. A failure here is reported and fails the run, after the tests have run.
# A toolchain without rustfmt or clippy (`rustup component add rustfmt clippy`) is said and
# not held against the run.
lint_status=0
lint() {
  echo "test.sh: $*"
  "$@" || { lint_status=1; echo "test.sh: FAILED: $*"; }
}
if cargo fmt --version >/dev/null 2>&1; then
  lint cargo fmt --all --check
else
  echo "test.sh: rustfmt is not installed (rustup component add rustfmt): formatting not checked"
fi
if cargo clippy --version >/dev/null 2>&1; then
  lint cargo clippy --workspace --all-targets --quiet -- -D warnings
else
  echo "test.sh: clippy is not installed (rustup component add clippy): lints not checked"
fi
RUSTDOCFLAGS="-D warnings" lint cargo doc --workspace --no-deps --document-private-items --quiet

# --no-fail-fast: a failing test binary does not hide the others (the exit status still fails).
# The whole output is kept in target/test-output.log; at the end each failing test's
# message is printed again (its first lines), so that a log cut in the middle (as CI's
# summary is) still says which assertion failed and why.
OUTPUT_LOG=target/test-output.log
status=0
cargo test --workspace --no-fail-fast -- --test-threads="${RB_TEST_THREADS:-2}" 2>&1 |
  tee "$OUTPUT_LOG" || status=$?
# The broker reads its host daemons through io_uring where the kernel allows it; the tests
# that run daemons, again with their sessions as tasks read through epoll (the way it reads
# where io_uring cannot be used, and with RB_HOSTD_READ=epoll).
echo "test.sh: host daemons' sessions read through epoll (RB_HOSTD_READ=epoll)"
RB_HOSTD_READ=epoll cargo test -p tests --test local --test report_local --test peers_local \
  --test hardening_local -- --test-threads="${RB_TEST_THREADS:-2}" 2>&1 |
  tee -a "$OUTPUT_LOG" || status=$?
if [ "$status" != 0 ]; then
  echo
  echo "test.sh: the failures again (their first 60 lines each; all of it in $OUTPUT_LOG):"
  awk '/^---- .* stdout ----$/ { shown = 0; on = 1 }
       /^failures:$/ { on = 0 }
       on && shown < 60 { print; shown++ }' "$OUTPUT_LOG"
fi
if [ "$lint_status" != 0 ]; then
  echo "test.sh: the checks above (fmt, clippy, rustdoc) failed: see their output before the tests'"
  [ "$status" != 0 ] || status=1
fi
exit "$status"
