"""Decoder-only language models from keras-hub, built from their configurations with random
weights (nothing is downloaded: no presets, no vocabularies), and greedy generation with a KV
cache through tf.function.

    import models
    lm = models.build("llama-tiny", seed=0)               # keras_hub CausalLM, preprocessor None
    gen = models.llm.GreedyDecoder(lm, batch=1, prompt_len=8, gen_len=4)
    tokens = gen.generate(prompt)                         # (batch, gen_len) int32, greedy

The registry names (models/README.md): `gpt2-tiny`, `llama-tiny`, `gemma-tiny` for tests (two
layers, hidden 64, vocabulary 512: seconds on the tiny chip), and the real sizes `llama-1b`
(Llama 3.2 1B's shape) and `llama-7b` (Llama 2 7B's shape). A CausalLM's call takes
{"token_ids", "padding_mask"} (batch, seq) and returns the logits (batch, seq, vocabulary), so
the generic runner's infer and train modes work on them; `models.run --mode generate` runs
GreedyDecoder.

Generation (GreedyDecoder): the cache is keras-hub's, one tensor (batch, layers, 2, max_len,
kv_heads, head_dim) in the model's compute dtype, max_len = prompt_len + gen_len.
- prefill: `call_with_cache(prompt, zeros, 0)` over the prompt's P tokens (keras-hub's own
  `generate` instead runs the whole padded max_len through `_build_cache`; starting from an
  empty cache computes only the prompt, as a serving stack does), then argmax of the last
  position's logits: the first generated token.
- decode step: `call_with_cache(token[:, None], cache, index)` with index = P, P+1, ...: one
  token against the cache (attention over all max_len positions, masked beyond index, as
  keras-hub computes it), argmax: the next token.
Both are tf.functions traced once (index is a tensor), so every decode step is the same graph.
ResidentCacheDecoder (GPT-2, Llama and Gemma models, on the NPU) holds the cache as a key and a
value variable per layer and writes each step's new rows into them in place (docs/llm.md, "Resident
KV cache").
"""

import contextlib
import functools

import numpy as np

from ._common import ModelSpec

# Test sizes: small enough for the tiny chip, every architectural feature kept (Llama: RMSNorm,
# RoPE, SwiGLU, grouped-query attention with 4 query heads over 2 KV heads; Gemma: 1 KV head,
# tanh-GELU gated feed-forward, scaled embeddings; GPT-2: learned positions, LayerNorm, GELU).
_TINY = dict(vocabulary_size=512, num_layers=2, hidden_dim=64)

# name -> (keras_hub backbone and causal LM class names, backbone arguments, where the shape
# comes from). The real sizes are the published model configurations (the models' config.json
# on their model cards); only the shapes are used, never weights.
CONFIGS = {
    "gpt2-tiny": ("GPT2", dict(_TINY, num_heads=4, intermediate_dim=256,
                               max_sequence_length=256, dropout=0.0), "test size"),
    "llama-tiny": ("Llama", dict(_TINY, num_query_heads=4, num_key_value_heads=2,
                                 intermediate_dim=128), "test size"),
    "llama-tiny-mha": ("Llama", dict(_TINY, num_query_heads=4, num_key_value_heads=4,
                                     intermediate_dim=128), "test size: MHA, as Llama 2 7B"),
    "gemma-tiny": ("Gemma", dict(_TINY, num_query_heads=4, num_key_value_heads=1, head_dim=16,
                                 intermediate_dim=256), "test size"),
    # Llama 3.2 1B: 16 layers, hidden 2048, FFN 8192, 32 query / 8 KV heads (head_dim 64),
    # vocabulary 128256, RoPE theta 500000, RMSNorm eps 1e-5, tied embeddings (1.24 B params).
    "llama-1b": ("Llama3", dict(vocabulary_size=128256, num_layers=16, hidden_dim=2048,
                                intermediate_dim=8192, num_query_heads=32, num_key_value_heads=8,
                                rope_max_wavelength=500000, layer_norm_epsilon=1e-5,
                                tie_word_embeddings=True), "Llama 3.2 1B config"),
    # Llama 2 7B: 32 layers, hidden 4096, FFN 11008, 32 heads (no GQA), vocabulary 32000,
    # RMSNorm eps 1e-5 (6.74 B params).
    "llama-7b": ("Llama", dict(vocabulary_size=32000, num_layers=32, hidden_dim=4096,
                               intermediate_dim=11008, num_query_heads=32, num_key_value_heads=32,
                               layer_norm_epsilon=1e-5), "Llama 2 7B config"),
}

