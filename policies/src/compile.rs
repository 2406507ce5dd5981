//! Parsing every expression of a file into CEL ASTs, and the static analysis of them: which
//! `[let]` names each uses (cycles refused) and which variables each reads, directly or
//! through lets (so the broker can cache host-only results per report).
//!
//! The `cel` parser (ANTLR) is recursive and stack-hungry: parsing (the TOML too) runs on
//! the parser thread ([`crate::parse_thread`], [`PARSE_STACK`] bytes of stack), never on the
//! caller's (a tokio worker), and nesting is capped at [`MAX_DEPTH`]. Evaluation recurses over the syntax tree on the caller's
//! stack, so the tree's depth, counting the lets an expression uses, is capped too
//! ([`MAX_TREE_DEPTH`]): `1 + 1 + … + 1`, `host.a.b.c…` and a chain of lets nest one level
//! per term without nesting in the parser.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, OnceLock},
};

use cel::{common::ast::SourceInfo, parser::Parser, IdedExpr};

use crate::{
    ast, cost,
    error::KeyError,
    fast,
    hooks::{Hook, Var},
    inline::Inliner,
    parse_thread::{self, ThreadError},
    source::{self, Entry, RawPolicy, SourceError},
};

/// Deepest nesting of an expression (parentheses, calls, operators) the parser accepts.
pub const MAX_DEPTH: u16 = 32;

/// Deepest syntax tree an expression may have, with the trees of the lets it uses (they
/// are evaluated inside it): what evaluation on a 2 MiB stack (a tokio worker's, a debug
/// build's test thread) takes with room to spare.
pub const MAX_TREE_DEPTH: usize = 32;

/// Longest expression (bytes) the parser is given. The parser's depth cap counts nested
/// expressions, not chains: `host.x.x…`, `1 + 1 + …`, `a[0][0]…` nest one parse-tree level
/// per term, and the tree is walked and dropped recursively on the parser thread before the
/// tree-depth cap can refuse it. 100 000 selections (200 KB) overflowed its 64 MiB in a
/// debug build, 200 000 in a release build (SIGSEGV); at this cap, 32 700 of them, or of
/// `+1`, `<1`, `*1`, `[1]`, load in a debug build and are refused as too deep.
pub const MAX_EXPRESSION_BYTES: usize = 64 * 1024;

/// Stack of the parser thread: the ANTLR parser's frames are large in debug builds.
pub const PARSE_STACK: usize = parse_thread::STACK;

/// One parsed expression and what it reads.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub entry: Entry,
    pub expr: IdedExpr,
    /// What is evaluated: `expr` with the lets it uses once written in and selections on
    /// variables made indexes (same values and errors, faster: [`set_run_forms`]); an
    /// evaluation that fails is run again as written for its message ([`crate::eval`]).
    /// Everything that reads the expression's shape (fields, explain, costs) reads `expr`.
    pub run: IdedExpr,
    /// The lets it names directly.
    pub lets: BTreeSet<String>,
    /// The variables it reads, through its lets too.
    pub reads: BTreeSet<Var>,
    /// Where each node of `expr` is in the expression's source.
    pub offsets: SourceInfo,
    /// Its estimated cost with the lets it uses ([`cost`]).
    pub cost: u64,
    /// A let's index among the file's lets (its slot in an evaluation's memo); 0 for a hook.
    pub slot: usize,
    /// `run` without the `cel` interpreter, when it is made of what [`crate::fast`] evaluates.
    pub fast: Option<fast::Node>,
}

impl Compiled {
    /// The file position of node `id` of `expr` (`skip` characters further), else of the
    /// expression's start.
    pub fn node_pos(&self, id: u64, skip: usize) -> crate::error::Pos {
        let Some((start, _)) = self.offsets.offset_for(id) else {
            return self.entry.at;
        };
        let before: String = self
            .entry
            .source
            .chars()
            .take(start as usize + skip)
            .collect();
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        self.entry.file_pos(line, col)
    }
}

/// A file's parsed expressions, and the built-in defaults.
#[derive(Debug)]
pub(crate) struct CompiledPolicy {
    pub hooks: BTreeMap<Hook, Compiled>,
    /// Shared by every policy of the process ([`defaults`]).
    pub defaults: Arc<BTreeMap<Hook, Compiled>>,
    pub lets: BTreeMap<String, Compiled>,
}

