"""BERT pre-training (masked language model + next sentence prediction) as MindSpore's r0.5
benchmark trains BERT-Large (the workload of validation/cases.yaml's
bert_large_train_b96_910_mindspore), built from Keras layers with random weights, and
MindSpore's Lamb optimizer with its gradient clipping and loss scale.

Sources (mindspore-ai/mindspore, model_zoo/bert/src of the r0.5 era, and the benchmark page):
- shapes: the benchmark page (docs/source_en/benchmark.md of mindspore-ai/docs, r0.5) says
  "24 hidden layers, the sequence length is 128 tokens, and the vocabulary contains 21128
  tokens", batch 96, mixed precision; config.py's 'nezha' network is that configuration
  (seq_length 128, vocab_size 21128, hidden_size 1024, 24 layers, 16 heads, intermediate_size
  4096, gelu, dropout 0.1 / 0.1, max_position_embeddings 512, type_vocab_size 2,
  initializer_range 0.02, compute_type float16). Its 'large' network has vocab 30522 and
  sequence 512: not the benchmark's.
- network: bert_model.py (EmbeddingLookup, EmbeddingPostprocessor, BertAttention,
  BertSelfAttention, BertOutput, BertEncoderCell, BertModel's pooler: Dense tanh on the first
  token) and bert_for_pre_training.py (GetMaskedLMOutput: the masked positions gathered from the
  flattened [batch x seq, hidden] output, Dense with the activation, LayerNorm, a MatMul by the
  word embedding table transposed (tied) plus an output bias, log-softmax; GetNextSentenceOutput:
  Dense 2, log-softmax; BertPretrainingLoss: the masked LM's weighted mean cross-entropy plus the
  next sentence's mean cross-entropy).
- training: config.py (optimizer 'Lamb': weight_decay 0.01, eps 1e-6; loss_scale_value 65536)
  and bert_for_pre_training.py (BertTrainOneStepWithLossScaleCell: gradients times
  1 / loss scale, then each gradient clipped by its own norm to 1.0, GRADIENT_CLIP_TYPE 1) with
  nn.Lamb's update (mindspore/nn/optim/lamb.py: Adam's moments with bias correction, trust ratio
  ||w|| / ||update|| clipped to [0, 10], weight decay added to the update of every parameter but
  LayerNorm's and the biases).

'nezha' has use_relative_positions True: the nezha_* models build it (build's
relative_positions; bert_large keeps BERT's learned absolute positions).

Left out (models/README.md says why): the dynamic loss scale's update (a
fixed scale: MindSpore reads the overflow flag from the NPU's float status, no pass over the
gradients), the learning-rate schedule (constant: one step is timed), and real masking (the
synthetic batch fills every sequence, input_mask all 1, with MAX_PREDICTIONS masked positions
of weight 1; the attention mask is still computed and added as for a real batch).
"""

import numpy as np

from ._common import ModelSpec, loss_scaled_optimizer_base

# name -> (layers, hidden, heads, intermediate, vocab, max positions, masked positions per
# sequence, default sequence length)
CONFIGS = {
    # config.py 'nezha' (the benchmark's shapes, above); 20 masked positions per 128-token
    # sequence is google-research/bert's max_predictions_per_seq for sequence 128 (its
    # README, "Pre-training with BERT"), the data MindSpore's pre-training reads.
    "bert_large": (24, 1024, 16, 4096, 21128, 512, 20, 128),
    # A small configuration of the same network for tests: dimensions multiples of 16.
    "bert-tiny": (2, 64, 4, 256, 512, 64, 4, 32),
}
# config.py 'nezha' with its use_relative_positions True: the same shapes, relative positions in
# every attention layer and no absolute position table (build's relative_positions).
NEZHA = {"nezha_large": "bert_large", "nezha-tiny": "bert-tiny"}
CONFIGS.update({nezha: CONFIGS[bert] for nezha, bert in NEZHA.items()})
# bert_model.py BertAttention: RelaPosEmbeddingsGenerator(max_relative_position=16), distances
# j - i clipped to [-16, 16], a learned [2 x 16 + 1, head_dim] table per attention layer.
MAX_RELATIVE_POSITION = 16
TYPE_VOCAB = 2  # config.py type_vocab_size
INIT_RANGE = 0.02  # config.py initializer_range: TruncatedNormal's sigma
DROPOUT = 0.1  # hidden_dropout_prob and attention_probs_dropout_prob
LAYER_NORM_EPSILON = 1e-7  # MindSpore nn.LayerNorm's default (bert_model.py passes none)
MASK_ADDER = -10000.0  # BertAttention: (1 - mask) * -10000 added to the scores
# Lamb (config.py cfg.Lamb; nn.Lamb's default betas)
LAMB_WEIGHT_DECAY = 0.01
LAMB_EPSILON = 1e-6
LAMB_BETAS = (0.9, 0.999)
LAMB_LEARNING_RATE = 3e-5  # config.py start_learning_rate; constant here
LOSS_SCALE = 65536.0  # config.py loss_scale_value (the dynamic scale's initial value)
GRADIENT_CLIP_NORM = 1.0  # bert_for_pre_training.py GRADIENT_CLIP_VALUE, by norm


