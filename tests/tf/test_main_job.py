"""The README's main job (models/train_demo.py, run by scripts/demo.sh) as a user runs it, on the
tiny chip with a small epoch: it trains, prints the final loss and the per-op summary, and
leaves a report folder whose op_statistic.csv agrees with the printed summary."""

import csv
import math
import re
import subprocess
import sys

from conftest import ROOT, child_env


def test_train_demo_prints_loss_summary_and_writes_report(tmp_path):
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "models.train_demo", "--chip", "tiny", "--samples", "256",
         "--report-dir", str(report)],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    loss = re.search(r"final loss ([0-9.]+|nan|inf)", out)
    assert loss and math.isfinite(float(loss.group(1))), out[-2000:]
    # The summary table: header, then rows "OpType count time share cube% vector%".
    rows = re.findall(r"^(\w+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)%\s+([0-9.]+)\s+([0-9.]+)$", out,
                      re.MULTILINE)
    types = {r[0]: int(r[1]) for r in rows}
    assert "MatMul" in types, out[-2000:]
    for name in ("op_summary.csv", "op_statistic.csv", "summary.txt", "trace.json"):
        assert (report / name).is_file(), name
    with open(report / "op_statistic.csv", newline="") as f:
        stats = {r["OP Type"] for r in csv.DictReader(f)}
    assert set(types) <= stats, (types, stats)
