"""models.run's simulated figures do not change from run to run: two processes running the same
training command (bert-tiny, mixed precision, NpuGraph clusters, two measured steps, so the
step boundary's read-backs and input copies lie inside the measured span) report the same
simulated_us_per_step and launch the same kernels at the same start cycles with the same host
dispatch (docs/runtime.md, "Host dispatch"; docs/reports.md). A copy or an op that landed on the
chip's timeline wherever TensorFlow's executor threads had got to would move the kernels after
it, and with them the span, by its time (an HDC copy: at least the chip config's hdc.latency_us).
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ROOT, child_env  # noqa: E402  pylint: disable=wrong-import-position

COMMAND = ["--model", "bert-tiny", "--mode", "train", "--batch", "2", "--steps", "2",
           "--precision", "allow_mix_precision", "--timing-only", "--no-counters", "--quiet"]


def run_once(tmp_path, k):
    """(models.run's JSON, [(op name, kernel, start cycle, cycles, host dispatch cycles)] of its
    report's launches) of COMMAND in a fresh process on the tiny chip."""
    out, report = tmp_path / f"run{k}.json", tmp_path / f"report{k}"
    proc = subprocess.run([sys.executable, "-m", "models.run", *COMMAND, "--json", str(out),
                           "--report-dir", str(report)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    launches = json.loads((report / "launches.json").read_text())
    return figures, [(r["op_name"], r["kernel"], r["start_cycle"], r["cycles"],
                      r["host_dispatch_cycles"]) for r in launches]


def test_a_models_run_training_step_is_the_same_in_every_process(tmp_path):
    (fig1, launches1), (fig2, launches2) = run_once(tmp_path, 1), run_once(tmp_path, 2)
    assert fig1["ok"] and fig2["ok"]
    assert len(launches1) > 100
    first_diff = next((i for i, (a, b) in enumerate(zip(launches1, launches2)) if a != b), None)
    assert launches2 == launches1, (f"{len(launches2)} launches vs {len(launches1)}, first "
                                    f"unlike: #{first_diff}")
    for key in ("simulated_us_per_step", "kernel_us_per_step", "kernels_per_step"):
        assert fig2[key] == fig1[key], key