DEFAULT_SEQ = 32  # input_size (sequence length) of infer / train runs


def vocabulary_size(name):
    return CONFIGS[name][1]["vocabulary_size"]


@contextlib.contextmanager
def unmaterialized_weights():
    """Inside: every Keras variable created is initialised with zeros instead of its
    initializer. Under tf.device("/NPU:0") the zeros are a Fill kernel on the chip, and in a
    timing-only run (npusim.configure(functional=False)) a kernel's output takes no host memory
    (docs/tf_plugin.md, "Timing-only runs"): a 7B model's weights are never materialised. The
    random initializers would instead draw every weight on the host (TensorFlow's normal
    distribution has no NPU kernel) and copy it in, and draw the uniform ones with Philox on the
    chip's scalar unit: minutes per GiB. Patches the backend's Variable class (keras.Variable;
    the TensorFlow backend overrides the common _initialize_with_initializer, the one place an
    initializer is called) while open."""
    import keras  # pylint: disable=import-outside-toplevel

    # pylint: disable=protected-access
    cls = keras.Variable
    original = cls.__dict__.get("_initialize_with_initializer")

    def zeros(self, initializer):  # pylint: disable=unused-argument
        self._initialize(keras.ops.zeros(self._shape, dtype=self._dtype))

    cls._initialize_with_initializer = zeros
    try:
        yield
    finally:
        if original is None:
            del cls._initialize_with_initializer
        else:
            cls._initialize_with_initializer = original


def build_causal_lm(name, dtype=None, zero_weights=False):
    """The keras_hub CausalLM `name` (CONFIGS) with preprocessor None. dtype: the backbone's
    dtype policy ("float32" default, "bfloat16", "float16", "mixed_float16", ...).
    zero_weights: unmaterialized_weights() around the construction (timing-only runs)."""
    import keras_hub  # pylint: disable=import-outside-toplevel

    family, kwargs, _ = CONFIGS[name]
    backbone_cls = getattr(keras_hub.models, f"{family}Backbone")
    lm_cls = getattr(keras_hub.models, f"{family}CausalLM")
    ctx = unmaterialized_weights() if zero_weights else contextlib.nullcontext()
    with ctx:
        backbone = backbone_cls(**kwargs, dtype=dtype)
        return lm_cls(backbone=backbone, preprocessor=None)


QUANTIZE_MODES = ("int8",)


def quantize(lm, mode):
    """Quantises `lm`'s Dense and EinsumDense kernels (and keras-hub's ReversibleEmbedding, the
    token embedding and the vocabulary projection) in place, weight-only, as Ascend's quantised
    inference runs decoders (CANN's WeightQuantBatchMatmulV2): mode "int8" is Keras' int8
    quantisation without an activation quantizer, Int8QuantizationConfig(activation_quantizer=
    None): each kernel becomes int8 with one scale per output channel (AbsMax: s = 127 /
    max|w| over the input axis), and a layer computes x @ cast(w_int8) / s in the model's compute
    dtype; activations stay in it. The plugin rewrites that subgraph onto
    WeightQuantBatchMatmulV2 (docs/llm.md). Norms, the rotary tables and the KV cache are
    unchanged."""
    import keras  # pylint: disable=import-outside-toplevel

    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize mode '{mode}': one of {', '.join(QUANTIZE_MODES)}")
    import warnings  # pylint: disable=import-outside-toplevel

    with warnings.catch_warnings():  # "Layer X does not have a `quantize` method": norms, ...
        warnings.simplefilter("ignore", UserWarning)
        lm.quantize(config=keras.quantizers.Int8QuantizationConfig(activation_quantizer=None))
    return lm


