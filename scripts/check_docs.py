#!/usr/bin/env python3
"""Keeps the documents honest mechanically.

- Every repository path a document names (in backticks or a Markdown link) exists.
- Every error code (`PSM_X0000`, `PSYNC_X0000`) the code can return is documented, and
  every code a document lists exists in the code.
- The metrics `GET /metrics` serves are exactly those docs/metrics.md lists, and no
  document names a metric that is not served.
- Every GUC `extension/src/guc.rs` defines is in docs/configuration.md's GUC table, every
  SQL function the extension defines (`sql.rs`, `support.rs`) is documented, and no document names a
  `powersync_mdbx.<name>` that is neither.
- Every key of the configuration file the engine uses or refuses
  (`worker/config/src/keys.rs`) is named in docs/configuration.md or docs/migrating.md.
- Every HTTP route the server answers (`worker/http/src/`) is in docs/http-api.md, and no
  document names a route the server does not answer.
- A section of the specification is named by its file in the repository
  (`docs/spec/protocol.md` §N), in documents and in code comments: nothing points to a
  specification outside the repository.

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


SPEC_RE = re.compile(r"spec(?:ification)?:?\s*§|(?<![\w/.])protocol\.md`?\s*§")


def check_spec_references(problems):
    """Every `§N` reference to the specification names `docs/spec/protocol.md`."""
    texts = [(doc, read(doc)) for doc in DOCS]
    texts += [(path, read(path)) for path in source_files()]
    for path, text in texts:
        for number, line in enumerate(text.splitlines(), 1):
            if SPEC_RE.search(line):
                problems.append(
                    f"{path}:{number}: a specification section without its file; write "
                    f"`docs/spec/protocol.md` §N"
                )


GUC_SOURCE = "extension/src/guc.rs"
SQL_SOURCES = ["extension/src/sql.rs", "extension/src/support.rs"]
GUC_DOC = "docs/configuration.md"
SETTING_RE = re.compile(r"\bpowersync_mdbx\.([a-z_]+)\b")
HTTP_SOURCES = "worker/http/src"
HTTP_DOC = "docs/http-api.md"
ROUTE_RE = re.compile(r"(?<![\w.:/-])/(?:sync|api|probes|peer|metrics|write-checkpoint)[\w./-]*")


def check_settings(problems):
    """GUCs and SQL functions against `guc.rs` and `sql.rs`."""
    gucs = set(re.findall(r'c"powersync_mdbx\.([a-z_]+)"', read(GUC_SOURCE)))
    functions = set()
    for source in SQL_SOURCES:
        text = read(source)
        functions.update(re.findall(r"#\[pg_extern[^\]]*\]\s*(?:pub\s+)?fn\s+([a-z_]+)", text))
        functions.update(re.findall(r"CREATE FUNCTION ([a-z_]+)\(", text))
    table = [line for line in read(GUC_DOC).splitlines() if line.startswith("| `powersync_mdbx.")]
    for guc in sorted(gucs):
        if not any(f"`powersync_mdbx.{guc}`" in line for line in table):
            problems.append(f"{GUC_DOC}: the GUC table has no row for powersync_mdbx.{guc}")
    for function in sorted(functions):
        if not any(f"{function}(" in read(doc) for doc in DOCS):
            problems.append(f"no document describes the SQL function powersync_mdbx.{function}()")
    for doc in DOCS:
        for name in sorted(set(SETTING_RE.findall(read(doc)))):
            if name not in gucs and name not in functions:
                problems.append(
                    f"{doc}: powersync_mdbx.{name} is neither a GUC ({GUC_SOURCE}) nor a SQL "
                    f"function ({', '.join(SQL_SOURCES)})"
                )


KEYS_SOURCE = "worker/config/src/keys.rs"
KEY_DOCS = ["docs/configuration.md", "docs/migrating.md"]


def check_config_keys(problems):
    """Keys the engine uses or refuses are documented (by their own name, in backticks,
    alone or at the end of a dotted path)."""
    keys = re.findall(r'\(\s*"([a-z_]+)",\s*(?:Used|Refused)', read(KEYS_SOURCE))
    text = "\n".join(read(doc) for doc in KEY_DOCS)
    for key in sorted(set(keys)):
        if not re.search(r"`(?:[\w\[\].]*\.)?" + re.escape(key) + r"`", text):
            problems.append(f"{KEYS_SOURCE}: the configuration key {key} is in neither {' nor '.join(KEY_DOCS)}")


def http_routes():
    routes = set()
    for dirpath, _, files in os.walk(os.path.join(ROOT, HTTP_SOURCES)):
        for name in files:
            if name.endswith(".rs"):
                text = read(os.path.relpath(os.path.join(dirpath, name), ROOT))
                routes.update(re.findall(r'"(/(?:sync|api|probes|peer|metrics|write-checkpoint)[\w./-]*)"', text))
    # Prefixes the router matches by (`/api/admin/v1/`) are not routes of their own.
    return {r for r in routes if not r.endswith("/")}


def check_routes(problems):
    """Routes the server answers against the routes documents name."""
    routes = http_routes()
    reference = set(ROUTE_RE.findall(read(HTTP_DOC)))
    for route in sorted(routes - {r.rstrip(".,;:)/") for r in reference}):
        problems.append(f"{HTTP_DOC}: the route {route} is missing")
    named = {}
    for doc in DOCS:
        for route in ROUTE_RE.findall(read(doc)):
            named.setdefault(route.rstrip(".,;:)/"), doc)
    for route in sorted(routes):
        if route not in named:
            problems.append(f"the route {route} is documented nowhere")
    for route, doc in sorted(named.items()):
        if route in routes or any(r.startswith(route + "/") for r in routes):
            continue
        problems.append(f"{doc}: names the route {route}, which the server does not answer")


def main():
    problems = []
    check_paths(problems)
    check_settings(problems)
    check_config_keys(problems)
    check_routes(problems)
    check_spec_references(problems)
    check_error_codes(problems)
    check_metrics(problems)
    for problem in problems:
        print(f"docs: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"docs: {len(DOCS)} documents; paths, error codes, metric names, settings, configuration "
        "keys, routes and specification references agree with the code"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
