//! Builds `libjel.so` (the C client, `c/jel.c`, nothing but libc) and puts it with `jel.h`
//! next to the workspace's binaries (`target/<profile>/`), where `cargo build --release`
//! leaves everything users install.
//!
//! Why a C shared library built here rather than a Rust `cdylib`: the PVM and MPI programs
//! of this lab link it with plain `cc … -ljel`; in C it stays a small libc-only library with
//! no Rust runtime or allocator inside those programs. The `cc` crate picks the compiler and
//! flags (CC, CFLAGS, the target) as for lam-add; it builds static archives only, so the
//! link into a `.so` is one more compiler call here.

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=c/jel.c");
    println!("cargo::rerun-if-changed=c/jel.h");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let lib = out.join("libjel.so");
    let compiler = cc::Build::new()
        .warnings(true)
        .extra_warnings(true)
        .pic(true)
        .opt_level(2)
        .get_compiler();
    let status = compiler
        .to_command()
        .args(["-shared", "-Wl,-soname,libjel.so", "-o"])
        .arg(&lib)
        .arg("c/jel.c")
        .status()
        .expect("run the C compiler for libjel.so");
    assert!(status.success(), "compiling c/jel.c into libjel.so failed");
    // OUT_DIR is target/<profile>/build/jel-<hash>/out.
    let profile_dir = out
        .ancestors()
        .nth(3)
        .expect("target/<profile>")
        .to_path_buf();
    for (from, name) in [
        (lib.clone(), "libjel.so"),
        (PathBuf::from("c/jel.h"), "jel.h"),
    ] {
        std::fs::copy(&from, profile_dir.join(name)).expect("copy next to the binaries");
    }
    println!("cargo::rustc-env=JEL_C_DIR={}", out.display());
    println!("cargo::rustc-env=JEL_PROFILE_DIR={}", profile_dir.display());
}