def cache_shape(backbone, batch, max_len):
    """keras-hub's cache layout for `backbone`: (batch, layers, 2 (key, value), max_len,
    kv_heads, head_dim), as each CausalLM's _build_cache makes it."""
    heads = getattr(backbone, "num_query_heads", None) or backbone.num_heads
    kv_heads = getattr(backbone, "num_key_value_heads", None) or heads
    head_dim = getattr(backbone, "head_dim", None) or backbone.hidden_dim // heads
    return (batch, backbone.num_layers, 2, max_len, kv_heads, head_dim)


class GreedyDecoder:
    """Greedy generation with keras-hub's KV cache (module docstring). prefill(prompt) ->
    (first token (batch,), cache, its logits); step(token, cache, index) -> (next token, cache,
    its logits), index the position `token` takes. Place the calls with tf.device; the
    tf.functions are traced at the first call of each."""

    def __init__(self, lm, batch, prompt_len, gen_len):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if prompt_len < 1 or gen_len < 1:
            raise ValueError(f"prompt_len ({prompt_len}) and gen_len ({gen_len}) must be >= 1")
        self.lm = lm
        self.batch, self.prompt_len, self.gen_len = batch, prompt_len, gen_len
        self.max_len = prompt_len + gen_len
        seq_limit = getattr(lm.backbone, "max_sequence_length", None)
        if seq_limit is not None and self.max_len > seq_limit:
            raise ValueError(f"prompt_len + gen_len = {self.max_len} exceeds the model's "
                             f"max_sequence_length {seq_limit}")
        self.cache_shape = cache_shape(lm.backbone, batch, self.max_len)
        self.prefill = tf.function(self._prefill)
        self.step = tf.function(self._step)

    def _next_token(self, logits, cache):
        """(greedy token (batch,) int32, cache, the last position's logits (batch, vocab))."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        last = logits[:, -1, :]
        return tf.argmax(last, axis=-1, output_type=tf.int32), cache, last

    def _prefill(self, prompt):
        import keras  # pylint: disable=import-outside-toplevel

        cache = keras.ops.zeros(self.cache_shape, dtype=self.lm.compute_dtype)
        logits, _, cache = self.lm.call_with_cache(prompt, cache, 0)
        return self._next_token(logits, cache)

    def _step(self, token, cache, index):
        logits, _, cache = self.lm.call_with_cache(token[:, None], cache, index)
        return self._next_token(logits, cache)

    def generate(self, prompt, on_token=None, return_logits=False):
        """The gen_len greedy tokens after `prompt` ((batch, prompt_len) int32) as a numpy
        (batch, gen_len) array; with return_logits also the logits each token was chosen from,
        (batch, gen_len, vocabulary). on_token(i), if given, is called after token i is on the
        host (i = 0: after the prefill), e.g. to read launch records per token."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        prompt = tf.convert_to_tensor(prompt, dtype=tf.int32)
        if tuple(prompt.shape) != (self.batch, self.prompt_len):
            raise ValueError(f"prompt has shape {tuple(prompt.shape)}, expected "
                             f"({self.batch}, {self.prompt_len})")
        tokens, logits = [], []
        token, cache, last = self.prefill(prompt)
        for i in range(self.gen_len):
            if i:
                index = tf.constant(self.prompt_len + i - 1, dtype=tf.int32)
                token, cache, last = self.step(token, cache, index)
            tokens.append(token.numpy())
            if return_logits:
                logits.append(last.numpy())
            if on_token:
                on_token(i)
        tokens = np.stack(tokens, axis=1)
        return (tokens, np.stack(logits, axis=1)) if return_logits else tokens


