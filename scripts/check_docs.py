#!/usr/bin/env python3
"""Keeps the documents honest mechanically.

- Every repository path a document names (in backticks or a Markdown link) exists.
- Every error code (`PSM_X0000`, `PSYNC_X0000`) the code can return is documented, and
  every code a document lists exists in the code.
- The metrics `GET /metrics` serves are exactly those docs/metrics.md lists, and no
  document names a metric that is not served.

Run from anywhere; exits 1 with one line per problem.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "e2e/README.md", "e2e/fixture/README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")
)
CODE_DIRS = ["worker", "extension/src"]
METRICS_SOURCE = "worker/http/src/metrics.rs"
METRICS_DOC = "docs/metrics.md"
# Where a path in backticks may start: the repository's top-level entries.
TOP_LEVEL = {e for e in os.listdir(ROOT) if not e.startswith(".") and e != "target"} | {".ci"}
FILE_SUFFIXES = (".rs", ".sh", ".md", ".py", ".toml", ".yaml", ".sql", ".mjs", ".json", ".ndjson")
# A bare file name must be one of the repository's (output files such as `summary.json` are not).
SOURCE_SUFFIXES = (".rs", ".sh", ".py", ".mjs")
CODE_RE = re.compile(r"\b(?:PSM|PSYNC)_[A-Z][0-9]{4}\b")
METRIC_RE = re.compile(r"\bpowersync_mdbx_[a-z_]+\b")
# Prometheus adds these to a histogram's name.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def source_files():
    for top in CODE_DIRS:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("target", "corpus")]
            for name in files:
                if name.endswith(".rs"):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, ROOT)


def file_names():
    names = set()
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in ("target", "node_modules", ".git")]
        names.update(files)
        names.update(dirs)
    return names


def check_paths(problems):
    names = file_names()
    for doc in DOCS:
        text = read(doc)
        doc_dir = os.path.dirname(doc)
        candidates = re.findall(r"`([^`\s]+)`", text)
        links = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text)
        for token in candidates:
            token = token.rstrip(".,:;")
            if "://" in token or token.startswith(("/", "$", "-")) or "*" in token or "<" in token:
                continue
            path = token.split("::")[0]
            if doc_dir and os.path.exists(os.path.join(ROOT, doc_dir, path)):
                continue
            first = path.split("/")[0]
            looks_like_path = "/" in path and (path.endswith(FILE_SUFFIXES) or path.endswith("/"))
            if (first in TOP_LEVEL and ("/" in path or path in TOP_LEVEL)) or looks_like_path:
                if not os.path.exists(os.path.join(ROOT, path)):
                    problems.append(f"{doc}: names `{token}`, which does not exist")
            elif path.endswith(SOURCE_SUFFIXES) and "/" not in path and "{" not in path:
                if path not in names:
                    problems.append(f"{doc}: names the file `{token}`, which no folder holds")
            elif path.startswith("../"):
                problems.append(f"{doc}: names `{token}`, outside the repository")
        for link in links:
            if "://" in link or link.startswith("mailto:"):
                continue
            target = os.path.normpath(os.path.join(doc_dir, link))
            if target.startswith("..") or not os.path.exists(os.path.join(ROOT, target)):
                problems.append(f"{doc}: links to `{link}`, which does not exist in the repository")


def check_error_codes(problems):
    in_code = {}
    for path in source_files():
        for code in CODE_RE.findall(read(path)):
            in_code.setdefault(code, path)
    in_docs = {}
    for doc in DOCS:
        for code in CODE_RE.findall(read(doc)):
            in_docs.setdefault(code, doc)
    for code in sorted(in_code.keys() - in_docs.keys()):
        problems.append(f"{in_code[code]}: error code {code} is documented nowhere "
                        "(docs/operations.md, section 9, lists every code)")
    for code in sorted(in_docs.keys() - in_code.keys()):
        problems.append(f"{in_docs[code]}: lists error code {code}, which the code never returns")


def base_metric(name, served):
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in served:
            return name[: -len(suffix)]
    return name


def check_metrics(problems):
    served = set(re.findall(r'"(powersync_mdbx_[a-z_]+)"', read(METRICS_SOURCE)))
    listed = {base_metric(m, served) for m in METRIC_RE.findall(read(METRICS_DOC))}
    for name in sorted(served - listed):
        problems.append(f"{METRICS_SOURCE}: serves {name}, which {METRICS_DOC} does not list")
    for name in sorted(listed - served):
        problems.append(f"{METRICS_DOC}: lists {name}, which /metrics does not serve")
    # Elsewhere, a name shaped like a metric must be one.
    metric_shape = re.compile(r"_(total|seconds|bytes|lsn|open|changes|phase|rows|done)$")
    for doc in DOCS:
        for name in set(METRIC_RE.findall(read(doc))):
            if metric_shape.search(name) and base_metric(name, served) not in served:
                problems.append(f"{doc}: names the metric {name}, which /metrics does not serve")


def main():
    problems = []
    check_paths(problems)
    check_error_codes(problems)
    check_metrics(problems)
    for problem in problems:
        print(f"docs: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"docs: {len(DOCS)} documents; paths, error codes and metric names agree with the code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
