#!/usr/bin/env python3
"""Membership moves under a connected client (scripts/bench.sh, PSM_BENCH_JOIN=1): what moving
a user from one project to another costs, against single-row updates in the user's bucket.

  bench_membership.py PORT SECRET LABEL UPDATES PSQL...   -> JSON, keys membership_LABEL_*

A user of its own, `user-benchmark-membership-LABEL`, gets one row in user_project_access,
for the fourth-last project of org 1, and a client subscribes as that user with the readiness
probe's request (tasks_by_auth_project only) and reads until it holds that project's bucket.
Then, with the same client:

- updates: UPDATES single-row UPDATEs of that project's tasks (round robin when the project
  has fewer rows), each its own transaction, committed one after another through one psql
  session; timed from the first COMMIT's return until the client holds the last one (a
  checkpoint covers a prefix of the primary's transactions: holding the last one, the client
  holds them all). The client reads on a thread of its own while the commits go on.
- moves: three single-row UPDATEs of the user's access row, each to the next of the last
  three projects of org 1 (T rows each: no batch sentinel there while D < P), each timed from
  its COMMIT's return until the client reached checkpoint_complete with the new project's
  bucket whole (its checksum as announced, every row the primary has) and without the
  old one.

The client's rows are compared with the primary's after each part. Only the standard library
and scripts/bench_stream.py.
"""
import json
import statistics
import sys
import threading
import time

from bench_stream import PROBE_BODY, Psql, Stream, project_bucket, token


def project_rows(db: Psql, project: str) -> dict:
    """The primary's task rows of `project`: id -> story_points."""
    out = db.run(f"SELECT json_object_agg(id, story_points) FROM tasks WHERE project_id = '{project}'")
    return json.loads(out[0]) if out and out[0] else {}


def held(stream: Stream, project: str) -> dict:
    """The client's rows of `project`'s bucket: id -> story_points."""
    rows = stream.rows.get(project_bucket(project), {})
    return {i: json.loads(data)["story_points"] for i, data in rows.items()}


def until_moved(stream: Stream, project: str, ids, old) -> None:
    """Reads checkpoints until the client holds `project`'s bucket whole (`ids`, the
    primary's rows) and no longer `old`'s bucket."""
    bucket = project_bucket(project)
    while True:
        stream.until_complete()
        if bucket not in stream.announced or (old and project_bucket(old) in stream.announced):
            continue
        # Its ops added up to the announced checksum (until_complete checks that).
        got = set(stream.rows.get(bucket, {}))
        if got != set(ids):
            sys.exit(f"membership: {bucket} complete with {len(got)} rows, the primary has {len(ids)}")
        return


def main() -> None:
    port, secret, label, updates = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    db = Psql(sys.argv[5:])
    user = f"user-benchmark-membership-{label}"
    access = f"access-{user}"
    # The fixture names projects project-org-001-0001 .. -P.
    last = int(db.run("SELECT max(project_id) FROM tasks WHERE org_id = 'org-001'")[0].rsplit("-", 1)[1])
    projects = [f"project-org-001-{n:04d}" for n in range(last - 3, last + 1)]
    first = projects[0]
    db.run(
        "INSERT INTO user_project_access (id, user_id, org_id, project_id, role, updated_at) "
        f"VALUES ('{access}', '{user}', 'org-001', '{first}', 'member', now())"
    )
    stream = Stream(port, token(secret, user), PROBE_BODY)
    if stream.status != 200:
        sys.exit(f"membership: HTTP {stream.status}")
    rows = project_rows(db, first)
    until_moved(stream, first, rows, None)

    # Single-row updates in the user's bucket, the client reading on a thread of its own.
    ids = sorted(rows)
    base = max(rows.values()) + 1
    target = (ids[(updates - 1) % len(ids)], base + updates - 1)
    seen = {}

    def follow():
        while True:
            stream.until_complete()
            data = stream.rows.get(project_bucket(first), {}).get(target[0])
            if data is not None and json.loads(data)["story_points"] == target[1]:
                seen["at"] = time.time()
                return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    committed = None
    for k in range(updates):
        db.run(f"UPDATE tasks SET story_points = {base + k} WHERE id = '{ids[k % len(ids)]}'")
        if committed is None:
            committed = time.time()
    commits_done = time.time()
    reader.join()
    updates_seconds = seen["at"] - committed
    if held(stream, first) != project_rows(db, first):
        sys.exit("membership: the client's rows differ from the primary's after the updates")

    # Moves: one UPDATE of the access row each.
    moves = []
    for old, new in zip(projects, projects[1:]):
        want = project_rows(db, new)
        db.run(f"UPDATE user_project_access SET project_id = '{new}' WHERE id = '{access}'")
        t0 = time.time()
        until_moved(stream, new, want, old)
        moves.append(time.time() - t0)
        if held(stream, new) != want:
            sys.exit(f"membership: the client's rows of {new} differ from the primary's")
    stream.conn.close()
    db.close()
    move = statistics.median(moves)
    key = f"membership_{label}"
    print(
        json.dumps(
            {
                f"{key}_updates": updates,
                f"{key}_updates_seconds": round(updates_seconds, 3),
                f"{key}_updates_commits_seconds": round(commits_done - committed, 3),
                f"{key}_move_rows": len(want),
                f"{key}_moves": len(moves),
                f"{key}_move_seconds": round(move, 4),
                f"{key}_move_seconds_max": round(max(moves), 4),
                f"{key}_move_over_updates": round(move / updates_seconds, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
