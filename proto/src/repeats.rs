//! Host daemons' frames, with a report that repeats the last one found without parsing it.
//!
//! At 10k hosts a quiet lab's reports are mostly the same text as the host's last one but
//! for the daemon's counter (`"seq":N`). Parsing that text again (≈ a sixth of the broker's
//! CPU then) tells nothing new, so [`HostdFrames::decode`] compares it with the last report
//! on the connection first: a report that is byte for byte the last one outside the digits
//! of its `seq` gives [`HostdFrame::Same`] with the new counter.
//!
//! Why the comparison is exact: the last report parsed, `seq` is a required field and a
//! duplicate key fails the parse, so the text holds the report's own `"seq":` key; the
//! comparison asks that it holds exactly one (a key of another field that ends in `"seq`,
//! which the parser would ignore, disqualifies the text). Outside that key's digits the new
//! text is the old one, so it parses to the same report with the new counter.
//!
//! A daemon the broker offered it to sends its reports after the first as what changed
//! ([`crate::report_changes`]): the decoder reads each into the fields it names
//! ([`HostdFrame::Changes`]), which the broker's host table applies to the host's last
//! report (the one copy of it: the connection keeps none), or gives [`HostdFrame::Same`]
//! when only the counter moved.

use memchr::memmem;

use crate::{
    frame::{decode_from_hostd, FrameError, REPORT_FRAME_START},
    msg::ToBroker,
    report_changes::{self, ReportPatch},
};

/// One frame from a host daemon.
#[derive(Debug, PartialEq)]
pub enum HostdFrame {
    /// A report that is the last report on this connection but for its counter.
    Same { seq: u64 },
    /// A report as what changed since the last one on this connection (at least one field
    /// named), for the holder of that report to apply.
    Changes(Box<ReportPatch>),
    /// Any other frame, parsed.
    Parsed(ToBroker),
}

/// A host daemon connection's decoder: remembers the last whole report's text.
#[derive(Debug, Default)]
pub struct HostdFrames {
    /// The last report's text, and where the digits of its one `seq` begin, while the last
    /// report came whole.
    last_report: Option<(String, usize)>,
    /// A whole report came on this connection: what changed can follow.
    reported: bool,
}

impl HostdFrames {
    /// Decodes `line`, a frame from the daemon ([`decode_from_hostd`]), or finds it the
    /// last report again.
    pub fn decode(&mut self, line: String) -> Result<HostdFrame, FrameError> {
        if line.starts_with(report_changes::FRAME_START) {
            return self.changes(&line);
        }
        if let Some((last, digits_at)) = &self.last_report {
            if let Some(seq) = same_counted_at(last.as_bytes(), *digits_at, line.as_bytes()) {
                return Ok(HostdFrame::Same { seq });
            }
        }
        let msg = decode_from_hostd(&line)?;
        if matches!(msg, ToBroker::Report(_)) {
            self.last_report = seq_digits_at(&line).map(|at| (line, at));
            self.reported = true;
        }
        Ok(HostdFrame::Parsed(msg))
    }

    /// A report as what changed since the last one. The usual frame of a quiet host, its
    /// counter alone (`{"t":"report_changes","seq":N}`), is read as such without the parser.
    fn changes(&mut self, line: &str) -> Result<HostdFrame, FrameError> {
        if !self.reported {
            return Err(FrameError::Malformed(
                "report changes before a whole report on this connection".into(),
            ));
        }
        // The last report is no longer the last whole report's text.
        self.last_report = None;
        if let Some(seq) = counter_alone(line) {
            return Ok(HostdFrame::Same { seq });
        }
        let patch = report_changes::parse(line)
            .map_err(|e| FrameError::Malformed(format!("report changes: {e}")))?;
        Ok(match patch.fields().is_empty() {
            true => HostdFrame::Same { seq: patch.seq },
            false => HostdFrame::Changes(Box::new(patch)),
        })
    }
}

