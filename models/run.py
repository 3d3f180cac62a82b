"""Runs one model of the registry for a few steps on the emulated NPU (or TensorFlow's CPU) and
writes its figures as JSON: the runner of the main job, the benchmarks and `npusim sweep`.

    python -m models.run --model NAME --mode infer|train --batch B --steps S
        [--input-size N] [--chip CHIP] [--set dotted.key=value ...] [--precision MODE]
        [--report-dir DIR] [--json OUT] [--device NPU|CPU] [--timing-only] [--no-counters]
        [--quiet]
    python -m models.run --model LM --mode generate [--prompt-len P] [--gen-len G] [--batch B]
        [--dtype DTYPE] [--quantize int8] [--resident-cache | --copied-cache]
        [--kv-cache-dtype auto|DTYPE] [the options above]
        (language models: run_generate's docstring)

(from the repository root). One process runs one chip config (SystemC elaborates one chip per
process): a sweep starts one runner per config.

What it does: imports npusim (not with --device CPU) and calls npusim.configure(chip, overrides,
precision_mode, report_dir, functional=False with --timing-only) with the options given (an
option left out keeps the environment's setting: NPUSIM_CHIP, default 910b, ...); builds the model
under tf.device (seed 0, so the initial weights do not depend on the device); runs one warm-up step,
not measured (it traces the tf.function and compiles the NPU kernels), then S measured steps:

- infer: `model(x, training=False)` inside a tf.function;
- train: `model.train_on_batch(x, y)`, compiled with the registry's optimizer (models.optimizer:
  the model's own, resnet50_v15 MindSpore's Momentum, the BERT models MindSpore's Lamb; else
  Adam, lr 1e-3) and its loss (y a tuple for the BERT models: masked LM ids, next-sentence labels)
  (jit_compile=False on both devices: XLA cannot compile for the NPU).

Every step ends with the result copied to the host, so it has finished on the device.
--timing-only: kernels take their simulated time but compute nothing (docs/tf_plugin.md,
"Timing-only runs"): the simulated figures hold, the loss is undefined and left out of the JSON.

The JSON (printed as the last line of stdout, and written to --json OUT if given):

  model, mode, batch, steps, input_size, device ("NPU" or "CPU"), ok (true),
  chip, overrides, precision_mode   the device's settings as the plugin reports them (NPU;
                                    null on the CPU)
  wall_s_per_step                   mean host wall time of a measured step (s)
  warmup_wall_s                     wall time of the warm-up step (s)
  loss                              train: the loss of the last measured step (not with
                                    --timing-only)
  NPU only, from npusim.launch_records():
  simulated_us_per_step             device timeline of the measured steps / S: end of the last
                                    launch (start_cycle + cycles) minus start of the first launch,
                                    in us at the chip clock; includes the device's idle gaps
                                    between kernels (host copies, ops that ran on the CPU)
  kernel_us_per_step                sum of the launches' durations / S (no gaps)
  samples_per_s                     batch / (simulated_us_per_step / 1e6)
  kernels_per_step                  launches / S
  from the launch counters of the LAST measured step (steps are identical; fetching every
  step's counters costs host memory: the flat counters of bert_large's batch-8 step, 5,995
  launches, took 0.9 GB, its counter trees 7.7 GB), see launch_counters():
  cube_utilization_pct              100 x cube MACs / (cube m*k*n x cube cores x span cycles)
  vector_utilization_pct            100 x vector repeats x 256 B / (vector bytes_per_cycle x
                                    vector cores x span cycles)
  hbm_bytes_per_step                HBM read + write bytes
  l2_hit_rate                       L2 hits / lookups (chip.l2.hits, chip.l2.misses)
  (span = that step's device timeline, first launch start to last launch end; the utilisations
  are left out if the chip config cannot be read)
  device_peak_bytes                 TensorFlow's allocator peak on the NPU
                                    (tf.config.experimental.get_memory_info)
  cpu_fallback_ops                  npusim.cpu_fallback_ops(), if npusim has it
  CPU only:
  samples_per_s                     batch / wall_s_per_step (no simulated time on the CPU)

On any error: exit code 1 and {"ok": false, "error": "<type>: <message>", plus the request's
fields}. --report-dir DIR: npusim writes its report there at exit; its launch records are the
measured steps' (the warm-up's are cleared). --mode generate marks the report's phases
(npusim.mark_phase): "prefill" and "decode_step" (each step an occurrence), so DIR/summary.txt
has a "Phases" section and DIR/phases/prefill/ and DIR/phases/decode_step/ hold the reports of
the prefill and of the last decode step (docs/reports.md, "Phases").
"""

