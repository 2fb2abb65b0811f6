#!/usr/bin/env python3
"""Summarises benchmark runs (one JSON object per file, from scripts/bench.sh) into
medians with min–max per profile: prints Markdown tables (initial replication, then
streaming: bulk changes against their decoding floor, many small transactions, then the
join profile where runs have it) and writes summary.json.

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
# The streaming table (method step 11).
STREAM_COLUMNS = [
    ("bulk_update_floor_seconds", "UPDATE floor (s)", "{:.2f}"),
    ("bulk_update_seconds", "UPDATE (s)", "{:.2f}"),
    ("bulk_update_settled_seconds", "UPDATE settled (s)", "{:.2f}"),
    ("bulk_update_over_floor", "UPDATE / floor", "{:.2f}×"),
    ("bulk_update_worker_cpu_us_per_row", "UPDATE CPU µs/row", "{:.1f}"),
    ("bulk_update_cpu_over_snapshot", "UPDATE CPU / snapshot's", "{:.2f}×"),
    ("bulk_delete_floor_seconds", "DELETE floor (s)", "{:.2f}"),
    ("bulk_delete_seconds", "DELETE (s)", "{:.2f}"),
    ("bulk_delete_settled_seconds", "DELETE settled (s)", "{:.2f}"),
    ("bulk_delete_over_floor", "DELETE / floor", "{:.2f}×"),
    ("bulk_delete_worker_cpu_us_per_row", "DELETE CPU µs/row", "{:.1f}"),
    ("bulk_delete_cpu_over_snapshot", "DELETE CPU / snapshot's", "{:.2f}×"),
    ("bulk_insert_floor_seconds", "INSERT floor (s)", "{:.2f}"),
    ("bulk_insert_seconds", "INSERT (s)", "{:.2f}"),
    ("bulk_insert_settled_seconds", "INSERT settled (s)", "{:.2f}"),
    ("bulk_insert_over_floor", "INSERT / floor", "{:.2f}×"),
    ("bulk_insert_worker_cpu_us_per_row", "INSERT CPU µs/row", "{:.1f}"),
    ("bulk_insert_cpu_over_snapshot", "INSERT CPU / snapshot's", "{:.2f}×"),
    ("bulk_truncate_seconds", "TRUNCATE (s)", "{:.2f}"),
    ("bulk_truncate_settled_seconds", "TRUNCATE settled (s)", "{:.2f}"),
    ("bulk_truncate_cpu_over_snapshot", "TRUNCATE CPU / snapshot's", "{:.2f}×"),
    ("bulk_peak_anon_rss_mib", "bulk peak anon RSS (MiB)", "{:.0f}"),
    ("small_tx_lag_ms_median", "2,000 tx/s lag median (ms)", "{:.0f}"),
    ("small_tx_lag_ms_p99", "lag p99 (ms)", "{:.0f}"),
    ("small_tx_worker_cpu_us_per_tx", "CPU µs/tx", "{:.0f}"),
]
# The join profile (PSM_BENCH_JOIN=1), in runs that have it.
JOIN_COLUMNS = [
    ("readiness_seconds", "readiness, CTE rules (s)", "{:.2f}"),
    ("join_readiness_seconds", "readiness, join rules (s)", "{:.2f}"),
    ("join_readiness_over_param", "join / CTE", "{:.2f}×"),
    ("join_worker_cpu_over_param", "worker CPU join / CTE", "{:.2f}×"),
    ("membership_join_move_ms", "join: move (ms)", "{:.0f}"),
    ("membership_join_updates_seconds", "join: updates (s)", "{:.2f}"),
    ("membership_join_move_over_updates", "join: move / updates", "{:.3f}×"),
    ("membership_param_move_ms", "CTE: move (ms)", "{:.0f}"),
    ("membership_param_updates_seconds", "CTE: updates (s)", "{:.2f}"),
    ("membership_param_move_over_updates", "CTE: move / updates", "{:.3f}×"),
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
    peaks = [run.get(f"bulk_{k}_peak_anon_rss_bytes") for k in ("update", "delete", "insert", "truncate")]
    if all(peaks):
        run["bulk_peak_anon_rss_mib"] = max(peaks) / 2**20
    for label in ("join", "param"):
        if f"membership_{label}_move_seconds" in run:
            run[f"membership_{label}_move_ms"] = run[f"membership_{label}_move_seconds"] * 1000
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
    tables = []
    tables_columns = [COLUMNS, STREAM_COLUMNS]
    if any("join_readiness_seconds" in r for group in runs.values() for r in group):
        tables_columns.append(JOIN_COLUMNS)
    for columns in tables_columns:
        header = ["profile", "rows", "runs"] + [title for _, title, _ in columns]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for profile in sorted(runs, key=lambda p: PROFILES.index(p) if p in PROFILES else 99):
            group = runs[profile]
            cells = [profile, f"{group[0]['rows']:,}", str(len(group))]
            summary.setdefault(profile, {"runs": len(group), "rows": group[0]["rows"]})
            for key, _, fmt in columns:
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
        tables.append("\n".join(lines))
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
