#!/usr/bin/env python3
"""Client side of scripts/bench.sh: the readiness probe and the streaming measurements.

  bench_stream.py probe   PORT SECRET               -> JSON: when the probe request first
                                                       reached checkpoint_complete, its rows
  bench_stream.py churn   PORT SECRET PSQL... --     -> JSON: commit-to-checkpoint latency
                                                       (median, p99) and full-table rounds
  bench_stream.py migration PORT SECRET PSQL... --   -> JSON: a column no rule reads added
                                                       to tasks; the next commits' latency
  bench_stream.py recopy  PORT SECRET PSQL...       -> JSON: columns the rules read retyped
                                                       (outputs unchanged), then renamed away
                                                       (every output changed): time until the
                                                       table's re-copy is merged, ops written,
                                                       how long writes are held meanwhile
  bench_stream.py sentinel PORT SECRET VALUE         -> JSON: when a client connecting as soon
                                                       as the port answers held the sentinel
                                                       row with story_points VALUE

Only the standard library: tokens are HS256 JWTs signed here, the stream is read with
http.client, commits go through one long-lived psql process.
"""
import base64
import hashlib
import hmac
import http.client
import json
import os
import subprocess
import threading
import sys
import time

AUDIENCE = "powersync-user-value-benchmark"
PROBE_USER = "user-benchmark-readiness-probe"


def project_bucket(project: str) -> str:
    """The `tasks_by_auth_project` bucket of a project. Buckets are kept by their names
    without the tag before `#` (it derives from the replica's store history:
    docs/storage.md, "Bucket names")."""
    return f'tasks_by_auth_project|0["{project}"]'


PROBE_BUCKET = project_bucket("project-org-001-0001")


def untagged(name: str) -> str:
    """A bucket name without its tag: `by_list["l1"]` for `<tag>#by_list["l1"]`."""
    return name.split("#", 1)[1] if "#" in name else name
PROBE_BODY = {
    "buckets": [],
    "include_checksum": True,
    "raw_data": True,
    "streams": {
        "include_defaults": False,
        "subscriptions": [
            {"stream": "tasks_by_auth_project", "parameters": {}, "override_priority": None}
        ],
    },
}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(secret: str, sub: str, lifetime: int = 3600) -> str:
    now = int(time.time())
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "bench"}).encode())
    payload = b64(json.dumps({"sub": sub, "aud": AUDIENCE, "iat": now, "exp": now + lifetime}).encode())
    signing = f"{header}.{payload}".encode()
    sig = b64(hmac.new(secret.encode(), signing, hashlib.sha256).digest())
    return f"{header}.{payload}.{sig}"


class Stream:
    """One open /sync/stream response, read line by line (NDJSON)."""

    def __init__(self, port: int, tok: str, body: dict):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.conn.request(
            "POST",
            "/sync/stream",
            body=json.dumps(body),
            headers={
                "Authorization": f"Token {tok}",
                "Content-Type": "application/json",
                "Accept": "application/x-ndjson",
            },
        )
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.announced = {}
        self.counts = {}
        self.sums = {}
        self.rows = {}

    def line(self):
        raw = self.resp.readline()
        if not raw:
            raise EOFError("the stream ended")
        return json.loads(raw)

    def until_complete(self):
        """Reads to the next checkpoint_complete; checks every announced checksum."""
        while True:
            line = self.line()
            if "checkpoint" in line:
                cp = line["checkpoint"]
                self.announced = {
                    untagged(b["bucket"]): b["checksum"] & 0xFFFFFFFF for b in cp["buckets"]
                }
                self.counts = {untagged(b["bucket"]): b.get("count") for b in cp["buckets"]}
            elif "checkpoint_diff" in line:
                d = line["checkpoint_diff"]
                for name in d["removed_buckets"]:
                    self.announced.pop(untagged(name), None)
                    self.counts.pop(untagged(name), None)
                for b in d["updated_buckets"]:
                    self.announced[untagged(b["bucket"])] = b["checksum"] & 0xFFFFFFFF
                    self.counts[untagged(b["bucket"])] = b.get("count")
            elif "data" in line:
                d = line["data"]
                bucket = untagged(d["bucket"])
                rows = self.rows.setdefault(bucket, {})
                for op in d["data"]:
                    checksum = op["checksum"] & 0xFFFFFFFF
                    if op["op"] == "CLEAR":
                        rows.clear()
                        self.sums[bucket] = checksum
                        continue
                    self.sums[bucket] = (self.sums.get(bucket, 0) + checksum) & 0xFFFFFFFF
                    if op["op"] == "PUT":
                        rows[op["object_id"]] = op["data"]
                    elif op["op"] == "REMOVE":
                        rows.pop(op["object_id"], None)
            elif "checkpoint_complete" in line:
                for bucket, checksum in self.announced.items():
                    got = self.sums.get(bucket, 0)
                    if got != checksum:
                        raise AssertionError(f"checksum mismatch in {bucket}: {got} != {checksum}")
                return line


