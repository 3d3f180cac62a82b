"""Keras 3 and the NPU: keep XLA out of model.compile(jit_compile=...) and grouped convolutions.

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

- Grouped convolutions (Conv1D/2D/3D with groups > 1, e.g. ConvNeXt's depthwise Conv2D with
  groups = channels): Keras' TensorFlow backend always runs them as a jit_compile=True
  tf.function (keras/src/backend/tensorflow/nn.py, conv: TF's CPU kernels lack them), which fails
  on the NPU ("No JIT device registered for NPU"). When the convolution runs on the NPU and its
  data is channels_last, the patched `conv` computes the same result without XLA: groups =
  channels as one DepthwiseConv2dNative (2-D, its kernel [kh, kw, 1, C * m] reshaped to
  [kh, kw, C, m]: output channel c * m + j is group c's j-th filter in both); other grouped
  1-D and 2-D convolutions as one Conv2D (tf.nn.conv2d / conv1d with the kernel as it is:
  TensorFlow's Conv2D and its gradients take input channels G times the filter's, and the NPU
  computes each as one launch for all the groups; NPUSIM_FUSION_GROUPED_CONV=0, read when a
  function is traced, keeps the per-group form below); 3-D ones as one convolution per group on
  a split of the input channels and of the filters, concatenated.
  Dilated 1-D and 2-D convolutions (dilation_rate > 1, stride 1), which tf.nn.convolution wraps
  in SpaceToBatchND / BatchToSpaceND (no NPU kernels: they ran on the CPU), go to Conv2D with
  its dilations attribute instead (conv1d for 1-D), which the NPU computes.
  Elsewhere (another device scope, channels_first) Keras' own conv runs. The choice is made when
  a function is traced; a function traced for the NPU and called under a CPU scope runs the same
  ops on the CPU, whose kernels compute them correctly (dilated Conv2D and its gradients agree
  with tf.nn.convolution's SpaceToBatchND form there). Dilated depthwise convolutions are not
  rewritten: TF's CPU DepthwiseConv2dNativeBackpropInput/Filter ignore dilations.

- Sparse gradients (Embedding's IndexedSlices) applied straight to a variable: Keras' TensorFlow
  optimizers do that with scatter_add / scatter_sub (plain SGD: ResourceScatterSub), which has
  no NPU kernel, and the variable's colocation then failed the step ("Cannot assign a device
  for operation ... ReadVariableOp"). For a variable on the NPU the patched
  TFOptimizer.assign_add / assign_sub densify the slices first (tf.convert_to_tensor:
  UnsortedSegmentSum, which sums repeated indices as the scatter would) and update the whole
  variable with AssignAdd/SubVariableOp on the chip: the same values, a dense update's time.

tf-keras (TF_USE_LEGACY_KERAS=1) needs none of this: it turns XLA on only when a GPU exists.

Keras is not imported here: each patch is applied when its module is first imported (a one-shot
import hook), or at once if it already is.
"""

import functools
import importlib.abc
import importlib.machinery
import os
import sys

TRAINER_MODULE = "keras.src.trainers.trainer"
TF_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
TF_NN_MODULE = "keras.src.backend.tensorflow.nn"
TF_OPTIMIZER_MODULE = "keras.src.backend.tensorflow.optimizer"

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


def _sequence(value, rank):
    return (value,) * rank if isinstance(value, int) else tuple(value)


def _dilated_natively(rank, strides, dilations):
    """Whether TF's Conv2D (1-D: through conv1d's ExpandDims) takes these dilations itself:
    tf.nn.convolution instead wraps a dilated convolution in SpaceToBatchND / BatchToSpaceND."""
    return rank in (1, 2) and max(dilations) > 1 and max(strides) == 1


