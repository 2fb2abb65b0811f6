//! Shared helpers for the rules tests: fixture rows rebuilt from the shared data.sql formulas.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use md5::{Digest, Md5};
use rules::{OwnedSourceRow, PgType, RowEvaluation, SyncRules};

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../e2e/fixture");

/// xorshift64*: small, deterministic, good enough for input generation; a seed reproduces
/// a failing case.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

pub fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()
}

pub fn ty(name: &str) -> PgType {
    PgType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"))
}

pub fn eval(rules: &SyncRules, row: &OwnedSourceRow) -> RowEvaluation {
    let cols = row.source_columns();
    let plan = rules
        .plan_for(&row.schema, &row.table)
        .unwrap_or_else(|| panic!("no plan for {}", row.table));
    plan.evaluate(&row.view(&cols)).unwrap()
}

/// A `tasks` row in table column order (schema.sql).
#[allow(clippy::too_many_arguments)]
pub fn task_row(
    id: &str,
    org: &str,
    project: &str,
    owner: &str,
    title: &str,
    status: &str,
    priority: i64,
    assignee: &str,
    points: i64,
    updated_at: &str,
    summary: &str,
) -> OwnedSourceRow {
    OwnedSourceRow::new("public", "tasks")
        .column("id", ty("text"), Some(id))
        .column("org_id", ty("text"), Some(org))
        .column("project_id", ty("text"), Some(project))
        .column("owner_id", ty("text"), Some(owner))
        .column("title", ty("text"), Some(title))
        .column("status", ty("text"), Some(status))
        .column("priority", ty("int4"), Some(&priority.to_string()))
        .column("assignee_id", ty("text"), Some(assignee))
        .column("story_points", ty("int4"), Some(&points.to_string()))
        .column("updated_at", ty("timestamptz"), Some(updated_at))
        .column("summary", ty("text"), Some(summary))
}

fn md5_hex(s: &str) -> String {
    Md5::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Generated task `p.t` of data.sql (PostgreSQL prints the timestamptz as `+00`).
pub fn generated_task(p: u32, t: u32, users: u32) -> OwnedSourceRow {
    let status = if t.is_multiple_of(7) {
        "blocked"
    } else if t.is_multiple_of(5) {
        "done"
    } else if t.is_multiple_of(3) {
        "in_progress"
    } else {
        "todo"
    };
    task_row(
        &format!("task-org-001-{p:04}-{t:04}"),
        "org-001",
        &format!("project-org-001-{p:04}"),
        "user-org-001-0001",
        &format!("Task {p}.{t}"),
        status,
        i64::from((t - 1) % 5 + 1),
        &format!("user-org-001-{:04}", (p + t - 2) % users + 1),
        i64::from((t - 1) % 8 + 1),
        "2026-01-01 00:00:00+00",
        &md5_hex(&format!("org-001:{p}:{t}")).repeat(3),
    )
}

/// Sentinel rows of data.sql.
pub fn sentinel(kind: &str) -> OwnedSourceRow {
    match kind {
        "update" => task_row(
            "task-sentinel-update-0001",
            "org-001",
            "project-org-001-0001",
            "user-org-001-0001",
            "Update sentinel benchmark row",
            "todo",
            2,
            "user-org-001-0001",
            2,
            "2026-01-01 00:00:00+00",
            "sentinel:update:1",
        ),
        "delete" => task_row(
            "task-sentinel-delete-0001",
            "org-001",
            "project-org-001-0001",
            "user-org-001-0001",
            "Delete sentinel benchmark row",
            "backlog",
            2,
            "user-org-001-0001",
            2,
            "2026-01-01 00:00:00+00",
            "sentinel:delete:1",
        ),
        _ => panic!("unknown sentinel {kind}"),
    }
}

/// Batch-delete sentinel `i` of data.sql (P projects, U users).
pub fn batch_sentinel(i: u32, projects: u32, users: u32) -> OwnedSourceRow {
    task_row(
        &format!("task-sentinel-batch-delete-{i:04}"),
        "org-001",
        &format!("project-org-001-{:04}", (i - 1) % projects + 1),
        "user-org-001-0001",
        &format!("Batch delete {i} benchmark row"),
        "backlog",
        i64::from(i % 5 + 1),
        &format!("user-org-001-{:04}", (i - 1) % users + 1),
        i64::from(i % 8 + 1),
        "2026-01-01 00:00:00+00",
        &format!("sentinel:batch-delete:{i}"),
    )
}

pub fn access_row(id: &str, user: &str, project: &str) -> OwnedSourceRow {
    OwnedSourceRow::new("public", "user_project_access")
        .column("id", ty("text"), Some(id))
        .column("user_id", ty("text"), Some(user))
        .column("org_id", ty("text"), Some("org-001"))
        .column("project_id", ty("text"), Some(project))
        .column("role", ty("text"), Some("member"))
        .column(
            "updated_at",
            ty("timestamptz"),
            Some("2026-01-01 00:00:00+00"),
        )
}
