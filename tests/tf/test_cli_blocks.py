"""`npusim op` launches a compiled op with allocation blocks laid out as the TF plugin lays out
every tensor (tools/device_buffers.h, rt::TensorBlock), so the same op times alike from both: a
MatMul on the 910b (L2 page rotation) with a 32 KiB L2 (4 sets of 16 ways: pages of 4 lines),
small enough that the kernel's re-reads of A and B conflict in it. Its L2 outcome then depends
on how the L2 files the lines: by block, pages counted from each block's first line (the guard
line before the tensor), or at device addresses, pages from line 0 (the command line before:
10,666 cycles; by block without the guard lines, 10,731; as TensorFlow, 10,703). TensorFlow's
tensors lie elsewhere (the allocator's order, a tensor kept before them), which must not
matter either."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import _build_dir, run_child  # noqa: E402  pylint: disable=wrong-import-position

M, K, N = 200, 320, 272
SMALL_L2 = {"NPUSIM_CHIP": "910b", "NPUSIM_CHIP_OVERRIDES": "memory.l2.bytes=32768",
            "NPUSIM_FUNCTIONAL": "0"}

CHILD = r'''
import json
import numpy as np
import npusim
import tensorflow as tf
rng = np.random.default_rng(0)
with tf.device("/NPU:0"):
    pad = tf.ones([{pad}], tf.float16)  # a tensor allocated before the operands
    a = tf.identity(rng.standard_normal(({m}, {k})).astype(np.float16))
    b = tf.identity(rng.standard_normal(({k}, {n})).astype(np.float16))
    npusim.clear_launch_records()
    c = tf.linalg.matmul(a, b)
    c.numpy()
print("LAUNCHES", json.dumps([r["cycles"] for r in npusim.launch_records()
                              if r["op_type"] == "MatMul"]))
'''


def tf_matmul_cycles(pad):
    p = run_child(CHILD.format(pad=pad, m=M, k=K, n=N), timeout=300, extra_env=SMALL_L2)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("LAUNCHES ")]
    assert line, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(line[0][len("LAUNCHES "):])


def test_op_cli_times_a_matmul_as_tensorflow_does(tmp_path):
    out = tmp_path / "op.json"
    subprocess.run([os.path.join(_build_dir(), "npusim"), "op", "MatMul", "--input",
                    f"f16:{M}x{K}", "--input", f"f16:{K}x{N}", "--chip", "910b", "--set",
                    "memory.l2.bytes=32768", "--timing-only", "--json", str(out)],
                   check=True, capture_output=True, text=True)
    cli = [launch["cycles"] for launch in json.loads(out.read_text())["launches"]]
    assert cli, "npusim op ran no launch"
    for pad in (1, 2000):
        assert tf_matmul_cycles(pad) == cli, pad
