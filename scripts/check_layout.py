#!/usr/bin/env python3
"""The house stays readable: fails on a source file over 700 lines, a function over 120
lines, or modules of one crate that need each other (docs/architecture.md, "Inside the
crates").

- Files: every tracked `.rs` file, tests included (the fuzz corpus is data, not source).
- Functions: from the line of `fn` to its closing brace, as text (strings and comments
  stripped before braces are counted).
- Circles: inside each crate, the modules under one parent (the crate's top-level modules,
  a folder module's children) and the references between them: `use crate::…`,
  `crate::a::…` and `super::…` paths anywhere in a file, resolved to the sibling they reach.
  A child's use of its parent is not an edge (the parent is the shared ground its children
  stand on). Unit tests (`tests.rs`, `src/**/tests/`) are left out: they may reach anything.

`--order` prints each crate's top-level modules in layers, bottom up (what the architecture
page draws): a module stands one layer above the highest module it uses.
Run from anywhere; exits 1 with one line per problem.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_LINES = 700
MAX_FN_LINES = 120

FN_RE = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+"[^"]*"\s+)?fn\s+(\w+)'
)
PATH_RE = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
USE_RE = re.compile(r"\buse\s+(crate|super|self)::(\{.*?\}|[^;]*?);", re.S)


def tracked_rust_files():
    out = subprocess.run(
        ["git", "-C", ROOT, "ls-files", "*.rs"], check=True, capture_output=True, text=True
    ).stdout.split()
    return [f for f in out if "/corpus/" not in f]


def blank_literals(text):
    """The text with comments and the insides of string and char literals blanked, newlines
    kept, so that braces and paths are counted only where they are code."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif ch == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not text[i - 1].isalnum()):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = '"' + hashes
            j = text.find(end, i + len(hashes) + 2)
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif ch == "'" and re.match(r"'(?:\\.|[^'\\])'", text[i:i + 4]):
            m = re.match(r"'(?:\\[^']*|[^'\\])'", text[i:])
            out.append("''")
            i += len(m.group(0)) if m else 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def long_functions(path, lines):
    problems = []
    for i, line in enumerate(lines):
        m = FN_RE.match(line)
        if not m:
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            s = lines[j]
            for ch in s:
                if ch == "{":
                    depth += 1
                    started = True
                elif ch == "}":
                    depth -= 1
            if started and depth <= 0:
                break
            if not started and s.rstrip().endswith(";"):
                break
            j += 1
        length = j - i + 1
        if started and length > MAX_FN_LINES:
            problems.append(
                f"{path}:{i + 1}: fn {m.group(1)} is {length} lines (at most {MAX_FN_LINES}); "
                "split it where a name explains the piece"
            )
    return problems


# ---- modules and their references -------------------------------------------------------


def crates():
    """Each crate's `src` folder, from the workspace's manifests (the fuzz workspace too)."""
    found = []
    for f in subprocess.run(
        ["git", "-C", ROOT, "ls-files", "*Cargo.toml"], check=True, capture_output=True, text=True
    ).stdout.split():
        src = os.path.join(os.path.dirname(f), "src")
        if os.path.isdir(os.path.join(ROOT, src)):
            found.append(src)
        # A binary of several files is a crate of its own (`src/bin/<name>/main.rs`).
        bins = os.path.join(ROOT, src, "bin")
        if os.path.isdir(bins):
            for entry in sorted(os.listdir(bins)):
                if os.path.isfile(os.path.join(bins, entry, "main.rs")):
                    found.append(os.path.join(src, "bin", entry))
    return sorted(found)


def module_path(src, file):
    """`src/a/b.rs` and `src/a/b/mod.rs` → ("a", "b"); `src/lib.rs` → ()."""
    rel = os.path.relpath(file, src)
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def is_test_file(parts):
    return "tests" in parts


def expand_use(tree):
    """`a::{b, c::d}` → [["a", "b"], ["a", "c", "d"]] (only the names matter here)."""
    tree = re.sub(r"\s+", "", tree)
    paths = []

    def walk(prefix, text):
        depth, start, items = 0, 0, []
        for k, ch in enumerate(text):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(text[start:k])
                start = k + 1
        items.append(text[start:])
        for item in items:
            if not item:
                continue
            if "{" in item:
                head, rest = item.split("{", 1)
                head_parts = [p for p in head.split("::") if p]
                walk(prefix + head_parts, rest[: rest.rfind("}")])
            else:
                name = item.split(" as ")[0]
                paths.append(prefix + [p for p in name.split("::") if p])

    if tree.startswith("{"):
        walk([], tree[1:-1])
    else:
        walk([], tree)
    return paths


