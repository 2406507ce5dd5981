//! Compiles rb-lam-add's LAM part (`src/lam_add.c`) against LAM/MPI 7.1's own headers when
//! they are installed (Debian `lam4-dev`: `/usr/include/lam`, or `LAM_INCLUDE_DIR`), and
//! links `liblam`. Without them the program is built all the same and answers exit 3
//! ("cannot be used here"), so `lam-grow` uses `lamgrow`, and building ResourceBroker
//! needs no LAM.
//!
//! Why C: the add drives LAM's boot framework (a table of function pointers) and its
//! daemon messages (`struct nmsg`, `struct dilink`), whose layouts only LAM's headers know.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(have_lam)");
    println!("cargo::rerun-if-changed=src/lam_add.c");
    println!("cargo::rerun-if-env-changed=LAM_INCLUDE_DIR");
    let include = std::env::var_os("LAM_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include/lam"));
    // A directory that appears later (lam4-dev installed after a first build) reruns this;
    // while it is absent, cargo reruns this script (and relinks rb-lam-add) at each build,
    // a fraction of a second.
    println!("cargo::rerun-if-changed={}", include.display());
    if !include.join("lam-ssi-boot.h").is_file() {
        return;
    }
    cc::Build::new()
        .file("src/lam_add.c")
        .include(&include)
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .compile("rb_lam_add");
    println!("cargo::rustc-link-lib=dylib=lam");
    println!("cargo::rustc-cfg=have_lam");
}
