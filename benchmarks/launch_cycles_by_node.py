#!/usr/bin/env python3
"""Each launch's own cycles in two runs of one model, matched by node: which launches took
fewer cycles in B than in A, which more, which the same.

Reads the launches.json of two report directories (NPUSIM_REPORT_DIR of two runs of
`benchmarks/launch_cycles.py`, e.g. one in order and one with NPUSIM_GRAPH_CONCURRENT=1) and
matches their launches by (node, kernel, occurrence in the run's launch order), which holds
however TensorFlow's executor ordered independent ops (compare_launches.py compares the
(kernel, block_dim, cycles) multisets instead, which says how many differ but not by how much).
Prints the counts and the summed cycles of each side, and the launches that gained most.
Exits 1 when the two runs' launches do not match one to one (different graphs or models).

    launch_cycles_by_node.py A_REPORT_DIR B_REPORT_DIR [N]   (N: gains to list, default 8)
"""
import collections
import json
import os
import sys


def by_node(report_dir):
    """{(node, kernel, occurrence): cycles} of the report's launches, occurrences counted in
    the order the launches were made (their `index`)."""
    with open(os.path.join(report_dir, "launches.json"), encoding="utf-8") as f:
        launches = json.load(f)
    seen = collections.Counter()
    out = {}
    for r in sorted(launches, key=lambda r: r["index"]):
        key = (r["op_name"], r["kernel"])
        seen[key] += 1
        out[key + (seen[key],)] = r["cycles"]
    return out


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    a, b = by_node(argv[1]), by_node(argv[2])
    shown = int(argv[3]) if len(argv) == 4 else 8
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        print(f"launches differ: {len(only_a)} only in A (first {only_a[:3]}), {len(only_b)} only "
              f"in B (first {only_b[:3]})")
        return 1
    fewer = sorted((b[k] - a[k], k) for k in a if b[k] < a[k])
    more = [k for k in a if b[k] > a[k]]
    print(f"{len(a)} launches: {len(a) - len(fewer) - len(more)} the same, {len(fewer)} fewer "
          f"cycles in B ({sum(d for d, _ in fewer):+,}), {len(more)} more "
          f"({sum(b[k] - a[k] for k in more):+,})")
    print(f"own cycles summed: A {sum(a.values()):,}, B {sum(b.values()):,}")
    for d, (node, kernel, n) in fewer[:shown]:
        print(f"  {d:+,}  {node} ({kernel}, #{n}): {a[(node, kernel, n)]:,} -> "
              f"{b[(node, kernel, n)]:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
