#!/usr/bin/env python3
"""Bulk changes and many small transactions through the stream, against a decoding floor
(scripts/bench.sh, method step 11).

  bench_bulk.py worker PORT SECRET WORKER_PID LAG_SECONDS PSQL...
      -> JSON: with the probe client connected, pgbench single-row transactions at
         2,000/s (the worker's lag sampled every 100 ms), then one transaction each of an
         UPDATE, a DELETE and an INSERT of every task row and a TRUNCATE of the table:
         seconds from COMMIT until the client holds the result, worker CPU per changed
         row, peak anonymous RSS. Leaves `tasks` empty and its rows in the unlogged
         table bench_tasks_saved.
  bench_bulk.py floor LAG_SECONDS PSQL...
      -> JSON: the sync replica stopped, pg_recvlogical reads a slot of its own with the
         worker's pgoutput options: the lag of its walsender's sent LSN under the same
         pgbench load, then the same four transactions, each timed from COMMIT until the
         walsender has sent past the commit.

Only the standard library; pgbench and pg_recvlogical come with PostgreSQL.
"""
import http.client
import json
import os
import subprocess
import sys
import threading
import time

from bench_stream import PROBE_BODY, PROBE_BUCKET, PROBE_USER, Psql, Stream, token

SENTINEL = "task-sentinel-update-0001"
PROBE_PROJECT = "project-org-001-0001"
# The worker's pgoutput options (worker/source/src/slot.rs `start_stream`).
PGOUTPUT_OPTIONS = ["proto_version=1", "publication_names=powersync", "messages=true"]
FLOOR_SLOT = "psm_bench_floor"

# name, statement, what the probe client holds once the worker applied it.
SCENARIOS = [
    ("update", "UPDATE tasks SET story_points = story_points + 1", "sentinel"),
    ("delete", "DELETE FROM tasks", "empty"),
    ("insert", "INSERT INTO tasks SELECT * FROM bench_tasks_saved", "full"),
    ("truncate", "TRUNCATE tasks", "empty"),
]

PGBENCH_SCRIPT = """\\set p random(1, {projects})
\\set t random(1, {tasks})
UPDATE tasks SET priority = priority + 1 WHERE id = 'task-org-001-' || lpad(:p::text, 4, '0') || '-' || lpad(:t::text, 4, '0');
"""


def connection(psql_argv) -> list:
    """`-h HOST -p PORT -U USER` of a psql command line (pgbench's `-d` means debug)."""
    args = []
    for flag in ("-h", "-p", "-U"):
        if flag in psql_argv:
            args += [flag, psql_argv[psql_argv.index(flag) + 1]]
    return args


def database(psql_argv) -> str:
    return psql_argv[psql_argv.index("-d") + 1] if "-d" in psql_argv else "postgres"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> dict:
    """Voluntary and involuntary context switches of the process's threads by name (those
    that exist now: a thread that ended took its counts with it)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except FileNotFoundError:
            continue
        name = ""
        for line in status.splitlines():
            if line.startswith("Name:"):
                name = line.split("\t", 1)[1]
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                out[name] = out.get(name, 0) + int(line.split()[1])
    return out


def cpu_by_thread(pid: int) -> dict:
    """CPU seconds of the process's threads by name (those that exist now)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except FileNotFoundError:
            continue
        name = head.split("(", 1)[1]
        fields = rest.split()
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        out[name] = out.get(name, 0.0) + seconds
    return out


class Profile:
    """`perf record` of the worker while one scenario runs, to `$PSM_BENCH_PROFILE_BULK.<name>`
    (nothing when the variable is unset); `PSM_BENCH_PROFILE_BULK_DWARF=1` records call
    graphs by DWARF (release builds keep no frame pointers), at 500 samples a second."""

    def __init__(self, pid: int, name: str):
        prefix = os.environ.get("PSM_BENCH_PROFILE_BULK")
        graph = ["-F", "2000", "-g"]
        if os.environ.get("PSM_BENCH_PROFILE_BULK_DWARF") == "1":
            graph = ["-F", "500", "--call-graph", "dwarf,16384"]
        self.perf = prefix and subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", *graph, "-p", str(pid),
             "-o", f"{prefix}.{name}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # perf needs a moment to attach before the statement starts.
        if self.perf:
            time.sleep(0.3)

    def stop(self) -> None:
        if self.perf:
            self.perf.send_signal(2)
            self.perf.wait()


