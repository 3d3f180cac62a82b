"""The child script the decode-step tests share (tests/tf/test_llm_decode_graph.py,
test_kv_cache_in_place.py): a tiny Llama's greedy generation (prompt 8, 3 tokens: a prefill and
two decode steps) on the CPU and on the NPU with the CPU's weights.

greedy_generation(name, batch, tail) is the script's text: it leaves `cpu` and `npu` (the
models), `dec` (the NPU's GreedyDecoder), `recs` (the NPU run's launch records), `marks` (the
number of launch records at each generated token: marks[0] ends the prefill, marks[i] the
i-th decode step) and `batch`; `tail` is code run after it that sets a dict `extra`. The script
prints "RESULT<json>" (conftest.child_result reads it) with the NPU's and the CPU's tokens and
logits, whether every launch succeeded (`ok`) and `extra`'s entries.
"""

import numpy as np

from conftest import ROOT

_PRELUDE = r'''
import json, sys
sys.path.insert(0, %r)
import npusim, tensorflow as tf
import models
from models import llm
name, batch, prompt_len, gen_len = %r, %d, 8, 3
npusim.configure(chip="tiny")
prompt = llm.prompt_tokens(name, batch, prompt_len, seed=1)
with tf.device("/CPU:0"):
    cpu = models.build(name, seed=0)
    want, want_logits = llm.GreedyDecoder(cpu, batch, prompt_len, gen_len).generate(
        prompt, return_logits=True)
marks = []
with tf.device("/NPU:0"):
    npu = models.build(name, seed=0)
    npu.set_weights(cpu.get_weights())
    dec = llm.GreedyDecoder(npu, batch, prompt_len, gen_len)
    npusim.clear_launch_records()
    got, got_logits = dec.generate(
        prompt, return_logits=True, on_token=lambda i: marks.append(len(npusim.launch_records())))
recs = npusim.launch_records()
'''

_RESULT = r'''
print("RESULT" + json.dumps(dict(
    tokens=got.tolist(), logits=got_logits.tolist(), cpu_tokens=want.tolist(),
    cpu_logits=want_logits.tolist(), ok=all(r["ok"] for r in recs), **extra)))
'''


def greedy_generation(name, batch, tail):
    """The child script: the generation, then `tail` (which sets `extra`), then the result."""
    return _PRELUDE % (ROOT, name, batch) + tail + _RESULT


def assert_cpu_tokens(r):
    """The NPU's greedy tokens equal the CPU's, where the CPU's two best logits lie further
    apart than twice the largest NPU-CPU logit difference (else an argmax could flip on
    rounding alone: the precondition of tests/tf/test_llm.py)."""
    got, want = np.array(r["tokens"]), np.array(r["cpu_tokens"])
    got_logits, want_logits = np.array(r["logits"]), np.array(r["cpu_logits"])
    d = float(np.abs(got_logits - want_logits).max())
    top2 = np.sort(want_logits, axis=-1)[..., -2:]
    margin = float((top2[..., 1] - top2[..., 0]).min())
    assert margin > 2 * d, "precondition: the CPU's two best logits are too close to compare"
    np.testing.assert_array_equal(got, want)
