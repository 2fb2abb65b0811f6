#!/usr/bin/env python3
"""Times a rules deploy on a running sync replica (called by scripts/bench.sh).

usage: bench_deploy.py CONFIG RULES_OUT STORE_DIR WORKER_PID -- PSQL_COMMAND...

Writes the fixture's streams with `tasks_dashboard` renamed (a stream removed, one
added: every bucket is rebuilt under the next generation) to RULES_OUT, points the
configuration file's `sync_config.path` at it, calls powersync_mdbx.reload() and polls
status() every 0.2 s until the next generation is served. Prints one JSON object: the
deploy's seconds (reload to switch), the worker CPU it took, the storage directory's
peak and final allocated bytes and the peak bytes the new generation held beside the
served one.
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


def main():
    split = sys.argv.index("--")
    config, rules_out, store_dir, pid = sys.argv[1:split]
    psql = sys.argv[split + 1:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rules = open(os.path.join(root, "fixture", "sync-config.yaml")).read()
    open(rules_out, "w").write(rules.replace("tasks_dashboard:", "tasks_board:"))
    text = open(config).read()
    open(config, "w").write(re.sub(r"(sync_config:\n  path: ).*", r"\g<1>" + rules_out, text))

    before = status(psql)
    generation = before["generation"]
    bytes_before = allocated(store_dir)
    cpu0 = worker_cpu(pid)
    started = time.monotonic()
    reload = subprocess.run(psql + ["-c", "SELECT powersync_mdbx.reload()"],
                            check=True, capture_output=True, text=True).stdout
    outcome = json.loads(reload)
    if outcome.get("outcome") != "deploying_rules":
        sys.exit(f"reload did not start a deploy: {outcome}")
    peak_dir, peak_build = allocated(store_dir), 0
    while True:
        s = status(psql)
        peak_dir = max(peak_dir, allocated(store_dir))
        deploy = s.get("deploy") or {}
        peak_build = max(peak_build, deploy.get("file_bytes", 0))
        if deploy.get("phase") == "failed":
            sys.exit(f"the deploy failed: {deploy}")
        if s.get("generation") == generation + 1:
            break
        if time.monotonic() - started > 3600:
            sys.exit(f"no switch within an hour: {s}")
        time.sleep(0.2)
    seconds = time.monotonic() - started
    cpu = worker_cpu(pid) - cpu0
    # The retired generation's files go once no stream reads it: wait until only the
    # new generation's directory holds a store.
    served = f"g{generation + 1}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        os.path.exists(os.path.join(store_dir, "mdbx.dat"))
        or any(re.fullmatch(r"g\d+", n) and n != served for n in os.listdir(store_dir))
    ):
        time.sleep(0.2)
    print(json.dumps({
        "deploy_seconds": round(seconds, 3),
        "deploy_switch_seconds": round(s["last_deploy"]["seconds"], 3),
        "deploy_rows": s["last_deploy"]["rows"],
        "deploy_worker_cpu_seconds": round(cpu, 3),
        "deploy_storage_bytes_before": bytes_before,
        "deploy_peak_storage_bytes": peak_dir,
        "deploy_peak_build_file_bytes": peak_build,
        "deploy_storage_bytes_after": allocated(store_dir),
    }))


if __name__ == "__main__":
    main()
