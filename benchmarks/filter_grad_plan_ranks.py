"""filter_grad_plan_ranks.py [--chip 910b] [--ranks 12] [--json OUT] [NPUSIM]: the fused filter
gradient's estimates against the simulated cycles of its candidates, on the filter gradients of
ResNet-50's convolutions at batch 8 (conv_plan_ranks.py's 19 layers, f16).

For each layer it builds the fused kernel (NPUSIM_FILTER_GRAD_POINTWISE=fused on the 1x1 stride-1
layers) of the plans with the 1st .. Nth lowest estimates (NPUSIM_FILTER_GRAD_PLAN_RANK,
adapter/compiler/ops/conv2d.cpp plan_fused_filter_grad: part counts and tilings together) with
`npusim op Conv2DBackpropFilter ... --timing-only` and reads the estimate and the FilterGrad
launch's cycles (task overheads included, which no estimate counts). Prints per layer the chosen
plan's, the fastest candidate's, and the Spearman rank correlation of estimate and cycles over
the candidates; then the launch-weighted totals."""
import json, os, re, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_plan_ranks import LAYERS, rank_args, ranked  # noqa: E402

LAUNCH = re.compile(r"^\s+launch \d+: (FilterGrad_\S+) \(.*modelled ~(\d+) cycles")


def run(npusim, chip, x, w, stride, rank):
    """(estimate, cycles, plan) of the FilterGrad launch, or None if that rank does not exist."""
    fmt = lambda t: "x".join(map(str, t))
    o = -(-x[1] // stride)
    dy = (x[0], o, o, w[3])
    padding = "VALID" if w[0] == 1 else "SAME"
    cmd = [npusim, "op", "Conv2DBackpropFilter", "--input", f"f16:{fmt(x)}",
           "--input", f"f16:{fmt(dy)}", "--attr", f"filter_sizes=[{','.join(map(str, w))}]",
           "--attr", f"strides=[1,{stride},{stride},1]", "--attr", f"padding={padding}",
           "--chip", chip, "--timing-only"]
    env = dict(os.environ, NPUSIM_FILTER_GRAD_PLAN_RANK=str(rank))
    if w[0] == 1 and stride == 1:
        env["NPUSIM_FILTER_GRAD_POINTWISE"] = "fused"
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        if "only" in p.stdout + p.stderr and "plans fit" in p.stdout + p.stderr:
            return None
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    name = est = plan = None
    for line in p.stdout.splitlines():
        m = LAUNCH.match(line)
        if m:
            name, est = m.group(1), int(m.group(2))
            plan = re.search(r"(\d+ parts: tiles of .*?\(L0 steps of \d+\))", line).group(1)
        elif name and line.strip().startswith(name + ":"):
            return est, int(line.split(":")[1].split()[0]), plan
    sys.exit(f"no FilterGrad launch in:\n{p.stdout}")


def main():
    args = rank_args()
    rows, tot_chosen, tot_best, tot_est = [], 0, 0, 0
    print(f"chip {args.chip}: layer (launches) | chosen: estimate, cycles | fastest of "
          f"{args.ranks}: rank, estimate, cycles | Spearman(estimate, cycles)")
    for label, x, w, stride, launches in LAYERS:
        cands, best_k, rho = ranked(lambda k: run(args.npusim, args.chip, x, w, stride, k),
                                    args.ranks)
        print(f"{label} ({launches}) | {cands[0][0]}, {cands[0][1]} | {best_k + 1}, "
              f"{cands[best_k][0]}, {cands[best_k][1]} ({cands[best_k][2]}) | {rho:+.2f}",
              flush=True)
        rows.append(dict(layer=label, launches=launches, candidates=cands, spearman=rho))
        tot_chosen += launches * cands[0][1]
        tot_best += launches * cands[best_k][1]
        tot_est += launches * cands[0][0]
    rhos = [r["spearman"] for r in rows if r["spearman"] == r["spearman"]]
    print(f"all {sum(l[4] for l in LAYERS)} launches (fused): chosen {tot_chosen} cycles "
          f"(estimates {tot_est}), fastest of each layer's {args.ranks} {tot_best} "
          f"({100 * (tot_best / tot_chosen - 1):+.1f} %); mean Spearman "
          f"{sum(rhos) / len(rhos):+.2f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
