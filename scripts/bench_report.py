#!/usr/bin/env python3
"""Summarises benchmark runs (one JSON object per file, from scripts/bench.sh) into
medians with min–max per profile: prints a Markdown table and writes summary.json.

  bench_report.py RESULTS_DIR
"""
import json
import pathlib
import statistics
import sys

# (key in bench.sh's JSON, column title, format)
COLUMNS = [
    ("floor_text_seconds", "COPY floor (s)", "{:.3f}"),
    ("snapshot_seconds", "snapshot (s)", "{:.2f}"),
    ("snapshot_over_floor", "snapshot / floor", "{:.1f}×"),
    ("readiness_seconds", "readiness (s)", "{:.2f}"),
    ("readiness_over_floor", "readiness / floor", "{:.1f}×"),
    ("readiness_seconds_per_million", "readiness per 1M rows (s)", "{:.2f}"),
    ("worker_cpu_us_per_row", "worker CPU µs/row", "{:.2f}"),
    ("peak_anon_rss_mib", "peak anon RSS (MiB)", "{:.0f}"),
    ("peak_rss_mib", "peak RSS incl. map (MiB)", "{:.0f}"),
    ("mdbx_allocated_over_source", "MDBX allocated / source", "{:.2f}×"),
    ("wal_bytes_mib", "primary WAL (MiB)", "{:.0f}"),
    ("download_unparsed_seconds", "download all rows, server (s)", "{:.2f}"),
]
PROFILES = ["100k", "250k", "1m", "2m", "5m"]


def derived(run: dict) -> dict:
    run = dict(run)
    floor = run.get("floor_text_seconds") or 0
    if floor:
        run["snapshot_over_floor"] = run["snapshot_seconds"] / floor
    run["readiness_seconds_per_million"] = run["readiness_seconds"] * 1e6 / run["rows"]
    run["peak_anon_rss_mib"] = run["peak_anon_rss_bytes"] / 2**20
    run["peak_rss_mib"] = run["peak_rss_bytes"] / 2**20
    run["mdbx_allocated_over_source"] = run["mdbx_allocated_bytes"] / run["source_relation_bytes"]
    if "wal_bytes" in run:
        run["wal_bytes_mib"] = run["wal_bytes"] / 2**20
    return run


def main() -> None:
    results = pathlib.Path(sys.argv[1])
    runs = {}
    for path in sorted(results.glob("*.json")):
        if path.name == "summary.json":
            continue
        run = derived(json.loads(path.read_text()))
        runs.setdefault(run["profile"], []).append(run)
    summary = {}
    header = ["profile", "rows", "runs"] + [title for _, title, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for profile in sorted(runs, key=lambda p: PROFILES.index(p) if p in PROFILES else 99):
        group = runs[profile]
        cells = [profile, f"{group[0]['rows']:,}", str(len(group))]
        summary[profile] = {"runs": len(group), "rows": group[0]["rows"]}
        for key, _, fmt in COLUMNS:
            values = [r[key] for r in group if r.get(key) is not None]
            if not values:
                cells.append("–")
                continue
            median = statistics.median(values)
            summary[profile][key] = {"median": median, "min": min(values), "max": max(values)}
            cell = fmt.format(median)
            if len(values) > 1:
                cell += f" ({fmt.format(min(values))}–{fmt.format(max(values))})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
