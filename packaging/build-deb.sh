#!/usr/bin/env bash
# Builds the Debian package `resourcebroker` into target/debian/resourcebroker_<version>_<arch>.deb
# with plain dpkg-deb (in every Debian; cargo-deb would be one more tool to install and
# would still need the man pages, completions and units laid out by hand).
#
#   packaging/build-deb.sh                     release build, shim and subagent static
#   packaging/build-deb.sh --profile debug --no-build --out-dir DIR
#                                              package what `cargo build` left in target/debug
#                                              (the tests: no cargo run inside cargo test)
#
# Layout (docs/src/admin/install.md): programs in /usr/bin; the shims in the private
# /usr/lib/rb/shims (never /usr/bin/rsh or ssh: the admin may make them the system's with
# update-alternatives); librb_preload.so and libjel.so in /usr/lib/rb; modules in
# /usr/share/rb/modules; the shipped policies in /usr/share/rb/policies; man pages,
# bash/zsh/fish completions; systemd units, disabled; the service's lab file /etc/rb/lab.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release build=1 out_dir=target/debian
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --out-dir) out_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "build-deb.sh: unknown argument $1" >&2; echo "help: build-deb.sh --help" >&2; exit 64 ;;
  esac
done
case "$profile" in
  release) cargo_profile=(--release) ;;
  debug) cargo_profile=() ;;
  *) echo "build-deb.sh: --profile is release or debug, not $profile" >&2; exit 64 ;;
esac

PROGRAMS=(rb agent rb-broker rb-hostd rb-subagent rb-jel rb-pvm-add rb-lam-add)
bin_dir="target/$profile"

if [ "$build" = 1 ]; then
  cargo build "${cargo_profile[@]}" -p rb -p agent -p broker -p hostd -p rsh-shim -p jel-cli \
    -p jel -p preload -p pvm-add -p lam-add -p docgen
  # Every remote call of a job execs the shim and, on a granted host, rb-subagent: static,
  # each starts sooner (the admin guide's "Static build"). Per binary: a global +crt-static
  # would break the preload library, a shared object.
  cargo rustc "${cargo_profile[@]}" -p rsh-shim --bin rsh -- -C target-feature=+crt-static
  cargo rustc "${cargo_profile[@]}" -p agent --bin rb-subagent -- -C target-feature=+crt-static
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
for p in "${PROGRAMS[@]}" rsh librb_preload.so rb-docgen; do
  [ -e "$bin_dir/$p" ] || { echo "build-deb.sh: $bin_dir/$p is missing" >&2; echo "help: run without --no-build" >&2; exit 1; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/rb/shims" "$root/usr/share/rb/modules" \
  "$root/usr/share/rb/policies" "$root/usr/share/man/man1" "$root/usr/share/doc/resourcebroker" \
  "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
  "$root/usr/share/fish/vendor_completions.d" "$root/lib/systemd/system" \
  "$root/usr/lib/systemd/user" "$root/etc/rb" "$root/usr/include/rb"

for p in "${PROGRAMS[@]}"; do install -m 755 "$bin_dir/$p" "$root/usr/bin/$p"; done
install -m 755 "$bin_dir/rsh" "$root/usr/lib/rb/shims/rsh"
# One program under four names: it reads ssh's grammar as ssh, and runs the real scp/sftp
# with -S the shim's ssh (a job links the same four names into its own bin directory).
for name in ssh scp sftp; do ln -s rsh "$root/usr/lib/rb/shims/$name"; done
# The agent links rb-jel into each job's bin dir from beside the shim.
ln -s ../../../bin/rb-jel "$root/usr/lib/rb/shims/rb-jel"
install -m 644 "$bin_dir/librb_preload.so" "$root/usr/lib/rb/librb_preload.so"
if [ -e "$bin_dir/libjel.so" ]; then
  install -m 644 "$bin_dir/libjel.so" "$root/usr/lib/rb/libjel.so"
  install -m 644 jel/c/jel.h "$root/usr/include/rb/jel.h"
fi
for m in modules/*-grow modules/*-shrink modules/*-halt; do
  install -m 755 "$m" "$root/usr/share/rb/modules/$(basename "$m")"
done
install -m 644 policies/{paper,desktop,nights-and-weekends,dedicated}.toml "$root/usr/share/rb/policies/"

# Man pages and completions, rendered from the programs' own clap definitions.
gen="$stage/gen"
"$bin_dir/rb-docgen" --out "$gen" >/dev/null
# The shims' pages and completions never take the system's names (rsh.1.gz is an
# alternative of rsh-client, ssh.1.gz is openssh-client's): their pages are rb-rsh(1) and
# rb-ssh(1), and they get no completion (the system's own completes ssh).
for shim in rsh ssh; do
  mv "$gen/man/$shim.1" "$gen/man/rb-$shim.1"
  rm -f "$gen/completions/bash/$shim" "$gen/completions/zsh/_$shim" "$gen/completions/fish/$shim.fish"
done
cp "$gen"/man/*.1 "$root/usr/share/man/man1/"
gzip -9n "$root"/usr/share/man/man1/*.1
install -m 644 "$gen"/completions/bash/* "$root/usr/share/bash-completion/completions/"
install -m 644 "$gen"/completions/zsh/* "$root/usr/share/zsh/vendor-completions/"
install -m 644 "$gen"/completions/fish/* "$root/usr/share/fish/vendor_completions.d/"

install -m 644 packaging/systemd/rb-broker.service "$root/lib/systemd/system/rb-broker.service"
install -m 644 packaging/systemd/rb-broker.user.service "$root/usr/lib/systemd/user/rb-broker.service"
install -m 644 packaging/debian/lab.toml "$root/etc/rb/lab.toml"
install -m 755 packaging/debian/postinst "$root/DEBIAN/postinst"
printf '/etc/rb/lab.toml\n' > "$root/DEBIAN/conffiles"
gzip -9n < README.md > "$root/usr/share/doc/resourcebroker/README.md.gz"
cat > "$root/usr/share/doc/resourcebroker/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: resourcebroker
License: MIT or Apache-2.0
COPYRIGHT

if [ "$profile" = debug ]; then
  # A debug build carries hundreds of MB of debug info: the tests' package does without.
  strip --strip-debug "$root"/usr/bin/* "$root"/usr/lib/rb/shims/rsh "$root"/usr/lib/rb/*.so
  compress=(-Zgzip -z1)
else
  compress=()
fi
installed_kib=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: resourcebroker
Version: $version
Architecture: $arch
Maintainer: ResourceBroker developers <root@localhost>
Section: net
Priority: optional
Installed-Size: $installed_kib
Depends: libc6, adduser, openssh-client | rsh-client
Suggests: pvm, lam-runtime, openmpi-bin, slurm-client
Description: user-level inter-job resource broker for a lab of Linux machines
 An unmodified program that runs \`rsh anyLinux cmd\` under \`agent\` gets a machine
 chosen now; its remote processes are watched by a subagent and can be taken back
 cleanly. One broker per lab (rb-broker) runs a host daemon (rb-hostd) on every
 machine over the real remote shell. Install this package on every host of the lab.
CONTROL

mkdir -p "$out_dir"
deb="$out_dir/resourcebroker_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compress[@]}" --build "$root" "$deb" >/dev/null
echo "$deb"
