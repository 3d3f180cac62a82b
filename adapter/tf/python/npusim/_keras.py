"""Keras 3 and the NPU: keep XLA out of model.compile(jit_compile="auto").

Keras 3 resolves jit_compile="auto" to True as soon as TensorFlow lists any non-CPU physical
device (keras/src/trainers/trainer.py, Trainer._resolve_auto_jit_compile). XLA has no compiler
for a PluggableDevice, so model.fit would then fail. The patch below makes "auto" resolve to
False when the only non-CPU devices are NPUs, and defers to Keras otherwise. An explicit
jit_compile=True still asks for XLA and fails on the NPU: that is the caller's choice.

Keras is not imported here: the patch is applied when keras.src.trainers.trainer is first
imported (a one-shot import hook), or at once if it already is.
"""

import importlib.abc
import importlib.machinery
import sys

TRAINER_MODULE = "keras.src.trainers.trainer"


def _patch(module):
    trainer = getattr(module, "Trainer", None)
    if trainer is None or getattr(trainer, "_npusim_patched", False):
        return
    original = trainer._resolve_auto_jit_compile  # pylint: disable=protected-access

    def _resolve_auto_jit_compile(self):
        import tensorflow as tf

        others = [d for d in tf.config.list_physical_devices()
                  if d.device_type not in ("CPU", "NPU")]
        if not others:
            return False  # XLA cannot compile for the NPU
        return original(self)

    # pylint: disable=protected-access
    trainer._resolve_auto_jit_compile = _resolve_auto_jit_compile
    trainer._npusim_patched = True


class _TrainerImportHook(importlib.abc.MetaPathFinder):
    """Patches keras.src.trainers.trainer right after it executes, then removes itself."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install():
    module = sys.modules.get(TRAINER_MODULE)
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _TrainerImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TrainerImportHook())
