#!/usr/bin/env python3
"""List the node_modules paths the Bun run needs (the workspaces' runtime dependencies and their
transitive dependencies in Bun's isolated store node_modules/.bun), for a tarball that travels to a
machine without a registry. Prints one path per line, relative to the repository root."""
import json
import os
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
store = root / "node_modules" / ".bun"
ws = [root / "tools", root / "apps" / "mlx-bun", *sorted((root / "packages").iterdir())]
out: set[str] = set()
entries: set[str] = set()


def add_entry(name: str) -> None:
    if name in entries:
        return
    entries.add(name)
    nm = store / name / "node_modules"
    for dirpath, dirnames, filenames in os.walk(nm):
        for d in list(dirnames) + filenames:
            p = Path(dirpath) / d
            if p.is_symlink():
                t = os.path.realpath(p)
                if t.startswith(str(store) + "/"):
                    add_entry(Path(t).relative_to(store).parts[0])
        # do not descend into the packages themselves (only their top-level dep links)
        if Path(dirpath) != nm and not Path(dirpath).name.startswith("@"):
            dirnames[:] = []


for w in ws:
    pj = w / "package.json"
    if not pj.exists():
        continue
    deps = json.loads(pj.read_text()).get("dependencies", {})
    for dep in deps:
        link = w / "node_modules" / dep
        if not link.is_symlink():
            continue  # workspace packages resolve through the workspace itself
        out.add(str(link.relative_to(root)))
        t = os.path.realpath(link)
        if t.startswith(str(store) + "/"):
            add_entry(Path(t).relative_to(store).parts[0])
for e in sorted(entries):
    out.add(str((store / e).relative_to(root)))
# workspace links (@mlx-bun/*) in each workspace's node_modules
for w in ws:
    d = w / "node_modules" / "@mlx-bun"
    if d.is_dir():
        for l in d.iterdir():
            out.add(str(l.relative_to(root)))
print("\n".join(sorted(out)))
