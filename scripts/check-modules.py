#!/usr/bin/env python3
"""Enforce libfst's module rule (src/README.md): a module uses only the
modules its row names, by include and by symbol, so no call cycle exists.

  check-modules.py --src SRC_DIR --objects OBJ_DIR   # OBJ_DIR mirrors SRC_DIR with .o files
  check-modules.py --self-test                         # the checker finds what it must

Exit 0 when the rule holds; 1 with one line per violation (file, what it
includes or which symbol it takes, from which module); 2 on bad input.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROW = re.compile(r"^\|\s*`(\w+)/`\s*\|\s*([^|]*)\|")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
PUBLIC = {"fst.h"}


def read_rules(readme):
    """{module: set of modules it may use}, in the table's order."""
    rules = {}
    with open(readme) as f:
        for line in f:
            m = ROW.match(line)
            if not m:
                continue
            uses = m.group(2).strip()
            allowed = set()
            if not uses.startswith("libc"):
                allowed = {u.strip() for u in uses.split(",") if u.strip()}
            rules[m.group(1)] = allowed
    return rules


def check_rules(rules):
    errors = []
    for m, uses in rules.items():
        for u in uses:
            if u not in rules:
                errors.append(f"src/README.md: {m}/ may use {u}/, which is no module")
    cycle = find_cycle({m: set(u) for m, u in rules.items()})
    if cycle:
        errors.append("src/README.md: the rule itself has a cycle: " + " -> ".join(cycle))
    return errors


def find_cycle(graph):
    """A list of nodes forming a cycle, or None."""
    state = {}

    def visit(n, path):
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d] if d in path else [n, d]
            if d not in state:
                c = visit(d, path + [d])
                if c:
                    return c
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            c = visit(n, [n])
            if c:
                return c
    return None


def source_files(src, rules):
    """{module: [paths]} of the .c and .h files; errors for files outside a module."""
    files, errors = {m: [] for m in rules}, []
    for entry in sorted(os.listdir(src)):
        p = os.path.join(src, entry)
        if os.path.isdir(p):
            if entry not in rules:
                errors.append(f"src/{entry}/: a folder that src/README.md does not name")
                continue
            for name in sorted(os.listdir(p)):
                if name.endswith((".c", ".h")):
                    files[entry].append(os.path.join(p, name))
        elif entry.endswith((".c", ".h")):
            errors.append(f"src/{entry}: a source outside every module")
    for m in rules:
        if not os.path.isdir(os.path.join(src, m)):
            errors.append(f"src/{m}/: named in src/README.md but missing")
    return files, errors


def check_includes(src, rules, files):
    owner = {}
    for m, paths in files.items():
        for p in paths:
            if p.endswith(".h"):
                owner[os.path.basename(p)] = m
    errors = []
    for m, paths in files.items():
        for p in paths:
            with open(p, errors="replace") as f:
                text = f.read()
            for inc in INCLUDE.findall(text):
                base = os.path.basename(inc)
                if base in PUBLIC:
                    continue
                o = owner.get(base)
                rel = os.path.relpath(p, os.path.dirname(src))
                if o is None:
                    errors.append(f"{rel}: includes \"{inc}\", which no module has")
                elif o != m and o not in rules[m]:
                    errors.append(f"{rel}: includes \"{inc}\" of {o}/, which {m}/ may not use")
    return errors


def nm_symbols(obj):
    """(defined, undefined) global symbol names of an object file."""
    out = subprocess.run(["nm", "-g", "--defined-only", obj], capture_output=True, text=True,
                         check=True).stdout
    defined = {line.split()[-1] for line in out.splitlines() if line.strip()}
    out = subprocess.run(["nm", "-g", "--undefined-only", obj], capture_output=True, text=True,
                         check=True).stdout
    undefined = {line.split()[-1] for line in out.splitlines() if line.strip()}
    return defined, undefined


