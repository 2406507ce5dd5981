//! ResourceBroker job specs: the paper's forms, every key, multi-requests,
//! canonical attribute names, and the errors users get.

use rsl::{Count, JobSpec, RslError, SpecError};

fn spec(text: &str) -> JobSpec {
    JobSpec::from_rsl_text(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn spec_err(text: &str) -> SpecError {
    match JobSpec::from_rsl_text(text) {
        Err(RslError::Spec(e)) => e,
        other => panic!("{text}: expected a spec error, got {other:?}"),
    }
}

#[test]
fn paper_example_is_one_request() {
    let s = spec("+(count>=4)(arch=\"i86Linux\")(module=\"pvm\")");
    assert_eq!(s.parts.len(), 1);
    let p = &s.parts[0];
    assert_eq!(p.count, Count { min: 4, max: None });
    assert_eq!(p.arch.as_deref(), Some("i86Linux"));
    assert_eq!(p.module.as_deref(), Some("pvm"));
    assert!(!p.adaptive);
}

#[test]
fn jel_is_the_pools_consistency() {
    let s = spec("(adaptive=yes)(jel=\"reliable,nonuniform\")");
    assert_eq!(s.parts[0].jel.as_deref(), Some("reliable,nonuniform"));
    assert_eq!(spec("(adaptive=yes)").parts[0].jel, None);
}

#[test]
fn bare_form_is_an_implicit_and() {
    let bare = spec("(module=\"pvm\")(adaptive=yes)");
    let explicit = spec("&(module=\"pvm\")(adaptive=yes)");
    assert_eq!(bare, explicit);
    assert!(bare.parts[0].adaptive);
    // Only for job specs: Globus RSL itself rejects it.
    assert!(rsl::Rsl::parse("(module=pvm)", rsl::Mode::Strict).is_err());
}

#[test]
fn every_key() {
    let s = spec(
        "&(count>=2)(count<8)(arch=x86_64)(os=Linux)(min_memory=512)\
         (host=node07 node08)(adaptive=YES)(module=lam)(start_script=/opt/start.sh)\
         (executable=/bin/app)(arguments=-v \"two words\")(directory=/tmp)\
         (environment=(A 1)(B 2))(stdin=/dev/null)(stdout=out.txt)(stderr=err.txt)\
         (max_wall_time=60)",
    );
    let p = &s.parts[0];
    assert_eq!(
        p.count,
        Count {
            min: 2,
            max: Some(7)
        }
    );
    assert_eq!(p.os.as_deref(), Some("Linux"));
    assert_eq!(p.min_memory_mb, Some(512));
    assert_eq!(p.hosts, ["node07", "node08"]);
    assert!(p.adaptive);
    assert_eq!(p.module.as_deref(), Some("lam"));
    assert_eq!(p.start_script.as_deref(), Some("/opt/start.sh"));
    assert_eq!(p.executable.as_deref(), Some("/bin/app"));
    assert_eq!(p.arguments, ["-v", "two words"]);
    assert_eq!(p.directory.as_deref(), Some("/tmp"));
    assert_eq!(
        p.environment,
        [("A".into(), "1".into()), ("B".into(), "2".into())]
    );
    assert_eq!(
        (p.stdin.as_deref(), p.stdout.as_deref(), p.stderr.as_deref()),
        (Some("/dev/null"), Some("out.txt"), Some("err.txt"))
    );
    assert_eq!(p.max_wall_time_min, Some(60));
}

#[test]
fn count_forms() {
    let count = |t: &str| spec(t).parts[0].count;
    assert_eq!(
        count("&(count=4)"),
        Count {
            min: 4,
            max: Some(4)
        }
    );
    assert_eq!(count("&(count>3)"), Count { min: 4, max: None });
    assert_eq!(
        count("&(count<=2)"),
        Count {
            min: 1,
            max: Some(2)
        }
    );
    assert_eq!(count("&(executable=a)"), Count { min: 1, max: None });
    assert_eq!(spec("&(memory>=256)").parts[0].min_memory_mb, Some(256));
}

#[test]
fn attribute_names_are_canonicalised() {
    let a = spec("&(Start_Script=s)(MAX_WALL_TIME=5)(ARCH=a)");
    let b = spec("&(startscript=s)(maxwalltime=5)(arch=a)");
    assert_eq!(a, b);
}

#[test]
fn substitution_works_in_job_specs() {
    let s = spec("&(rsl_substitution=(BIN /opt/bin))(executable=$(BIN)/app)");
    assert_eq!(s.parts[0].executable.as_deref(), Some("/opt/bin/app"));
    assert!(matches!(
        JobSpec::from_rsl_text("&(executable=$(BIN)/app)"),
        Err(RslError::Eval(_))
    ));
}

#[test]
fn multi_requests_have_parts() {
    let s = spec("+(&(count=2)(module=pvm))(&(count>=1)(arch=x86_64)(adaptive=yes))");
    assert_eq!(s.parts.len(), 2);
    assert_eq!(
        s.parts[0].count,
        Count {
            min: 2,
            max: Some(2)
        }
    );
    assert!(s.parts[1].adaptive);
    assert!(matches!(
        spec_err("+(&(count=2))(count=3)"),
        SpecError::Shape(_)
    ));
    assert!(matches!(
        spec_err("|(count=2)(count=3)"),
        SpecError::Shape(_)
    ));
    assert!(matches!(
        spec_err("&(count=2)(+(&(a=1)))"),
        SpecError::Shape(_)
    ));
}

#[test]
fn unknown_attributes_suggest_the_closest() {
    let e = spec_err("&(cuont=4)");
    assert_eq!(
        e.to_string(),
        "unknown attribute `cuont` (did you mean `count`?)"
    );
    let e = spec_err("&(startscrpt=x)");
    assert!(
        e.to_string().contains("did you mean `start_script`?"),
        "{e}"
    );
    let e = spec_err("&(queue=fast)");
    assert_eq!(e.to_string(), "unknown attribute `queue`");
}

#[test]
fn duplicates_and_contradictions() {
    assert!(matches!(
        spec_err("&(count=4)(COUNT=5)"),
        SpecError::Duplicate { .. }
    ));
    assert!(matches!(
        spec_err("&(arch=a)(Arch=b)"),
        SpecError::Duplicate { .. }
    ));
    assert!(matches!(
        spec_err("&(memory>=1)(min_memory=2)"),
        SpecError::Duplicate { .. }
    ));
    let e = spec_err("&(count>=8)(count<=2)");
    assert!(matches!(e, SpecError::Contradiction { .. }));
    assert!(e.to_string().contains("at least 8 and at most 2"), "{e}");
    assert!(matches!(
        spec_err("&(count=4)(count>=2)"),
        SpecError::Contradiction { .. }
    ));
    assert!(matches!(
        spec_err("&(count<1)"),
        SpecError::Contradiction { .. }
    ));
    assert!(matches!(
        spec_err("&(count=0)"),
        SpecError::Contradiction { .. }
    ));
}

#[test]
fn bad_values_and_operators() {
    assert!(matches!(spec_err("&(count=four)"), SpecError::Value { .. }));
    assert!(matches!(
        spec_err("&(adaptive=maybe)"),
        SpecError::Value { .. }
    ));
    assert!(matches!(spec_err("&(arch=a b)"), SpecError::Value { .. }));
    assert!(matches!(
        spec_err("&(environment=A)"),
        SpecError::Value { .. }
    ));
    assert!(matches!(spec_err("&(arch>=a)"), SpecError::Operator { .. }));
    assert!(matches!(
        spec_err("&(count!=3)"),
        SpecError::Operator { .. }
    ));
}

#[test]
fn serialises_to_json() {
    let s = spec("(count>=4)(module=pvm)(adaptive=yes)");
    let json: serde_json::Value = serde_json::from_str(&s.to_json_pretty()).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"parts": [{"count": {"min": 4, "max": null}, "adaptive": true, "module": "pvm"}]})
    );
    let back: JobSpec = serde_json::from_value(json).expect("round trip");
    assert_eq!(back, s);
}

#[test]
fn parse_errors_are_strict() {
    assert!(matches!(
        JobSpec::from_rsl_text("&(count=4)~"),
        Err(RslError::Parse(_))
    ));
    assert!(JobSpec::from_rsl_text("&(executable=\"/bin/a\")").is_ok());
}
