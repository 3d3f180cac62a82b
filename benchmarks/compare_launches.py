"""compare_launches.py A.json B.json (written by launch_cycles.py): exits 1 unless both runs
launched the same kernels with identical block_dim and cycles and (where both recorded it)
produced bit-identical outputs; prints the first differences. Runs marked "unordered" (training
steps, whose independent ops TF's executor orders at run time) are compared as multisets: a
launch differs when no launch of the other run has its kernel, block_dim and cycles, and the
differences are printed by kernel (A's unmatched launches beside B's)."""
import collections, json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
la, lb = a["launches"], b["launches"]
if len(la) != len(lb):
    print(f"DIFFERENT: {len(la)} vs {len(lb)} launches")
if a.get("unordered") or b.get("unordered"):
    ca = collections.Counter(tuple(x) for x in la)
    cb = collections.Counter(tuple(x) for x in lb)
    only_a, only_b = ca - cb, cb - ca
    ndiff = max(sum(only_a.values()), sum(only_b.values()))
    by_kernel = collections.defaultdict(lambda: ([], []))
    for side, only in ((0, only_a), (1, only_b)):
        for (name, blocks, cycles), n in only.items():
            by_kernel[name][side].extend([(blocks, cycles)] * n)
    def shown(xs):  # (block_dim, cycles) pairs, the first 12
        xs = sorted(xs)
        return f"{xs[:12]}{f' ... {len(xs)} in all' if len(xs) > 12 else ''}"
    for name, (xa, xb) in sorted(by_kernel.items())[:20]:
        print(f"DIFF {name}: {len(xa)} in A {shown(xa)}, {len(xb)} in B {shown(xb)}")
else:
    diff = [(i, x, y) for i, (x, y) in enumerate(zip(la, lb)) if x != y]
    ndiff = len(diff) + abs(len(la) - len(lb))
    for d in diff[:10]: print("DIFF", d)
print(f"{len(la)} vs {len(lb)} launches, {ndiff} differ; total cycles {sum(x[2] for x in la)} vs "
      f"{sum(x[2] for x in lb)}; output sums {a['output_sum']} vs {b['output_sum']}")
same_output = a.get("output_sha1") == b.get("output_sha1") or not (a.get("output_sha1") and b.get("output_sha1"))
if not same_output:
    print(f"DIFFERENT outputs: sha1 {a['output_sha1']} vs {b['output_sha1']}")
sys.exit(1 if ndiff or not same_output else 0)
