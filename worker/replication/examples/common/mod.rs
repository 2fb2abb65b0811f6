//! Fixture-shaped `tasks` rows for the cost examples: the columns and COPY text lines like
//! `e2e/fixture/data.sql` generates.

use rules::PgType;

/// The `tasks` columns and their type OIDs.
pub const COLUMNS: [(&str, u32); 11] = [
    ("id", 25),
    ("org_id", 25),
    ("project_id", 25),
    ("owner_id", 25),
    ("title", 25),
    ("status", 25),
    ("priority", 23),
    ("assignee_id", 25),
    ("story_points", 23),
    ("updated_at", 1184),
    ("summary", 25),
];

/// The column types.
pub fn types() -> Vec<PgType> {
    COLUMNS
        .iter()
        .map(|(_, oid)| PgType::from_oid(*oid))
        .collect()
}

/// `rows` COPY text lines (without newline), 1,000 tasks per project.
pub fn copy_lines(rows: usize) -> Vec<String> {
    (0..rows)
        .map(|i| {
            let (p, t) = (i / 1000 + 1, i % 1000 + 1);
            format!(
                "task-org-001-{p:04}-{t:04}\torg-001\tproject-org-001-{p:04}\tuser-org-001-0001\tTask {p}.{t}\ttodo\t{}\tuser-org-001-{:04}\t{}\t2026-01-01 00:00:00+00\t{}",
                (t - 1) % 5 + 1, (p + t) % 1024 + 1, (t - 1) % 8 + 1, format!("{:032x}", i * 7919).repeat(3)
            )
        })
        .collect()
}

/// The rows argument of an example (default `default`).
pub fn rows_arg(default: usize) -> usize {
    std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// The source columns of one decoded line.
pub fn source_columns<'a>(
    fields: &source::Fields<'a>,
    types: &[PgType],
) -> Vec<rules::SourceColumn<'a>> {
    COLUMNS
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, ((name, _), t))| rules::SourceColumn {
            name,
            pg_type: *t,
            value: fields.get_str(i),
        })
        .collect()
}

/// The `tasks` source row of `columns`.
pub fn tasks_row<'a>(columns: &'a [rules::SourceColumn<'a>]) -> rules::SourceRow<'a> {
    rules::SourceRow {
        schema: "public",
        table: "tasks",
        columns,
    }
}
