//! CTEs no query reads (edition 3). A stream's queries see its own CTEs and the file's; a
//! stream CTE hides a file CTE of the same name (compared without case, as the official
//! compiler does), and CTEs do not read each other.

use std::ops::ControlFlow;

use sqlparser::ast::{ObjectName, ObjectNamePart, Visit, Visitor};

use super::{parsed, query_label, structural};
use crate::sql::{ident_name, QueryCtx};
use crate::warning::{RulesWarning, WarningKind};
use crate::yaml::RawRules;

/// The file's CTEs, then each stream's, that no query of their scope reads.
pub(super) fn unused(raw: &RawRules) -> Vec<RulesWarning> {
    let mut global_used = vec![false; raw.with.len()];
    let mut out = Vec::new();
    for s in &raw.streams {
        let mut local_used = vec![false; s.with.len()];
        for (k, sql) in s.queries.iter().enumerate() {
            let ctx = QueryCtx::new("stream", &s.name, query_label(s, k), sql, raw.compat);
            let Some(select) = parsed(&ctx) else { continue };
            for name in tables_read(&select) {
                let used = match position(&s.with, &name) {
                    Some(i) => local_used.get_mut(i),
                    None => position(&raw.with, &name).and_then(|i| global_used.get_mut(i)),
                };
                if let Some(used) = used {
                    *used = true;
                }
            }
        }
        for ((name, _), used) in s.with.iter().zip(local_used) {
            if !used {
                out.push(warning(name, "stream", &s.name, &format!("with.{name}")));
            }
        }
    }
    let mut globals: Vec<RulesWarning> = raw
        .with
        .iter()
        .zip(global_used)
        .filter(|(_, used)| !used)
        .map(|((name, _), _)| warning(name, "CTE", name, ""))
        .collect();
    globals.append(&mut out);
    globals
}

fn warning(name: &str, kind: &'static str, rule: &str, label: &str) -> RulesWarning {
    structural(
        WarningKind::UnusedCte,
        kind,
        rule,
        label,
        name,
        format!(
            "no query reads the CTE `{name}` (the official compiler: \"This common table \
             expression isn't referenced.\")"
        ),
        format!(
            "remove it, or read it: `FROM t, {name} WHERE ...` or `IN (SELECT ... FROM {name})`"
        ),
    )
}

/// The CTE of `ctes` named `name` (without case).
fn position(ctes: &[(String, String)], name: &str) -> Option<usize> {
    ctes.iter().position(|(n, _)| n.to_lowercase() == name)
}

/// The lower-cased names of the tables a query reads without schema, subqueries' included.
fn tables_read(select: &sqlparser::ast::Select) -> Vec<String> {
    struct Names(Vec<String>);
    impl Visitor for Names {
        type Break = ();
        fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<()> {
            if let [ObjectNamePart::Identifier(id)] = relation.0.as_slice() {
                self.0.push(ident_name(id).to_lowercase());
            }
            ControlFlow::Continue(())
        }
    }
    let mut names = Names(Vec::new());
    let _ = select.visit(&mut names);
    names.0
}
