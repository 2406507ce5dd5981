//! Builds `rb-mw`, a C program (`c/*.c`, libc and pthreads only), with the JEL C client
//! (`jel/c/jel.c`) compiled into it, and puts it next to the workspace's binaries
//! (`target/<profile>/rb-mw`), as jel's build script does for `libjel.so`.
//!
//! Why libjel is linked in statically (its source compiled into the program) rather than
//! against `libjel.so`: the master starts workers by the absolute path of its own binary,
//! on granted hosts and from the job's bin dir; a program with nothing to find at run
//! time runs from anywhere, with no run path to get right.

use std::path::{Path, PathBuf};

const SOURCES: [&str; 7] = [
    "c/main.c",
    "c/master.c",
    "c/worker.c",
    "c/launch.c",
    "c/watch.c",
    "c/net.c",
    "c/json.c",
];

fn main() {
    let jel_dir = Path::new("../../jel/c");
    println!("cargo::rerun-if-changed=c");
    println!("cargo::rerun-if-changed={}", jel_dir.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let program = out.join("rb-mw");
    let compiler = cc::Build::new()
        .warnings(true)
        .extra_warnings(true)
        .opt_level(2)
        .std("gnu11")
        .get_compiler();
    let status = compiler
        .to_command()
        .arg("-I")
        .arg(jel_dir)
        .args(SOURCES)
        .arg("c/primes.c")
        .arg(jel_dir.join("jel.c"))
        .args(["-pthread", "-o"])
        .arg(&program)
        .status()
        .expect("run the C compiler for rb-mw");
    assert!(status.success(), "compiling rb-mw (c/*.c) failed");
    // OUT_DIR is target/<profile>/build/rb-mw-<hash>/out.
    let profile_dir = out.ancestors().nth(3).expect("target/<profile>");
    let dest = profile_dir.join("rb-mw");
    // Replace rather than overwrite: a running rb-mw keeps its (old) file.
    let tmp = profile_dir.join(".rb-mw.new");
    std::fs::copy(&program, &tmp).expect("copy rb-mw next to the binaries");
    std::fs::rename(&tmp, &dest).expect("move rb-mw next to the binaries");
    println!("cargo::rustc-env=RB_MW_PATH={}", dest.display());
}
