"""Shared setup of the TensorFlow adapter tests (tests/tf).

Every test here needs tensorflow; without it the whole folder is skipped. The plugin is taken
from NPUSIM_TF_PLUGIN, else $NPUSIM_BUILD_DIR/libnpusim_tf_plugin.so (default build/); the
npusim package from the repository (adapter/tf/python). All tests of one pytest process share
one TensorFlow and one emulated chip: the tiny preset (NPUSIM_CHIP=tiny), which keeps kernels
fast, or the preset NPUSIM_TEST_CHIP names (910b, 910, 310p: as for the compiler tests,
docs/compiler.md "Tests on the chip presets"), whichever test opens the NPU first (the
environment is set, and npusim imported so that the plugin is loaded before any TensorFlow op,
when this file loads: the test files run in any order in one process). Tests
that need a fresh process (import order, configure before the device exists) run
a child Python (run_child).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(ROOT, "adapter", "tf", "python")
# The chip the tests run on: $NPUSIM_TEST_CHIP, default tiny.
TEST_CHIP = os.environ.get("NPUSIM_TEST_CHIP") or "tiny"


# Settings the tests expect at their defaults, whatever the caller's environment holds.
RESET_VARIABLES = ("NPUSIM_CHIP_OVERRIDES", "NPUSIM_REPORT_DIR", "NPUSIM_PRECISION_MODE",
                   "NPUSIM_RECORD_LAUNCHES", "NPUSIM_KEEP_DERIVED", "NPUSIM_MODIFY_MIXLIST",
                   "NPUSIM_MIX_PRECISION_GRAPH", "NPUSIM_LAUNCH_ORDER")


def _build_dir():
    return os.environ.get("NPUSIM_BUILD_DIR", os.path.join(ROOT, "build"))


def _plugin_from_build():
    return os.path.join(_build_dir(), "libnpusim_tf_plugin.so")


_SIZE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def config_bytes(value):
    """A size of a resolved chip config ("1 GiB", "256 KiB" or a plain number) in bytes."""
    number, _, unit = str(value).partition(" ")
    return int(float(number) * _SIZE_UNITS[unit or "B"])


_TEST_CHIP_CONFIG = []


def chip_config():
    """The resolved config of TEST_CHIP (`npusim config --chip TEST_CHIP`, YAML, `extends`
    applied), parsed: for expectations that depend on the chip (its cube's types, its paths,
    its HBM size)."""
    if not _TEST_CHIP_CONFIG:
        import yaml  # pylint: disable=import-outside-toplevel

        text = subprocess.run([os.path.join(_build_dir(), "npusim"), "config", "--chip",
                               TEST_CHIP], capture_output=True, text=True, check=True).stdout
        _TEST_CHIP_CONFIG.append(yaml.safe_load(text))
    return _TEST_CHIP_CONFIG[0]


def child_env():
    """Environment of a child process: the plugin and package of this test run, its chip."""
    env = dict(os.environ)
    env.setdefault("NPUSIM_TF_PLUGIN", _plugin_from_build())
    env["PYTHONPATH"] = PACKAGE_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env["NPUSIM_CHIP"] = TEST_CHIP
    for name in RESET_VARIABLES:
        env.pop(name, None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_child(code, timeout=120, extra_env=None):
    """Runs `code` in a fresh Python (child_env() updated by extra_env); returns the
    CompletedProcess (text output)."""
    env = child_env()
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


# Code for the inference-fusion tests' models (exec'd in the test process and prefixed to child
# code): set_batch_norms(model, seed, gamma, beta) gives every BatchNormalization non-trivial
# moving statistics and affine parameters (gamma and beta uniform in the given ranges);
# npu_second_run(npusim, tf, model, x) runs the model with training=False in a tf.function on
# the NPU twice and returns the second run's outputs (a list of arrays) and launch records.
INFERENCE_HELPERS = r"""
import numpy as np
import keras

def set_batch_norms(model, seed, gamma=(0.5, 1.5), beta=(-0.5, 0.5)):
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(*gamma, c).astype(np.float32))
            layer.beta.assign(rng.uniform(*beta, c).astype(np.float32))
            layer.moving_mean.assign(rng.uniform(-0.3, 0.3, c).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype(np.float32))

def npu_second_run(npusim, tf, model, x, training=False):
    with tf.device("/NPU:0"):
        f = tf.function(lambda t: model(t, training=training))
        xt = tf.constant(x)
        f(xt)
        n0 = len(npusim.launch_records())
        got = f(xt)
        recs = npusim.launch_records()[n0:]
    got = [np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])]
    return got, recs
