"""The report of a generation split by phase (docs/reports.md, "Phases"; docs/llm.md): models.run
--mode generate marks the prefill and each decode step (npusim.mark_phase), so the report
folder answers where one decode step's time goes, not only the whole generation's.

llama-tiny on the tiny chip, batch 1, prompt 6 + 3 tokens. Checked against the runner's JSON
(the launch records split per token), the phase's own op_summary.csv and the model's config:
the phases' launches and kernel timelines are the JSON's prefill and decode steps; the decode
step's "Where the time goes" rows add up to its simulated time; the rows' launches and times
are those of op_summary.csv's rows of each kind (attention = the fused attention kernels, one
per layer; slice updates = the resident cache's row writes, layers x K / V; task overheads =
the column's sum); its one host dispatch is the chip config's host.graph_dispatch_us (a decode
step is one task list: docs/llm.md); the rate is batch / time.
"""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras_hub")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ROOT, child_env  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, ROOT)
from models import llm  # noqa: E402  pylint: disable=wrong-import-position

MODEL, PROMPT, GEN = "llama-tiny", 6, 3


def _chip_host(chip):
    import yaml  # pylint: disable=import-outside-toplevel
    host = {}
    for name in ("910b", chip):  # tiny.yaml extends 910b.yaml: its keys override
        with open(os.path.join(ROOT, "configs", "chips", name + ".yaml"), encoding="utf-8") as f:
            host.update(yaml.safe_load(f).get("host", {}))
    return host


def _section(text, heading):
    """The lines of summary.txt's section starting with `heading`, up to the blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    out = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        out.append(line)
    return lines[start], out


@pytest.fixture(scope="module")
def generation(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    out, rep = tmp / "gen.json", tmp / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "models.run", "--model", MODEL, "--mode", "generate",
         "--prompt-len", str(PROMPT), "--gen-len", str(GEN), "--chip", "tiny", "--json",
         str(out), "--report-dir", str(rep), "--quiet"], cwd=ROOT, env=child_env(),
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), rep


def test_phases_section_matches_the_runner(generation):
    r, rep = generation
    _, rows = _section((rep / "summary.txt").read_text(), "Phases (")
    phases = {}
    for line in rows[1:]:
        f = line.split()
        phases[f[0]] = {"times": int(f[1]), "launches": float(f[2]), "time": float(f[3]),
                        "kernels": float(f[6]), "rate": float(f[7])}
    assert set(phases) == {"prefill", "decode_step"}
    assert phases["prefill"]["times"] == 1 and phases["decode_step"]["times"] == GEN - 1
    assert phases["prefill"]["launches"] == r["prefill_kernels"]
    assert phases["decode_step"]["launches"] == r["decode_kernels_per_step"]
    # kernels = first launch start to last launch end: the JSON's TTFT and TPOT.
    assert phases["prefill"]["kernels"] == pytest.approx(r["ttft_us"], abs=2e-3)
    assert phases["decode_step"]["kernels"] == pytest.approx(r["tpot_us"], abs=2e-3)
    for p in phases.values():
        # The phase's time also holds its dispatch and the copies before its first launch.
        assert p["time"] >= p["kernels"]
        assert p["rate"] == pytest.approx(r["batch"] / (p["time"] * 1e-6), rel=1e-3)
    for name in phases:
        assert (rep / "phases" / name / "op_summary.csv").is_file()


def test_decode_step_time_split(generation):
    r, rep = generation
    folder = rep / "phases" / "decode_step"
    with open(folder / "op_summary.csv", encoding="utf-8") as f:
        ops = list(csv.DictReader(f))
    assert len(ops) == r["decode_kernels_per_step"]
    text = (folder / "summary.txt").read_text()
    assert "phase decode_step (occurrence 2 of 2)" in text.splitlines()[0]
    simulated = float(re.search(r"simulated time ([0-9.]+) us", text).group(1))
    mhz = float(re.search(r"([0-9.]+) MHz", text).group(1))
    duration = sum(int(o["task_duration_cycles"]) for o in ops) / mhz
    waits = sum(int(o["task_wait_cycles"]) for o in ops) / mhz
    assert duration + waits == pytest.approx(simulated, abs=0.01)

    heading, lines = _section(text, "Where the time goes")
    assert f"{simulated:.3f} us" in heading
    rows = {}
    for line in lines[1:]:
        if line.strip().startswith("HBM:"):
            continue
        m = re.match(r"\s+(.+?)\s{2,}(\d+\s+)?([0-9.]+)\s+([0-9.]+)%", line)
        assert m, line
        rows[m.group(1).strip()] = (int(m.group(2) or 0), float(m.group(3)))
    # The rows add up to the step's simulated time, their launches to the step's.
    assert sum(t for _, t in rows.values()) == pytest.approx(simulated, abs=0.01)
    kinds = {k: v for k, v in rows.items() if "(w/o task overheads)" in k}
    assert sum(n for n, _ in kinds.values()) == len(ops)

    def by_type(pred):  # launches, and their time without the task overheads in us
        sel = [o for o in ops if pred(o)]
        return len(sel), sum(int(o["task_duration_cycles"]) - int(o["task_overhead_cycles"])
                             for o in sel) / mhz

    cfg = llm.CONFIGS[MODEL][1]
    layers = cfg["num_layers"]
    attention = by_type(lambda o: "Attention" in o["OP Type"])
    updates = by_type(lambda o: "DynamicUpdateSlice" in o["OP Type"])
    cube = by_type(lambda o: int(o["cube_macs"]) > 0 and "Attention" not in o["OP Type"])
    # One fused decode attention per layer; the resident cache writes K and V rows per layer.
    assert attention[0] == layers and updates[0] == 2 * layers
    for key, (n, t) in (("attention", attention), ("slice updates", updates),
                        ("cube products", cube)):
        row = kinds[f"{key} (w/o task overheads)"]
        assert row[0] == n and row[1] == pytest.approx(t, abs=0.01), (key, row, n, t)
    # Every weight product of the model is among the cube rows: 7 per layer (q, k, v, o, gate,
    # up, down) and the vocabulary projection.
    assert cube[0] == 7 * layers + 1
    overhead = next(v for k, v in rows.items() if k.startswith("task overheads"))
    assert overhead[1] == pytest.approx(
        sum(int(o["task_overhead_cycles"]) for o in ops) / mhz, abs=0.01)
    wait_rows = sum(t for k, (_, t) in rows.items() if k.startswith("waits:"))
    assert wait_rows == pytest.approx(waits, abs=0.01)
    # A decode step is one task list: its one host dispatch is the config's.
    assert rows["waits: host dispatch"][1] == pytest.approx(
        _chip_host("tiny")["graph_dispatch_us"], abs=0.01)


def test_phase_names_are_checked(npusim):
    for bad in ("a/b", "", "..", "decode step"):
        with pytest.raises(npusim.NpusimError, match="phase name"):
            npusim.mark_phase(bad)
    with pytest.raises(npusim.NpusimError, match="items"):
        npusim.mark_phase("ok", items=-1)
