#!/usr/bin/env python3
"""Checks that hybra's includes follow the layer order of docs/architecture.md.

Each folder of include/hybra/ may include its own folder and the folders
below it in the order written in docs/architecture.md's "Layer order"
section. Every include that runs the other way must be listed in that
section's table of departures, with its reason; a departure that no longer
exists must be removed from the table. Exits 1, naming each, otherwise.
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
doc = (root / "docs" / "architecture.md").read_text()
section = doc.split("## Layer order", 1)[1].split("\n## ", 1)[0]
order = re.search(r"^order: (.+)$", section, re.M).group(1).split()
rank = {folder: i for i, folder in enumerate(order)}
allowed = set(re.findall(r"^\| `([\w/.]+)` → `([\w/.]+)` \|", section, re.M))

include = root / "include" / "hybra"


def folder_of(path):
    rel = path.relative_to(include)
    if len(rel.parts) == 1:
        return None  # the umbrella headers (hybra.hpp, eager.hpp, ...) sit above every folder
    if rel.parts[0] == "backend":
        return "backend/" + rel.parts[1]
    if rel.parts[0] == "nn" and rel.parts[1] == "model_zoo":
        return "nn"
    return rel.parts[0]


found = set()
for header in sorted(include.rglob("*.hpp")):
    source = folder_of(header)
    if source is None:
        continue
    if source not in rank:
        sys.exit(f"check-layers: folder {source} is not in the layer order of docs/architecture.md")
    for target in re.findall(r'^#include "([^"]+)"', header.read_text(), re.M):
        target_folder = folder_of((header.parent / target).resolve())
        if target_folder and rank[target_folder] > rank[source]:
            found.add((str(header.relative_to(include)), str((header.parent / target).resolve().relative_to(include))))

unlisted = sorted(found - allowed)
stale = sorted(allowed - found)
for a, b in unlisted:
    print(f"check-layers: {a} includes {b}, above it, and docs/architecture.md does not say why")
for a, b in stale:
    print(f"check-layers: docs/architecture.md lists {a} → {b}, which no longer exists")
print(f"check-layers: {len(found)} includes run up the layer order, each named in docs/architecture.md"
      if not unlisted and not stale else "check-layers: failed")
sys.exit(1 if unlisted or stale else 0)