"""


# A child's workload (run_child): the small CNN on the NPU predicts twice, trains three steps with
# Adam, predicts twice again (the same tf.function with new weights). Leaves `losses`, `preds`.
CNN_PREDICT_TRAIN_PREDICT = """
import tensorflow as tf
import keras
import models
keras.utils.set_random_seed(3)
x, y = models.synthetic_data("cnn", batch=8, seed=1)
model = models.build("cnn", seed=3)
model.compile(optimizer="adam", loss=models.loss("cnn"))
predict = tf.function(lambda t: model(t, training=False))
preds = [predict(x).numpy().tolist() for _ in range(2)]
losses = [float(model.train_on_batch(x, y)) for _ in range(3)]
preds += [predict(x).numpy().tolist() for _ in range(2)]
"""


# Child code (run_child) defining fit_steps(model, opt, x, y, device, steps=3): `steps` steps of
# a mean-squared-error training tf.function (GradientTape, opt.apply_gradients), run under the
# caller's device scope; returns the losses. On the NPU the launch records are cleared before
# each step, so they hold the last step's.
FIT_STEPS = r"""
def fit_steps(model, opt, x, y, device, steps=3):
    import npusim
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss

    losses = []
    for _ in range(steps):
        if device != "/CPU:0":
            npusim.clear_launch_records()
        losses.append(float(step(x, y).numpy()))
    return losses
"""


# Child code (run_child) defining keras3_batch_norm(x, gamma, beta): the training batch norm
# over axes [0, 1, 2] of a 4-D x as Keras 3 writes it (tf.nn.moments, then the affine chain; the
# graph pass's rewrite 0 fuses it with its gradient), and run_pattern_variants(pattern, args,
# variants): each variant's outputs of tf.function(pattern(*args, variant)) on the NPU and on the
# CPU, with the NPU's launched op types, printed as the child's RESULT line.
# Child code (after `import npusim` and `import tensorflow as tf`): Keras' train step under a loss
# scale, as `model.fit` runs it (the scaled loss's gradients, unscaled by the optimizer's
# `apply`), as a tf.function; `steps` steps on (x, y), the launch records cleared before each
# (so they hold the last step's). Returns the unscaled losses. Call it inside the device scope.
KERAS_SCALED_TRAIN = r"""
def scaled_train(model, opt, x, y, steps=3):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    losses = []
    for _ in range(steps):
        npusim.clear_launch_records()
        losses.append(float(step(x, y).numpy()))
    return losses
"""


KERAS3_BN_PATTERN = r"""
import json
import numpy as np
import npusim
import tensorflow as tf


def keras3_batch_norm(x, gamma, beta):
    mean = tf.reduce_mean(x, [0, 1, 2], keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, tf.stop_gradient(mean)), [0, 1, 2],
                         keepdims=True)
    mean, var = tf.squeeze(mean, [0, 1, 2]), tf.squeeze(var, [0, 1, 2])
    inv = tf.math.rsqrt(var + 1e-3) * gamma
    return x * inv + (beta - mean * inv)


def run_pattern_variants(pattern, args, variants):
    def run(variant, device):
        with tf.device(device):
            npusim.clear_launch_records()
            outs = tf.function(lambda *a: pattern(*a, variant))(*[tf.constant(a) for a in args])
            outs = [o.numpy().astype(np.float64).tolist() for o in outs]
        return {"outs": outs, "types": sorted({r["op_type"] for r in npusim.launch_records()})}

    print("RESULT " + json.dumps({v: {"npu": run(v, "/NPU:0"), "cpu": run(v, "/CPU:0")}
                                  for v in variants}))
"""


# Child code (run_child) defining train_conv_bn_relu(device, use_bias=False, blocks=1, axis=-1,
# batch=4, scale=True): Keras Input (8, 8, 3) -> `blocks` x (Conv2D ->
# BatchNormalization(axis, scale) -> ReLU; the
# first convolution 16 filters 3x3 "same", the second 32 filters 1x1) -> GlobalAveragePooling2D
# -> Dense(4), seeded (keras.utils.set_random_seed(0)), trained three SGD(0.1) steps (FIT_STEPS)
# on a fixed batch of `batch` samples under `device`. Returns its losses, weights, and the last
# step's launches (none on the CPU): their count, op types, (op type, kernel) pairs ("ops") and
# (op type, op name) pairs ("names").
CONV_BN_RELU_TRAIN = FIT_STEPS + r"""
def train_conv_bn_relu(device, use_bias=False, blocks=1, axis=-1, batch=4, scale=True):
    import numpy as np
    import npusim
    import tensorflow as tf
    import keras

    keras.utils.set_random_seed(0)
    with tf.device(device):
        inp = keras.Input((8, 8, 3))
        h = inp
        for conv in [dict(filters=16, kernel_size=3, padding="same"),
                     dict(filters=32, kernel_size=1)][:blocks]:
            h = keras.layers.Conv2D(**conv, use_bias=use_bias)(h)
            h = keras.layers.BatchNormalization(axis=axis, scale=scale)(h)
            h = keras.layers.ReLU()(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, keras.layers.Dense(4)(h))
        opt = keras.optimizers.SGD(0.1)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((batch, 8, 8, 3)).astype(np.float32))
        y = tf.constant(rng.standard_normal((batch, 4)).astype(np.float32))
        losses = fit_steps(model, opt, x, y, device)
    recs = npusim.launch_records() if device != "/CPU:0" else []
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "launches": len(recs), "types": sorted({r["op_type"] for r in recs}),
            "ops": sorted({(r["op_type"], r["kernel"]) for r in recs}),
            "names": sorted({(r["op_type"], r["op_name"]) for r in recs})}
