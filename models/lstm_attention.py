"""A risk-scoring sequence model: input_size time steps (default 20) of `features` (16)
float features per step -> LSTM (32 units, the whole sequence) -> additive attention over the
time steps (score_t = v . tanh(W h_t + b), weights = softmax over t, context = sum_t w_t h_t)
-> Dense 16 relu -> Dense 1 sigmoid: a risk score in (0, 1), trained with binary
cross-entropy against 0/1 labels.

The LSTM is unrolled by default (unroll=True: a fixed chain of MatMul/element-wise ops per
step instead of a while_loop over TensorList ops, which have no NPU kernels and run on the
CPU); unroll=False, Keras' while_loop form, gives the same results (seen: identical training
losses on the NPU) at about 1.3x the wall time per train step on the tiny chip."""

import numpy as np

from ._common import ModelSpec, binary_loss

FEATURES = 16


def _attention_pooling_layer():
    import keras  # pylint: disable=import-outside-toplevel

    class AdditiveAttentionPooling(keras.layers.Layer):
        """Bahdanau-style attention over the time axis of (batch, time, units) -> (batch, units)."""

        def __init__(self, attention_units=16, **kw):
            super().__init__(**kw)
            self.attention_units = attention_units
            self.score_hidden = keras.layers.Dense(attention_units, activation="tanh")
            self.score = keras.layers.Dense(1, use_bias=False)

        def call(self, h):
            weights = keras.ops.softmax(self.score(self.score_hidden(h)), axis=1)  # (b, t, 1)
            return keras.ops.sum(weights * h, axis=1)

        def get_config(self):
            return dict(super().get_config(), attention_units=self.attention_units)

    return AdditiveAttentionPooling


def build(input_size, classes=None, features=FEATURES, units=32, unroll=True,
          output_activation="sigmoid"):
    del classes
    import keras  # pylint: disable=import-outside-toplevel

    inputs = keras.Input((input_size, features))
    h = keras.layers.LSTM(units, return_sequences=True, unroll=unroll)(inputs)
    context = _attention_pooling_layer()(name="attention")(h)
    hidden = keras.layers.Dense(16, activation="relu")(context)
    score = keras.layers.Dense(1, activation=output_activation, name="risk_score")(hidden)
    return keras.Model(inputs, score, name="lstm_attention")


def _data(rng, batch, input_size, classes=None, features=FEATURES):
    """Feature sequences and 0/1 labels that depend on them (the label is 1 when the mean of
    feature 0 over the sequence is positive), so a model can learn something."""
    del classes
    x = rng.standard_normal((batch, input_size, features)).astype(np.float32)
    y = (x[:, :, 0].mean(axis=1) > 0).astype(np.float32).reshape(batch, 1)
    return x, y


SPEC = ModelSpec(
    name="lstm_attention", description="LSTM over a feature sequence, additive attention over "
    "time steps, sigmoid risk score",
    default_input_size=20, input_shape=lambda n: (n, FEATURES), default_classes=None,
    build=build, data=_data, make_loss=binary_loss)