const SEQ_KEY: &[u8] = br#""seq":"#;

/// The counter of `new` when it is the report frame `last` (which parsed) with another
/// number after its one `"seq":` key; `None` when anything else differs (the tests' form
/// of what [`HostdFrames::decode`] does).
#[cfg(test)]
fn same_but_seq(last: &str, new: &str) -> Option<u64> {
    same_counted_at(last.as_bytes(), seq_digits_at(last)?, new.as_bytes())
}

/// Where the digits after the one `"seq":` key of the report frame `text` begin; `None`
/// for another frame, or a text with that key twice.
fn seq_digits_at(text: &str) -> Option<usize> {
    let text = text.as_bytes();
    if !text.starts_with(REPORT_FRAME_START.as_bytes()) {
        return None;
    }
    let finder = memmem::Finder::new(SEQ_KEY);
    let digits_at = finder.find(text)? + SEQ_KEY.len();
    finder
        .find(&text[digits_at..])
        .is_none()
        .then_some(digits_at)
}

/// `same_but_seq` with the place of `last`'s counter known.
fn same_counted_at(last: &[u8], digits_at: usize, new: &[u8]) -> Option<u64> {
    if new.get(..digits_at)? != &last[..digits_at] {
        return None;
    }
    let last_digits = digit_run(&last[digits_at..]);
    let new_digits = digit_run(&new[digits_at..]);
    if last[digits_at + last_digits..] != new[digits_at + new_digits..] {
        return None;
    }
    let number = &new[digits_at..digits_at + new_digits];
    if number.len() > 1 && number[0] == b'0' {
        return None; // not JSON
    }
    std::str::from_utf8(number).ok()?.parse().ok()
}

/// The counter of a `report_changes` frame that holds nothing else, as daemons write it.
fn counter_alone(line: &str) -> Option<u64> {
    let digits = line
        .strip_prefix(report_changes::FRAME_START)?
        .strip_prefix(r#""seq":"#)?
        .strip_suffix('}')?;
    let plain = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits.len() == 1 || !digits.starts_with('0'));
    plain.then(|| digits.parse().ok()).flatten()
}