"""


# Child code for the MatMul -> BiasAdd (MatMulBiasAdd) tests (prefixed to a child's code):
# second_run(fn, args) runs fn in a tf.function on the NPU twice and returns the second run's
# output (float64 array) and launch records ([op type, kernel]); DENSE_CASES, (m, k, n,
# transpose_a, transpose_b, relu): n = 24 and 130 rows that are not whole 32-byte blocks in f16
# (130 also in f32, past two 64-lane column groups); dense_case(rng, *case) the float32 operands
# a, b, bias and fn(a, b, bias) = MatMul -> BiasAdd [-> Relu]; dense_mlp(rng) a Keras MLP of
# three Dense layers (ReLU on the first two) with biases uniform in [-0.5, 0.5], and its input.
DENSE_HELPERS = r"""
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

def second_run(fn, args):
    with tf.device("/NPU:0"):
        f = tf.function(fn)
        ts = [tf.constant(a) for a in args]
        f(*ts)
        n0 = len(npusim.launch_records())
        got = f(*ts)
        recs = npusim.launch_records()[n0:]
    return np.asarray(got, np.float64), [[r["op_type"], r["kernel"]] for r in recs]

DENSE_CASES = [(20, 40, 24, False, False, True), (33, 70, 130, True, False, False),
               (64, 48, 96, False, True, True)]

def dense_case(rng, m, k, n, ta, tb, relu):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)

    def fn(a, b, c):
        y = tf.nn.bias_add(tf.linalg.matmul(a, b, transpose_a=ta, transpose_b=tb), c)
        return tf.nn.relu(y) if relu else y

    return a, b, c, fn

def dense_mlp(rng):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(96, activation="relu"),
                              keras.layers.Dense(20, activation="relu"), keras.layers.Dense(10)])
    for layer in model.layers:
        layer.bias.assign(rng.uniform(-0.5, 0.5, layer.bias.shape[0]).astype(np.float32))
    return model, rng.standard_normal((8, 30)).astype(np.float32)
"""


# Child code (run_child) defining small_cnn_training(device): a small CNN (Conv2D with bias,
# BatchNormalization, ReLU, global average pooling, Dense), Adam(0.01), a batch of 4 8x8x3 images
# with integer labels, built under the device scope after keras.utils.set_random_seed(0); returns
# (model, step, x, y), step(x, y) a tf.function of one softmax cross-entropy training step
# returning (loss, max |logit|), to be called under the device scope.
SMALL_CNN_TRAINING = r"""
def small_cnn_training(device):
    import numpy as np
    import tensorflow as tf
    import keras

    keras.utils.set_random_seed(0)
    with tf.device(device):
        inp = keras.Input((8, 8, 3))
        h = keras.layers.Conv2D(16, 3, padding="same")(inp)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, keras.layers.Dense(4)(h))
        opt = keras.optimizers.Adam(0.01)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((4, 8, 8, 3)).astype(np.float32))
        y = tf.constant(rng.integers(0, 4, 4).astype(np.int32))

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss, tf.reduce_max(tf.abs(logits))

    return model, step, x, y
"""


def assert_close_lists(got, want, rtol, atol):
    """got and want: lists of equal length whose items (arrays, nested lists) agree within
    numpy's assert_allclose(rtol, atol)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def training_batch_norm_relu(tf, h, gamma, beta, epsilon=1e-3):
    """Keras 3's BatchNormalization in training as it writes it (tf.nn.moments' Mean,
    SquaredDifference, Mean, Squeeze, then the inference chain on the batch statistics: the
    graph pass's rewrite 0 pattern) over NHWC h, then a ReLU; returns (mean, var, y)."""
    mean = tf.reduce_mean(h, [0, 1, 2], keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(h, tf.stop_gradient(mean)), [0, 1, 2],
                         keepdims=True)
    mean, var = tf.squeeze(mean, [0, 1, 2]), tf.squeeze(var, [0, 1, 2])
    inv = tf.math.rsqrt(var + epsilon) * gamma
    return mean, var, tf.nn.relu(h * inv + (beta - mean * inv))


