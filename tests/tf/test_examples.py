"""The user stories of examples/ run as scripts, as a user runs them (a fresh Python per
script, chip tiny through NPUSIM_CHIP, conftest.child_env).

story_resnet50.py (ResNet-50 at 224x224, batch 8, as written, every op of the step on the NPU) is
reduced to one train step: about a minute on the 2-core development machine. Its
activations do not fit the tiny chip's 1 GiB HBM (TensorFlow runs out of NPU memory in the
forward pass), so it runs on tiny with 16 GiB of HBM (memory.hbm.bytes; the HBM is sparse in
the emulator, untouched bytes cost no host memory)."""

import math
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

from conftest import ROOT, child_env  # noqa: E402  pylint: disable=wrong-import-position

EXAMPLES = os.path.join(ROOT, "examples")


def run_story(script, timeout, extra_env=None, args=()):
    env = child_env()
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def test_story_mlp_trains_on_the_npu():
    out = run_story("story_mlp.py", timeout=300)
    assert "NPUs: [PhysicalDevice(name='/physical_device:NPU:0', device_type='NPU')]" in out, out
    epochs = re.findall(r"^Epoch (\d+)/5$", out, re.M)
    assert epochs == ["1", "2", "3", "4", "5"], out
    losses = [float(v) for v in re.findall(r" - loss: ([0-9.]+)", out)]
    final = float(re.search(r"^final loss: (\S+)$", out, re.M).group(1))
    assert math.isfinite(final) and final > 0
    assert len(losses) == 5 and abs(losses[-1] - final) <= 1e-3 * final, (losses, final)
    # 256 memorisable samples: the loss falls over the 5 epochs (from ~ln 10 = 2.3).
    assert losses[-1] < losses[0], losses


def test_story_resnet50_one_step():
    out = run_story("story_resnet50.py", timeout=1200,
                    extra_env={"STORY_STEPS": "1",
                               "NPUSIM_CHIP_OVERRIDES": "memory.hbm.bytes=16 GiB"})
    losses = [float(v) for v in re.findall(r"^step \d+: loss (\S+)$", out, re.M)]
    assert len(losses) == 1 and math.isfinite(losses[0]) and losses[0] > 0, out