def _conv_ungrouped(tf, inputs, kernel, strides, padding, dilations):
    rank = len(inputs.shape) - 2
    if _dilated_natively(rank, strides, dilations):
        return _conv_2d(tf, inputs, kernel, strides, padding, dilations)
    return tf.nn.convolution(inputs, kernel, strides, padding.upper(), dilations=dilations)


def _conv_2d(tf, inputs, kernel, strides, padding, dilations):
    """One Conv2D (1-D: conv1d's, through ExpandDims) with strides and dilations, grouped or not
    (input channels G times the kernel's: G groups)."""
    rank = len(inputs.shape) - 2
    conv = tf.nn.conv2d if rank == 2 else tf.nn.conv1d
    return conv(inputs, kernel, strides if rank == 2 else strides[0], padding.upper(),
                dilations=dilations if rank == 2 else dilations[0])


def _conv_without_xla(tf, inputs, kernel, strides, padding, dilations):
    """Keras' channels_last convolution (kernel [..., C / groups, filters]) without XLA."""
    rank = len(inputs.shape) - 2
    channels, per_group = int(inputs.shape[-1]), int(kernel.shape[-2])
    groups = channels // per_group
    if groups == 1:
        return _conv_ungrouped(tf, inputs, kernel, strides, padding, dilations)
    if rank == 2 and per_group == 1 and max(dilations) == 1:
        depthwise = tf.reshape(kernel, tuple(kernel.shape[:2]) + (channels, -1))
        return tf.nn.depthwise_conv2d(inputs, depthwise, (1,) + strides + (1,), padding.upper())
    if rank in (1, 2) and os.environ.get("NPUSIM_FUSION_GROUPED_CONV") != "0":
        return _conv_2d(tf, inputs, kernel, strides, padding, dilations)
    outputs = [_conv_ungrouped(tf, x, k, strides, padding, dilations)
               for x, k in zip(tf.split(inputs, groups, axis=-1),
                               tf.split(kernel, groups, axis=-1))]
    return tf.concat(outputs, axis=-1)


def _patch_tf_nn(module):
    original = getattr(module, "conv", None)
    if original is None or getattr(original, "_npusim_patched", False):
        return

    def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        import tensorflow as tf
        from keras.src import backend

        rank = len(inputs.shape) - 2
        strides, dilations = _sequence(strides, rank), _sequence(dilation_rate, rank)
        grouped = inputs.shape[-1] is not None and inputs.shape[-1] != kernel.shape[-2]
        if (backend.standardize_data_format(data_format) == "channels_last"
                and (grouped or _dilated_natively(rank, strides, dilations))
                and _runs_on_the_npu()):
            return _conv_without_xla(tf, inputs, kernel, strides, padding, dilations)
        return original(inputs, kernel, strides, padding, data_format, dilation_rate)

    functools.update_wrapper(conv, original)
    conv._npusim_patched = True  # pylint: disable=protected-access
    module.conv = conv


def _patch_tf_optimizer(module):
    optimizer = getattr(module, "TFOptimizer", None)
    if optimizer is None or vars(optimizer).get("_npusim_patched", False):
        return

    def densified(update):
        def assign_update(self, variable, value):
            import tensorflow as tf
            from keras.src import backend

            if isinstance(value, tf.IndexedSlices):
                inner = variable.value if isinstance(variable, backend.Variable) else variable
                if "NPU" in (getattr(inner, "device", "") or "").upper():
                    value = tf.convert_to_tensor(value)
            return update(self, variable, value)

        functools.update_wrapper(assign_update, update)
        return assign_update

    for name in ("assign_add", "assign_sub"):
        setattr(optimizer, name, densified(getattr(optimizer, name)))
    optimizer._npusim_patched = True  # pylint: disable=protected-access


PATCHES = {TRAINER_MODULE: _patch_trainer, TF_TRAINER_MODULE: _patch_tf_trainer,
           TF_NN_MODULE: _patch_tf_nn, TF_OPTIMIZER_MODULE: _patch_tf_optimizer}


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