def second_call(npusim, tf, f, args, device):
    """f as a tf.function on `device`, called twice on args; the second call's outputs (float64
    numpy arrays) and its launch records (none on the CPU)."""
    with tf.device(device):
        fn = tf.function(f)
        fn(*args)
        npusim.clear_launch_records()
        outs = [o.numpy().astype(np.float64) for o in fn(*args)]
    return outs, (npusim.launch_records() if device != "/CPU:0" else [])


def child_result(code, timeout=600, extra_env=None):
    """Runs `code` (run_child), which must succeed and print a line "RESULT<json>"; returns the
    last such JSON."""
    proc = run_child(code, timeout=timeout, extra_env=extra_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def runs_with_and_without(mode, code, off_env):
    """(mode, the child_result of `code`, the same with `off_env` added to the environment): a
    fusion's run and its switch-off run, both under allow_mix_precision where mode is "mixed"
    (else the default precision)."""
    env = {"NPUSIM_PRECISION_MODE": "allow_mix_precision"} if mode == "mixed" else {}
    return mode, child_result(code, extra_env=env), child_result(
        code, extra_env=dict(env, **off_env))


def launch_multiset_diff(off, on):
    """The launches (any comparable records, e.g. [op type, node name]) of `off` not matched one
    for one in `on` (missing), and those of `on` not matched in `off` (extra), as multisets."""
    missing, extra = list(off), []
    for launch in on:
        if launch in missing:
            missing.remove(launch)
        else:
            extra.append(launch)
    return missing, extra


def mlp_on_two_npus(samples):
    """A child's prelude (run_child): 2 tiny NPUs, an MLP builder `build`, its initial weights
    `init`, `samples` inputs `x` and labels `y`, and its `loss`; json, np, npusim, tf and keras
    imported."""
    return textwrap.dedent(f"""
        import json
        import numpy as np
        import npusim
        npusim.configure(chip="tiny", chips=2)
        import tensorflow as tf
        import keras

        def build():
            return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, "relu"),
                                     keras.layers.Dense(4)])

        keras.utils.set_random_seed(1)
        rng = np.random.default_rng(2)
        x = rng.normal(size=({samples}, 12)).astype(np.float32)
        y = rng.integers(0, 4, size=({samples},)).astype(np.int64)
        init = build().get_weights()
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        """)


def _use_the_test_chip():
    """Sets this process up for the tests' chip (TEST_CHIP) before any test module runs. The chip
    config is fixed when the process's first NPU op opens the device (one per process), so it
    must not depend on which test comes first: a test that imports npusim without the `npusim`
    fixture, run before the others, would otherwise open the default 910b, and every later
    configure(chip="tiny") would raise "already in use" (test files failed in some orders)."""
    os.environ.update({k: v for k, v in child_env().items()
                       if k in ("NPUSIM_TF_PLUGIN", "NPUSIM_CHIP")})
    # Quiet TensorFlow's C++ logging (before any test module imports tensorflow).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in RESET_VARIABLES:
        os.environ.pop(name, None)
    if PACKAGE_DIR not in sys.path:
        sys.path.insert(0, PACKAGE_DIR)


_use_the_test_chip()


def _load_the_plugin():
    """Imports npusim, which loads the plugin into TensorFlow, when this file loads: before any
    test module is collected or any test runs. TensorFlow creates its devices once per process,
    at its first op (or when devices are listed), and the NPU appears only if the plugin was
    loaded before that; `import npusim` after it raises NpusimError ("already created its
    devices"). So a test that runs a TensorFlow op (a CPU reference, say) without the `npusim`
    or `tf` fixture would, run first, make every later test of the process that needs the NPU
    fail: files passed alone and failed after others. Loading the plugin here makes the order
    of the test files in one process irrelevant. Without tensorflow nothing is loaded (the
    test files skip themselves); a plugin that cannot be found is an error here, naming it."""
    try:
        import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return
    import npusim  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import,redefined-outer-name


_load_the_plugin()


@pytest.fixture(scope="session")
def npusim():
    import npusim as module  # pylint: disable=import-outside-toplevel

    module.configure(chip=TEST_CHIP)
    return module


@pytest.fixture(scope="session")
def tf(npusim):  # pylint: disable=redefined-outer-name,unused-argument
    import tensorflow as module  # pylint: disable=import-outside-toplevel

    return module


@pytest.fixture
def strict_placement(tf):  # pylint: disable=redefined-outer-name
    """Soft placement off for one test: an op without an NPU kernel fails instead of moving."""
    previous = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)
    yield
    tf.config.set_soft_device_placement(previous)
