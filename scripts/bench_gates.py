#!/usr/bin/env python3
"""Correctness gates of scripts/bench.sh, checked against the primary in the same run.

  bench_gates.py PORT SECRET PSQL... -> JSON: what was checked; exits non-zero on the first
                                        difference

1. The target user's routed buckets (`tasks_by_auth_project`, one per project the user has
   an access row for): the bucket set, each bucket's row ids, every row's data compared
   field by field with the primary's row, each bucket's count, and its checksum recomputed
   here from the received data with the spec's formula (independent of the server's own
   arithmetic). Run right after the snapshot, when a bucket holds only PUTs.
2. The authorization probe: a user without access rows gets no project bucket and no data.
3. The churn transaction (fixture README): over the target user's projects, 10 inserts,
   10 updates (t = 1..10) and 10 deletes (t = 11..20) per project in one transaction; the
   open client must then hold exactly the primary's rows again (its PUTs and REMOVEs).

Only the standard library; shares the stream client and tokens with bench_stream.py.
"""
import datetime
import hashlib
import json
import sys
import time

from bench_stream import Psql, Stream, token

TARGET_USER = "user-org-001-0001"
OUTSIDER = "user-benchmark-no-access"
PREFIX = "tasks_by_auth_project|0"  # without the tag (bench_stream keeps names so)
BODY = {
    "buckets": [],
    "include_checksum": True,
    "raw_data": True,
    "streams": {
        "include_defaults": False,
        "subscriptions": [{"stream": "tasks_by_auth_project", "parameters": {}}],
    },
}
CHURN_SECONDS = 60
COLUMNS = ["id", "org_id", "project_id", "title", "status", "priority", "assignee_id",
           "story_points", "updated_at", "summary"]


def fail(message: str) -> None:
    sys.exit(f"gate failed: {message}")


def put_checksum(object_type: str, object_id: str, data: str) -> int:
    digest = hashlib.sha256(f"put.{object_type}.{object_id}.{data}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def same_value(column: str, got, want) -> bool:
    if column == "updated_at":
        parse = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
        return parse(got) == parse(want)
    return got == want


def primary_rows(db: Psql, projects: list) -> dict:
    """project id -> {task id -> row dict}, as the primary has them now."""
    quoted = ",".join("'" + p.replace("'", "''") + "'" for p in projects) or "NULL"
    lines = db.run(
        f"SELECT row_to_json(t) FROM (SELECT {', '.join(COLUMNS)} FROM tasks "
        f"WHERE project_id IN ({quoted})) t"
    )
    out = {p: {} for p in projects}
    for line in lines:
        row = json.loads(line)
        out[row["project_id"]][row["id"]] = row
    return out


def bucket_of(project: str) -> str:
    return f'{PREFIX}["{project}"]'


def compare_rows(stream: Stream, expected: dict, check_sums: bool):
    """Checks the client's buckets against the primary's rows: (rows checked, None) or
    (0, the first difference)."""
    want_buckets = {bucket_of(p) for p in expected}
    if set(stream.announced) != want_buckets:
        return 0, (f"bucket set {sorted(stream.announced)[:5]}... differs from the primary's "
                   f"{sorted(want_buckets)[:5]}...")
    checked = 0
    for project, rows in expected.items():
        bucket = bucket_of(project)
        got = stream.rows.get(bucket, {})
        if set(got) != set(rows):
            missing = sorted(set(rows) - set(got))[:3]
            extra = sorted(set(got) - set(rows))[:3]
            return 0, f"{bucket}: {len(got)} rows, primary has {len(rows)} (missing {missing}, extra {extra})"
        total = 0
        for task_id, data in got.items():
            row = json.loads(data)
            for column in COLUMNS:
                if not same_value(column, row.get(column), rows[task_id][column]):
                    return 0, (f"{bucket} {task_id}.{column}: {row.get(column)!r} "
                               f"!= primary {rows[task_id][column]!r}")
            total = (total + put_checksum("tasks", task_id, data)) & 0xFFFFFFFF
            checked += 1
        if check_sums:
            if total != stream.announced[bucket]:
                return 0, (f"{bucket}: checksum recomputed from the rows {total} "
                           f"!= announced {stream.announced[bucket]}")
            if stream.counts.get(bucket) != len(rows):
                return 0, f"{bucket}: announced count {stream.counts.get(bucket)} != {len(rows)} rows"
    return checked, None


def churn_sql(projects: list) -> str:
    statements = ["BEGIN"]
    for project in projects:
        p = project.rsplit("-", 1)[1]
        updated = ", ".join(f"'task-org-001-{p}-{t:04d}'" for t in range(1, 11))
        deleted = ", ".join(f"'task-org-001-{p}-{t:04d}'" for t in range(11, 21))
        for t in range(1, 11):
            statements.append(
                "INSERT INTO tasks VALUES ("
                f"'task-churn-{p}-{t:04d}', 'org-001', '{project}', '{TARGET_USER}', 'Churn {p}.{t}', "
                f"'todo', 1, '{TARGET_USER}', 3, '2026-02-01T00:00:00Z', 'churn')"
            )
        statements.append(
            "UPDATE tasks SET title = title || ' (churned)', story_points = story_points + 1 "
            f"WHERE id IN ({updated})"
        )
        statements.append(f"DELETE FROM tasks WHERE id IN ({deleted})")
    statements.append("COMMIT")
    return ";\n".join(statements)


def main() -> None:
    port, secret, psql_argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    db = Psql(psql_argv)
    projects = db.run(
        f"SELECT project_id FROM user_project_access WHERE user_id = '{TARGET_USER}' ORDER BY 1"
    )
    expected = primary_rows(db, projects)

    stream = Stream(port, token(secret, TARGET_USER), BODY)
    if stream.status != 200:
        fail(f"target user: HTTP {stream.status}")
    stream.until_complete()
    rows_checked, problem = compare_rows(stream, expected, check_sums=True)
    if problem:
        fail(problem)

    outsider = Stream(port, token(secret, OUTSIDER), BODY)
    if outsider.status != 200:
        fail(f"authorization probe: HTTP {outsider.status}")
    outsider.until_complete()
    if outsider.announced or any(outsider.rows.values()):
        fail(f"authorization probe: a user without access got {sorted(outsider.announced)[:3]}")
    outsider.conn.close()

    # The churn, through the same open connection: each checkpoint the client completes
    # is compared; the transaction must show within CHURN_SECONDS.
    db.run(churn_sql(projects))
    expected = primary_rows(db, projects)
    deadline = time.time() + CHURN_SECONDS
    while True:
        stream.until_complete()
        churn_checked, problem = compare_rows(stream, expected, check_sums=False)
        if problem is None:
            break
        if time.time() > deadline:
            fail(f"after the churn transaction: {problem}")
    stream.conn.close()
    db.close()
    print(json.dumps({
        "gate_target_buckets": len(projects),
        "gate_rows_checked": rows_checked,
        "gate_authorization": "no buckets",
        "gate_churn_projects": len(projects),
        "gate_churn_rows_checked": churn_checked,
    }))


if __name__ == "__main__":
    main()