def dims(name):
    """{layers, hidden, heads, intermediate, vocab, max_positions, predictions, seq} of name."""
    keys = ("layers", "hidden", "heads", "intermediate", "vocab", "max_positions",
            "predictions", "seq")
    return dict(zip(keys, CONFIGS[name]))


def build(name, input_size, dropout=DROPOUT, output_activation=None, relative_positions=None):
    """The pre-training network of `name` over sequences of input_size tokens: inputs
    {input_ids, input_mask, token_type_ids: [B, S] int32, masked_lm_positions: [B, P] int32},
    outputs [masked LM logits [B, P, vocab], next sentence logits [B, 2]] (logits: the loss
    takes them, as MindSpore's log-softmax and one-hot cross-entropy do). output_activation is
    accepted for the registry's interface; the heads always give logits.

    relative_positions (default: on for the NEZHA names, off for BERT's): NEZHA's relative
    positions as MindSpore's bert_model.py computes them with use_relative_positions (its
    BertAttention, RelaPosEmbeddingsGenerator, EmbeddingPostprocessor): no absolute position
    table; each attention layer gathers a [S, S, head_dim] tensor R[i, j] = table[clip(j - i,
    -16, 16) + 16] from its own learned table and adds q_i . R[i, j] to the scores q_i . k_j
    before their 1 / sqrt(head_dim) scale, and sum_j p_ij R[i, j] to the context sum_j p_ij
    v_j (p: the probabilities after dropout). Both products are batch matmuls over the query
    position i (q and p transposed to [S, B x heads, ...]). The NEZHA paper (Wei et al. 2019,
    "NEZHA: Neural Contextualized Representation for Chinese Language Understanding", 3.2)
    defines R by fixed sinusoids; MindSpore's model, the one the benchmark ran, learns it
    (TruncatedNormal(0.02) initial values): the same launches apart from the table's gather
    gradient and update."""
    del output_activation
    if relative_positions is None:
        relative_positions = name in NEZHA
    import keras  # pylint: disable=import-outside-toplevel
    from keras import layers, ops  # pylint: disable=import-outside-toplevel

    d = dims(name)
    seq, hidden, heads, pred = input_size, d["hidden"], d["heads"], d["predictions"]
    if seq > d["max_positions"]:
        raise ValueError(f"{name}: sequence length {seq} exceeds its {d['max_positions']} "
                         "position embeddings")
    head_dim = hidden // heads
    init = keras.initializers.TruncatedNormal(stddev=INIT_RANGE)

    def dense(units, label, activation=None):
        return layers.Dense(units, activation=activation, kernel_initializer=init, name=label)

    def layer_norm(label):
        return layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=label)

    gelu = _gelu_with_gradient()

    input_ids = keras.Input((seq,), dtype="int32", name="input_ids")
    input_mask = keras.Input((seq,), dtype="int32", name="input_mask")
    token_type_ids = keras.Input((seq,), dtype="int32", name="token_type_ids")
    positions = keras.Input((pred,), dtype="int32", name="masked_lm_positions")

    word = layers.Embedding(d["vocab"], hidden, embeddings_initializer=init,
                            name="word_embeddings")
    x = word(input_ids)
    x = x + layers.Embedding(TYPE_VOCAB, hidden, embeddings_initializer=init,
                             name="token_type_embeddings")(token_type_ids)
    if not relative_positions:
        x = _PositionEmbedding(d["max_positions"], init, name="position_embeddings")(x)
    x = layers.Dropout(dropout)(layer_norm("embeddings_layer_norm")(x))
    # The encoder works on [B x S, H], as BertTransformer reshapes it: every Dense is a 2-D
    # MatMul with its bias (the plugin fuses the two: MatMulBiasAdd).
    x = ops.reshape(x, (-1, hidden))

    # [B, 1, 1, S]: 0 where a token may be attended to, -10000 where it is padding.
    adder = layers.Lambda(lambda m: (1.0 - ops.cast(m, "float32")[:, None, None, :])
                          * MASK_ADDER, output_shape=(1, 1, seq),
                          name="attention_mask_adder")(input_mask)

    def split_heads(t):  # [B x S, H] -> [B, heads, S, head_dim]
        return ops.transpose(ops.reshape(t, (-1, seq, heads, head_dim)), (0, 2, 1, 3))

    # The relative positions' matmuls batch over the query position (BertAttention's
    # trans_shape_relative and trans_shape_position).
    def query_major(t):  # [B, heads, S, W] -> [S, B x heads, W]
        return ops.reshape(ops.transpose(t, (2, 0, 1, 3)), (seq, -1, t.shape[-1]))

    def head_major(t):  # [S, B x heads, W] -> [B, heads, S, W]
        return ops.transpose(ops.reshape(t, (seq, -1, heads, t.shape[-1])), (1, 2, 0, 3))

    for i in range(d["layers"]):
        p = f"layer_{i}_"
        q = split_heads(dense(hidden, p + "query")(x))
        k = split_heads(dense(hidden, p + "key")(x))
        v = split_heads(dense(hidden, p + "value")(x))
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        if relative_positions:
            rel = _RelativePositions(seq, head_dim, init, name=p + "relative_positions")(q)
            scores = scores + head_major(ops.matmul(query_major(q),
                                                    ops.transpose(rel, (0, 2, 1))))
        scores = scores * (1.0 / float(np.sqrt(head_dim)))
        probs = layers.Dropout(dropout)(ops.softmax(scores + adder, axis=-1))
        context = ops.matmul(probs, v)
        if relative_positions:
            context = context + head_major(ops.matmul(query_major(probs), rel))
        context = ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (-1, hidden))
        attn = layers.Dropout(dropout)(dense(hidden, p + "attention_output")(context))
        x = layer_norm(p + "attention_layer_norm")(x + attn)
        f = dense(d["intermediate"], p + "intermediate", activation=gelu)(x)
        f = layers.Dropout(dropout)(dense(hidden, p + "output")(f))
        x = layer_norm(p + "output_layer_norm")(x + f)

    # Masked LM head: the masked positions of the [B x S, H] output, [B x P, H].
    picked = _MaskedPositions(seq, name="masked_lm_gather")(x, positions)
    picked = layer_norm("masked_lm_layer_norm")(dense(hidden, "masked_lm_dense", gelu)(picked))
    mlm = _TiedOutput(word, pred, name="masked_lm")(picked)
    pooled = dense(hidden, "pooler", "tanh")(ops.reshape(x, (-1, seq, hidden))[:, 0, :])
    nsp = dense(2, "next_sentence")(pooled)
    return keras.Model({"input_ids": input_ids, "input_mask": input_mask,
                        "token_type_ids": token_type_ids, "masked_lm_positions": positions},
                       [mlm, nsp], name=name.replace("-", "_"))


