//! `POST /api/admin/v1/diagnostics`: the connection to the primary, the served sync config
//! and the one being deployed, in the official `DiagnosticsResponse` shape, from the
//! replica's status and a live look at the primary (its slots' WAL budget, the tables).

use serde_json::{json, Value};

use super::sync_rules_status::{live_tables, table_errors, warnings};
use super::{connect, problem, AdminApi, ConfigInUse, SyncConfigs, ADMIN_DEADLINE};
use super::{CONNECTION_ID, CONNECTION_TAG};
use config::SourceConnection;
use source::SlotBudget;
use status::{iso_time, Status};

/// The official service warns when this share of `max_slot_wal_keep_size` or less is left.
const LOW_WAL_BUDGET_PERCENT: i64 = 50;

/// What the primary says of the two slots, or why it could not be asked.
struct Live {
    connected: Result<(), String>,
    active: Option<SlotBudget>,
    deploying: Option<SlotBudget>,
    /// Why a slot's budget could not be read, though the primary answered.
    unread: Vec<String>,
}

pub(super) async fn diagnostics(
    api: &AdminApi,
    configs: &SyncConfigs,
    include_content: bool,
) -> Value {
    let status = api.status.snapshot();
    let live = read_live(&api.source, configs).await;
    let mut connection_errors: Vec<Value> = live
        .unread
        .iter()
        .map(|message| problem("warning", message.clone()))
        .collect();
    if let Err(message) = &live.connected {
        connection_errors.push(problem("fatal", message.clone()));
    }
    let mut out = json!({
        "connections": [{
            "id": CONNECTION_ID,
            "postgres_uri": display_uri(&api.source),
            "connected": live.connected.is_ok(),
            "errors": connection_errors,
        }],
    });
    if let Some(active) = &configs.active {
        let mut section =
            config_status(&api.source, active, live.active.as_ref(), include_content).await;
        section["connections"][0]["initial_replication_done"] = json!(status.served.is_some());
        section["connections"][0]["replication_lag_seconds"] = json!(api.lag_seconds());
        add_served_progress(&mut section, &status);
        if let Some(quiet) = quiet_for(&status, status::unix_now()) {
            push_error(&mut section, quiet);
        }
        out["active_sync_rules"] = section;
    }
    if let Some(deploying) = &configs.deploying {
        let mut section = config_status(
            &api.source,
            deploying,
            live.deploying.as_ref(),
            include_content,
        )
        .await;
        if let Some(error) = status.deploy.as_ref().and_then(|d| d.last_error.as_ref()) {
            push_error(
                &mut section,
                problem(level(error.needs_operator), &error.message),
            );
        }
        out["deploying_sync_rules"] = section;
    }
    out
}

async fn read_live(source: &SourceConnection, configs: &SyncConfigs) -> Live {
    let read = async {
        let client = connect(source).await?;
        let mut unread = Vec::new();
        let active = budget_of(&client, configs.active.as_ref(), &mut unread).await;
        let deploying = budget_of(&client, configs.deploying.as_ref(), &mut unread).await;
        Ok::<_, String>((active, deploying, unread))
    };
    match tokio::time::timeout(ADMIN_DEADLINE, read).await {
        Ok(Ok((active, deploying, unread))) => Live {
            connected: Ok(()),
            active,
            deploying,
            unread,
        },
        Ok(Err(message)) => Live {
            connected: Err(message),
            active: None,
            deploying: None,
            unread: Vec::new(),
        },
        Err(_) => Live {
            connected: Err(format!(
                "the primary did not answer within {}s",
                ADMIN_DEADLINE.as_secs()
            )),
            active: None,
            deploying: None,
            unread: Vec::new(),
        },
    }
}

/// The WAL budget of `config`'s slot; a query that failed is noted in `unread`.
async fn budget_of(
    client: &tokio_postgres::Client,
    config: Option<&ConfigInUse>,
    unread: &mut Vec<String>,
) -> Option<SlotBudget> {
    let config = config?;
    match source::slot_budget(client, &config.slot).await {
        Ok(budget) => Some(budget),
        Err(e) => {
            unread.push(format!(
                "the WAL budget of slot {} could not be read: {e}",
                config.slot
            ));
            None
        }
    }
}

/// One config's `SyncRulesStatus`: its slot and its budget, its tables as the primary has
/// them, its warnings.
async fn config_status(
    source: &SourceConnection,
    config: &ConfigInUse,
    budget: Option<&SlotBudget>,
    include_content: bool,
) -> Value {
    let tables = live_tables(source, &config.rules).await;
    let mut errors = table_errors(&tables);
    errors.extend(warnings(&config.rules));
    let mut connection = json!({
        "id": CONNECTION_ID,
        "tag": CONNECTION_TAG,
        "slot_name": config.slot,
        "initial_replication_done": false,
        "tables": tables,
    });
    if let Some(budget) = budget {
        if let Some(lag) = budget.lag_bytes {
            connection["replication_lag_bytes"] = json!(lag.max(0));
        }
        if let Some(wal_status) = &budget.wal_status {
            connection["wal_status"] = json!(wal_status);
        }
        if let Some(safe) = budget.safe_wal_size {
            connection["safe_wal_size"] = json!(safe);
        }
        if let Some(keep) = budget.max_slot_wal_keep_size {
            connection["max_slot_wal_keep_size"] = json!(keep);
        }
        errors.extend(budget_warning(budget));
        if !budget.exists {
            errors.push(problem(
                "warning",
                format!(
                    "the replication slot {} does not exist on the primary (yet)",
                    config.slot
                ),
            ));
        }
    }
    let mut section = json!({ "connections": [connection], "errors": errors });
    if include_content {
        section["content"] = json!(config.rules.text());
    }
    section
}