def probe(port: int, secret: str) -> None:
    tok = token(secret, PROBE_USER)
    while True:
        try:
            stream = Stream(port, tok, PROBE_BODY)
        except OSError:
            time.sleep(0.02)
            continue
        if stream.status == 200:
            break
        stream.conn.close()
        time.sleep(0.02)
    stream.until_complete()
    done = time.time()
    rows = stream.rows.get(PROBE_BUCKET, {})
    print(json.dumps({"ready_at": done, "rows": len(rows), "row_ids": sorted(rows)}))


def download_unparsed(port: int, tok: str, body: dict) -> tuple:
    """Reads a response's bytes up to the first checkpoint_complete line without decoding
    them: the time is the server's (plus loopback transfer), not the client's."""
    marker = b'{"checkpoint_complete"'
    started = time.time()
    stream = Stream(port, tok, body)
    if stream.status != 200:
        sys.exit(f"download: HTTP {stream.status}")
    total, tail = 0, b""
    while True:
        chunk = stream.resp.read1(1 << 20)
        if not chunk:
            sys.exit("download: the stream ended before checkpoint_complete")
        total += len(chunk)
        if marker in tail + chunk:
            break
        tail = chunk[-len(marker):]
    seconds = time.time() - started
    stream.conn.close()
    return seconds, total


DOWNLOAD_BODY = {
    "buckets": [],
    "raw_data": True,
    "streams": {"include_defaults": False, "subscriptions": [{"stream": "tasks", "parameters": {}}]},
}


def download_raw(port: int, secret: str) -> None:
    """Downloads the global `tasks` bucket (every task row) without decoding it."""
    seconds, total = download_unparsed(port, token(secret, "user-benchmark-download"), DOWNLOAD_BODY)
    print(json.dumps({"download_unparsed_seconds": round(seconds, 3), "download_bytes": total}))


def download(port: int, secret: str) -> None:
    """Downloads the global `tasks` bucket on a fresh connection, decoding every line and
    checking every checksum; times the request to its checkpoint_complete (client parsing
    included)."""
    started = time.time()
    stream = Stream(port, token(secret, "user-benchmark-download"), DOWNLOAD_BODY)
    if stream.status != 200:
        sys.exit(f"download: HTTP {stream.status}")
    stream.until_complete()
    seconds = time.time() - started
    rows = sum(len(r) for r in stream.rows.values())
    print(json.dumps({"download_rows": rows, "download_seconds": round(seconds, 3)}))