GELU_C = 0.7978845608028654  # sqrt(2 / pi), GELU's tanh form
GELU_CUBIC = 0.044715


def _gelu_with_gradient():
    """MindSpore's Gelu and GeluGrad pair: gelu(x) = 0.5 x (1 + tanh(c (x + 0.044715 x^3))) (the
    tanh form, Ascend's Gelu; keras' gelu(approximate=True) builds exactly the ops of the
    plugin's Gelu rewrite, graph_fusion.h 11b), and its gradient g x d(x) computed from x alone,
    d = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 x 0.044715 x^2), t = tanh(c (x + 0.044715 x^3)),
    as GeluGrad(dy, x, y) does. TensorFlow's autodiff of the composition instead reads the
    forward pass's intermediate values, which keeps the rewrite from matching in a training
    graph (seen: ten launches per GELU in the backward pass, the forward unfused)."""
    import keras  # pylint: disable=import-outside-toplevel
    from keras import ops  # pylint: disable=import-outside-toplevel

    @ops.custom_gradient
    def gelu(x):
        def grad(*args, upstream=None):
            g = upstream if upstream is not None else args[0]
            t = ops.tanh(GELU_C * (x + GELU_CUBIC * x * x * x))
            slope = GELU_C * (1.0 + 3.0 * GELU_CUBIC * x * x)
            return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope)

        return keras.activations.gelu(x, approximate=True), grad

    return gelu