import argparse
import contextlib
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m models.run",
                                 description="Run a registry model on the emulated NPU.")
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=("infer", "train", "generate"), required=True)
    ap.add_argument("--batch", type=int, default=None, help="required for infer and train; "
                    "generate: default 1")
    ap.add_argument("--steps", type=int, default=None, help="measured steps (infer, train)")
    ap.add_argument("--prompt-len", type=int, default=128, help="generate: prompt tokens")
    ap.add_argument("--gen-len", type=int, default=32, help="generate: generated tokens")
    ap.add_argument("--quantize", choices=("int8",), default=None,
                    help="generate: quantise the Dense / EinsumDense kernels weight-only "
                    "(models.llm.quantize; the dtype must not be float16)")
    ap.add_argument("--resident-cache", action="store_true",
                    help="generate: the KV cache as a variable per layer written in place "
                    "(models.llm.ResidentCacheDecoder; GPT-2, Llama and Gemma models on the "
                    "NPU, float or int8); the default on the NPU (docs/llm.md)")
    ap.add_argument("--copied-cache", action="store_true",
                    help="generate: keras-hub's own decode step, the cache a tensor copied "
                    "once per step (models.llm.GreedyDecoder); the default on the CPU")
    ap.add_argument("--kv-cache-dtype", default="auto",
                    help="generate, resident cache: the cache variables' dtype; auto (default): "
                    "float16 for a float32 model on the NPU whose precision mode runs its "
                    "attention in fp16 (allow_fp32_to_fp16, allow_mix_precision), else the "
                    "model's compute dtype (docs/llm.md)")
    ap.add_argument("--dtype", default=None, help="generate: the model's dtype policy "
                    "(float32 default, bfloat16, float16, ...)")
    ap.add_argument("--input-size", type=int, default=None,
                    help="image side / feature count / sequence length (default: the model's)")
    ap.add_argument("--classes", type=int, default=None)
    ap.add_argument("--chip", default=None, help="preset or YAML file (default: NPUSIM_CHIP "
                    "or 910b)")
    ap.add_argument("--set", dest="overrides", action="append", default=None,
                    metavar="dotted.key=value", help="chip config override (repeatable)")
    ap.add_argument("--precision", default=None,
                    help="must_keep_origin_dtype | allow_fp32_to_fp16 | allow_mix_precision")
    ap.add_argument("--report-dir", default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--device", choices=("NPU", "CPU"), default="NPU")
    ap.add_argument("--timing-only", action="store_true",
                    help="kernels take their simulated time but compute nothing (outputs and "
                    "the loss are undefined): npusim.configure(functional=False)")
    ap.add_argument("--no-counters", action="store_true",
                    help="fetch no counters for the last step (the JSON then has no "
                    "hbm_bytes_per_step, l2_hit_rate or utilisations; --report-dir's "
                    "op_summary.csv still has them): a step of many thousand launches "
                    "(bert_large: 5,995) takes about a gigabyte of host memory otherwise")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.mode == "generate":
        a.batch = 1 if a.batch is None else a.batch
        a.steps = a.gen_len
        if a.prompt_len < 1 or a.gen_len < 1:
            ap.error("--prompt-len and --gen-len must be at least 1")
    elif a.batch is None or a.steps is None:
        ap.error(f"--mode {a.mode} needs --batch and --steps")
    elif a.dtype is not None:
        ap.error("--dtype is a generate option")
    if a.batch < 1 or a.steps < 1:
        ap.error("--batch and --steps must be at least 1")
    if a.timing_only and a.device == "CPU":
        ap.error("--timing-only is an NPU setting (TensorFlow's CPU always computes)")
    return a


def chip_peaks(npusim):
    """{clock_mhz, cube_macs_per_cycle, vector_repeats_per_cycle, hbm_gbps, hbm_efficiency} of
    the whole chip, from the resolved chip config the plugin loaded; None if it cannot be
    read."""
    try:
        import yaml  # pylint: disable=import-outside-toplevel

        text = npusim._hooks.chip_config_yaml()  # pylint: disable=protected-access
        cfg = yaml.safe_load(text) if text else None
    except Exception:  # pylint: disable=broad-except
        return None
    if not cfg:
        return None
    cores = cfg["cores"]
    # Split chip: cube cores (aic) and vector cores (aiv); coupled: every aicore has both.
    cube_cores = cores["aic"]["count"] if "aic" in cores else cores["aicore"]["count"]
    vector_cores = cores["aiv"]["count"] if "aiv" in cores else cores["aicore"]["count"]
    cube = cfg["cube"]
    return {
        "clock_mhz": float(cfg["clock_mhz"]),
        "cube_macs_per_cycle": cube["m"] * cube["k"] * cube["n"] * cube_cores,
        # One repeat is 256 bytes (docs/reports.md's roofline: repeats x 256 B / bytes_per_cycle).
        "vector_repeats_per_cycle": cfg["vector"]["bytes_per_cycle"] / 256.0 * vector_cores,
        # GB/s; None if the config has none
        "hbm_gbps": cfg.get("memory", {}).get("hbm", {}).get("gbps"),
        # sustained / peak HBM rate (memory.hbm.efficiency; 1 where the config has none)
        "hbm_efficiency": float(cfg.get("memory", {}).get("hbm", {}).get("efficiency", 1.0)),
    }


def _sum_flat(counters, totals):
    """Adds a launch's flat counters ({"aic0.m.macs": value, "l2.hits": value, ...}, the dotted
    names below "chip": launch_records(with_counters="flat")) to `totals`, keyed by "chip." and
    the name with the core names (aic0, aiv3, aicore7, ...) replaced by '*'."""
    for name, value in counters.items():
        parts = ["*" if p.startswith(("aic", "aiv")) and p[-1].isdigit() else p
                 for p in name.split(".")]
        key = "chip." + ".".join(parts)
        totals[key] = totals.get(key, 0) + value


def timeline(records):
    """(first start cycle, last end cycle, sum of durations in cycles) of launch records."""
    if not records:
        return None
    first = min(r["start_cycle"] for r in records)
    last = max(r["start_cycle"] + r["cycles"] for r in records)
    return first, last, sum(r["cycles"] for r in records)


def launch_counters(records, peaks):
    """Figures of one step from its launch records with flat counters: cube_macs (fp16-MAC
    equivalents), vector_repeats, hbm_bytes (read + write), and cube_utilization_pct /
    vector_utilization_pct over the step's device timeline against the whole chip's peak
    (chip_peaks; left out when peaks is None). The one place that reads the counters."""
    totals = {}
    for r in records:
        _sum_flat(r.get("counters", {}), totals)
    span = timeline(records)
    out = {
        "cube_macs": totals.get("chip.*.m.macs", 0),
        "vector_repeats": totals.get("chip.*.v.repeats", 0),
        "hbm_bytes": totals.get("chip.hbm.read_bytes", 0) + totals.get("chip.hbm.write_bytes", 0),
    }
    lookups = totals.get("chip.l2.hits", 0) + totals.get("chip.l2.misses", 0)
    if lookups:
        out["l2_hit_rate"] = totals.get("chip.l2.hits", 0) / lookups
    if peaks and span and span[1] > span[0]:
        cycles = span[1] - span[0]
        out["cube_utilization_pct"] = 100.0 * out["cube_macs"] / (
            peaks["cube_macs_per_cycle"] * cycles)
        out["vector_utilization_pct"] = 100.0 * out["vector_repeats"] / (
            peaks["vector_repeats_per_cycle"] * cycles)
    return out


def _clock_mhz(records, peaks):
    if peaks:
        return peaks["clock_mhz"]
    for r in records:  # time_us = cycles / clock_mhz
        if r["cycles"] and r["time_us"]:
            return r["cycles"] / r["time_us"]
    return None


def run(a, log):
    """Runs the request `a` (parse_args); returns the result dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import models  # pylint: disable=import-outside-toplevel

    models.spec(a.model)  # an unknown model fails here, before TensorFlow loads
    npusim = None
    if a.device == "NPU":
        import npusim  # pylint: disable=import-outside-toplevel,redefined-outer-name

        npusim.configure(chip=a.chip, overrides=a.overrides, precision_mode=a.precision,
                         report_dir=a.report_dir,
                         functional=False if a.timing_only else None)
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    result = {"model": a.model, "mode": a.mode, "batch": a.batch, "steps": a.steps,
              "input_size": a.input_size or models.spec(a.model).default_input_size,
              "device": a.device, "chip": None, "overrides": None, "precision_mode": None}
    device = "/NPU:0" if a.device == "NPU" else "/CPU:0"
    if a.mode == "generate":
        return run_generate(a, log, npusim, device, result)
    x, y = models.synthetic_data(a.model, a.batch, a.input_size, a.classes, seed=0)
    with tf.device(device):
        model = models.build(a.model, a.input_size, a.classes, seed=0)
        xt = tf.nest.map_structure(tf.constant, x)  # a dict for the language models
        yt = tf.nest.map_structure(tf.constant, y)  # a tuple for the BERT models
        if a.mode == "train":
            model.compile(optimizer=models.optimizer(a.model), loss=models.loss(a.model),
                          jit_compile=False)

            def step():
                # return_dict: the causal LMs compile with an accuracy metric besides the loss.
                return float(model.train_on_batch(xt, yt, return_dict=True)["loss"])
        else:
            forward = tf.function(lambda inputs: model(inputs, training=False))

            def step():
                return forward(xt).numpy()

        if npusim is not None:
            info = npusim.device_info()["settings"]
            result.update(chip=info["chip"], overrides=info["overrides"],
                          precision_mode=info["precision_mode"])
        log(f"{a.model} {a.mode} batch {a.batch} on {a.device}"
            + (f" (chip {result['chip']})" if npusim else "") + ": warm-up step")
        t0 = time.perf_counter()
        step()
        result["warmup_wall_s"] = time.perf_counter() - t0

        walls, out, earlier, with_counters = time_steps(step, a.steps, npusim, log,
                                                        keep_all=bool(a.report_dir),
                                                        counters=not a.no_counters)

    result["wall_s_per_step"] = float(np.mean(walls))
    if a.mode == "train" and not a.timing_only:
        result["loss"] = out
    if npusim is None:
        result["samples_per_s"] = a.batch / result["wall_s_per_step"]
        return result
    result.update(npu_figures(npusim, a.batch, a.steps, earlier, with_counters))
    return device_extras(npusim, tf, result)


def run_generate(a, log, npusim, device, result):
    """--mode generate: greedy generation with the KV cache (models/llm.py, GreedyDecoder) of
    --gen-len tokens after a random --prompt-len prompt. One warm-up (a prefill and one decode
    step: traces both tf.functions and compiles their kernels), then the measured generation,
    the launch records split per token. Figures (simulated, from the launch records):
      ttft_us             the prefill's device timeline (first launch start to last launch end)
      tpot_us             mean of the decode steps' timelines (a step: one token for the batch)
      decode_tokens_per_s batch / tpot
      tokens_per_s        batch x gen_len / (ttft + (gen_len - 1) x tpot)
      decode_step_us      every decode step's timeline; decode_kernel_us: its launches' sum
      decode_kernels_per_step, prefill_kernels
      kv_cache_dtype      the cache's dtype (--kv-cache-dtype; the model's with --copied-cache)
      weight_bytes, kv_cache_bytes, decode_roofline_us   (weight bytes + cache bytes) / HBM
                          bandwidth (memory.hbm.gbps): the time a batch-1 decode step needs at
                          least to read its weights and cache once
      decode_roofline_sustained_us   the same at the sustained rate the chip model streams at
                          (memory.hbm.gbps x memory.hbm.efficiency)
      wall_s_per_token    host wall time per decode step (the emulator's cost; on the CPU:
                          TensorFlow's), wall_s_prefill. On the NPU the measured generation
                          repeats the warm-up's launches, which the emulator replays
                          (prefill_replayed, decode_replayed_per_step: launches replayed, not
                          simulated): in timing-only runs nearly all of the prefill's are, so
                          wall_s_prefill is the replay's cost; warmup_wall_s_prefill is the
                          first prefill's (simulated, and the tf.function's tracing)
      cpu_s_per_token     the process's CPU time (all threads) per decode step: the cost
                          without the waits for a CPU that a loaded host adds to the wall time
    and tokens (the generated ids; undefined with --timing-only)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from models import llm  # pylint: disable=import-outside-toplevel

    if a.model not in llm.CONFIGS:
        raise ValueError(f"--mode generate needs a language model ({', '.join(llm.CONFIGS)}), "
                         f"not '{a.model}'")
    result.update(prompt_len=a.prompt_len, gen_len=a.gen_len, dtype=a.dtype, quantize=a.quantize)
    del result["steps"], result["input_size"]
    prompt = llm.prompt_tokens(a.model, a.batch, a.prompt_len, seed=0)
    with tf.device(device):
        if a.timing_only:  # weights are never materialised: zeros from a Fill kernel
            lm = llm.build_causal_lm(a.model, dtype=a.dtype, zero_weights=True)
        else:
            import keras  # pylint: disable=import-outside-toplevel

            keras.utils.set_random_seed(0)
            lm = llm.build_causal_lm(a.model, dtype=a.dtype)
        if a.quantize:
            # Timing-only: the int8 kernels and scales Keras adds are zeros from a Fill kernel
            # too; the quantised values it assigns come from the (zero) float kernels.
            ctx = llm.unmaterialized_weights() if a.timing_only else contextlib.nullcontext()
            with ctx:
                llm.quantize(lm, a.quantize)
        if npusim is not None:
            info = npusim.device_info()["settings"]
            result.update(chip=info["chip"], overrides=info["overrides"],
                          precision_mode=info["precision_mode"])
        result["weight_bytes"] = int(sum(
            int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in lm.weights))
        family = llm.CONFIGS[a.model][0]
        resident = a.resident_cache or (not a.copied_cache and a.device == "NPU" and
                                        family in llm.RESIDENT_CACHE_FAMILIES)
        cache_dtype = lm.compute_dtype
        if resident:
            cache_dtype = kv_cache_dtype(a.kv_cache_dtype, lm.compute_dtype,
                                         a.device, result["precision_mode"])
            gen = llm.ResidentCacheDecoder(lm, a.batch, a.prompt_len, a.gen_len,
                                           cache_dtype=cache_dtype)
        else:
            if a.kv_cache_dtype not in ("auto", lm.compute_dtype):
                raise ValueError(f"--kv-cache-dtype {a.kv_cache_dtype}: keras-hub's own step "
                                 f"(--copied-cache) keeps the cache in the model's dtype, "
                                 f"{lm.compute_dtype}")
            gen = llm.GreedyDecoder(lm, a.batch, a.prompt_len, a.gen_len)
        result["resident_cache"] = resident
        result["kv_cache_dtype"] = cache_dtype
        result["kv_cache_bytes"] = int(np.prod(gen.cache_shape)) * tf.as_dtype(cache_dtype).size
        log(f"{a.model} generate batch {a.batch} prompt {a.prompt_len} + {a.gen_len} on "
            f"{a.device}: warm-up (prefill and one decode step)")
        t0 = time.perf_counter()
        token, cache, _ = gen.prefill(tf.constant(prompt))
        token.numpy()
        result["warmup_wall_s_prefill"] = time.perf_counter() - t0
        gen.step(token, cache, tf.constant(a.prompt_len, tf.int32))[0].numpy()
        result["warmup_wall_s"] = time.perf_counter() - t0

        marks, walls, cpus = [], [], []
        if npusim is not None:
            npusim.clear_launch_records()
        last = [time.perf_counter(), time.process_time()]

        def on_token(i):
            now, cpu = time.perf_counter(), time.process_time()
            walls.append(now - last[0])
            cpus.append(cpu - last[1])
            last[0], last[1] = now, cpu
            if npusim is not None:
                marks.append(len(npusim.launch_records()))
                # The report's phases: the prefill, then each decode step (one token each).
                npusim.mark_phase("decode_step" if i + 1 < a.gen_len else None,
                                  items=a.batch, unit="tokens")
            log(f"  token {i + 1}/{a.gen_len}: {walls[-1]:.2f} s wall")

        if npusim is not None:
            npusim.mark_phase("prefill", items=a.batch, unit="tokens")
        tokens = gen.generate(prompt, on_token=on_token)
    result["tokens"] = tokens.tolist()
    result["wall_s_prefill"] = walls[0]
    if len(walls) > 1:
        result["wall_s_per_token"] = float(np.mean(walls[1:]))
        result["cpu_s_per_token"] = float(np.mean(cpus[1:]))
    if npusim is None:
        if len(walls) > 1:
            result["decode_tokens_per_s"] = a.batch / result["wall_s_per_token"]
        return result
    records = npusim.launch_records()
    failed = [r for r in records if not r["ok"]]
    if failed:
        raise RuntimeError(f"{len(failed)} launches failed on the NPU, first: "
                           f"{failed[0]['kernel']}: {failed[0]['error']}")
    peaks = chip_peaks(npusim)
    clock = _clock_mhz(records, peaks)
    bounds = [0] + marks
    spans = [timeline(records[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
    if any(s is None for s in spans):
        raise RuntimeError("a generation step ran no launch on the NPU")
    us = [(s[1] - s[0]) / clock for s in spans]
    result["ttft_us"] = us[0]
    result["prefill_kernels"] = bounds[1]
    # Launches the emulator replayed from the warm-up's (sim/replay: same kernel and arguments),
    # which the wall times above then do not simulate.
    replayed = [sum(1 for r in records[lo:hi] if r.get("replayed"))
                for lo, hi in zip(bounds, bounds[1:])]
    result["prefill_replayed"] = replayed[0]
    if len(replayed) > 1:
        result["decode_replayed_per_step"] = float(np.mean(replayed[1:]))
    if len(us) > 1:
        result["decode_step_us"] = us[1:]
        result["decode_kernel_us"] = [s[2] / clock for s in spans[1:]]
        result["tpot_us"] = float(np.mean(us[1:]))
        result["decode_tokens_per_s"] = a.batch / (result["tpot_us"] / 1e6)
        result["decode_kernels_per_step"] = (bounds[-1] - bounds[1]) / (len(bounds) - 2)
    tpot = result.get("tpot_us", 0.0)
    result["tokens_per_s"] = a.batch * a.gen_len / ((us[0] + (a.gen_len - 1) * tpot) / 1e6)
    if peaks and peaks["hbm_gbps"]:
        result["decode_roofline_us"] = (result["weight_bytes"] + result["kv_cache_bytes"]) / (
            peaks["hbm_gbps"] * 1e3)
        result["decode_roofline_sustained_us"] = (
            result["decode_roofline_us"] / peaks["hbm_efficiency"])
    return device_extras(npusim, tf, result)


# Precision modes in which the plugin runs a float32 model's fused attention in fp16.
FP16_ATTENTION_MODES = ("allow_fp32_to_fp16", "allow_mix_precision")


def kv_cache_dtype(choice, compute_dtype, device, precision_mode):
    """The resident cache's dtype for --kv-cache-dtype `choice`: "auto" gives float16 for a
    float32 model on the NPU in a precision mode whose attention reads fp16 K / V anyway (so
    holding them in fp16 changes no value and saves the step's cast of the whole cache), else
    the model's compute dtype; any other choice is taken as given."""
    if choice != "auto":
        return choice
    if device == "NPU" and compute_dtype == "float32" and precision_mode in FP16_ATTENTION_MODES:
        return "float16"
    return compute_dtype


def device_extras(npusim, tf, result):
    """Adds device_peak_bytes (TensorFlow's allocator peak on the NPU) and cpu_fallback_ops
    (if npusim has it) to result; returns it."""
    try:
        result["device_peak_bytes"] = tf.config.experimental.get_memory_info("NPU:0")["peak"]
    except Exception:  # pylint: disable=broad-except
        pass
    if hasattr(npusim, "cpu_fallback_ops"):
        result["cpu_fallback_ops"] = npusim.cpu_fallback_ops()
    return result


def time_steps(step, steps, npusim=None, log=None, keep_all=False, counters=True):
    """Runs step() `steps` times after the warm-up (which the caller ran). Returns (wall seconds
    per step, the last step's result, the launch records of steps 1..S-1 without counters, the
    last step's records with counters). With npusim the records are cleared first; keep_all:
    they are not cleared before the last step either (a report then holds every measured step)
    and the records returned split at the last step. counters=False fetches no counters (the
    last list is then without them too; else they are flat: launch_counters())."""
    if npusim is not None:
        npusim.clear_launch_records()
    earlier, walls, out = [], [], None
    for i in range(steps):
        if npusim is not None and i == steps - 1:
            earlier = npusim.launch_records()
            if not keep_all:
                npusim.clear_launch_records()
        t0 = time.perf_counter()
        out = step()
        walls.append(time.perf_counter() - t0)
        if log:
            log(f"  step {i + 1}/{steps}: {walls[-1]:.2f} s wall")
    last = []
    if npusim is not None:
        # Flat counters: the counter trees (units and descriptions with every value) of
        # bert_large's batch-8 step, 5,995 launches, took 7.7 GB of host memory, 2.5 min.
        last = npusim.launch_records(with_counters="flat" if counters else False)
        if keep_all:
            last = last[len(earlier):]
    return walls, out, earlier, last


def npu_figures(npusim, batch, steps, earlier, last):
    """The simulated figures of the contract from time_steps' records (the module docstring):
    simulated_us_per_step, kernel_us_per_step, samples_per_s, kernels_per_step, and from the
    last step's counters (when fetched) hbm_bytes_per_step and the utilisations."""
    records = earlier + [{k: v for k, v in r.items() if k != "counters"} for r in last]
    failed = [r for r in records if not r["ok"]]
    if failed:
        raise RuntimeError(f"{len(failed)} launches failed on the NPU, first: "
                           f"{failed[0]['kernel']}: {failed[0]['error']}")
    out = {}
    peaks = chip_peaks(npusim)
    span = timeline(records)
    clock = _clock_mhz(records, peaks)
    if span and clock:
        out["simulated_us_per_step"] = (span[1] - span[0]) / clock / steps
        out["kernel_us_per_step"] = span[2] / clock / steps
        out["samples_per_s"] = batch / (out["simulated_us_per_step"] / 1e6)
    out["kernels_per_step"] = len(records) / steps
    # Where the emulator's own wall time goes (launch records' wall_us): seconds per step by op
    # type, largest first; what is left of the step's wall time is TensorFlow, Python and copies.
    by_type = {}
    for r in records:
        key = r.get("op_type") or r["kernel"]
        by_type[key] = by_type.get(key, 0.0) + r.get("wall_us", 0.0) / 1e6 / steps
    out["emulator_wall_s_per_step"] = sum(by_type.values())
    out["emulator_wall_s_by_op_type"] = dict(sorted(by_type.items(), key=lambda kv: -kv[1]))
    if last and "counters" in last[0]:
        figures = launch_counters(last, peaks)
        out["hbm_bytes_per_step"] = figures["hbm_bytes"]
        if "l2_hit_rate" in figures:
            out["l2_hit_rate"] = figures["l2_hit_rate"]
        for key in ("cube_utilization_pct", "vector_utilization_pct"):
            if key in figures:
                out[key] = figures[key]
    return out


def main(argv=None):
    a = parse_args(argv)

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    request = {"model": a.model, "mode": a.mode, "batch": a.batch, "steps": a.steps,
               "device": a.device, "chip": a.chip, "overrides": a.overrides}
    try:
        result = dict(run(a, log), ok=True)
        code = 0
    except Exception as e:  # pylint: disable=broad-except
        if not a.quiet:
            traceback.print_exc()
        result = dict(request, ok=False, error=f"{type(e).__name__}: {e}")
        code = 1
    text = json.dumps(result)
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
