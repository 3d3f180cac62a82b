"""ResNet-50 v1.5 as MindSpore's model zoo trains it on ImageNet (the workload of the published
Ascend 910 training throughputs in validation/cases.yaml), built from Keras layers with random
weights, and MindSpore's Momentum optimizer.

Architecture (mindspore-ai/models, benchmark/ascend/resnet/src/resnet.py: `resnet50`,
`ResidualBlock`, `_conv*`, `_bn`, `_fc`):
- stem: Conv 7x7/2 64 (pad_mode "same"), BatchNorm, ReLU, MaxPool 3x3/2 ("same");
- four stages of bottleneck blocks, [3, 4, 6, 3] blocks, outputs [256, 512, 1024, 2048], strides
  [1, 2, 2, 2]; a block is Conv 1x1 (out/4), BN, ReLU, Conv 3x3 (out/4, the stage's stride: the
  "v1.5" placement; v1 strides the first 1x1), BN, ReLU, Conv 1x1 (out), BN, plus the shortcut
  (Conv 1x1 with the stride and BN where the shape changes, else the input), ReLU;
- every convolution without bias (nn.Conv2d's has_bias defaults to False), BatchNorm after each
  (eps 1e-4, momentum 0.9: `_bn`), global average pool, Dense with bias (`_fc`).
Keras' padding="same" is TensorFlow's SAME, which is MindSpore's pad_mode "same" (the extra row /
column of an even total padding at the bottom / right). Initialisers: glorot_uniform for the
convolutions (the config's conv_init "XavierUniform"), a truncated normal of stddev 0.01 for the
classifier (dense_init "TruncatedNormal", MindSpore's TruncatedNormal default sigma); BN gamma 1,
beta 0. Random weights, nothing downloaded.

Training setup: benchmark/ascend/resnet/train.py (`Momentum(group_params, lr, momentum,
loss_scale=loss_scale)`, the weight decay on every parameter except BN's gamma / beta and biases
by `init_group_params`, `FixedLossScaleManager(loss_scale, drop_overflow_update=False)`, fp16
mixed precision by amp_level "O2", here the device's precision mode allow_mix_precision) with
the values of official/cv/ResNet/config/resnet50_imagenet2012_config.yaml (momentum 0.9,
weight_decay 1e-4, loss_scale 1024, class_num 1001).
`momentum_optimizer()` is that update (see its docstring). Left out: the loss's label smoothing
(0.1; Keras' sparse cross-entropy has none, and it costs a one-hot of batch x classes elements,
nothing next to the network) and the learning-rate schedule (a constant here: one step is timed).
"""

from ._common import ModelSpec, images, loss_scaled_optimizer_base, sparse_categorical_loss

# (blocks, output channels, stride of the stage's first block), ResNet-50: resnet.py `resnet50`.
STAGES = ((3, 256, 1), (4, 512, 2), (6, 1024, 2), (3, 2048, 2))
BN_EPSILON = 1e-4  # resnet.py `_bn`
BN_MOMENTUM = 0.9  # MindSpore's moving = moving * 0.9 + batch * 0.1, Keras' convention too
MOMENTUM = 0.9  # resnet50_imagenet2012_config.yaml: momentum
WEIGHT_DECAY = 1e-4  # config: weight_decay (convolution and Dense kernels only)
LOSS_SCALE = 1024.0  # config: loss_scale (FixedLossScaleManager, no overflow check)
LEARNING_RATE = 0.1  # constant; the config's schedule peaks at lr_max 0.8 after 2 warm-up epochs
CLASSES = 1001  # config: class_num


