//! Label rules a lab file must follow because symbolic names are built from labels
//! (`proto::symbolic`): every label can be asked for by name (`any<Label>` is a valid host
//! name), and no two labels make one name mean two things (`gpu` and `gpu-1`: is
//! `anyGpu-1` the label `gpu-1` or instance 1 of `gpu`?). Pure: the caller turns a
//! [`LabelProblem`] into a located `ConfigError`.

use proto::symbolic::{ambiguous_labels, check_name, label_name, IMPLICIT_LABELS};

/// What is wrong with a label, and where: `host` and `label` index the `[[host]]` tables
/// and their `labels` arrays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LabelProblem {
    pub(crate) host: usize,
    pub(crate) label: usize,
    pub(crate) message: String,
    pub(crate) help: String,
}

/// The first problem among `labels` (per host, in file order), if any.
pub(crate) fn check(labels: &[Vec<&str>]) -> Option<LabelProblem> {
    let at = |host, label, message, help| LabelProblem {
        host,
        label,
        message,
        help,
    };
    for (h, list) in labels.iter().enumerate() {
        for (l, label) in list.iter().enumerate() {
            let name = format!("any{}", label_name(label));
            if check_name(&name).is_err() {
                return Some(at(
                    h,
                    l,
                    format!(
                        "label `{label}` cannot be asked for: `{name}` is not a valid host name"
                    ),
                    "use letters, digits, '-' and '_' in labels ('_' reads as '-' in names)"
                        .to_string(),
                ));
            }
        }
    }
    let all = labels.iter().flatten().copied();
    let (short, long) = ambiguous_labels(all).into_iter().next()?;
    let (h, l) = labels.iter().enumerate().find_map(|(h, list)| {
        let l = list
            .iter()
            .position(|x| label_name(x) == long || label_name(x) == short)?;
        Some((h, l))
    })?;
    Some(at(
        h,
        l,
        format!(
            "labels `{short}` and `{long}` make `any{long}` ambiguous: label `{long}`, or \
             instance {} of `any{short}`",
            long.rsplit('-').next().unwrap_or_default()
        ),
        if IMPLICIT_LABELS.iter().any(|l| label_name(l) == short) {
            format!(
                "rename `{long}`: `{short}` is a label every lab has (`host` for anyHost, \
                 the others reported by the host daemons)"
            )
        } else {
            format!("rename one of them (e.g. `{short}-x` or `{long}x`)")
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_labels_pass() {
        assert_eq!(
            check(&[vec!["public", "fast"], vec!["gpu-1", "x86_64"]]),
            None
        );
    }

    #[test]
    fn a_label_and_its_numbered_twin_are_refused_where_the_first_is() {
        let p = check(&[vec!["public"], vec!["fast", "gpu-1"], vec!["gpu"]]).expect("ambiguous");
        assert_eq!((p.host, p.label), (1, 1));
        assert!(p.message.contains("`gpu` and `gpu-1`"), "{}", p.message);
        let p = check(&[vec!["linux-2"]]).expect("beside the sensor label linux");
        assert_eq!((p.host, p.label), (0, 0));
    }

    #[test]
    fn a_label_that_cannot_be_a_host_name_is_refused() {
        let p = check(&[vec!["public", "a.b"]]).expect("dot");
        assert_eq!((p.host, p.label), (0, 1));
        assert!(p.message.contains("`anya.b`"), "{}", p.message);
    }
}

#[cfg(test)]
mod lab_file_tests {
    #[test]
    fn rb_check_refuses_ambiguous_labels_at_their_line() {
        let text = "[broker]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"/var/tmp/x\"\n\
                    secret_file = \"/var/tmp/x/secret\"\n\n[[host]]\nname = \"n1\"\n\
                    labels = [\"gpu\"]\n\n[[host]]\nname = \"n2\"\nlabels = [\"gpu-1\"]\n";
        let err = crate::LabConfig::parse(text, Some(std::path::Path::new("lab.toml")))
            .expect_err("ambiguous labels");
        let shown = err.to_string();
        assert!(shown.contains("lab.toml:8"), "{shown}");
        assert!(shown.contains("host[0].labels"), "{shown}");
        assert!(shown.contains("ambiguous"), "{shown}");
    }
}
