"""A small Transformer encoder classifier: input_size token ids (default 32, vocabulary
`vocab` = 1000) -> token embedding + learned position embedding (d_model 64) -> one encoder
block (MultiHeadAttention 4 heads + residual + LayerNormalization, feed-forward 128 relu -> 64 +
residual + LayerNormalization) -> mean over tokens -> Dense classes (10) softmax."""

import numpy as np

from ._common import ModelSpec, sparse_categorical_loss

VOCAB = 1000


def _position_embedding_layer():
    import keras  # pylint: disable=import-outside-toplevel

    class PositionEmbedding(keras.layers.Layer):
        """Adds a learned (sequence_length, d_model) table to (batch, sequence, d_model)."""

        def build(self, input_shape):
            self.table = self.add_weight(shape=tuple(input_shape[1:]), name="table",
                                         initializer="random_normal")

        def call(self, x):
            return x + self.table

    return PositionEmbedding


def build(input_size, classes, vocab=VOCAB, d_model=64, heads=4, ff=128, dropout=0.1,
          output_activation="softmax"):
    import keras  # pylint: disable=import-outside-toplevel

    L = keras.layers
    tokens = keras.Input((input_size,), dtype="int32")
    x = L.Embedding(vocab, d_model)(tokens)
    x = _position_embedding_layer()(name="position_embedding")(x)
    attn = L.MultiHeadAttention(heads, d_model // heads, dropout=dropout)(x, x)
    x = L.LayerNormalization(epsilon=1e-6)(x + L.Dropout(dropout)(attn))
    f = L.Dense(d_model)(L.Dense(ff, activation="relu")(x))
    x = L.LayerNormalization(epsilon=1e-6)(x + L.Dropout(dropout)(f))
    x = L.GlobalAveragePooling1D()(x)
    out = L.Dense(classes, activation=output_activation)(x)
    return keras.Model(tokens, out, name="transformer")


def _data(rng, batch, input_size, classes, vocab=VOCAB):
    x = rng.integers(0, vocab, (batch, input_size)).astype(np.int32)
    y = rng.integers(0, classes, batch).astype(np.int32)
    return x, y


SPEC = ModelSpec(
    name="transformer", description="token + position embedding, one Transformer encoder block "
    "(MultiHeadAttention, LayerNormalization, feed-forward), mean pooling, softmax classifier",
    default_input_size=32, input_shape=lambda n: (n,), default_classes=10, build=build,
    data=_data, make_loss=sparse_categorical_loss)
