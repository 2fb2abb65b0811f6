//! The differential test against the official compiler (`@powersync/service-sync-rules`, the
//! version `e2e/package.json` pins): every case of the corpus — sync configs, rows in
//! PostgreSQL text and requests — is evaluated by the official package in Node
//! (`e2e/oracle/evaluate.mjs`) and by this crate, and compared field by field: whether the
//! config compiles, each row's bucket memberships (bucket, object type, id, the exact `data`
//! text), and each request's bucket set (name, priority, reasons) and failed subscriptions.
//! Bucket names compare without a history prefix (`BucketVersion::Unversioned` here, the
//! default hydration state there).
//!
//! The corpus is the hand-written cases (`cases`: every feature of the language and the
//! examples of the official documentation) and generated ones (`generate`: random expressions
//! over random typed rows, random claims and subscriptions). A case may carry a
//! [`Difference`]: a deliberate one (the official evaluator throws or is wrong) or a feature
//! not built yet; the test then checks the difference is still exactly that, so the list
//! cannot go stale.

mod cases;
mod compare;
mod dates;
mod edition3;
mod events;
mod generate;
mod geometry;
mod warnings;
mod wildcard;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// One case of the corpus.
pub struct Case {
    /// What it exercises: `feature/detail` (the first part counts the corpus by feature).
    pub name: String,
    pub yaml: String,
    pub rows: Vec<Row>,
    pub requests: Vec<Request>,
    /// Where this crate deliberately or knowingly differs.
    pub difference: Option<Difference>,
}

/// A source row: `public.<table>`, columns in table order as `(name, type, text)`.
pub struct Row {
    pub table: String,
    pub columns: Vec<(String, String, Option<String>)>,
}

/// A sync request: JWT claims, client parameters and subscriptions.
#[derive(Clone)]
pub struct Request {
    pub claims: Value,
    pub parameters: Value,
    pub include_defaults: bool,
    /// `(stream, subscription parameters, priority override)`.
    pub subscriptions: Vec<(String, Value, Option<u8>)>,
}

/// Why a case's results differ from the official ones, and how.
pub struct Difference {
    /// What differs, in the comparison's words (`compile`, `row 0`, `request 1`).
    pub part: &'static str,
    pub why: &'static str,
}

impl Case {
    pub fn new(name: impl Into<String>, yaml: impl Into<String>) -> Self {
        Case {
            name: name.into(),
            yaml: yaml.into(),
            rows: Vec::new(),
            requests: Vec::new(),
            difference: None,
        }
    }

    pub fn row(mut self, table: &str, columns: &[(&str, &str, Option<&str>)]) -> Self {
        self.rows.push(Row {
            table: table.to_string(),
            columns: columns
                .iter()
                .map(|(n, t, v)| (n.to_string(), t.to_string(), v.map(str::to_string)))
                .collect(),
        });
        self
    }

    pub fn request(mut self, r: Request) -> Self {
        self.requests.push(r);
        self
    }

    pub fn differs(mut self, part: &'static str, why: &'static str) -> Self {
        self.difference = Some(Difference { part, why });
        self
    }

    fn to_json(&self) -> Value {
        json!({
            "yaml": self.yaml,
            "rows": self.rows.iter().map(|r| json!({"table": r.table, "columns": r.columns})).collect::<Vec<_>>(),
            "requests": self.requests.iter().map(|q| json!({
                "claims": q.claims,
                "parameters": q.parameters,
                "include_defaults": q.include_defaults,
                "subscriptions": q.subscriptions.iter().map(|(s, p, o)| json!({"stream": s, "parameters": p, "priority": o})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

impl Request {
    /// A request with these claims, no client parameters, defaults included.
    pub fn claims(claims: Value) -> Self {
        Request {
            claims,
            parameters: json!({}),
            include_defaults: true,
            subscriptions: Vec::new(),
        }
    }

    pub fn params(mut self, parameters: Value) -> Self {
        self.parameters = parameters;
        self
    }

    pub fn subscribe(mut self, stream: &str, parameters: Value) -> Self {
        self.subscriptions
            .push((stream.to_string(), parameters, None));
        self
    }

    pub fn subscribe_at(mut self, stream: &str, parameters: Value, priority: u8) -> Self {
        self.subscriptions
            .push((stream.to_string(), parameters, Some(priority)));
        self
    }

    pub fn no_defaults(mut self) -> Self {
        self.include_defaults = false;
        self
    }
}

fn e2e() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../e2e"))
}

/// Runs the corpus through the official package; one result per case.
fn official(corpus: &[Case]) -> Vec<Value> {
    let node = e2e().join("node_modules/.bin/node");
    let package = e2e().join("node_modules/@powersync/service-sync-rules/package.json");
    assert!(
        node.exists() && package.exists(),
        "the oracle is not installed: {} or {} is missing; run e2e/install.sh (scripts/setup.sh does)",
        node.display(),
        package.display()
    );
    let input = Value::Array(corpus.iter().map(Case::to_json).collect()).to_string();
    let mut child = Command::new(&node)
        .arg(e2e().join("oracle/evaluate.mjs"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("node output");
    writer.join().expect("writer").expect("write corpus");
    assert!(
        out.status.success(),
        "the oracle failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).expect("oracle JSON");
    assert_eq!(results.len(), corpus.len(), "one oracle result per case");
    results
}

fn corpus() -> Vec<Case> {
    let mut all = cases::all();
    all.extend(wildcard::all());
    all.extend(dates::all());
    all.extend(geometry::all());
    all.extend(edition3::all());
    all.extend(events::all());
    all.extend(generate::all(0x5eed_2026));
    all.extend(warnings::all());
    all
}

#[test]
fn the_official_compiler_agrees_with_this_crate_on_the_corpus() {
    let corpus = corpus();
    let official = official(&corpus);
    let mut failures = Vec::new();
    let mut by_feature = std::collections::BTreeMap::<String, (usize, usize)>::new();
    let mut warned = std::collections::BTreeMap::<String, usize>::new();
    for (case, theirs) in corpus.iter().zip(&official) {
        let ours = compare::evaluate(case);
        for w in ours["warnings"].as_array().into_iter().flatten() {
            let code = w
                .as_str()
                .unwrap_or_default()
                .split(' ')
                .next()
                .unwrap_or_default();
            *warned.entry(code.to_string()).or_default() += 1;
        }
        let found = compare::differences(&ours, theirs);
        let feature = case.name.split('/').next().unwrap_or_default().to_string();
        let tally = by_feature.entry(feature).or_default();
        tally.0 += 1;
        match (&case.difference, found.first()) {
            (None, None) => {}
            (None, Some(_)) => failures.push(compare::report(case, &found)),
            (Some(d), Some((part, _))) if *part == d.part => tally.1 += 1,
            (Some(d), _) => failures.push(format!(
                "case `{}` is listed as differing in {} ({}), but the differences are now {:?}: \
                 update or remove its difference",
                case.name, d.part, d.why, found
            )),
        }
    }
    println!("corpus: {} cases", corpus.len());
    for (feature, (n, differing)) in &by_feature {
        println!("  {feature}: {n} cases, {differing} with a listed difference");
    }
    println!("warnings reported here (and compared):");
    for (code, n) in &warned {
        println!("  {code}: {n}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases disagree with the official compiler:\n\n{}",
        failures.len(),
        corpus.len(),
        failures.join("\n\n")
    );
}
