//! The book (`docs/`) and the README that points into it: the book builds with mdBook, every
//! relative link and anchor of its pages and of the README resolves, every section the README
//! had before the book is a heading of some page, the README stays a front door (≤ 12 KiB,
//! the two commands word for word), and the book's runnable examples (code blocks tagged
//! `sh,runnable`) run and exit 0.
//!
//! Links are checked here, not by mdbook-linkcheck: a small checker of relative links and
//! mdBook's heading ids needs no network and no other tool.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.md` file under `dir`.
fn pages(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(pages(&path));
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// `text` with every `{{#include PATH}}` replaced by PATH's text (relative to `base`).
fn expand_includes(text: &str, base: &Path) -> String {
    let mut out = String::new();
    for line in text.lines() {
        match include_target(line) {
            Some(target) => out.push_str(&read(&base.join(target))),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

fn include_target(line: &str) -> Option<&str> {
    line.trim()
        .strip_prefix("{{#include ")?
        .strip_suffix("}}")
        .map(str::trim)
}

/// The lines of `text` outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// mdBook's id of a heading (`normalize_id` of its text without markup), with `-N` for
/// repeats, as mdBook 0.4 renders them.
fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for line in prose_lines(text) {
        let Some(title) = line.strip_prefix('#').map(|t| t.trim_start_matches('#')) else {
            continue;
        };
        if !title.starts_with(' ') {
            continue;
        }
        let plain: String = title.trim().replace('`', "");
        let id: String = plain
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '_' || c == '-' {
                    Some(c.to_ascii_lowercase())
                } else if c.is_whitespace() {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let n = counts.entry(id.clone()).or_default();
        ids.insert(if *n == 0 {
            id.clone()
        } else {
            format!("{id}-{n}")
        });
        *n += 1;
    }
    ids
}

/// The targets of the inline links `[text](target)` in `text`'s prose (not in code).
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        // Inline code may hold `](`: drop it first.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].trim().to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

/// What is wrong with the links of the markdown file `page` (anchors into it looked up with
/// its includes expanded when `expand`), each as `file: target: why`.
fn broken_links(page: &Path, expand: bool) -> Vec<String> {
    let dir = page.parent().expect("a page's directory");
    let raw = read(page);
    // An included file's links are its own, relative to where it lives (checked there).
    let text = if expand {
        expand_includes(&raw, dir)
    } else {
        raw.clone()
    };
    let mut problems = Vec::new();
    for target in link_targets(&raw) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            page.to_path_buf()
        } else {
            dir.join(path)
        };
        if !file.exists() {
            problems.push(format!("{}: {target}: no such file", page.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        let target_text = if file == page {
            text.clone()
        } else {
            expand_includes(&read(&file), file.parent().expect("dir"))
        };
        if !heading_ids(&target_text).contains(anchor) {
            problems.push(format!(
                "{}: {target}: no heading with that id",
                page.display()
            ));
        }
    }
    problems
}

#[test]
fn every_link_and_anchor_of_the_book_and_the_readme_resolves() {
    let src = repo().join("docs/src");
    let mut problems = Vec::new();
    for page in pages(&src) {
        problems.extend(broken_links(&page, true));
        for line in read(&page).lines() {
            if let Some(target) = include_target(line) {
                let file = page.parent().expect("dir").join(target);
                if file.is_file() {
                    // An included file's own links are relative to where it lives.
                    problems.extend(broken_links(&file, false));
                } else {
                    problems.push(format!(
                        "{}: include {target}: no such file",
                        page.display()
                    ));
                }
            }
        }
    }
    problems.extend(broken_links(&repo().join("README.md"), false));
    // Every page of SUMMARY.md exists (mdBook would create empty ones otherwise).
    let summary = read(&src.join("SUMMARY.md"));
    for target in link_targets(&summary) {
        if !src.join(&target).is_file() {
            problems.push(format!("SUMMARY.md: {target}: no such page"));
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let src = repo().join("docs/src");
    let summary: BTreeSet<PathBuf> = link_targets(&read(&src.join("SUMMARY.md")))
        .iter()
        .map(|t| src.join(t))
        .collect();
    let missing: Vec<_> = pages(&src)
        .into_iter()
        .filter(|p| !p.ends_with("SUMMARY.md") && !summary.contains(p))
        .collect();
    assert!(missing.is_empty(), "pages not in SUMMARY.md: {missing:?}");
    assert!(summary.len() >= 15, "the book has {} pages", summary.len());
}

#[test]
fn every_section_the_readme_had_is_a_heading_of_the_book() {
    let mut headings = BTreeSet::new();
    for page in pages(&repo().join("docs/src")) {
        for line in prose_lines(&read(&page)) {
            if line.starts_with('#') {
                headings.insert(line.trim_start_matches('#').trim().to_string());
            }
        }
    }
    let list = read(&repo().join("docs/readme-sections.txt"));
    let missing: Vec<&str> = list
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter(|l| !headings.contains(l.trim()))
        .collect();
    assert!(
        missing.is_empty(),
        "README sections missing from the book: {missing:?}"
    );
}

#[test]
fn the_readme_is_a_front_door_with_the_two_commands() {
    let readme = read(&repo().join("README.md"));
    assert!(
        readme.len() <= 12 * 1024,
        "README.md is {} bytes: keep it under 12 KiB and move the rest into the book",
        readme.len()
    );
    for command in [
        "cargo build --release && ./target/release/agent sh -c 'rsh anyLinux echo hello from a just-in-time host; rsh anyHost uname -sr'",
        "./test.sh",
    ] {
        assert!(
            readme.lines().any(|l| l == command),
            "README.md lost the command `{command}`"
        );
    }
    assert!(
        readme.contains("docs/src/SUMMARY.md"),
        "README.md does not point into the book"
    );
}

/// mdbook: on PATH, else where `cargo install` puts it.
fn mdbook() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let candidates = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("mdbook"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .chain(home.map(|h| h.join(".cargo/bin/mdbook")));
    candidates.into_iter().find(|p| p.is_file())
}

#[test]
fn the_book_builds_with_mdbook() {
    let Some(mdbook) = mdbook() else {
        panic!("mdbook is not installed\nhelp: ./test.sh installs it (cargo install mdbook --locked --version 0.4.40)");
    };
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(mdbook)
        .arg("build")
        .arg(repo().join("docs"))
        .arg("--dest-dir")
        .arg(out_dir.path())
        .output()
        .expect("run mdbook");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mdbook build failed:\n{log}");
    assert!(
        !log.contains("[WARN]") && !log.contains("[ERROR]"),
        "mdbook warned:\n{log}"
    );
    for page in [
        "index.html",
        "user/first-job.html",
        "reference/commands.html",
        "reference/PROTOCOL.html",
    ] {
        assert!(out_dir.path().join(page).is_file(), "{page} was not built");
    }
    // The included files are in the built page: one source, no copy.
    let protocol = read(&out_dir.path().join("reference/PROTOCOL.html"));
    assert!(
        protocol.contains("wire protocol"),
        "PROTOCOL.md was not included"
    );
}

/// The code blocks tagged `sh,runnable`, with the page each is on.
fn runnable_blocks() -> Vec<(PathBuf, String)> {
    let mut blocks = Vec::new();
    for page in pages(&repo().join("docs/src")) {
        let text = read(&page);
        let mut current: Option<String> = None;
        for line in text.lines() {
            match &mut current {
                None if line.trim() == "```sh,runnable" => current = Some(String::new()),
                Some(block) if line.trim() == "```" => {
                    blocks.push((page.clone(), std::mem::take(block)));
                    current = None;
                }
                Some(block) => {
                    block.push_str(line);
                    block.push('\n');
                }
                None => {}
            }
        }
    }
    blocks
}

#[test]
fn the_books_runnable_examples_run() {
    let blocks = runnable_blocks();
    assert!(blocks.len() >= 4, "runnable examples: {}", blocks.len());
    for (page, block) in blocks {
        let home = tempfile::tempdir().expect("home");
        let runtime = home.path().join("run");
        std::fs::create_dir(&runtime).expect("runtime dir");
        std::fs::set_permissions(
            &runtime,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("chmod");
        let path = format!(
            "{}:{}",
            tests::bin_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-e", "-c", &block])
            .current_dir(repo())
            .env("PATH", path)
            .env("HOME", home.path())
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("USER", "booktest")
            .stdin(std::process::Stdio::null());
        for var in [
            "RB_BROKER",
            "RB_LAB",
            "RB_AGENT",
            "RB_JEL",
            "RB_CREDENTIAL",
            "XDG_CONFIG_HOME",
        ] {
            cmd.env_remove(var);
        }
        let child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let out = wait_with_deadline(child, Duration::from_secs(180));
        assert!(
            out.status.success(),
            "{}: the example\n{block}exited {}:\n{}{}",
            page.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The child's output, killing it when it runs past `deadline` (the assertion then fails).
fn wait_with_deadline(mut child: std::process::Child, deadline: Duration) -> std::process::Output {
    let done = tests::wait_until(deadline, || child.try_wait().ok().flatten());
    if done.is_none() {
        let _ = child.kill();
    }
    child.wait_with_output().expect("wait")
}