class ResidentCacheDecoder(GreedyDecoder):
    """GreedyDecoder with the KV cache resident on the device, as Ascend's serving stacks hold
    it: a key and a value variable per layer, (batch, max_len, kv_heads, head_dim) each in the
    model's compute dtype, created on the device that is current at generate(). The prefill
    runs keras-hub's call_with_cache and assigns each layer's cache to its variables (once); a
    decode step runs the layers itself (keras-hub's sublayers and attention, the computation
    call_with_cache does: _embed and the family's _*_layer method) and writes the new token's
    key and value rows into the variables in place (npusim.llm.update_variable_slice: the
    plugin's ResourceDynamicUpdateSlice), then attends over the variables' values: no copy of
    the cache per step. On the NPU the updates and the reads join the step's whole-graph run
    (one task list per step, as GreedyDecoder's). Needs the plugin (the op has no CPU kernel,
    so the calls must be placed on the NPU) and a backbone of RESIDENT_CACHE_FAMILIES, float or
    int8-quantised (quantize(): the quantised sublayers are called as keras-hub calls them).
    The cache argument and result of prefill / step are None.

    cache_dtype: the variables' dtype (default: the model's compute dtype). A float32 model on
    the NPU whose precision mode runs its attention in fp16 (allow_fp32_to_fp16) can hold the
    cache in float16, as serving stacks do: each new row is cast to it at the update and the
    attention reads the variables widened to float32, which the plugin's fused attention takes
    as the fp16 variables themselves (rewrite 9; the f16 -> f32 -> f16 round trip is exact), so
    no step casts the whole cache and the attention sees the values it saw with a float32
    cache (cast to fp16 there). models.run chooses it (--kv-cache-dtype auto)."""

    def __init__(self, lm, batch, prompt_len, gen_len, cache_dtype=None):
        super().__init__(lm, batch, prompt_len, gen_len)
        self.cache_dtype = cache_dtype or lm.compute_dtype
        family = type(lm.backbone).__name__.removesuffix("Backbone")
        if family not in RESIDENT_CACHE_FAMILIES:
            raise ValueError(f"ResidentCacheDecoder runs the decoder layers of "
                             f"{', '.join(RESIDENT_CACHE_FAMILIES)} backbones, not "
                             f"{type(lm.backbone).__name__}")
        self._layer_step = getattr(self, RESIDENT_CACHE_FAMILIES[family])
        self._family = family
        self.keys, self.values = [], []
        self.vocab_kernel = None  # _make_cache: a tied int8 embedding's table, transposed
        # _make_cache: Gemma's float query / key / value kernels laid out [d, n, h] (by the
        # EinsumDense layer's id): _project's product reads them without a transpose.
        self._kernels_dnh = {}
        # No autograph: the step has no data-dependent Python control flow, and autograph's
        # conversion of its calls was seen to resolve one to another converted function in a
        # 7B run ("_prefill() takes 2 positional arguments but 4 were given").
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        self.step = tf.function(self._step, autograph=False)
        traced = tf.function(self._prefill, autograph=False)

        def prefill(prompt):  # GreedyDecoder's, creating the cache variables at the first call
            self._make_cache()
            return traced(prompt)

        self.prefill = prefill

    def _make_cache(self):
        """The per-layer variables (zeros), on the current device, once; and for a tied int8
        embedding its table transposed once (_logits)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if self.keys:
            return
        embedding = self.lm.backbone.token_embedding
        if (getattr(embedding, "quantization_mode", None) == "int8" and embedding.tie_weights
                and not embedding.inputs_quantizer and embedding.logit_soft_cap is None):
            # pylint: disable=protected-access
            self.vocab_kernel = tf.Variable(tf.transpose(embedding._embeddings), trainable=False,
                                            name="vocab_projection_int8")
        if self._family == "Gemma":
            import keras  # pylint: disable=import-outside-toplevel

            # keras-hub's EinsumDense "btd,ndh->btnh" multiplies by its [n, d, h] kernel
            # transposed to [d, n, h], a Transpose launch per projection and step (and for a
            # float32 model a cast of that new tensor, which the plugin cannot keep); held
            # transposed once, as a serving stack lays its weights out at load.
            for layer in self.lm.backbone.transformer_layers:
                attention = layer.attention
                for dense in (attention.query_dense, attention.key_dense,
                              attention.value_dense):
                    if (_dnh_equation(dense.equation) and dense.bias is None
                            and dense.activation in (None, keras.activations.linear)
                            and getattr(dense, "quantization_mode", None) is None
                            and not getattr(dense, "lora_enabled", False)):
                        self._kernels_dnh[id(dense)] = tf.Variable(
                            tf.transpose(dense.kernel, [1, 0, 2]), trainable=False,
                            name=f"{dense.name}_kernel_dnh")
        batch, layers, _, max_len, kv_heads, head_dim = self.cache_shape
        shape = (batch, max_len, kv_heads, head_dim)
        for i in range(layers):
            for kind, out in (("key", self.keys), ("value", self.values)):
                out.append(tf.Variable(tf.zeros(shape, self.cache_dtype), trainable=False,
                                       name=f"kv_cache_{kind}_{i}"))

    def _prefill(self, prompt):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        token, cache, last = GreedyDecoder._prefill(self, prompt)
        for i, (key, value) in enumerate(zip(self.keys, self.values)):
            key.assign(tf.cast(cache[:, i, 0], self.cache_dtype))
            value.assign(tf.cast(cache[:, i, 1], self.cache_dtype))
        return token, None, last

    def _step(self, token, cache, index):
        # pylint: disable=import-outside-toplevel
        import tensorflow as tf
        from keras_hub.src.layers.modeling.transformer_layer_utils import compute_causal_mask

        del cache  # resident: self.keys, self.values
        backbone = self.lm.backbone
        x = self._embed(token[:, None], index)
        # (batch, 1, max_len): the new token attends positions 0..index, as each family's
        # decoder layer computes its mask for a one-token step over the whole cache.
        mask = compute_causal_mask(self.batch, self.max_len, 1, index)
        start = tf.stack([0, index, 0, 0])
        for layer, key_cache, value_cache in zip(backbone.transformer_layers, self.keys,
                                                 self.values):
            write = functools.partial(_write_rows, key_cache, value_cache, start)
            x = self._layer_step(layer, x, write, index, mask)
        return self._next_token(self._logits(backbone.layer_norm(x)), None)

    def _logits(self, x):
        """The vocabulary projection of the step's hidden state, as keras-hub's
        `token_embedding(x, reverse=True)`. A tied int8 embedding (quantize()) computes it from
        its [vocabulary, hidden] int8 table transposed on every call (Keras'
        ReversibleEmbedding), 128256 x 2048 bytes for llama-1b; here the table is transposed
        once per decoder (self.vocab_kernel, made with the cache, its own device memory, as a
        serving stack lays out its weights at load) and the product is Keras' untied int8
        one: matmul(x, kernel) in the compute dtype divided by the per-row scales, which
        rewrite 13 fuses as any int8 Dense."""
        import keras  # pylint: disable=import-outside-toplevel

        embedding = self.lm.backbone.token_embedding
        if self.vocab_kernel is None:
            return embedding(x, reverse=True)
        logits = keras.ops.cast(keras.ops.matmul(x, self.vocab_kernel), embedding.compute_dtype)
        return keras.ops.divide(logits, keras.ops.multiply(
            keras.ops.ones((1,), dtype=embedding.compute_dtype), embedding.embeddings_scale))

    def _embed(self, tokens, index):
        """The backbone's input embedding of the step's tokens (batch, 1) at position index,
        as the family's call_with_cache computes it."""
        import keras  # pylint: disable=import-outside-toplevel

        backbone = self.lm.backbone
        x = backbone.token_embedding(tokens)
        if self._family == "Gemma":  # scaled embeddings
            return x * keras.ops.cast(keras.ops.sqrt(backbone.hidden_dim), x.dtype)
        if self._family == "GPT2":  # learned positions
            # The table's row `index` gathered (keras-hub's serving path, `positions`): the
            # same values as call_with_cache's slice at start_index, whose begin TensorFlow
            # reads on the host (a Slice outside the step's graph run).
            positions = backbone.position_embedding(x, positions=keras.ops.reshape(index, (1,)))
            return backbone.embeddings_dropout(backbone.embeddings_add((x, positions)))
        return x

    # One decoder layer of a one-token step per family, as the layer's call with a cache
    # computes it, the cache update replaced by write(key_rows, value_rows) (_write_rows: the
    # new rows into the layer's variables, returning their values). x: (batch, 1, hidden).

    @staticmethod
    def _llama_layer(layer, x, write, index, mask):
        # pylint: disable=protected-access
        import keras  # pylint: disable=import-outside-toplevel

        attention = layer._self_attention_layer
        h = layer._self_attention_layernorm(x)
        query = attention.rotary_embedding_layer(attention._query_dense(h), start_index=index)
        key, value = write(
            attention.rotary_embedding_layer(attention._key_dense(h), start_index=index),
            attention._value_dense(h))
        groups = attention.num_key_value_groups
        key = keras.ops.repeat(key, repeats=groups, axis=2)
        value = keras.ops.repeat(value, repeats=groups, axis=2)
        x = x + attention._output_dense(attention._compute_attention(query, key, value, mask))
        h = layer._feedforward_layernorm(x)
        gate = keras.ops.cast(layer.activation(
            keras.ops.cast(layer._feedforward_gate_dense(h), "float32")), layer.compute_dtype)
        return x + layer._feedforward_output_dense(
            keras.ops.multiply(layer._feedforward_intermediate_dense(h), gate))

    def _project(self, dense, h):
        """dense(h) for an EinsumDense layer; with its kernel held as [d, n, h]
        (_kernels_dnh) the same product "btd,dnh->btnh" on that layout, no transpose."""
        import keras  # pylint: disable=import-outside-toplevel

        kernel = self._kernels_dnh.get(id(dense))
        if kernel is None:
            return dense(h)
        return keras.ops.einsum(_dnh_equation(dense.equation), h,
                                keras.ops.cast(kernel, h.dtype))

    def _gemma_layer(self, layer, x, write, index, mask):
        # pylint: disable=protected-access
        import keras  # pylint: disable=import-outside-toplevel

        attention = layer.attention
        h = layer.pre_attention_norm(x)
        query = attention._apply_rope(self._project(attention.query_dense, h), index)
        key, value = write(attention._apply_rope(self._project(attention.key_dense, h), index),
                           self._project(attention.value_dense, h))
        # CachedGemmaAttention.call then zeroes the rows of queries that attend no position;
        # a decode step's query attends 0..index, so that is the identity and left out (its
        # All and Select kernels with it).
        a = attention.output_dense(attention._compute_attention(
            query, key, value, mask, training=False, cache_update_index=index))
        if layer.use_post_attention_norm:
            a = layer.post_attention_norm(a)
        x = x + a
        h = layer.pre_ffw_norm(x)
        f = layer.ffw_linear(keras.activations.gelu(layer.gating_ffw(h), approximate=True) *
                             layer.gating_ffw_2(h))
        if layer.use_post_ffw_norm:
            f = layer.post_ffw_norm(f)
        return x + f

    @staticmethod
    def _gpt2_layer(layer, x, write, index, mask):
        # pylint: disable=protected-access
        del index  # GPT-2's positions are in the embedding
        if not layer.normalize_first:
            raise ValueError("ResidentCacheDecoder runs GPT-2's pre-norm decoder layers")
        attention = layer._self_attention_layer
        h = layer._self_attention_layer_norm(x)
        query = attention._query_dense(h)
        key, value = write(attention._key_dense(h), attention._value_dense(h))
        a, _ = attention._compute_attention(query=query, key=key, value=value,
                                            attention_mask=mask, training=False)
        x = x + attention._output_dense(a)
        h = layer._feedforward_layer_norm(x)
        return x + layer._feedforward_output_dense(layer._feedforward_intermediate_dense(h))


