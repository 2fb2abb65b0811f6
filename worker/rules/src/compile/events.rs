//! `event_definitions`: named replication events, each a list of payload queries that read
//! columns of one table's rows. The official open-source service evaluates them into
//! events that no part of it consumes (custom write checkpoints belong to the hosted
//! service); here they are compiled and checked as the official compiler checks them,
//! and have no effect (`docs/sync-rules.md`, "Event definitions").

use super::from_items;
use super::select_list::row_projection;
use crate::error::RulesError;
use crate::options::Compatibility;
use crate::plan::TableRef;
use crate::sql::parse::parse_select;
use crate::sql::scope::{RequestStyle, Scope};
use crate::sql::QueryCtx;
use crate::yaml::RawEvent;

/// What errors call an event definition.
const KIND: &str = "event definition";

/// A compiled `event_definitions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventDefinition {
    /// The event's name.
    pub name: String,
    /// The table each payload query reads, in order (wildcards as written).
    pub tables: Vec<TableRef>,
}

/// Compiles one event: each payload query selects row values (no request values, no
/// `id` needed) from exactly one table; its `WHERE`, which the official evaluator does
/// not apply, is not checked either.
pub(crate) fn compile(
    event: &RawEvent,
    compat: Compatibility,
) -> Result<EventDefinition, RulesError> {
    let mut tables = Vec::with_capacity(event.payloads.len());
    for (i, sql) in event.payloads.iter().enumerate() {
        let ctx = QueryCtx::new(KIND, &event.name, format!("payloads[{i}]"), sql, compat);
        let select = parse_select(&ctx, sql)?;
        let from = from_items(&ctx, &select)?;
        let table = match from.as_slice() {
            [t] => t.clone(),
            [] => {
                return Err(ctx.err(
                    select.select_token.0.span,
                    "an event payload query needs FROM <table>",
                    "`SELECT <columns> FROM <table>`",
                ))
            }
            [_, second, ..] => {
                return Err(ctx.err(
                    second.span,
                    "an event payload query reads exactly one table",
                    "one payload query per table",
                ))
            }
        };
        let mut scope = Scope {
            table_qualifiers: [Some(table.table.name.clone()), table.alias.clone()]
                .into_iter()
                .flatten()
                .collect(),
            has_table: true,
            ref_qualifiers: Vec::new(),
            request: RequestStyle::Forbidden,
            slots: Vec::new(),
        };
        row_projection(&ctx, &mut scope, &select, false)?;
        tables.push(table.table);
    }
    Ok(EventDefinition {
        name: event.name.clone(),
        tables,
    })
}