class Psql:
    """One psql session fed through stdin; `run` returns when the statements are done."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(
            argv + ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.n = 0

    def run(self, sql: str) -> list:
        """Runs `sql`; returns the lines it printed."""
        self.n += 1
        marker = f"done-{self.n}"
        self.proc.stdin.write(f"{sql};\nSELECT '{marker}';\n")
        self.proc.stdin.flush()
        printed = []
        while True:
            out = self.proc.stdout.readline()
            if not out:
                raise EOFError("psql ended")
            if out.strip() == marker:
                return printed
            printed.append(out.strip())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def percentile_ms(ordered, p: float) -> float:
    """The `p` quantile of ascending latencies in seconds, in milliseconds."""
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)


def churn(port: int, secret: str, psql_argv, commits: int, rounds: int) -> None:
    stream = Stream(port, token(secret, PROBE_USER), PROBE_BODY)
    stream.until_complete()
    db = Psql(psql_argv)
    # Latency: one single-row update per commit, from COMMIT's return to the client
    # holding the checkpoint that contains it (checkpoint_complete of its diff).
    latencies = []
    for i in range(commits):
        db.run(
            "UPDATE tasks SET priority = priority + 1 "
            f"WHERE id = 'task-sentinel-update-0001' /* {i} */"
        )
        t0 = time.time()
        stream.until_complete()
        latencies.append(time.time() - t0)
    latencies.sort()
    # Sustained: full-table update rounds, each one transaction; time until the client
    # holds the last one's checkpoint: the probe bucket's sentinel row shows the value the
    # primary has after the last round (a transaction is applied whole, so every row of
    # that round is in the same checkpoint).
    # The client reads on while the rounds run, on a thread of its own: a client that
    # stops reading is cut off by the server's write timeout (30 s), as it should be.
    final = {}
    reached = threading.Event()

    def follow():
        while not reached.is_set():
            stream.until_complete()
            want = final.get("story_points")
            if want is not None and sentinel_value(stream, "story_points") == want:
                reached.set()

    reader = threading.Thread(target=follow, daemon=True)
    t0 = time.time()
    if rounds:
        reader.start()
    for _ in range(rounds):
        db.run("UPDATE tasks SET story_points = story_points + 1")
    last = int(db.run("SELECT story_points FROM tasks WHERE id = 'task-sentinel-update-0001'")[0])
    final["story_points"] = last
    # The last round's checkpoint may have arrived before its value was known.
    while rounds and not reached.wait(0.05):
        if sentinel_value(stream, "story_points") == last:
            reached.set()
    seconds = time.time() - t0
    if rounds:
        reader.join(timeout=1)
    db.close()
    print(
        json.dumps(
            {
                "commits": commits,
                "commit_to_client_ms_median": percentile_ms(latencies, 0.5),
                "commit_to_client_ms_p99": percentile_ms(latencies, 0.99),
                "commit_to_client_ms_max": round(latencies[-1] * 1000, 2),
                "rounds": rounds,
                "rounds_seconds": round(seconds, 3),
            }
        )
    )


def migration(port: int, secret: str, psql_argv, commits: int) -> None:
    """A schema migration under a connected client: ALTER TABLE tasks ADD COLUMN (a column
    the fixture's rules do not read), then single-row commits of the table timed from
    COMMIT to the client holding their checkpoint, the first one apart: how long until
    clients see new writes again."""
    stream = Stream(port, token(secret, PROBE_USER), PROBE_BODY)
    stream.until_complete()
    db = Psql(psql_argv)
    t0 = time.time()
    db.run("ALTER TABLE tasks ADD COLUMN bench_note text DEFAULT 'none'")
    alter = time.time() - t0
    latencies = []
    for i in range(max(commits, 1)):
        db.run(
            "UPDATE tasks SET priority = priority + 1, bench_note = 'n' "
            f"WHERE id = 'task-sentinel-update-0001' /* migration {i} */"
        )
        t0 = time.time()
        stream.until_complete()
        latencies.append(time.time() - t0)
    db.close()
    first = latencies[0]
    rest = sorted(latencies[1:]) or [first]

    print(
        json.dumps(
            {
                "migration_alter_ms": round(alter * 1000, 2),
                "migration_first_commit_to_client_ms": round(first * 1000, 2),
                "migration_commits": len(latencies),
                "migration_commit_to_client_ms_median": percentile_ms(rest, 0.5),
                "migration_commit_to_client_ms_p99": percentile_ms(rest, 0.99),
            }
        )
    )


def metric(port: int, name: str) -> float:
    """The value of an unlabelled sample of GET /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    sys.exit(f"metric {name} not served")


def sentinel_value(stream: "Stream", field: str):
    """The probe bucket's sentinel row's `field` as the client holds it now (None without
    the row)."""
    data = stream.rows.get(PROBE_BUCKET, {}).get("task-sentinel-update-0001")
    return json.loads(data)[field] if data is not None else None


def until_sentinel(stream: "Stream", field: str, value, at_most: bool = False) -> None:
    """Reads the stream until the client holds the probe bucket's sentinel row with
    `field` equal to `value` (checkpoints published before that write may come first); with
    `at_most`, until it is `value` or less (a later write of descending values)."""
    while True:
        got = sentinel_value(stream, field)
        if got is not None and (got == value or (at_most and got <= value)):
            return
        stream.until_complete()


class Gauge(threading.Thread):
    """Polls an unlabelled gauge of GET /metrics every 20 ms: when it first rose above 0
    and when it was back at 0 after that."""

    def __init__(self, port: int, name: str, deadline: float):
        super().__init__(daemon=True)
        self.port, self.name, self.deadline = port, name, deadline
        self.rose = None
        self.fell = None

    def run(self):
        while True:
            value = metric(self.port, self.name)
            now = time.time()
            if value > 0 and self.rose is None:
                self.rose = now
            if value == 0 and self.rose is not None:
                self.fell = now
                return
            if self.rose is None and now > self.deadline:
                return
            time.sleep(0.02)


def recopy(port: int, secret: str, psql_argv) -> None:
    """Migrations of a column the rules read, each with one write of the table after it
    (the change reaches the worker with the table's next row change). The clients are held
    on the last checkpoint from before it until the re-copy is merged (docs/correctness.md,
    section 5): reports the time from that write's COMMIT until the connected client holds
    it (how long clients are held), the commit-to-client latency of single-row writes
    issued every 100 ms while the table is copied again (a write of any table waits for
    the merge alike), the time until the re-copy is merged (the gauge
    powersync_mdbx_tables_recopying back at 0), and the ops the worker wrote meanwhile
    (powersync_mdbx_ops_written_total)."""
    stream = Stream(port, token(secret, PROBE_USER), PROBE_BODY)
    stream.until_complete()
    db = Psql(psql_argv)
    out = {}
    steps = [
        ("recopy_retype", "ALTER TABLE tasks ALTER COLUMN title TYPE varchar(1000)"),
        ("recopy_rename", "ALTER TABLE tasks RENAME COLUMN summary TO summary_renamed"),
    ]
    write = 0
    for key, alter in steps:
        t0 = time.time()
        db.run(alter)
        out[f"{key}_alter_ms"] = round((time.time() - t0) * 1000, 2)
        ops_before = metric(port, "powersync_mdbx_ops_written_total")
        write += 1
        db.run(
            f"UPDATE tasks SET story_points = {-write} "
            f"WHERE id = 'task-sentinel-update-0001' /* {key} */"
        )
        committed = time.time()
        gauge = Gauge(port, "powersync_mdbx_tables_recopying", committed + 60)
        gauge.start()
        # Writes while the table is copied again, from a thread of their own: each timed
        # from its COMMIT until the client holds it.
        writer = Writer(psql_argv, gauge, write, key)
        writer.start()
        # The writes after it descend: holding one of them, the client holds this one.
        until_sentinel(stream, "story_points", -write, at_most=True)
        out[f"{key}_first_write_seconds"] = round(time.time() - committed, 3)
        # The client reads on while the writer writes: each write is timed when the client
        # first holds it (or a later one: values descend).
        during = []
        while writer.is_alive() or len(during) < len(writer.commits):
            if len(during) < len(writer.commits):
                value, at = writer.commits[len(during)]
                held = sentinel_value(stream, "story_points")
                if held is not None and held <= value:
                    during.append(time.time() - at)
                    continue
            elif not writer.is_alive():
                break
            stream.until_complete()
        writer.join()
        gauge.join()
        if gauge.rose is None:
            sys.exit(f"{key}: no re-copy started within 60 s")
        write = writer.last
        out[f"{key}_seconds"] = round(gauge.fell - committed, 3)
        # Until the stream decoded the write (after the ALTER's WAL) and the gauge rose;
        # the rest is the temporary slot, the copy and its merge.
        out[f"{key}_started_seconds"] = round(gauge.rose - committed, 3)
        out[f"{key}_ops"] = int(metric(port, "powersync_mdbx_ops_written_total") - ops_before)
        during.sort()
        out[f"{key}_writes_during"] = len(during)
        if during:
            out[f"{key}_write_to_client_ms_median"] = percentile_ms(during, 0.5)
            out[f"{key}_write_to_client_ms_max"] = round(during[-1] * 1000, 2)
    db.close()
    print(json.dumps(out))


class Writer(threading.Thread):
    """Writes the sentinel's story_points (-first-1, -first-2, ...) every 100 ms while
    `gauge` shows the re-copy running, and once after; keeps each timed value's COMMIT
    time (appended only: the reader reads the list while it grows)."""

    def __init__(self, psql_argv, gauge: "Gauge", first: int, key: str):
        super().__init__(daemon=True)
        self.psql_argv, self.gauge, self.last, self.key = psql_argv, gauge, first, key
        self.commits = []

    def run(self):
        db = Psql(self.psql_argv)
        while True:
            running = self.gauge.is_alive()
            self.last += 1
            db.run(
                f"UPDATE tasks SET story_points = {-self.last} "
                f"WHERE id = 'task-sentinel-update-0001' /* {self.key} during */"
            )
            if not running:
                # One write after the re-copy ended, not timed: the reader waiting for a
                # checkpoint always gets one more.
                break
            self.commits.append((-self.last, time.time()))
            time.sleep(0.1)
        db.close()


def sentinel(port: int, secret: str, value: int) -> None:
    """Connects as the probe user as soon as the sync port answers and reads until the
    client holds the sentinel row with story_points `value`; prints when it did."""
    while True:
        try:
            stream = Stream(port, token(secret, PROBE_USER), PROBE_BODY)
            if stream.status == 200:
                break
            stream.conn.close()
        except OSError:
            pass
        time.sleep(0.05)
    first = time.time()
    until_sentinel(stream, "story_points", value)
    print(json.dumps({"connected_at": first, "seen_at": time.time()}))


def main() -> None:
    mode, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "probe":
        probe(port, secret)
    elif mode == "download":
        download(port, secret)
    elif mode == "download-raw":
        download_raw(port, secret)
    elif mode == "recopy":
        recopy(port, secret, sys.argv[4:])
    elif mode == "sentinel":
        sentinel(port, secret, int(sys.argv[4]))
    elif mode in ("churn", "migration"):
        # PSQL... -- NUMBERS...
        rest = sys.argv[4:]
        split = rest.index("--")
        numbers = [int(n) for n in rest[split + 1 :]]
        if mode == "churn":
            churn(port, secret, rest[:split], *numbers)
        else:
            migration(port, secret, rest[:split], *numbers)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