_LAYER_CLASSES = {}


def _layer_classes():
    """{position, tied, positions}: the layer classes below, defined once Keras is imported."""
    if _LAYER_CLASSES:
        return _LAYER_CLASSES
    import keras  # pylint: disable=import-outside-toplevel
    from keras import ops  # pylint: disable=import-outside-toplevel

    class PositionEmbedding(keras.layers.Layer):
        """Adds the first S rows of a learned [max_positions, H] table to [B, S, H]
        (EmbeddingPostprocessor's full_position_embeddings and its slice)."""

        def __init__(self, max_positions, initializer, **kw):
            super().__init__(**kw)
            self.max_positions = max_positions
            self.initializer = initializer

        def build(self, input_shape):
            self.table = self.add_weight(shape=(self.max_positions, input_shape[-1]),
                                         initializer=self.initializer, name="table")

        def call(self, x):
            return x + self.table[None, :ops.shape(x)[1], :]

    class RelativePositions(keras.layers.Layer):
        """[S, S, depth]: row clip(j - i, -M, M) + M of a learned [2 M + 1, depth] table at
        [i, j], M = MAX_RELATIVE_POSITION (RelaPosMatrixGenerator's clipped distances and
        RelaPosEmbeddingsGenerator's gather). Called on any tensor of the layer's graph (its
        value unused) so that Keras places it there.

        The table's gradient is dense: the output's gradient [S x S, depth] summed into the
        2 M + 1 rows by one UnsortedSegmentSum, as MindSpore differentiates its Gather.
        TensorFlow's own gather gradient is an IndexedSlices of S x S rows, which the
        optimizer densifies (one UnsortedSegmentSum each) once per consumer: three per layer
        (docs/validation.md, "NEZHA's relative positions")."""

        def __init__(self, seq, depth, initializer, **kw):
            super().__init__(**kw)
            self.seq, self.depth, self.initializer = seq, depth, initializer
            distance = np.arange(seq)[None, :] - np.arange(seq)[:, None]  # j - i at [i, j]
            self.rows = (np.clip(distance, -MAX_RELATIVE_POSITION, MAX_RELATIVE_POSITION)
                         + MAX_RELATIVE_POSITION).astype(np.int32)

        def build(self, input_shape):
            self.table = self.add_weight(shape=(2 * MAX_RELATIVE_POSITION + 1, self.depth),
                                         initializer=self.initializer, name="table")

        def call(self, anchor):
            import tensorflow as tf  # pylint: disable=import-outside-toplevel

            del anchor
            rows = ops.convert_to_tensor(self.rows)

            @ops.custom_gradient
            def gather_rows(table):
                def table_gradient(*args, upstream=None):
                    if upstream is None:
                        (upstream,) = args
                    return ops.segment_sum(ops.reshape(upstream, (-1, self.depth)),
                                           ops.reshape(rows, (-1,)),
                                           num_segments=ops.shape(table)[0])

                return ops.take(table, rows, axis=0), table_gradient

            # The variable's value as a tensor: a custom gradient of the variable itself
            # would have to return the variable's gradient separately.
            return gather_rows(tf.convert_to_tensor(self.table))

        def compute_output_shape(self, input_shape):
            return (self.seq, self.seq, self.depth)

    class MaskedPositions(keras.layers.Layer):
        """(x [B x S, H], positions [B, P] int32) -> the rows of sequence b's tokens
        positions[b, p], [B x P, H]: one GatherV2 at positions + b x S (GetMaskedLMOutput's
        flat_offsets and gather)."""

        def __init__(self, seq, **kw):
            super().__init__(**kw)
            self.seq = seq

        def call(self, x, positions):
            offsets = ops.arange(ops.shape(positions)[0], dtype="int32")[:, None] * self.seq
            return ops.take(x, ops.reshape(positions + offsets, (-1,)), axis=0)

        def compute_output_shape(self, x_shape, positions_shape):
            return (None, x_shape[-1])

    class TiedOutput(keras.layers.Layer):
        """x [B x P, H] times the word embedding table [V, H] transposed, plus an output bias
        [V] (GetMaskedLMOutput's matmul(transpose_b) and output_bias), as [B, P, V]."""

        def __init__(self, embedding, predictions, **kw):
            super().__init__(**kw)
            self.embedding = embedding
            self.predictions = predictions

        def build(self, input_shape):
            self.bias = self.add_weight(shape=(self.embedding.input_dim,), initializer="zeros",
                                        name="output_bias")

        def call(self, x):
            logits = ops.matmul(x, ops.transpose(self.embedding.embeddings)) + self.bias
            return ops.reshape(logits, (-1, self.predictions, self.embedding.input_dim))

        def compute_output_shape(self, x_shape):
            return (None, self.predictions, self.embedding.input_dim)

    _LAYER_CLASSES.update(position=PositionEmbedding, tied=TiedOutput,
                          positions=MaskedPositions, relative=RelativePositions)
    return _LAYER_CLASSES