/// Why a file could not be parsed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Its TOML.
    Source(SourceError),
    /// One of its expressions.
    Key(KeyError),
    /// The parser thread (not the file).
    Thread(ThreadError),
}

/// Parses a whole file (its TOML, then every expression) on the parser thread: deeply
/// nested TOML is as much a parser's recursion as nested CEL.
pub(crate) fn compile(text: &str) -> Result<CompiledPolicy, Failure> {
    let text = text.to_string();
    let parse = move || {
        let raw = source::read(&text).map_err(Failure::Source)?;
        compile_here(raw).map_err(Failure::Key)
    };
    parse_thread::run(parse).map_err(Failure::Thread)?
}

/// The built-in defaults, parsed by the first load of the process and shared by every
/// later one: they are the same constant text each time, and parsing them was most of the
/// time a small file took to load (the fuzz target `policy_file` measured 4.4 ms per
/// input, 72 % of it here).
static DEFAULTS: OnceLock<Arc<BTreeMap<Hook, Compiled>>> = OnceLock::new();

/// The parsed defaults ([`DEFAULTS`]). Called on the parser thread: parsing needs its stack.
fn defaults() -> Result<Arc<BTreeMap<Hook, Compiled>>, KeyError> {
    if let Some(parsed) = DEFAULTS.get() {
        return Ok(Arc::clone(parsed));
    }
    let parsed = Hook::ALL
        .into_iter()
        .filter_map(|h| h.default_source().map(|s| (h, s)))
        .map(|(h, source)| {
            let entry = Entry {
                key: h.key().to_string(),
                source: source.to_string(),
                at: Default::default(),
            };
            parse(entry).map(|c| (h, c))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    Ok(Arc::clone(DEFAULTS.get_or_init(|| Arc::new(parsed))))
}

fn compile_here(raw: RawPolicy) -> Result<CompiledPolicy, KeyError> {
    let defaults = defaults()?;
    let let_names: BTreeSet<String> = raw.lets.iter().map(|(n, _)| n.clone()).collect();
    let mut lets = BTreeMap::new();
    for (name, entry) in raw.lets {
        let mut c = parse(entry)?;
        c.lets.retain(|n| let_names.contains(n));
        lets.insert(name, c);
    }
    let mut hooks = BTreeMap::new();
    for (hook, entry) in raw.hooks {
        let mut c = parse(entry)?;
        c.lets.retain(|n| let_names.contains(n));
        hooks.insert(hook, c);
    }
    let order = let_order(&lets)?;
    check_tree_depths(&order, &lets, &hooks)?;
    check_costs(&order, &mut lets, &mut hooks)?;
    set_run_forms(&mut lets, &mut hooks);
    set_fast_forms(&order, &mut lets, &mut hooks);
    for (slot, c) in lets.values_mut().enumerate() {
        c.slot = slot;
    }
    for name in &order {
        let inherited = inherited_reads(&lets, &lets[name].lets);
        if let Some(c) = lets.get_mut(name) {
            c.reads.extend(inherited);
        }
    }
    for c in hooks.values_mut() {
        let inherited = inherited_reads(&lets, &c.lets);
        c.reads.extend(inherited);
    }
    Ok(CompiledPolicy {
        hooks,
        defaults,
        lets,
    })
}

/// Each expression's evaluated form ([`Compiled::run`]): the lets it uses once written in
/// ([`Inliner`]), then the selections on variables made indexes ([`ast::indexed`]). After
/// the costs: the charges the lets got are inlined with them.
fn set_run_forms(lets: &mut BTreeMap<String, Compiled>, hooks: &mut BTreeMap<Hook, Compiled>) {
    let mut inliner = Inliner::new(lets);
    let mut run = |c: &Compiled| ast::indexed(&inliner.inline(&c.expr));
    let let_runs: Vec<IdedExpr> = lets.values().map(&mut run).collect();
    let hook_runs: Vec<IdedExpr> = hooks.values().map(&mut run).collect();
    for (c, r) in lets.values_mut().zip(let_runs) {
        c.run = r;
    }
    for (c, r) in hooks.values_mut().zip(hook_runs) {
        c.run = r;
    }
}

/// Each expression's fast form ([`Compiled::fast`]), from its evaluated form (`order`: each
/// let after those it uses).
fn set_fast_forms(
    order: &[String],
    lets: &mut BTreeMap<String, Compiled>,
    hooks: &mut BTreeMap<Hook, Compiled>,
) {
    let mut fast_lets = BTreeMap::new();
    for name in order {
        let Some(c) = lets.get_mut(name) else {
            continue;
        };
        c.fast = fast::compile(&c.run, &fast_lets);
        if let Some(f) = &c.fast {
            fast_lets.insert(name.clone(), f.clone());
        }
    }
    for c in hooks.values_mut() {
        c.fast = fast::compile(&c.run, &fast_lets);
    }
}

fn inherited_reads(lets: &BTreeMap<String, Compiled>, used: &BTreeSet<String>) -> Vec<Var> {
    used.iter()
        .filter_map(|n| lets.get(n))
        .flat_map(|c| c.reads.iter().copied())
        .collect()
}

/// Every expression's tree depth, counting the deepest let it uses (`order`: each let after
/// those it uses), within [`MAX_TREE_DEPTH`].
fn check_tree_depths(
    order: &[String],
    lets: &BTreeMap<String, Compiled>,
    hooks: &BTreeMap<Hook, Compiled>,
) -> Result<(), KeyError> {
    let mut depths: BTreeMap<&str, usize> = BTreeMap::new();
    let with_lets = |c: &Compiled, depths: &BTreeMap<&str, usize>| {
        let below = c.lets.iter().filter_map(|n| depths.get(n.as_str())).max();
        ast::depth(&c.expr) + below.copied().unwrap_or(0)
    };
    let too_deep = |c: &Compiled, depth: usize| {
        c.entry.error(
            format!(
                "the expression nests {depth} levels deep with the lets it uses, deeper than \
                 {MAX_TREE_DEPTH}"
            ),
            "shorten it: each term of a chain such as `a + b + c` or `x.f.g` is one level, \
             and a let counts inside every expression that uses it",
        )
    };
    for name in order {
        let c = &lets[name];
        let depth = with_lets(c, &depths);
        if depth > MAX_TREE_DEPTH {
            return Err(too_deep(c, depth));
        }
        depths.insert(name, depth);
    }
    for c in hooks.values() {
        let depth = with_lets(c, &depths);
        if depth > MAX_TREE_DEPTH {
            return Err(too_deep(c, depth));
        }
    }
    Ok(())
}

/// Every expression's estimated cost, each use of a let counted at the let's own estimate
/// (`order`: each let after those it uses), within [`cost::MAX_COST`]; sets
/// [`Compiled::cost`].
fn check_costs(
    order: &[String],
    lets: &mut BTreeMap<String, Compiled>,
    hooks: &mut BTreeMap<Hook, Compiled>,
) -> Result<(), KeyError> {
    let mut own: BTreeMap<String, cost::Estimate> = BTreeMap::new();
    for name in order {
        let Some(c) = lets.get_mut(name) else {
            continue;
        };
        let (est, per_item) = estimate_of(c, &own)?;
        c.cost = over_budget(c, est.cost)?;
        cost::instrument(&mut c.expr, &per_item);
        own.insert(name.clone(), est);
    }
    for c in hooks.values_mut() {
        let (est, per_item) = estimate_of(c, &own)?;
        c.cost = over_budget(c, est.cost)?;
        cost::instrument(&mut c.expr, &per_item);
    }
    Ok(())
}

fn estimate_of(
    c: &Compiled,
    lets: &BTreeMap<String, cost::Estimate>,
) -> Result<(cost::Estimate, cost::PerItem), KeyError> {
    cost::estimate(&c.expr, &cost::Names { lets }).ok_or_else(|| {
        c.entry.error(
            "the expression is too complex to estimate its cost (comprehensions nested \
             too deeply)"
                .to_string(),
            "split it into named parts under [let]; see \"Cost\" in policies/README.md",
        )
    })
}

fn over_budget(c: &Compiled, cost: u64) -> Result<u64, KeyError> {
    if cost <= cost::MAX_COST {
        return Ok(cost);
    }
    let shown = if cost == u64::MAX {
        "unbounded".to_string()
    } else {
        cost.to_string()
    };
    Err(c.entry.error(
        format!(
            "the expression's estimated cost is {shown}, over the budget of {} (with the \
             uses of lets, each counted at the let's own cost)",
            cost::MAX_COST
        ),
        format!(
            "a comprehension (all, exists, map, filter) costs its list's size times its body, \
             an input list or string counts as {} elements, and each use of a let costs the \
             whole let; iterate over fewer or smaller lists, do not nest them, and name a \
             costly let once (see \"Cost\" in policies/README.md)",
            cost::INPUT_SIZE
        ),
    ))
}

/// Parses one expression; a syntax error points into the file.
fn parse(entry: Entry) -> Result<Compiled, KeyError> {
    if entry.source.len() > MAX_EXPRESSION_BYTES {
        return Err(entry.error(
            format!(
                "the expression is {} bytes long, longer than {MAX_EXPRESSION_BYTES}",
                entry.source.len()
            ),
            "split it into named parts under [let]",
        ));
    }
    let parsed = Parser::new()
        .max_recursion_depth(MAX_DEPTH)
        .parse_with_source_info(&entry.source);
    let (expr, offsets) = match parsed {
        Ok(parsed) => parsed,
        Err(errors) => return Err(syntax_error(&entry, &errors)),
    };
    let depth = ast::depth(&expr);
    if depth > MAX_TREE_DEPTH {
        return Err(entry.error(
            format!("the expression nests {depth} levels deep, deeper than {MAX_TREE_DEPTH}"),
            "shorten it: each term of a chain such as `a + b + c` or `x.f.g` is one level",
        ));
    }
    let refs = expr.references();
    let names = refs.variables();
    let reads = Var::ALL
        .into_iter()
        .filter(|v| names.contains(&v.name()))
        .collect();
    let lets = names.iter().map(|n| n.to_string()).collect();
    let run = ast::indexed(&expr);
    Ok(Compiled {
        entry,
        fast: fast::compile(&run, &BTreeMap::new()),
        run,
        expr,
        lets,
        reads,
        offsets,
        cost: 0,
        slot: 0,
    })
}

fn syntax_error(entry: &Entry, errors: &cel::ParseErrors) -> KeyError {
    let first = errors.errors.first();
    let too_deep = errors
        .errors
        .iter()
        .any(|e| e.msg.contains("Recursion limit"));
    let (line, col) = first.map_or((1, 1), |e| (to_usize(e.pos.0), to_usize(e.pos.1)));
    let (message, help) = if too_deep {
        (
            format!("the expression nests deeper than {MAX_DEPTH} levels"),
            "split it into named parts under [let]".to_string(),
        )
    } else {
        let msg = first.map_or("syntax error", |e| e.msg.as_str());
        (
            msg.replace("Syntax error: ", "syntax error: "),
            "the value is a CEL expression (https://github.com/google/cel-spec); \
             strings inside it use double quotes"
                .to_string(),
        )
    };
    KeyError {
        at: entry.file_pos(line, col),
        key: entry.key.clone(),
        message,
        help,
    }
}

fn to_usize(n: isize) -> usize {
    usize::try_from(n).unwrap_or(1).max(1)
}

/// The lets in an order where each comes after those it uses; a cycle is an error.
fn let_order(lets: &BTreeMap<String, Compiled>) -> Result<Vec<String>, KeyError> {
    let mut done: Vec<String> = Vec::new();
    let mut path: Vec<String> = Vec::new();
    for name in lets.keys() {
        visit(lets, name, &mut path, &mut done)?;
    }
    Ok(done)
}

fn visit(
    lets: &BTreeMap<String, Compiled>,
    name: &str,
    path: &mut Vec<String>,
    done: &mut Vec<String>,
) -> Result<(), KeyError> {
    if done.iter().any(|d| d == name) {
        return Ok(());
    }
    if let Some(start) = path.iter().position(|p| p == name) {
        let mut cycle = path[start..].to_vec();
        cycle.push(name.to_string());
        let first = &lets[&cycle[0]];
        return Err(first.entry.error(
            format!("the lets form a cycle: {}", cycle.join(" -> ")),
            "a let may use other lets, but never itself, directly or through others",
        ));
    }
    path.push(name.to_string());
    for used in &lets[name].lets {
        visit(lets, used, path, done)?;
    }
    path.pop();
    done.push(name.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Pos;

    fn compiled(text: &str) -> Result<CompiledPolicy, KeyError> {
        compile(text).map_err(|e| match e {
            Failure::Key(e) => e,
            other => panic!("expected an expression's error, got {other:?}"),
        })
    }

    #[test]
    fn reads_include_those_of_the_lets_used() {
        let c = compiled(
            "start = 'away && job.adaptive'\nrank = 'host.load1'\n\
             [let]\naway = 'idle > 300'\nidle = 'host.keyboard_idle_s'\n",
        )
        .expect("compiles");
        let start = &c.hooks[&Hook::Start];
        assert_eq!(start.reads, BTreeSet::from([Var::Host, Var::Job]));
        assert_eq!(c.hooks[&Hook::Rank].reads, BTreeSet::from([Var::Host]));
        assert_eq!(c.lets["away"].reads, BTreeSet::from([Var::Host]));
    }

    #[test]
    fn let_cycles_are_refused() {
        let e =
            compiled("start = 'a'\n[let]\na = 'b'\nb = 'c || a'\nc = 'true'\n").expect_err("cycle");
        assert_eq!(e.key, "let.a");
        assert!(e.message.contains("a -> b -> a"), "{}", e.message);
        let e = compiled("[let]\nme = 'me'\n").expect_err("self cycle");
        assert!(e.message.contains("me -> me"), "{}", e.message);
    }

    #[test]
    fn syntax_errors_point_into_the_file() {
        let e = compiled("# x\nvacate = 'host.up &&'\n").expect_err("syntax");
        assert_eq!(e.key, "vacate");
        // Line 2: the expression starts at column 11 and is 10 characters long; the parser
        // reports the end of input, its column 11, which is column 21 of the file.
        assert_eq!(e.at, Pos { line: 2, col: 21 });
        assert!(e.message.starts_with("syntax error"), "{}", e.message);
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let deep = format!("start = '{}true{}'\n", "(".repeat(500), ")".repeat(500));
        let e = compiled(&deep).expect_err("too deep");
        assert!(e.message.contains("nests deeper"), "{}", e.message);
        let fine = format!("start = '{}true{}'\n", "(".repeat(10), ")".repeat(10));
        compiled(&fine).expect("modest nesting parses");
    }

    /// Found by the `policy_file` fuzz target: chains that nest the tree, not the parser,
    /// overflowed the caller's stack when evaluated or dropped.
    #[test]
    fn long_chains_are_refused_not_a_stack_overflow() {
        let sum = format!("rank = '{}'\n", vec!["1"; 10_000].join(" + "));
        let e = compiled(&sum).expect_err("too deep");
        assert!(e.message.contains("nests 10000 levels"), "{}", e.message);
        let select = format!("start = 'host{}'\n", ".x".repeat(10_000));
        let e = compiled(&select).expect_err("too deep");
        assert!(e.message.contains("deeper than 32"), "{}", e.message);
        let mut lets = String::from("start = 'l0'\n[let]\n");
        for i in 0..3000 {
            lets.push_str(&format!("l{i} = 'l{}'\n", i + 1));
        }
        lets.push_str("l3000 = 'true'\n");
        let e = compiled(&lets).expect_err("too deep");
        assert!(e.message.contains("with the lets it uses"), "{}", e.message);
    }

    /// Found by replaying fuzz inputs with a smaller parser stack: a chain nests the parse
    /// tree one level per term, and 100 000 terms overflowed the parser thread's 64 MiB.
    #[test]
    fn an_expression_longer_than_the_cap_is_refused_before_parsing() {
        let select = format!("start = 'host{}'\n", ".x".repeat(100_000));
        let e = compiled(&select).expect_err("too long");
        assert_eq!(e.key, "start");
        assert_eq!(e.at, Pos { line: 1, col: 10 });
        assert!(
            e.message.contains("200004 bytes long, longer than 65536"),
            "{}",
            e.message
        );
        let at_cap = format!(
            "start = 'host{}'\n",
            ".x".repeat((MAX_EXPRESSION_BYTES - 4) / 2)
        );
        let e = compiled(&at_cap).expect_err("too deep");
        assert!(e.message.contains("levels deep"), "{}", e.message);
    }

    /// At the limit, loading (which evaluates every expression on the samples, on this
    /// test thread's 2 MiB stack, in a debug build) works.
    #[test]
    fn trees_at_the_depth_limit_load_and_evaluate() {
        let sum = vec!["1"; MAX_TREE_DEPTH].join(" + ");
        let text = format!("rank = '{sum}'\n");
        crate::Policy::from_text(std::path::Path::new("p.toml"), &text).expect("loads");
        // Lets of depth 2 each above a leaf: the limit (or one less), through lets.
        let n = (MAX_TREE_DEPTH - 1) / 2;
        let mut text = String::from("rank = 'l0'\n[let]\n");
        for i in 0..n {
            text.push_str(&format!("l{i} = 'l{} + 1'\n", i + 1));
        }
        text.push_str(&format!("l{n} = '1'\n"));
        crate::Policy::from_text(std::path::Path::new("p.toml"), &text).expect("loads");
    }
}
