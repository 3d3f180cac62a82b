"""Keras 3 and the NPU: keep XLA out of model.compile(jit_compile=...).

XLA has no compiler for a PluggableDevice, so a train step compiled with jit_compile=True cannot
run on the NPU.

- jit_compile="auto": Keras 3 resolves it to True as soon as TensorFlow lists any non-CPU
  physical device (keras/src/trainers/trainer.py, Trainer._resolve_auto_jit_compile). The patch
  makes "auto" resolve to False when the only non-CPU devices are NPUs, and defers to Keras
  otherwise.
- jit_compile=True, explicitly: fit / evaluate / predict raise a ValueError saying that XLA
  cannot compile for the NPU (instead of TensorFlow's error from deep inside XLA), unless the
  call runs under a tf.device scope that is not the NPU (e.g. "/CPU:0", where XLA works).
  The check is in TensorFlowTrainer.make_train/test/predict_function
  (keras/src/backend/tensorflow/trainer.py), which every fit/evaluate/predict calls first.

tf-keras (TF_USE_LEGACY_KERAS=1) needs none of this: it turns XLA on only when a GPU exists.

Keras is not imported here: each patch is applied when its module is first imported (a one-shot
import hook), or at once if it already is.
"""

import functools
import importlib.abc
import importlib.machinery
import sys

TRAINER_MODULE = "keras.src.trainers.trainer"
TF_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"

XLA_MESSAGE = (
    "jit_compile=True asks XLA to compile the model's step function, and XLA cannot compile "
    "for the NPU (TensorFlow has no XLA backend for a PluggableDevice). Compile the model with "
    "jit_compile=False (or leave the default \"auto\", which npusim resolves to False), or run "
    "it under tf.device(\"/CPU:0\") to use XLA on the CPU.")


def _only_npus():
    import tensorflow as tf

    return not [d for d in tf.config.list_physical_devices()
                if d.device_type not in ("CPU", "NPU")]


def _patch_trainer(module):
    trainer = getattr(module, "Trainer", None)
    # vars(): the flag must be the class's own (TensorFlowTrainer inherits from Trainer).
    if trainer is None or vars(trainer).get("_npusim_patched", False):
        return
    original = trainer._resolve_auto_jit_compile  # pylint: disable=protected-access

    def _resolve_auto_jit_compile(self):
        if _only_npus():
            return False  # XLA cannot compile for the NPU
        return original(self)

    # pylint: disable=protected-access
    trainer._resolve_auto_jit_compile = _resolve_auto_jit_compile
    trainer._npusim_patched = True


def _runs_on_the_npu():
    """True when ops without a device scope, or in the current scope, would go to the NPU."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    if not tf.config.list_physical_devices("NPU"):
        return False
    scope = context.context().device_name or ""
    # No scope: TensorFlow prefers the NPU (a PluggableDevice outranks the CPU).
    return scope == "" or "NPU" in scope.upper()


def _patch_tf_trainer(module):
    trainer = getattr(module, "TensorFlowTrainer", None)
    if trainer is None or vars(trainer).get("_npusim_patched", False):
        return

    def checked(make):
        def make_function(self, force=False):
            if not self.run_eagerly and self.jit_compile is True and _runs_on_the_npu():
                raise ValueError(XLA_MESSAGE)
            return make(self, force=force)

        functools.update_wrapper(make_function, make)
        return make_function

    for name in ("make_train_function", "make_test_function", "make_predict_function"):
        setattr(trainer, name, checked(getattr(trainer, name)))
    trainer._npusim_patched = True  # pylint: disable=protected-access


PATCHES = {TRAINER_MODULE: _patch_trainer, TF_TRAINER_MODULE: _patch_tf_trainer}


class _ImportHook(importlib.abc.MetaPathFinder):
    """Patches each module of PATCHES right after it executes; removes itself when all are."""

    def __init__(self, pending):
        self._pending = set(pending)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self._pending:
            return None
        self._pending.discard(fullname)
        if not self._pending:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        patch = PATCHES[fullname]

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install():
    pending = []
    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            pending.append(name)
    if pending and not any(isinstance(f, _ImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportHook(pending))
