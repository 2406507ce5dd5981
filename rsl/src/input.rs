//! Reading a job spec from a file or standard input (`@FILE`, `@-`), at most
//! [`MAX_SPEC_BYTES`]: `@/dev/zero` must end at once with an error, not read until memory
//! runs out. A real spec is a few hundred bytes.

use std::io::Read;

/// The longest job spec accepted, in bytes, whatever it comes from (argument, file or
/// standard input).
pub const MAX_SPEC_BYTES: usize = 64 * 1024;

/// Why a spec could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read {what}: {source}")]
    Read {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} is longer than {MAX_SPEC_BYTES} bytes, the limit of a job spec\nhelp: a job spec is a few relations; check that {what} is the spec meant")]
    TooLong { what: String },
}

/// Reads `source` (named `what` in errors) to its end, refusing more than
/// [`MAX_SPEC_BYTES`] as soon as one byte more arrives.
pub fn read_limited(source: impl Read, what: &str) -> Result<Vec<u8>, InputError> {
    let mut bytes = Vec::new();
    source
        .take(MAX_SPEC_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| InputError::Read {
            what: what.to_string(),
            source,
        })?;
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(InputError::TooLong {
            what: what.to_string(),
        });
    }
    Ok(bytes)
}

/// `@FILE` → the file, `@-` → standard input, anything else → itself (checked against the
/// limit too). The name is what errors about the text should say (`None`: the argument).
pub fn read_spec_arg(spec: &str) -> Result<(Option<String>, Vec<u8>), InputError> {
    match spec.strip_prefix('@') {
        Some("-") => {
            let bytes = read_limited(std::io::stdin().lock(), "standard input")?;
            Ok((Some("<stdin>".into()), bytes))
        }
        Some(path) => {
            let file = std::fs::File::open(path).map_err(|source| InputError::Read {
                what: path.to_string(),
                source,
            })?;
            Ok((Some(path.to_string()), read_limited(file, path)?))
        }
        None => read_limited(spec.as_bytes(), "the job spec").map(|bytes| (None, bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_source_is_refused_after_the_limit() {
        let e = read_limited(std::io::repeat(0), "/dev/zero").expect_err("too long");
        assert!(matches!(e, InputError::TooLong { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("/dev/zero is longer than 65536 bytes"),
            "{e}"
        );
        let at_limit = vec![b'x'; MAX_SPEC_BYTES];
        assert_eq!(
            read_limited(&at_limit[..], "x").expect("fits").len(),
            MAX_SPEC_BYTES
        );
    }

    #[test]
    fn dev_zero_as_a_file_ends_at_once() {
        let e = read_spec_arg("@/dev/zero").expect_err("too long");
        assert!(e.to_string().contains("limit of a job spec"), "{e}");
    }
}