/// How many ASCII digits `text` begins with.
fn digit_run(text: &[u8]) -> usize {
    text.iter().take_while(|b| b.is_ascii_digit()).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{frame::encode, report::HostReport};

    fn report(seq: u64, load: f64) -> HostReport {
        HostReport {
            hostname: "n1".into(),
            seq,
            cpus: Some(8),
            load: Some([load, 0.37, 0.30]),
            labels: vec!["linux".into()],
            allocs_running: Some(vec![]),
            ..HostReport::default()
        }
    }

    fn line(report: HostReport) -> String {
        encode(&ToBroker::Report(Box::new(report))).expect("encodes")
    }

    #[test]
    fn a_report_that_differs_only_in_its_counter_is_the_same_with_the_new_one() {
        let mut frames = HostdFrames::default();
        let first = frames.decode(line(report(9, 0.42))).expect("decodes");
        assert_eq!(
            first,
            HostdFrame::Parsed(ToBroker::Report(Box::new(report(9, 0.42))))
        );
        // One digit more, then the same length again.
        for seq in [10, 11, 1_000_000] {
            let again = frames.decode(line(report(seq, 0.42))).expect("decodes");
            assert_eq!(again, HostdFrame::Same { seq });
        }
    }

    #[test]
    fn a_report_that_changed_anything_else_is_parsed_and_becomes_the_last() {
        let mut frames = HostdFrames::default();
        frames.decode(line(report(1, 0.42))).expect("decodes");
        let changed = frames.decode(line(report(2, 0.43))).expect("decodes");
        assert_eq!(
            changed,
            HostdFrame::Parsed(ToBroker::Report(Box::new(report(2, 0.43))))
        );
        let same = frames.decode(line(report(3, 0.43))).expect("decodes");
        assert_eq!(same, HostdFrame::Same { seq: 3 });
    }

    #[test]
    fn another_frame_between_reports_leaves_the_last_report() {
        let mut frames = HostdFrames::default();
        frames.decode(line(report(1, 0.42))).expect("decodes");
        let lease = ToBroker::PilotLease {
            slurm_job: "7".into(),
            ending: false,
        };
        let parsed = frames
            .decode(encode(&lease).expect("encodes"))
            .expect("decodes");
        assert_eq!(parsed, HostdFrame::Parsed(lease));
        let same = frames.decode(line(report(2, 0.42))).expect("decodes");
        assert_eq!(same, HostdFrame::Same { seq: 2 });
    }

    #[test]
    fn a_text_with_a_second_seq_key_or_no_counter_is_never_the_same() {
        let last = line(report(1, 0.42));
        // An unknown field whose name ends in `"seq`: the parser ignores it, the
        // comparison refuses the text.
        let sneaky = last.replacen(r#""hostname""#, r#""x\"seq":5,"hostname""#, 1);
        let sneaky_next = sneaky.replacen(r#""seq":1,"#, r#""seq":2,"#, 1);
        assert!(sneaky != last && sneaky_next != sneaky);
        assert_eq!(same_but_seq(&sneaky, &sneaky_next), None);
        // Digits missing, or too many for a counter.
        let none = last.replacen(r#""seq":1,"#, r#""seq":,"#, 1);
        assert_eq!(same_but_seq(&last, &none), None);
        let huge = last.replacen(r#""seq":1,"#, r#""seq":99999999999999999999999,"#, 1);
        assert_eq!(same_but_seq(&last, &huge), None);
        let leading_zero = last.replacen(r#""seq":1,"#, r#""seq":02,"#, 1);
        assert!(none != last && huge != last && leading_zero != last);
        assert_eq!(same_but_seq(&last, &leading_zero), None);
        // Not a report frame.
        assert_eq!(
            same_but_seq("{\"t\":\"x\",\"seq\":1}", "{\"t\":\"x\",\"seq\":2}"),
            None
        );
        // A shorter text.
        assert_eq!(same_but_seq(&last, &last[..10]), None);
    }

    fn changes(old: &HostReport, new: &HostReport) -> String {
        report_changes::encode(old, new).expect("encodes")
    }

    /// The report a frame leaves on the connection, as the broker's host table keeps it:
    /// a whole report replaces `held`, what changed is applied to it.
    fn follow(frames: &mut HostdFrames, line: String, held: &mut HostReport) -> HostdFrame {
        let frame = frames.decode(line).expect("decodes");
        match &frame {
            HostdFrame::Parsed(ToBroker::Report(whole)) => *held = (**whole).clone(),
            HostdFrame::Changes(patch) => {
                patch.as_ref().clone().apply_to(held);
            }
            HostdFrame::Same { seq } => held.seq = *seq,
            HostdFrame::Parsed(_) => {}
        }
        frame
    }

    /// After a whole report, what changed is read into the fields it names, which turn the
    /// held report into the new one; only a new counter is the last report again; a whole
    /// report afterwards is parsed, never matched against the text of the first one (which
    /// is no longer the last).
    #[test]
    fn report_changes_turn_the_held_report_into_the_new_one_and_a_new_counter_alone_is_the_same() {
        let mut frames = HostdFrames::default();
        let mut held = HostReport::default();
        follow(&mut frames, line(report(1, 0.42)), &mut held);
        let moved = follow(
            &mut frames,
            changes(&report(1, 0.42), &report(2, 0.5)),
            &mut held,
        );
        assert!(matches!(moved, HostdFrame::Changes(_)), "{moved:?}");
        assert_eq!(held, report(2, 0.5));
        let counter = follow(
            &mut frames,
            changes(&report(2, 0.5), &report(3, 0.5)),
            &mut held,
        );
        assert_eq!(counter, HostdFrame::Same { seq: 3 });
        assert_eq!(held, report(3, 0.5));
        follow(
            &mut frames,
            changes(&report(3, 0.5), &report(4, 0.6)),
            &mut held,
        );
        assert_eq!(held, report(4, 0.6));
        // The first report's text again but for its counter: not the last report.
        let whole = follow(&mut frames, line(report(5, 0.42)), &mut held);
        assert_eq!(
            whole,
            HostdFrame::Parsed(ToBroker::Report(Box::new(report(5, 0.42))))
        );
        follow(
            &mut frames,
            changes(&report(5, 0.42), &report(6, 0.7)),
            &mut held,
        );
        assert_eq!(held, report(6, 0.7));
        // The whole text of report 5 again after what changed: parsed, not the same.
        let whole_again = follow(&mut frames, line(report(7, 0.42)), &mut held);
        assert!(
            matches!(whole_again, HostdFrame::Parsed(_)),
            "{whole_again:?}"
        );
        assert_eq!(held, report(7, 0.42));
    }

    /// A frame that names fields with their old values is the counter alone in effect:
    /// applied, it changes nothing else.
    #[test]
    fn named_fields_with_their_old_values_change_nothing_else() {
        let mut frames = HostdFrames::default();
        let mut held = HostReport::default();
        follow(&mut frames, line(report(1, 0.42)), &mut held);
        let frame = follow(
            &mut frames,
            r#"{"t":"report_changes","seq":2,"cpus":8}"#.into(),
            &mut held,
        );
        let HostdFrame::Changes(patch) = frame else {
            panic!("{frame:?}");
        };
        assert_eq!(
            patch.clone().apply_to(&mut report(1, 0.42)),
            Default::default()
        );
        assert_eq!(held, report(2, 0.42));
    }

    #[test]
    fn a_counter_alone_is_read_without_the_parser_and_only_when_plain() {
        assert_eq!(
            counter_alone(r#"{"t":"report_changes","seq":42}"#),
            Some(42)
        );
        assert_eq!(counter_alone(r#"{"t":"report_changes","seq":0}"#), Some(0));
        for other in [
            r#"{"t":"report_changes","seq":042}"#,
            r#"{"t":"report_changes","seq":}"#,
            r#"{"t":"report_changes","seq":4,"cpus":2}"#,
            r#"{"t":"report_changes","seq":99999999999999999999999}"#,
            r#"{"t":"report_changes","seq":-1}"#,
            r#"{"t":"report","seq":4}"#,
        ] {
            assert_eq!(counter_alone(other), None, "{other}");
        }
        // With no report before it, even a counter alone is refused.
        let mut frames = HostdFrames::default();
        let first = frames.decode(r#"{"t":"report_changes","seq":2}"#.into());
        assert!(matches!(first, Err(FrameError::Malformed(_))), "{first:?}");
    }

    #[test]
    fn report_changes_before_a_whole_report_or_malformed_are_refused() {
        let mut frames = HostdFrames::default();
        let first = frames.decode(changes(&report(1, 0.42), &report(2, 0.5)));
        assert!(matches!(first, Err(FrameError::Malformed(_))), "{first:?}");
        frames.decode(line(report(1, 0.42))).expect("decodes");
        let bad = frames.decode(r#"{"t":"report_changes","seq":2,"cpus":"x"}"#.into());
        assert!(matches!(bad, Err(FrameError::Malformed(_))), "{bad:?}");
    }

    #[test]
    fn the_same_text_with_a_new_counter_parses_to_the_found_counter() {
        let last = line(report(41, 0.5));
        let new = line(report(42, 0.5));
        let seq = same_but_seq(&last, &new).expect("the same report");
        let ToBroker::Report(parsed) = decode_from_hostd(&new).expect("decodes") else {
            panic!("a report");
        };
        assert_eq!(parsed.seq, seq);
        assert_eq!(*parsed, report(42, 0.5));
    }
}
