#!/usr/bin/env python3
"""Times a rules deploy on a running sync replica (called by scripts/bench.sh).

usage: bench_deploy.py MODE CONFIG RULES_OUT STORE_DIR WORKER_PID -- PSQL_COMMAND...

Both modes deploy inside the served store (docs/operations.md 3.4). MODE `add`: the
fixture's streams and one more, `my_access` (not subscribed by default), reading only
`user_project_access`: no bucket of the fixture's streams changes, only that table is
copied again. MODE `rename`: the fixture's streams with `tasks` renamed (a stream removed,
one added: the global bucket `tasks_dashboard` shares is named after the first of the two,
so `tasks` is copied again, every row gets a PUT in the renamed stream's bucket; the old
one's is no longer served). Writes the rules to RULES_OUT, points the
configuration file's `sync_config.path` at it, calls powersync_mdbx.reload() and polls
status() every 0.2 s until the new rules are served. Prints one JSON object, keys
prefixed `deploy_<mode>_`: the deploy's seconds (reload to switch), the worker CPU it took,
the ops the store gained, and the storage directory's allocated bytes before, at the peak
and after.
"""

import json
import os
import re
import subprocess
import sys
import time


def status(psql):
    out = subprocess.run(psql + ["-c", "SELECT powersync_mdbx.status()"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def allocated(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def worker_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


ADDED_STREAM = """  my_access:
    query: SELECT * FROM user_project_access WHERE user_id = auth.user_id()
"""


def main():
    split = sys.argv.index("--")
    mode, config, rules_out, store_dir, pid = sys.argv[1:split]
    psql = sys.argv[split + 1:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rules = open(os.path.join(root, "e2e", "fixture", "sync-config.yaml")).read()
    if mode == "add":
        rules = rules.rstrip("\n") + "\n" + ADDED_STREAM
    elif mode == "rename":
        rules = rules.replace("\n  tasks:\n", "\n  tasks_board:\n")
    else:
        sys.exit(f"unknown mode {mode}")
    open(rules_out, "w").write(rules)
    text = open(config).read()
    open(config, "w").write(re.sub(r"(sync_config:\n  path: ).*", r"\g<1>" + rules_out, text))

    before = status(psql)
    served_hash = before["rules_hash"]
    ops_before = (before.get("replication") or {}).get("last_op_id") or 0
    bytes_before = allocated(store_dir)
    cpu0 = worker_cpu(pid)
    started = time.monotonic()
    reload = subprocess.run(psql + ["-c", "SELECT powersync_mdbx.reload()"],
                            check=True, capture_output=True, text=True).stdout
    outcome = json.loads(reload)
    if outcome.get("outcome") != "deploying_rules":
        sys.exit(f"reload did not start a deploy: {outcome}")
    peak_dir = allocated(store_dir)
    while True:
        s = status(psql)
        peak_dir = max(peak_dir, allocated(store_dir))
        deploy = s.get("deploy") or {}
        if deploy.get("phase") == "failed":
            sys.exit(f"the deploy failed: {deploy}")
        if s.get("rules_hash") != served_hash and not s.get("deploy"):
            break
        if time.monotonic() - started > 3600:
            sys.exit(f"no switch within an hour: {s}")
        time.sleep(0.2)
    seconds = time.monotonic() - started
    cpu = worker_cpu(pid) - cpu0
    after = status(psql)
    ops_after = (after.get("replication") or {}).get("last_op_id") or 0
    out = {
        "seconds": round(seconds, 3),
        "switch_seconds": round(s["last_deploy"]["seconds"], 3),
        "worker_cpu_seconds": round(cpu, 3),
        "ops_written": int(ops_after) - int(ops_before),
        "storage_bytes_before": bytes_before,
        "peak_storage_bytes": peak_dir,
        "storage_bytes_after": allocated(store_dir),
    }
    print(json.dumps({f"deploy_{mode}_{k}": v for k, v in out.items()}))


if __name__ == "__main__":
    main()
