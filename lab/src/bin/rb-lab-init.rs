//! `rb-lab-init`: PID 1 of a lab host. All the work is in [`lab::init`].

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(lab::init::main(&args));
}
