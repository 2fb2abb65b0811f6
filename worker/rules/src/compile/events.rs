//! `event_definitions`: named replication events, each a list of payload queries that read
//! columns of one table's rows. The official open-source service evaluates them into
//! events that no part of it consumes (custom write checkpoints belong to the hosted
//! service); here they are compiled and checked as the official compiler checks them,
//! and have no effect (`docs/sync-rules.md`, "Event definitions").

use super::select_list::row_projection;
use super::{one_row_table, row_scope};
use crate::error::RulesError;
use crate::options::Compatibility;
use crate::plan::TableRef;
use crate::sql::parse::parse_select;
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
        let table = one_row_table(&ctx, &select, "an event payload query")?;
        let mut scope = row_scope(&table, Vec::new());
        row_projection(&ctx, &mut scope, &select, false)?;
        tables.push(table.table);
    }
    Ok(EventDefinition {
        name: event.name.clone(),
        tables,
    })
}