def references(text):
    """Each path a file names from `crate`, `super` or `self`, as (root, [segments])."""
    refs = []
    code = blank_literals(text)
    for m in USE_RE.finditer(code):
        for path in expand_use(m.group(2)):
            refs.append((m.group(1), path))
    code = USE_RE.sub("", code)
    for m in PATH_RE.finditer(code):
        refs.append((m.group(1), m.group(2).strip(":").split("::")))
    return refs


def resolve(current, root, segments):
    """The absolute module path a reference starts from, followed by its segments."""
    if root == "crate":
        return list(segments)
    base = list(current)
    if root == "self":
        return base + list(segments)
    # super: the parent of the current module (repeated `super::super`).
    base = base[:-1]
    while segments and segments[0] == "super":
        base = base[:-1]
        segments = segments[1:]
    return base + list(segments)


def crate_modules(src):
    """Each module of the crate rooted at `src` (its `bin/` left to the binaries' own
    roots, unit tests left out) and the file that holds it."""
    modules = {}
    for dirpath, dirs, names in os.walk(os.path.join(ROOT, src)):
        if dirpath == os.path.join(ROOT, src):
            dirs[:] = [d for d in dirs if d != "bin"]
        for n in names:
            if n.endswith(".rs"):
                file = os.path.join(dirpath, n)
                parts = module_path(os.path.join(ROOT, src), file)
                if not is_test_file(parts):
                    modules[parts] = file
    return modules


def circles_of_crate(modules):
    """The edges between sibling modules: (the referring one, the one it reaches)."""
    known = set(modules)
    edges = set()
    for parts, file in modules.items():
        with open(file, encoding="utf-8") as f:
            text = f.read()
        for root, segments in references(text):
            target = resolve(parts, root, segments)
            # The longest known module the path reaches.
            while target and tuple(target) not in known:
                target = target[:-1]
            target = tuple(target)
            if not target or target == parts:
                continue
            # The siblings under the deepest common parent.
            k = 0
            while k < min(len(parts), len(target)) and parts[k] == target[k]:
                k += 1
            if k == len(target) or k == len(parts):
                continue  # a parent or a child of the referring module
            edges.add((parts[: k + 1], target[: k + 1]))
    return edges


def sccs(nodes, edges):
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for n in sorted(nodes):
        if n not in index:
            strong(n)
    return out  # reverse topological order: what is used comes first


def layers(top, edges):
    """The top-level modules in layers, bottom up: a module stands one layer above the
    highest it uses (`a, b → c` : c uses a or b; a and b use neither)."""
    uses = {m: {b for a, b in edges if a == m and len(b) == 1} for m in top}
    level = {}

    def of(m, seen=()):
        if m not in level:
            below = [of(u, seen + (m,)) for u in uses[m] if u not in seen]
            level[m] = 1 + max(below, default=-1)
        return level[m]

    for m in sorted(top):
        of(m)
    rows = {}
    for m, k in level.items():
        rows.setdefault(k, []).append(name(m))
    return " → ".join(", ".join(sorted(rows[k])) for k in sorted(rows))


def name(parts):
    return "::".join(parts)


def main():
    problems = []
    for path in tracked_rust_files():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        lines = text.split("\n")
        if len(lines) - 1 > MAX_FILE_LINES:
            problems.append(
                f"{path}: {len(lines) - 1} lines (at most {MAX_FILE_LINES}); split it along "
                "what its parts do"
            )
        problems.extend(long_functions(path, blank_literals(text).split("\n")))
    orders = []
    for src in crates():
        modules = crate_modules(src)
        edges = circles_of_crate(modules)
        nodes = {a for a, _ in edges} | {b for _, b in edges}
        for comp in sccs(nodes, edges):
            if len(comp) > 1:
                ties = sorted(
                    f"{name(a)} -> {name(b)}" for a, b in edges if a in comp and b in comp
                )
                problems.append(
                    f"{src}: modules need each other ({'; '.join(ties)}); move what they "
                    "share into a module below both"
                )
        top = {(p[0],) for p in modules if p} if "--order" in sys.argv else set()
        if top:
            orders.append(f"{src}: {layers(top, edges)}")
    for line in orders:
        print(line)
    for problem in problems:
        print(f"layout: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"layout: no file over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES}, "
        "no circle between the modules of a crate"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