class PeakAnon:
    """The process's peak RssAnon (bytes), sampled every 50 ms on a thread."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.running = pid, 0, True
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self):
        while self.running:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            time.sleep(0.05)

    def stop(self) -> int:
        self.running = False
        self.thread.join()
        return self.peak


def publish_histogram(port: int) -> dict:
    """Cumulative counts of powersync_mdbx_checkpoint_publish_seconds by upper bound."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    counts = {}
    for line in text.splitlines():
        if line.startswith("powersync_mdbx_checkpoint_publish_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            counts[float("inf") if bound == "+Inf" else float(bound)] = float(line.split()[-1])
    return counts


def histogram_quantile(before: dict, after: dict, q: float):
    """The upper bound (ms) of the bucket holding quantile `q` of what was added."""
    added = sorted((bound, after[bound] - before.get(bound, 0)) for bound in after)
    total = added[-1][1] if added else 0
    for bound, count in added:
        if total and count >= q * total:
            return None if bound == float("inf") else round(bound * 1000, 1)
    return None


def applied_lsn(conn: http.client.HTTPConnection) -> int:
    """The worker's applied LSN from GET /metrics (a kept-alive connection)."""
    conn.request("GET", "/metrics")
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith("powersync_mdbx_applied_lsn "):
            return int(float(line.split()[1]))
    sys.exit("metric powersync_mdbx_applied_lsn not served")


def lsn_value(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def percentile(ordered, p: float) -> float:
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def write_back() -> int:
    """Writes the page cache's dirty pages back (`sync`) and returns how many bytes were
    dirty before. The benchmark's primary runs with `fsync = off` on this machine's disk:
    without this, the kernel writes back what earlier phases left (800 MB and more) while a
    phase is timed, and the worker's `fdatasync` calls wait behind it, while a floor that
    never syncs does not. In production the primary's writes are another machine's."""
    dirty = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Dirty:"):
                dirty = int(line.split()[1]) * 1024
    os.sync()
    return dirty


def small_transactions(psql_argv, seconds: int, position, cpu_pid=None) -> dict:
    """pgbench at 2,000 single-row transactions per second for `seconds`; every 100 ms
    the primary's current LSN is noted, and its lag is the time until `position()` (the
    worker's applied LSN, or the floor's sent LSN; polled every 5 ms) passed it."""
    db = Psql(psql_argv)
    projects = int(db.run("SELECT count(DISTINCT project_id) FROM tasks WHERE id LIKE 'task-org-001-%'")[0])
    per_project = int(db.run("SELECT count(*) FROM tasks WHERE project_id = 'project-org-001-0001' AND id LIKE 'task-org-001-%'")[0])
    script = f"/tmp/psm-bench-pgbench-{os.getpid()}.sql"
    with open(script, "w") as f:
        f.write(PGBENCH_SCRIPT.format(projects=projects, tasks=per_project))
    pgbench = os.path.join(os.path.dirname(psql_argv[0]), "pgbench")
    dirty = write_back()
    cpu0 = cpu_seconds(cpu_pid) if cpu_pid else 0
    peak = PeakAnon(cpu_pid) if cpu_pid else None
    bench = subprocess.Popen(
        [pgbench, "-n", "-c", "4", "-j", "2", "-R", "2000", "-T", str(seconds), "-f", script]
        + connection(psql_argv)
        + [database(psql_argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pending, lags = [], []
    next_sample = time.time() + 1.0  # after pgbench's connections are up
    while bench.poll() is None or pending:
        now = time.time()
        if bench.poll() is None and now >= next_sample:
            pending.append((now, lsn_value(db.run("SELECT pg_current_wal_lsn()")[0])))
            next_sample += 0.1
        passed = position()
        seen = time.time()
        while pending and passed >= pending[0][1]:
            lags.append(seen - pending.pop(0)[0])
        if pending and seen - pending[0][0] > 60:
            sys.exit("the position did not pass a primary LSN within 60 s")
        time.sleep(0.005)
    out = bench.stdout.read()
    transactions = next(
        (int(line.split(":")[1].split()[0]) for line in out.splitlines() if "number of transactions actually processed" in line),
        None,
    )
    if bench.returncode != 0 or transactions is None:
        sys.exit(f"pgbench failed:\n{out}")
    lags.sort()
    db.close()
    os.unlink(script)
    result = {
        "seconds": seconds,
        "transactions": transactions,
        "lag_samples": len(lags),
        "lag_ms_median": round(percentile(lags, 0.5) * 1000, 1),
        "lag_ms_p99": round(percentile(lags, 0.99) * 1000, 1),
        "lag_ms_max": round(lags[-1] * 1000, 1),
        "dirty_written_back_bytes": dirty,
    }
    if cpu_pid:
        result["worker_cpu_us_per_tx"] = round((cpu_seconds(cpu_pid) - cpu0) * 1e6 / transactions, 1)
        result["peak_anon_rss_bytes"] = peak.stop()
    return result


def settle(pid: int, quiet_cpu: float = 0.01, interval: float = 0.2, most: float = 120.0) -> float:
    """Waits until the worker uses less than `quiet_cpu` seconds of CPU in `interval`;
    returns when its last busy interval ended (wall clock)."""
    deadline = time.time() + most
    while True:
        started, before = time.time(), cpu_seconds(pid)
        time.sleep(interval)
        if cpu_seconds(pid) - before < quiet_cpu:
            return started
        if time.time() > deadline:
            raise SystemExit(f"the worker stayed busy for {most:.0f} s after a bulk change")


def worker(port: int, secret: str, worker_pid: int, lag_seconds: int, psql_argv) -> None:
    out = {}
    if lag_seconds > 0:
        metrics = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        before = publish_histogram(port)
        small = small_transactions(psql_argv, lag_seconds, lambda: applied_lsn(metrics), worker_pid)
        after = publish_histogram(port)
        out = {f"small_tx_{k}": v for k, v in small.items()}
        # The worker's own part: Commit message received -> checkpoint published.
        out["small_tx_publish_ms_p50_bound"] = histogram_quantile(before, after, 0.5)
        out["small_tx_publish_ms_p99_bound"] = histogram_quantile(before, after, 0.99)
    stream = Stream(port, token(secret, PROBE_USER), PROBE_BODY)
    stream.until_complete()
    db = Psql(psql_argv)
    db.run("DROP TABLE IF EXISTS bench_tasks_saved")
    db.run("CREATE UNLOGGED TABLE bench_tasks_saved AS SELECT * FROM tasks")
    total = int(db.run("SELECT count(*) FROM tasks")[0])
    in_probe = int(db.run(f"SELECT count(*) FROM tasks WHERE project_id = '{PROBE_PROJECT}'")[0])
    out["bulk_rows"] = total
    for name, statement, holds in SCENARIOS:
        write_back()
        cpu0, switches0 = cpu_seconds(worker_pid), context_switches(worker_pid)
        threads0 = cpu_by_thread(worker_pid)
        peak = PeakAnon(worker_pid)
        profile = Profile(worker_pid, name)
        db.run(statement)
        committed = time.time()
        final = int(db.run(f"SELECT coalesce(max(story_points), -1) FROM tasks WHERE id = '{SENTINEL}'")[0])
        while True:
            rows = stream.rows.get(PROBE_BUCKET, {})
            if holds == "empty" and not rows:
                break
            if holds == "full" and len(rows) == in_probe:
                break
            if holds == "sentinel" and SENTINEL in rows and json.loads(rows[SENTINEL])["story_points"] == final:
                break
            stream.until_complete()
        seconds = time.time() - committed
        # The work the change leaves after clients see it (the compactions it made due
        # run in a write of their own) is its cost too: CPU is counted until the worker
        # is idle again, so the next scenario starts from an idle worker.
        settled = settle(worker_pid) - committed
        profile.stop()
        cpu = cpu_seconds(worker_pid) - cpu0
        out[f"bulk_{name}_seconds"] = round(seconds, 3)
        out[f"bulk_{name}_settled_seconds"] = round(settled, 3)
        out[f"bulk_{name}_worker_cpu_us_per_row"] = round(cpu * 1e6 / total, 2)
        switches = {
            thread: count - switches0.get(thread, 0)
            for thread, count in sorted(context_switches(worker_pid).items())
        }
        out[f"bulk_{name}_context_switches_per_1k_rows"] = round(
            sum(switches.values()) * 1000 / total, 1
        )
        out[f"bulk_{name}_context_switches_per_1k_rows_by_thread"] = {
            thread: round(count * 1000 / total, 1) for thread, count in switches.items() if count
        }
        out[f"bulk_{name}_cpu_us_per_row_by_thread"] = {
            thread: round((seconds - threads0.get(thread, 0.0)) * 1e6 / total, 2)
            for thread, seconds in sorted(cpu_by_thread(worker_pid).items())
            if seconds - threads0.get(thread, 0.0) > 0
        }
        out[f"bulk_{name}_peak_anon_rss_bytes"] = peak.stop()
    db.close()
    print(json.dumps(out))


def floor(lag_seconds: int, psql_argv) -> None:
    db = Psql(psql_argv)
    db.run(f"SELECT pg_create_logical_replication_slot('{FLOOR_SLOT}', 'pgoutput')")
    options = [arg for option in PGOUTPUT_OPTIONS for arg in ("-o", option)]
    reader = subprocess.Popen(
        [os.path.join(os.path.dirname(psql_argv[0]), "pg_recvlogical"), *connection(psql_argv),
         "-d", database(psql_argv), "--slot", FLOOR_SLOT, "--start", "--no-loop", "-f", "/dev/null", *options],
        # Its stop below is reported as an unexpected end of the stream.
        stderr=subprocess.DEVNULL,
    )

    def sent_past_commit() -> float:
        """Seconds from now until the walsender sent past the WAL written so far."""
        committed = time.time()
        lsn = db.run("SELECT pg_current_wal_lsn()")[0]
        while True:
            sent = db.run(
                f"SELECT coalesce(bool_or(sent_lsn >= '{lsn}'), false) FROM pg_stat_replication "
                f"WHERE application_name = 'pg_recvlogical'"
            )[0]
            if sent == "t":
                return time.time() - committed
            if reader.poll() is not None:
                sys.exit("pg_recvlogical ended")
            if time.time() - committed > 600:
                sys.exit("the floor's walsender did not pass the commit within 600 s")
            time.sleep(0.01)

    # The table as the worker's scenarios found it (they left it empty), read through too.
    db.run("INSERT INTO tasks SELECT * FROM bench_tasks_saved")
    sent_past_commit()
    out = {}
    if lag_seconds > 0:
        watcher = Psql(psql_argv)

        def sent() -> int:
            got = watcher.run(
                "SELECT coalesce(max(sent_lsn), '0/0') FROM pg_stat_replication "
                "WHERE application_name = 'pg_recvlogical'"
            )[0]
            return lsn_value(got)

        small = small_transactions(psql_argv, lag_seconds, sent)
        watcher.close()
        out.update({f"small_tx_floor_{k}": small[k] for k in ("lag_ms_median", "lag_ms_p99", "lag_ms_max")})
    for name, statement, _ in SCENARIOS:
        write_back()
        db.run(statement)
        out[f"bulk_{name}_floor_seconds"] = round(sent_past_commit(), 3)
    reader.terminate()
    reader.wait()
    # Its walsender lets go of the slot a moment after the client is gone.
    deadline = time.time() + 30
    while db.run(f"SELECT active FROM pg_replication_slots WHERE slot_name = '{FLOOR_SLOT}'")[0] == "t":
        if time.time() > deadline:
            sys.exit(f"the slot {FLOOR_SLOT} stayed active 30 s after pg_recvlogical ended")
        time.sleep(0.05)
    db.run(f"SELECT pg_drop_replication_slot('{FLOOR_SLOT}')")
    db.close()
    print(json.dumps(out))


def main() -> None:
    mode = sys.argv[1]
    if mode == "worker":
        port, secret, pid, lag = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        worker(port, secret, pid, lag, sys.argv[6:])
    elif mode == "floor":
        floor(int(sys.argv[2]), sys.argv[3:])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
