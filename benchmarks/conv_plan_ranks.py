"""conv_plan_ranks.py [--chip 910b] [--ranks 12] [--json OUT] [NPUSIM]: the conv planner's
estimates against the simulated cycles of its candidates, on ResNet-50's forward convolutions at
batch 8 (the 19 layers after the first, with their launch counts in one training step).

For each layer it builds the kernel of the tilings with the 1st .. Nth lowest estimates
(NPUSIM_CONV_PLAN_RANK, adapter/compiler/ops/conv_tiling.cpp) with `npusim op Conv2DBiasAdd ...
--timing-only` and reads the estimate and the convolution launch's cycles. Prints per layer the
chosen plan's cycles, the fastest candidate's, and the Spearman rank correlation of estimate and
cycles over the candidates; then the launch-weighted totals. Stride-2 layers plan x both dense and
as a strided view (ops/conv2d.cpp plan_or_view); there the rank applies to each and the lower
estimate of the two ranked plans is built."""
import argparse, json, os, re, subprocess, sys

# (label, input NHWC, filter HWIO, stride, launches in the b8 step)
LAYERS = [
    ("1x1 64->64 @56", (8, 56, 56, 64), (1, 1, 64, 64), 1, 1),
    ("3x3 64->64 @56", (8, 56, 56, 64), (3, 3, 64, 64), 1, 3),
    ("1x1 64->256 @56", (8, 56, 56, 64), (1, 1, 64, 256), 1, 4),
    ("1x1 256->64 @56", (8, 56, 56, 256), (1, 1, 256, 64), 1, 2),
    ("1x1/2 256->128 @28", (8, 56, 56, 256), (1, 1, 256, 128), 2, 1),
    ("3x3 128->128 @28", (8, 28, 28, 128), (3, 3, 128, 128), 1, 4),
    ("1x1 128->512 @28", (8, 28, 28, 128), (1, 1, 128, 512), 1, 4),
    ("1x1/2 256->512 @28", (8, 56, 56, 256), (1, 1, 256, 512), 2, 1),
    ("1x1 512->128 @28", (8, 28, 28, 512), (1, 1, 512, 128), 1, 3),
    ("1x1/2 512->256 @14", (8, 28, 28, 512), (1, 1, 512, 256), 2, 1),
    ("3x3 256->256 @14", (8, 14, 14, 256), (3, 3, 256, 256), 1, 6),
    ("1x1 256->1024 @14", (8, 14, 14, 256), (1, 1, 256, 1024), 1, 6),
    ("1x1/2 512->1024 @14", (8, 28, 28, 512), (1, 1, 512, 1024), 2, 1),
    ("1x1 1024->256 @14", (8, 14, 14, 1024), (1, 1, 1024, 256), 1, 5),
    ("1x1/2 1024->512 @7", (8, 14, 14, 1024), (1, 1, 1024, 512), 2, 1),
    ("3x3 512->512 @7", (8, 7, 7, 512), (3, 3, 512, 512), 1, 3),
    ("1x1 512->2048 @7", (8, 7, 7, 512), (1, 1, 512, 2048), 1, 3),
    ("1x1/2 1024->2048 @7", (8, 14, 14, 1024), (1, 1, 1024, 2048), 2, 1),
    ("1x1 2048->512 @7", (8, 7, 7, 2048), (1, 1, 2048, 512), 1, 2),
]

LAUNCH = re.compile(r"^\s+launch \d+: (\S+) \(cube conv.*~(\d+) cycles\)$")


def run(npusim, chip, x, w, stride, rank):
    """(estimate, cycles) of the convolution launch, or None if that rank does not exist."""
    fmt = lambda t: "x".join(map(str, t))
    cmd = [npusim, "op", "Conv2DBiasAdd", "--input", f"f16:{fmt(x)}", "--input", f"f16:{fmt(w)}",
           "--input", f"f32:{w[3]}", "--attr", f"strides=[1,{stride},{stride},1]",
           "--attr", "padding=SAME", "--chip", chip, "--timing-only"]
    env = dict(os.environ, NPUSIM_CONV_PLAN_RANK=str(rank))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        if "NPUSIM_CONV_PLAN_RANK" in p.stdout + p.stderr:
            return None
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    name = est = None
    for line in p.stdout.splitlines():
        m = LAUNCH.match(line)
        if m:
            name, est = m.group(1), int(m.group(2))
        elif name and line.strip().startswith(name + ":"):
            return est, int(line.split(":")[1].split()[0])
    sys.exit(f"no cube conv launch in:\n{p.stdout}")


def spearman(a, b):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):  # ties share their mean rank
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def rank_args():
    """The command line of a plan-rank measurement: npusim, --chip, --ranks, --json."""
    ap = argparse.ArgumentParser()
    ap.add_argument("npusim", nargs="?", default="build/npusim")
    ap.add_argument("--chip", default="910b")
    ap.add_argument("--ranks", type=int, default=12)
    ap.add_argument("--json")
    return ap.parse_args()


def ranked(run_rank, ranks):
    """The candidates run_rank(k) gives for k = 1 .. ranks (until it gives None; each a tuple
    that starts with estimate, cycles), the index of the fastest, and the Spearman correlation
    of their estimates and cycles."""
    cands = []
    for k in range(1, ranks + 1):
        r = run_rank(k)
        if r is None:
            break
        cands.append(r)
    best = min(range(len(cands)), key=lambda i: cands[i][1])
    return cands, best, spearman([c[0] for c in cands], [c[1] for c in cands])


def main():
    args = rank_args()
    rows, tot_chosen, tot_best, tot_est = [], 0, 0, 0
    print(f"chip {args.chip}: layer (launches) | chosen: estimate, cycles | fastest of "
          f"{args.ranks}: rank, estimate, cycles | Spearman(estimate, cycles) | mean |est/cyc - 1|")
    for label, x, w, stride, launches in LAYERS:
        os.environ.pop("NPUSIM_CONV_PLAN_RANK", None)
        chosen = run(args.npusim, args.chip, x, w, stride, "")
        cands, best_k, rho = ranked(lambda k: run(args.npusim, args.chip, x, w, stride, k),
                                    args.ranks)
        err = sum(abs(e / c - 1) for e, c in cands) / len(cands)
        print(f"{label} ({launches}) | {chosen[0]}, {chosen[1]} | {best_k + 1}, {cands[best_k][0]}, "
              f"{cands[best_k][1]} | {rho:+.2f} | {err:.3f}", flush=True)
        rows.append(dict(layer=label, launches=launches, chosen=chosen, candidates=cands,
                         spearman=rho, mean_abs_err=err))
        tot_chosen += launches * chosen[1]
        tot_best += launches * cands[best_k][1]
        tot_est += launches * chosen[0]
    rhos = [r["spearman"] for r in rows if r["spearman"] == r["spearman"]]
    errs = [r["mean_abs_err"] for r in rows]
    print(f"all {sum(l[4] for l in LAYERS)} launches: chosen {tot_chosen} cycles (estimates "
          f"{tot_est}), fastest of each layer's {args.ranks} {tot_best} "
          f"({100 * (tot_best / tot_chosen - 1):+.1f} %); mean Spearman {sum(rhos) / len(rhos):+.2f}, "
          f"mean |est/cycles - 1| {sum(errs) / len(errs):.3f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