/// The official warning when half or less of `max_slot_wal_keep_size` is left.
pub(super) fn budget_warning(budget: &SlotBudget) -> Option<Value> {
    let (Some(safe), Some(keep)) = (budget.safe_wal_size, budget.max_slot_wal_keep_size) else {
        return None;
    };
    if keep <= 0 || budget.wal_status.as_deref() == Some("lost") {
        return None;
    }
    let percent = (safe.max(0) * 100 + keep / 2) / keep;
    (percent <= LOW_WAL_BUDGET_PERCENT).then(|| {
        problem(
            "warning",
            format!(
                "WAL budget is low: {percent}% remaining. The replication slot may be \
                 invalidated if WAL consumption continues at this rate. Consider increasing \
                 max_slot_wal_keep_size."
            ),
        )
    })
}

/// What the served generation's status adds: its position, when it last heard from the
/// primary and published, and what stops or slows its ingest.
fn add_served_progress(section: &mut Value, status: &Status) {
    let connection = &mut section["connections"][0];
    if let Some(served) = &status.served {
        connection["last_lsn"] = json!(served.lsn);
        connection["last_checkpoint_ts"] = json!(iso_time(served.since * 1000));
    }
    let replication = status.replication.as_ref();
    if let Some(heard) = replication.and_then(|r| r.source_heard_at) {
        connection["last_keepalive_ts"] = json!(iso_time(heard * 1000));
    }
    if connection.get("replication_lag_bytes").is_none() {
        if let Some(r) = replication {
            connection["replication_lag_bytes"] = json!(r.lag_bytes);
        }
    }
    let mut found = Vec::new();
    if let Some(error) = &status.last_error {
        found.push(problem(level(error.needs_operator), &error.message));
    }
    if !status.ingest.running {
        if let Some(why) = &status.ingest.stopped_because {
            found.push(problem(
                level(status.ingest.waiting_for_operator),
                format!("ingest stopped; what is served does not advance: {why}"),
            ));
        }
    }
    if let Some(r) = replication {
        if r.source_stalled {
            found.push(problem(
                "warning",
                "replication has heard nothing from the primary for longer than its bound; \
                 what is served does not advance",
            ));
        }
        if r.rebuilding {
            found.push(problem(
                "warning",
                "the slot was lost and the store is being rebuilt from a new one; what is \
                 served is stale until the rebuild ends",
            ));
        }
        if r.tables_gone > 0 {
            found.push(problem(
                "warning",
                format!(
                    "{} table(s) the sync config reads are gone from the primary; their rows \
                     left the buckets",
                    r.tables_gone
                ),
            ));
        }
    }
    for entry in found {
        push_error(section, entry);
    }
}

/// The official warning (after 5 minutes) or fatal error (after 15) when nothing was
/// replicated or heard from the primary for that long: the later of the served checkpoint's
/// publication and the last word from the primary, at `now` (Unix seconds).
pub(super) fn quiet_for(status: &Status, now: u64) -> Option<Value> {
    let checkpoint = status.served.as_ref().map(|s| s.since);
    let heard = status.replication.as_ref().and_then(|r| r.source_heard_at);
    let last = checkpoint.into_iter().chain(heard).max()?;
    let seconds = now.saturating_sub(last);
    let level = match seconds {
        s if s > QUIET_FATAL_SECONDS => "fatal",
        s if s > QUIET_WARNING_SECONDS => "warning",
        _ => return None,
    };
    Some(problem(
        level,
        format!("No replicated commit in more than {seconds}s"),
    ))
}

/// See [`quiet_for`].
const QUIET_WARNING_SECONDS: u64 = 5 * 60;
/// See [`quiet_for`].
const QUIET_FATAL_SECONDS: u64 = 15 * 60;

fn push_error(section: &mut Value, entry: Value) {
    if let Some(errors) = section["errors"].as_array_mut() {
        errors.push(entry);
    }
}

/// An error only the operator can fix is fatal; one the worker retries by itself, a
/// warning.
fn level(needs_operator: bool) -> &'static str {
    if needs_operator {
        "fatal"
    } else {
        "warning"
    }
}

/// The primary's address without its password, as the official diagnostics show it.
pub(super) fn display_uri(source: &SourceConnection) -> String {
    if source.is_unix_socket() {
        return format!(
            "postgresql://{}@/{}?host={}&port={}",
            source.username, source.database, source.host, source.port
        );
    }
    let host = if source.host.contains(':') {
        format!("[{}]", source.host)
    } else {
        source.host.clone()
    };
    format!(
        "postgresql://{}@{host}:{}/{}",
        source.username, source.port, source.database
    )
}