def _PositionEmbedding(*args, **kw):  # pylint: disable=invalid-name
    return _layer_classes()["position"](*args, **kw)


def _TiedOutput(*args, **kw):  # pylint: disable=invalid-name
    return _layer_classes()["tied"](*args, **kw)


def _MaskedPositions(*args, **kw):  # pylint: disable=invalid-name
    return _layer_classes()["positions"](*args, **kw)


def _RelativePositions(*args, **kw):  # pylint: disable=invalid-name
    return _layer_classes()["relative"](*args, **kw)


def synthetic_data(name, rng, batch, seq):
    """(x, y): a pre-training batch of `batch` full sequences of `seq` random tokens, two
    segments (token type 0 then 1), input_mask all 1, `predictions` distinct masked positions
    per sequence (sorted, never the first token) with random target ids, and random next
    sentence labels; y = (masked_lm_ids [B, P], next_sentence_labels [B])."""
    d = dims(name)
    pred = d["predictions"]
    if pred >= seq:
        raise ValueError(f"{name}: {pred} masked positions need a sequence longer than {seq}")
    x = {
        "input_ids": rng.integers(0, d["vocab"], (batch, seq)).astype(np.int32),
        "input_mask": np.ones((batch, seq), np.int32),
        "token_type_ids": np.repeat((np.arange(seq) >= seq // 2)[None, :], batch,
                                    0).astype(np.int32),
        "masked_lm_positions": np.stack([np.sort(rng.choice(np.arange(1, seq), pred, False))
                                         for _ in range(batch)]).astype(np.int32),
    }
    y = (rng.integers(0, d["vocab"], (batch, pred)).astype(np.int32),
         rng.integers(0, 2, batch).astype(np.int32))
    return x, y


def pretraining_loss():
    """[masked LM loss, next sentence loss]: sparse cross-entropy of the logits, each the mean
    over its positions (MindSpore's weighted mean with every weight 1; Keras adds the two)."""
    import keras  # pylint: disable=import-outside-toplevel

    return [keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True)]


_OPTIMIZER_CLASS = []


def _decayed(variable):
    """config.py's decay filter (names without 'layernorm' and 'bias'): here the variables of
    rank > 1, the kernels and embedding tables; LayerNorm's gamma / beta and every bias
    (the masked LM's output_bias too) are 1-D."""
    return len(variable.shape) > 1