def _dnh_equation(equation):
    """For an EinsumDense equation of the form "btd,ndh->btnh" (any letters: Gemma's query
    "btd,ndh->btnh", key and value "bsd,kdh->bskh"), the same product with the kernel laid out
    [d, n, h] ("btd,dnh->btnh"); None for any other."""
    lhs, _, out = equation.partition("->")
    x, _, w = lhs.partition(",")
    if (len(x) != 3 or len(w) != 3 or len(set(x + w)) != 5 or w[1] != x[2]
            or out != x[0] + x[1] + w[0] + w[2]):
        return None
    return f"{x},{w[1]}{w[0]}{w[2]}->{out}"


def _write_rows(key_cache, value_cache, start, key_rows, value_rows):
    """A decode step's cache write for one layer: the new rows (batch, 1, kv_heads, head_dim)
    into the layer's (batch, max_len, kv_heads, head_dim) key and value variables in place at
    start [0, index, 0, 0]; returns the variables' values (the whole cache of the layer). Rows
    are cast to the variables' dtype and the values back to the rows' (ResidentCacheDecoder's
    cache_dtype; tf.cast of a tensor already of the dtype adds no op)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from npusim.llm import update_variable_slice  # pylint: disable=import-outside-toplevel

    dtype = key_rows.dtype
    update_variable_slice(key_cache, tf.cast(key_rows, key_cache.dtype), start)
    update_variable_slice(value_cache, tf.cast(value_rows, value_cache.dtype), start)
    return tf.cast(key_cache.read_value(), dtype), tf.cast(value_cache.read_value(), dtype)


# The keras-hub families (backbone class name less "Backbone") whose decoder layers
# ResidentCacheDecoder runs: the method computing one layer's step (models.run's default
# decoder for them on the NPU).
RESIDENT_CACHE_FAMILIES = {"Llama": "_llama_layer", "Llama3": "_llama_layer",
                           "Gemma": "_gemma_layer", "GPT2": "_gpt2_layer"}


def prompt_tokens(name, batch, prompt_len, seed=0):
    """A deterministic random prompt (batch, prompt_len) int32 over the model's vocabulary."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocabulary_size(name), (batch, prompt_len)).astype(np.int32)


def _spec(name):
    def build(input_size, classes, output_activation=None, dtype=None, zero_weights=False):
        del input_size, classes  # the sequence length is the input's; logits, no classes
        if output_activation is not None:
            raise ValueError(f"model '{name}' returns logits (output_activation must be None)")
        return build_causal_lm(name, dtype=dtype, zero_weights=zero_weights)

    def data(rng, batch, input_size, classes):
        """Next-token prediction: x = tokens[:, :-1] (all positions valid), y = tokens[:, 1:]."""
        del classes
        t = rng.integers(0, vocabulary_size(name), (batch, input_size + 1)).astype(np.int32)
        x = {"token_ids": t[:, :-1], "padding_mask": np.ones((batch, input_size), np.int32)}
        return x, t[:, 1:]

    def make_loss():
        import keras  # pylint: disable=import-outside-toplevel

        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    family, _, source = CONFIGS[name]
    return ModelSpec(name=name, description=f"keras_hub {family}CausalLM ({source}), random "
                     "weights, logits over the vocabulary", default_input_size=DEFAULT_SEQ,
                     input_shape=lambda n: (n,), default_classes=None, build=build, data=data,
                     make_loss=make_loss)


SPECS = [_spec(name) for name in CONFIGS]