def build(input_size, classes, output_activation="softmax"):
    import keras  # pylint: disable=import-outside-toplevel
    from keras import layers  # pylint: disable=import-outside-toplevel

    def conv(x, filters, kernel, stride, name):
        return layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False,
                             kernel_initializer="glorot_uniform", name=name)(x)

    def bn(x, name):
        return layers.BatchNormalization(axis=-1, momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
                                         name=name)(x)

    def block(x, filters, stride, name):
        shortcut = x
        if stride != 1 or x.shape[-1] != filters:
            shortcut = bn(conv(x, filters, 1, stride, name + "_0_conv"), name + "_0_bn")
        y = layers.ReLU(name=name + "_1_relu")(
            bn(conv(x, filters // 4, 1, 1, name + "_1_conv"), name + "_1_bn"))
        y = layers.ReLU(name=name + "_2_relu")(
            bn(conv(y, filters // 4, 3, stride, name + "_2_conv"), name + "_2_bn"))
        y = bn(conv(y, filters, 1, 1, name + "_3_conv"), name + "_3_bn")
        return layers.ReLU(name=name + "_out")(layers.Add(name=name + "_add")([shortcut, y]))

    inputs = keras.Input((input_size, input_size, 3))
    x = layers.ReLU(name="conv1_relu")(bn(conv(inputs, 64, 7, 2, "conv1_conv"), "conv1_bn"))
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="pool1_pool")(x)
    for s, (blocks, filters, stride) in enumerate(STAGES):
        for b in range(blocks):
            x = block(x, filters, stride if b == 0 else 1, f"conv{s + 2}_block{b + 1}")
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = layers.Dense(
        classes, activation=output_activation, name="predictions",
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.01))(x)
    return keras.Model(inputs, outputs, name="resnet50_v15")


_OPTIMIZER_CLASS = []


def momentum_optimizer(learning_rate=LEARNING_RATE, momentum=MOMENTUM,
                       weight_decay=WEIGHT_DECAY, loss_scale=LOSS_SCALE):
    """MindSpore's Momentum with a fixed loss scale and L2 weight decay (nn.Momentum with
    loss_scale and a weight_decay group; MindSpore's graph compiler fuses the decay, the
    unscaling and the update into one FusedWeightScaleApplyMomentum per parameter), per
    variable w with accumulation a and gradient g of the scaled loss:

        g' = g / loss_scale (+ weight_decay * w for convolution and Dense kernels)
        a  = momentum * a + g'
        w  = w - learning_rate * a

    The loss is multiplied by loss_scale before the gradients (scale_loss, which Keras' train
    step calls) and the gradient divided back inside the update, as that fused op does.
    (Keras' own loss_scale_factor divides the gradients before the update, a RealDiv per
    gradient, each a launch of its own; until 2026-12-06 the plugin's training batch-norm
    fusion, adapter/tf/plugin/graph_fusion.h rewrite 0, matched none of the batch norms with
    it.) The decay is L2, added to
    the gradient as MindSpore does, not Keras' decoupled weight_decay (a second assign of every
    variable). BN's gamma / beta and the Dense bias are not decayed (train.py
    `init_group_params`)."""
    from keras import ops  # pylint: disable=import-outside-toplevel

    if not _OPTIMIZER_CLASS:

        class MindSporeMomentum(loss_scaled_optimizer_base()):
            def __init__(self, learning_rate, momentum, l2, loss_scale, name="momentum"):
                super().__init__(learning_rate=learning_rate, name=name)
                self.momentum = momentum
                self.l2 = l2
                self.loss_scale = loss_scale
                self.accumulations = []

            def build(self, variables):
                if self.built:
                    return
                super().build(variables)
                self.accumulations = self.add_optimizer_variables(variables, "accumulation")

            def update_step(self, gradient, variable, learning_rate):
                lr = ops.cast(learning_rate, variable.dtype)
                g = ops.cast(gradient, variable.dtype)
                if self.loss_scale is not None:
                    g = ops.multiply(g, ops.cast(1.0 / self.loss_scale, variable.dtype))
                # Kernels only: a convolution's is 4-D, Dense's 2-D; gamma, beta, bias are 1-D.
                if self.l2 and len(variable.shape) > 1:
                    g = ops.add(g, ops.multiply(variable, ops.cast(self.l2, variable.dtype)))
                a = self.accumulations[self._get_variable_index(variable)]
                self.assign(a, ops.add(ops.multiply(a, ops.cast(self.momentum, a.dtype)), g))
                self.assign_sub(variable, ops.multiply(a, lr))

            def get_config(self):
                config = super().get_config()
                config.update(momentum=self.momentum, l2=self.l2, loss_scale=self.loss_scale)
                return config

        _OPTIMIZER_CLASS.append(MindSporeMomentum)
    return _OPTIMIZER_CLASS[0](learning_rate, momentum, weight_decay, loss_scale)


SPEC = ModelSpec(
    name="resnet50_v15",
    description="ResNet-50 v1.5 as MindSpore trains it (no conv bias, Momentum), 224x224x3",
    default_input_size=224, input_shape=lambda n: (n, n, 3), default_classes=CLASSES,
    build=build,
    data=lambda rng, batch, n, classes: images(rng, batch, (n, n, 3), classes),
    make_loss=sparse_categorical_loss, make_optimizer=momentum_optimizer)
