//! proptest strategies that write RSL text: valid specifications with random
//! spacing, comments and quoting (exercising implicit `#`, comments as
//! separators, quote doubling, `^X` delimiters, `\r`, 8-bit text), junk
//! suffixes that trigger libglobus-rsl's truncation quirks, and mutations
//! of all of that.

use proptest::prelude::*;

/// Blanks and comments between tokens (often nothing at all).
pub fn trivia() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just(String::new()),
        6 => Just(" ".to_string()),
        1 => Just("\n".to_string()),
        1 => Just("\t".to_string()),
        1 => Just(" (* c *) ".to_string()),
        1 => Just("(**)".to_string()),
        1 => Just("\n  ".to_string()),
    ]
}

pub fn unquoted() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_/.:%@,;{}\\\\\r\u{e9}-][a-zA-Z0-9_/.:+&|%@\\\\\r\u{e9}-]{0,5}"
}

fn delimited(delim: char, content: String) -> String {
    let body = content.replace(delim, &format!("{delim}{delim}"));
    format!("{delim}{body}{delim}")
}

pub fn quoted() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just('"'), Just('\'')],
        "[a-z ()$#'\"^|\n=]{0,6}",
    )
        .prop_map(|(d, content)| delimited(d, content))
}

pub fn user_quoted() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!['|', '!', '/', '%', 'a', ' ', '"']),
        "[a-z ()$#'\"|!]{0,6}",
    )
        .prop_map(|(d, content)| format!("^{}", delimited(d, content)))
}

pub fn literal() -> impl Strategy<Value = String> {
    prop_oneof![5 => unquoted(), 2 => quoted(), 1 => user_quoted()]
}

fn join(parts: Vec<String>, seps: Vec<String>) -> String {
    let mut out = String::new();
    for (k, part) in parts.into_iter().enumerate() {
        if k > 0 {
            // Never glue two values together silently: keep at least a blank
            // half of the time, otherwise whatever trivia came up.
            out.push_str(seps.get(k).map_or(" ", String::as_str));
        }
        out.push_str(&part);
    }
    out
}

pub fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        6 => literal(),
        2 => unquoted().prop_map(|n| format!("$({n})")),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            (
                prop::collection::vec(inner.clone(), 1..4),
                prop::collection::vec(trivia(), 4),
                trivia()
            )
                .prop_map(|(vs, seps, t)| format!("({t}{}{t})", join(vs, seps))),
            (
                prop::collection::vec(inner.clone(), 1..3),
                prop::collection::vec(trivia(), 3),
                trivia()
            )
                .prop_map(|(vs, seps, t)| format!("${t}({}){}", join(vs, seps), "")),
            (inner.clone(), trivia(), inner.clone(), trivia())
                .prop_map(|(l, t1, r, t2)| format!("{l}{t1}#{t2}{r}")),
            (unquoted(), unquoted(), unquoted()).prop_map(|(a, v, b)| format!("{a}$({v}){b}")),
        ]
    })
}

pub fn rel_op() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["=", "!=", "<", "<=", ">", ">="])
}

pub fn relation() -> impl Strategy<Value = String> {
    (
        prop_oneof![8 => unquoted(), 1 => quoted(), 1 => Just("rsl_substitution".to_string())],
        trivia(),
        rel_op(),
        trivia(),
        prop::collection::vec(value(), 1..4),
        prop::collection::vec(trivia(), 4),
    )
        .prop_map(|(attr, t1, op, t2, values, seps)| {
            format!("{attr}{t1}{op}{t2}{}", join(values, seps))
        })
}

pub fn specification() -> impl Strategy<Value = String> {
    relation().prop_recursive(3, 24, 4, |inner| {
        (
            prop::sample::select(vec!["&", "|", "+"]),
            prop::collection::vec((trivia(), inner, trivia()), 1..4),
            trivia(),
        )
            .prop_map(|(op, operands, t)| {
                let body: String = operands
                    .into_iter()
                    .map(|(a, spec, b)| format!("({a}{spec}{b}){t}"))
                    .collect();
                format!("{op}{t}{body}")
            })
    })
}

/// A whole input: a specification, maybe followed by something that makes
/// libglobus-rsl stop reading (or an ordinary syntax error).
pub fn document() -> impl Strategy<Value = String> {
    (
        trivia(),
        specification(),
        trivia(),
        prop::sample::select(vec![
            "",
            "",
            "",
            "",
            "\n",
            " ",
            "~junk (y",
            "(* never closed",
            "\"q\"",
            "\"q",
            "?",
            "^",
            "!",
            "*)",
            "(x=1)",
            "\r\n",
            "$",
            "#",
        ]),
    )
        .prop_map(|(a, spec, b, tail)| format!("{a}{spec}{b}{tail}"))
}

/// Bytes that matter to the scanner, for mutations.
const ALPHABET: &[u8] = b"()&|+=!<>\"'^*$#?~ \t\n\ra1_";

/// A document with 1-3 random byte edits (insert, delete, replace, cut).
pub fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        document(),
        prop::collection::vec((0.0..1.0f64, 0..4u8, prop::sample::select(ALPHABET)), 1..4),
    )
        .prop_map(|(doc, edits)| {
            let mut bytes = doc.into_bytes();
            for (at, op, b) in edits {
                let k = ((bytes.len() as f64) * at) as usize;
                let k = k.min(bytes.len());
                match op {
                    0 => bytes.insert(k, b),
                    1 if k < bytes.len() => {
                        bytes.remove(k);
                    }
                    2 if k < bytes.len() => bytes[k] = b,
                    _ => bytes.truncate(k),
                }
            }
            bytes
        })
}
