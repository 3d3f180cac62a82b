"""compare_launches.py A.json B.json (written by launch_cycles.py): exits 1 unless both runs
launched the same kernels with identical block_dim and cycles and (where both recorded it)
produced bit-identical outputs; prints the first differences. Runs marked "unordered" (training
steps, whose independent ops TF's executor orders at run time) are compared as sorted lists."""
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
la, lb = a["launches"], b["launches"]
if a.get("unordered") or b.get("unordered"):
    la, lb = sorted(la), sorted(lb)
if len(la) != len(lb):
    print(f"DIFFERENT: {len(la)} vs {len(lb)} launches"); sys.exit(1)
diff = [(i, x, y) for i, (x, y) in enumerate(zip(la, lb)) if x != y]
for d in diff[:10]: print("DIFF", d)
print(f"{len(la)} launches, {len(diff)} differ; total cycles {sum(x[2] for x in la)} vs {sum(x[2] for x in lb)}; output sums {a['output_sum']} vs {b['output_sum']}")
same_output = a.get("output_sha1") == b.get("output_sha1") or not (a.get("output_sha1") and b.get("output_sha1"))
if not same_output:
    print(f"DIFFERENT outputs: sha1 {a['output_sha1']} vs {b['output_sha1']}")
sys.exit(1 if diff or not same_output else 0)
