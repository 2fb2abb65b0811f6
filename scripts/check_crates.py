#!/usr/bin/env python3
"""The crate graph flows one way: fails on a dependency between the project's crates that
docs/architecture.md does not allow.

Reads `cargo metadata` (no network, no build). Only normal dependencies count: tests may
use any crate (dev-dependencies), and the test rig is outside the engine.
"""
import json
import subprocess
import sys

# Each crate and the project crates it may depend on (normal dependencies), bottom up.
# docs/architecture.md draws this graph; change both together.
ALLOWED = {
    "powersync-mdbx-config": set(),
    "powersync-mdbx-rules": set(),
    "powersync-mdbx-metrics": set(),
    "powersync-mdbx-store": {"metrics"},
    "powersync-mdbx-source": {"config"},
    "powersync-mdbx-auth": {"config"},
    "powersync-mdbx-status": {"store"},
    "powersync-mdbx-replication": {"config", "metrics", "rules", "source", "store"},
    "powersync-mdbx-service": {
        "auth", "config", "metrics", "replication", "rules", "source", "status", "store",
    },
    "powersync-mdbx-http": {"auth", "metrics", "service", "source", "status", "store"},
    "powersync-mdbx-admin": {"service", "store"},
    "powersync-mdbx-engine": {
        "admin", "auth", "config", "http", "replication", "rules", "service", "source",
        "status", "store",
    },
    "powersync-mdbx-cli": {"rules"},
    "powersync_mdbx": {"admin", "engine", "rules", "status", "store"},
    # The test rig: its optional `buckets` feature reads stores with the engine's crates.
    "powersync-mdbx-testkit": {"config", "rules", "source", "store"},
}
PREFIX = "powersync-mdbx-"


def short(name):
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def main():
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = {p["name"] for p in metadata["packages"]}
    problems = []
    for name in sorted(members - ALLOWED.keys()):
        problems.append(f"{name}: a crate scripts/check_crates.py does not know; add it "
                        "to ALLOWED and to the graph in docs/architecture.md")
    for package in metadata["packages"]:
        allowed = ALLOWED.get(package["name"], set())
        for dep in package["dependencies"]:
            if dep["name"] not in members or dep["kind"] is not None:
                continue
            if short(dep["name"]) not in allowed:
                problems.append(
                    f"{package['name']} depends on {dep['name']}: not an allowed edge "
                    "(docs/architecture.md, 'Crates'); move the code to the crate that "
                    "owns it, or change the layering deliberately in both places"
                )
        if package["name"] != "powersync-mdbx-testkit":
            for dep in package["dependencies"]:
                if dep["name"] == "powersync-mdbx-testkit" and dep["kind"] != "dev":
                    problems.append(f"{package['name']}: the test rig only as a dev-dependency")
    for problem in problems:
        print(f"crate graph: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"crate graph: {len(members)} crates, every edge allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