def check_symbols(src, objects, rules, files):
    """Every symbol a module's objects take from another module must come
    from one it may use; the graph of modules must have no cycle."""
    defined_in, uses, errors = {}, [], []
    for m in rules:
        d = os.path.join(objects, m)
        objs = sorted(os.path.join(d, n) for n in os.listdir(d)) if os.path.isdir(d) else []
        objs = [o for o in objs if o.endswith(".o")]
        want = {os.path.basename(p)[:-2] for p in files[m] if p.endswith(".c")}
        have = {os.path.basename(o).split(".c.o")[0].split(".o")[0] for o in objs}
        for missing in sorted(want - have):
            errors.append(f"{objects}/{m}: no object for src/{m}/{missing}.c (build first)")
        for o in objs:
            dfn, und = nm_symbols(o)
            for s in dfn:
                defined_in[s] = (m, o)
            uses.append((m, o, und))
    graph = {m: set() for m in rules}
    for m, o, und in uses:
        for s in sorted(und):
            if s not in defined_in:
                continue  # libc, jansson, liburing: outside the library
            n, where = defined_in[s]
            if n == m:
                continue
            graph[m].add(n)
            if n not in rules[m]:
                errors.append(f"{os.path.basename(o)} ({m}/): uses {s} of {n}/ "
                              f"({os.path.basename(where)}), which {m}/ may not use")
    cycle = find_cycle(graph)
    if cycle:
        errors.append("call cycle between modules: " + " -> ".join(cycle))
    return errors, graph


def run(src, objects):
    readme = os.path.join(src, "README.md")
    if not os.path.exists(readme):
        print(f"{readme}: missing", file=sys.stderr)
        return 2, [], {}
    rules = read_rules(readme)
    if not rules:
        print(f"{readme}: no module table", file=sys.stderr)
        return 2, [], {}
    errors = check_rules(rules)
    files, e = source_files(src, rules)
    errors += e
    errors += check_includes(src, rules, files)
    graph = {}
    if objects:
        e, graph = check_symbols(src, objects, rules, files)
        errors += e
    return (1 if errors else 0), errors, graph


def self_test():
    """A tiny tree with a forbidden include and a call cycle: both found;
    and the same tree made right: clean."""
    ok = True
    with tempfile.TemporaryDirectory() as t:
        src, obj = os.path.join(t, "src"), os.path.join(t, "obj")
        for m in ("low", "high"):
            os.makedirs(os.path.join(src, m))
            os.makedirs(os.path.join(obj, m))
        with open(os.path.join(src, "README.md"), "w") as f:
            f.write("| module | may use | job |\n|---|---|---|\n"
                    "| `low/` | libc only | x |\n| `high/` | low | y |\n")

        def write(path, text):
            with open(os.path.join(src, path), "w") as f:
                f.write(text)

        write("low/low.h", "int low_f(void);\n")
        write("high/high.h", "int high_f(void);\n")
        write("high/high.c", '#include "low.h"\n#include "high.h"\n'
              "int high_f(void) { return low_f(); }\n")

        def build(low_c):
            write("low/low.c", low_c)
            for m in ("low", "high"):
                subprocess.run(["cc", "-c", "-I", os.path.join(src, "low"), "-I",
                                os.path.join(src, "high"), os.path.join(src, m, m + ".c"),
                                "-o", os.path.join(obj, m, m + ".c.o")], check=True)

        build('#include "low.h"\nint low_f(void) { return 1; }\n')
        rc, errors, _ = run(src, obj)
        if rc != 0:
            print("self-test: a clean tree was refused:", errors)
            ok = False
        build('#include "low.h"\n#include "high.h"\nint low_f(void) { return high_f(); }\n')
        rc, errors, _ = run(src, obj)
        text = "\n".join(errors)
        for want in ('low.c: includes "high.h" of high/', "uses high_f of high/",
                     "call cycle between modules"):
            if want not in text:
                print(f"self-test: not found: {want!r} in {errors}")
                ok = False
        write("stray.c", "int x;\n")
        rc, errors, _ = run(src, None)
        if not any("a source outside every module" in e for e in errors):
            print("self-test: a stray source was not refused:", errors)
            ok = False
    print("check-modules self-test:", "passed" if ok else "FAILED")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src")
    ap.add_argument("--objects")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.src:
        ap.error("--src is needed")
    rc, errors, graph = run(a.src, a.objects)
    for e in errors:
        print(e)
    if rc == 0:
        edges = ", ".join(f"{m} -> {'/'.join(sorted(d))}" for m, d in graph.items() if d)
        print(f"modules: the rule of src/README.md holds ({edges or 'includes only'})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