def lamb_optimizer(learning_rate=LAMB_LEARNING_RATE, weight_decay=LAMB_WEIGHT_DECAY,
                   loss_scale=LOSS_SCALE, clip_norm=GRADIENT_CLIP_NORM, epsilon=LAMB_EPSILON,
                   betas=LAMB_BETAS):
    """MindSpore's Lamb with BertTrainOneStepWithLossScaleCell's unscaling and clipping. Per
    variable w with moments m, v, step t (1, 2, ...) and gradient g of the scaled loss:

        g  = g / loss_scale;  n = ||g||;  g = g * clip_norm / max(n, clip_norm)
        m  = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        u  = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)  (+ weight_decay * w, decayed)
        r  = ||w|| / ||u|| where ||w|| > 0 and n > 0, else 1; clipped to [0, 10]
        w  = w - learning_rate * r * u

    Differences from nn.Lamb, none of which changes what a step costs beyond one element-wise
    pass: its trust ratio's ||u|| is taken over m_hat * rsqrt(v_hat + eps) (+ decay), its
    ||g|| test over the clipped gradient (> 0 exactly where n > 0). Decayed: every variable of
    rank > 1 (config.py's decay filter, not 'layernorm' and not 'bias': those are 1-D).
    The loss is multiplied by loss_scale before the gradients (scale_loss, which Keras' train
    step calls)."""
    from keras import ops  # pylint: disable=import-outside-toplevel

    if not _OPTIMIZER_CLASS:

        class MindSporeLamb(loss_scaled_optimizer_base()):
            def __init__(self, learning_rate, weight_decay, loss_scale, clip_norm, epsilon,
                         betas, name="lamb"):
                super().__init__(learning_rate=learning_rate, name=name)
                self.decay = weight_decay
                self.loss_scale = loss_scale
                self.clip_norm = clip_norm
                self.epsilon = epsilon
                self.betas = tuple(betas)
                self.moments = []
                self.velocities = []

            def build(self, variables):
                if self.built:
                    return
                super().build(variables)
                self.moments = self.add_optimizer_variables(variables, "m")
                self.velocities = self.add_optimizer_variables(variables, "v")

            def update_step(self, gradient, variable, learning_rate):
                dt = variable.dtype
                b1, b2 = self.betas
                lr = ops.cast(learning_rate, dt)
                t = ops.cast(self.iterations + 1, dt)
                g = ops.cast(gradient, dt)
                if self.loss_scale is not None:
                    g = ops.multiply(g, ops.cast(1.0 / self.loss_scale, dt))
                g_norm = ops.sqrt(ops.sum(ops.square(g)))
                g = ops.multiply(g, ops.divide(ops.cast(self.clip_norm, dt),
                                               ops.maximum(g_norm, self.clip_norm)))
                index = self._get_variable_index(variable)
                m, v = self.moments[index], self.velocities[index]
                self.assign(m, ops.add(ops.multiply(m, b1), ops.multiply(g, 1.0 - b1)))
                self.assign(v, ops.add(ops.multiply(v, b2),
                                       ops.multiply(ops.square(g), 1.0 - b2)))
                m_hat = ops.divide(m, ops.subtract(1.0, ops.power(ops.cast(b1, dt), t)))
                v_hat = ops.divide(v, ops.subtract(1.0, ops.power(ops.cast(b2, dt), t)))
                u = ops.divide(m_hat, ops.add(ops.sqrt(v_hat), self.epsilon))
                if self.decay and _decayed(variable):
                    u = ops.add(u, ops.multiply(variable, ops.cast(self.decay, dt)))
                w_norm = ops.sqrt(ops.sum(ops.square(variable)))
                u_norm = ops.sqrt(ops.sum(ops.square(u)))
                one = ops.ones((), dt)
                ratio = ops.where(ops.logical_and(w_norm > 0, g_norm > 0),
                                  ops.divide(w_norm, ops.maximum(u_norm, 1e-30)), one)
                ratio = ops.clip(ratio, 0.0, 10.0)
                self.assign_sub(variable, ops.multiply(u, ops.multiply(lr, ratio)))

            def get_config(self):
                config = super().get_config()
                config.update(weight_decay=self.decay, loss_scale=self.loss_scale,
                              clip_norm=self.clip_norm, epsilon=self.epsilon,
                              betas=list(self.betas))
                return config

        _OPTIMIZER_CLASS.append(MindSporeLamb)
    return _OPTIMIZER_CLASS[0](learning_rate, weight_decay, loss_scale, clip_norm, epsilon,
                               betas)


def _spec(name, description):
    d = dims(name)
    return ModelSpec(
        name=name, description=description, default_input_size=d["seq"],
        input_shape=lambda n: (n,), default_classes=None,
        build=lambda n, classes, **kw: build(name, n, **kw),
        data=lambda rng, batch, n, classes: synthetic_data(name, rng, batch, n),
        make_loss=pretraining_loss, make_optimizer=lamb_optimizer)


SPECS = [
    _spec("bert_large", "BERT-Large pre-training (MLM + NSP) as MindSpore's r0.5 benchmark "
          "trains it: 24 layers, hidden 1024, 16 heads, FFN 4096, vocabulary 21128, Lamb"),
    _spec("bert-tiny", "the BERT pre-training network at 2 layers, hidden 64, 4 heads, FFN 256, "
          "vocabulary 512 (tests)"),
    _spec("nezha_large", "bert_large as config.py's 'nezha' network: NEZHA's relative "
          "positions (max distance 16, a learned table per layer) in place of the absolute"),
    _spec("nezha-tiny", "bert-tiny with nezha_large's relative positions (tests)"),
]
