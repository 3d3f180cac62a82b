// Fusions on NPU graphs, run by the plugin's grappler optimizer (graph_optimizer.cpp)
// on every graph TensorFlow optimizes for the NPU; the fused ops' definitions and kernels are in
// kernels_fused.cpp, their compiled kernels in adapter/compiler/ops/fused.cpp (and
// fused_elementwise.h's).
//
// Rewrites (every node on the NPU, rewritten in place: the chain's last node keeps its name,
// device and control inputs and becomes the fused op; the chain's other nodes are removed):
//   0. Training batch norm, as CANN splits it (kernels in adapter/compiler/ops/batchnorm.cpp):
//      Keras 3's BatchNormalization in training (tf.nn.moments, then rewrite 1's chain on the
//      batch statistics) together with the gradient TensorFlow's autodiff builds for it:
//        forward  mean = Mean(x, [0,1,2], keep_dims)  sqd = SquaredDifference(x, mean)
//                 variance = Mean(sqd, [0,1,2], keep_dims)  Squeeze of each [-> Reshape to
//                 [1,1,1,C] for a positive channel axis], rewrite 1's chain on them [-> Relu]
//        gradient (g: the gradient arriving at the chain's output) dscale = Mul(AddN, rsqrt)
//                 with AddN = Sum(x * g) [Reshape] + Neg(dbeta) * mean, dbeta = [Reshape] Sum(g),
//                 RsqrtGrad(rsqrt, AddN * scale) -> Mean gradient (Reshapes, Tile, Mul 1/R) ->
//                 Mul(2, .) * Sub(x, mean); dx = AddN(g * (rsqrt * scale), Mean gradient of
//                 Neg(dbeta) * (rsqrt * scale), that product)
//      become four nodes, each in place of one it replaces (names kept):
//        BNTrainingReduce(x) in place of `variance`: per-channel sum, square_sum
//        BNTrainingUpdate(x, sum, square_sum, scale, offset; epsilon, relu) in place of the
//          Relu (else the chain's final AddV2): y, batch_mean, batch_variance
//        BNTrainingUpdateGrad(g, x, batch_mean, batch_variance) in place of dscale:
//          diff_scale, diff_offset
//        BNTrainingReduceGrad(g, x, diff_scale, diff_offset, scale, batch_mean, batch_variance)
//          in place of dx; where x has other gradients in dx's AddN besides the three above (x
//          also read elsewhere: a pre-activation block's identity shortcut, ResNet50V2's
//          preact_bn), a node `<dx's name>/npusim_bn_reduce_grad` of its own, and dx (its name
//          kept) the AddN of it and those others
//      The Squeezes' other consumers (Keras' moving-average updates, fused by rewrite 4 into
//      one small FusedElementwise each) read batch_mean / batch_variance, dbeta's read
//      diff_offset. Every other matched node goes; each must have its consumers and control
//      edges inside the match (the gradient's Sub and constant 2 depend on its Mean gradient by
//      control edges), all float. Under a constant loss scale (Keras' `loss_scale_factor`: every
//      gradient times k = 1 / scale before the update) grappler's constant folding has pushed k
//      into dscale: Mul(AddN, Mul(k, rsqrt)) with k a one-element Const and Mul(k, rsqrt) read
//      by nothing else; then Mul(k, rsqrt) becomes the BNTrainingUpdateGrad (its name kept) and
//      the outer Mul stays, as Mul(diff_scale, k) (dbeta's own Mul by k, the other gradients'
//      and a variable scale's, such as LossScaleOptimizer's, are outside the match). A batch
//      norm whose gradient is not in the same graph, or that differs in any node, is left to
//      the other rewrites. Without a scale (tf.nn.batch_normalization's scale=None, Keras'
//      BatchNormalization(scale=False), e.g. every batch norm of InceptionV3) the chain
//      multiplies x and mean by the Rsqrt itself and the gradient has no scale gradient:
//      RsqrtGrad(rsqrt, AddN) directly; the RsqrtGrad becomes BNTrainingUpdateGrad (its name
//      kept, diff_scale read only by BNTrainingReduceGrad), and the fused ops read as scale a new
//      float Const [C] of ones, `<BNTrainingUpdate's name>/npusim_ones` (C from the offset
//      variable's shape: no fusion where it is unknown). x * (rsqrt * 1) is x * rsqrt bit for
//      bit. NPUSIM_FUSION_BN_TRAINING=0 turns this rewrite alone off.
//   0b. The ReLU's gradient folded into rewrite 0's gradients (CANN's fusion of ReluGrad into
//      the batch norm's backward), right after 0: ReluGrad(g, y) where y is output 0 of a
//      BNTrainingUpdate with relu = true and the ReluGrad's only consumers are that batch
//      norm's BNTrainingUpdateGrad and BNTrainingReduceGrad (reading it as their gradient;
//      not preserved, no control edges): both read g instead, with relu = true and the fold's
//      inputs added (BNTrainingUpdateGrad(g, x, batch_mean, batch_variance, scale, offset),
//      BNTrainingReduceGrad(..., batch_variance, offset)), and mask g by x * a + shift > 0,
//      the ReLU's own pre-activation recomputed bit for bit (adapter/compiler/ops/
//      batchnorm.cpp); the ReluGrad goes (a pass over g, y and its output fewer). The four
//      ops of one type, float or half. Runs with rewrite 0 only; under allow_mix_precision's
//      graph pass after that pass (fold_bn_relu_grads below), on the half ops it leaves, and
//      after 0f (on its float16 batch norms) in every graph.
//      NPUSIM_FUSION_BN_RELU_GRAD=0 turns it alone off.
//   0c. The residual add and its ReLU in BNTrainingUpdate (CANN's BNTrainingUpdate + Add +
//      ReLU fusion), run by the optimizer after the mixed precision pass and 0b
//      (fuse_bn_add_relus below; the ops in the types they run in): AddRelu(y, r) (either
//      operand order; rewrite 3's) where y is output 0 of a BNTrainingUpdate without ReLU or
//      residual that nothing else reads (its batch_mean and batch_variance may have readers;
//      not preserved), r output 0 of a BNTrainingUpdate, AddRelu, Relu or AddV2 (an activation
//      of the network, not a bias or constant) that does not depend on the batch norm, all of
//      one T (float or half) on the NPU, the batch norm on the add's device (r may be on another
//      NPU device: TensorFlow copies it), the AddRelu not preserved and without control
//      inputs (control edges from it come from the batch norm) -> the BNTrainingUpdate with r as
//      input 5 (attribute R = 1) and relu = true, its name kept, `_npusim_fused` naming the
//      AddRelu, whose readers (the next block, the ReLU's gradient) read the batch norm's output 0
//      and which goes. The kernel adds r after y's rounding to T, in T, then the ReLU: the unfused
//      AddRelu's values bit for bit, without its launch and y's round trip through HBM
//      (adapter/compiler/ops/batchnorm.cpp). The pass does not see the operands' shapes: an r
//      of another shape that broadcasts into y's (an AddRelu's broadcast) compiles as the update
//      and an AddRelu launch, the unfused graph's (an r larger than y, which y would broadcast
//      into, is a compile error naming the residual: a limit). A ResNet's blocks end so in
//      training. 0b takes no BNTrainingUpdate with R = 1 (its ReLU follows the add).
//      NPUSIM_FUSION_BN_ADD_RELU=0 turns it alone off.
//   0d. A convolution's bias gradient in the batch norm's x gradient, run by the optimizer after
//      the mixed precision pass (fuse_bn_bias_grads below; the two in the type they run in):
//      BiasAddGrad(dx) (NHWC, T float or half) whose dx is output 0 of a BNTrainingReduceGrad
//      (rewrite 0's, with or without 0b's fold; bias_grads = 0) of the same T on the same device ->
//      that BNTrainingReduceGrad with bias_grads = 1: output 1 the per-channel sum of dx in T,
//      summed from the f32 dx tiles in its pass before their rounding to T (adapter/compiler/ops/
//      batchnorm.cpp), `_npusim_fused` naming the BiasAddGrad, whose readers read output 1 and
//      which goes (a launch and an HBM pass over dx fewer: Keras' convolutions with a bias
//      followed by a batch norm in training). dx's other readers are fine; the BiasAddGrad must
//      have no control edges and not be preserved. NPUSIM_FUSION_BN_BIAS_GRAD=0 turns it alone
//      off.
//   0e. Keras mixed_float16's casts around the training batch norm, run by the optimizer after
//      rewrite 0 and before the mixed precision pass (fold_bn_half_casts below): under the
//      policy Keras casts a float16 x to float32 for the batch norm and y back, and the
//      gradient the same way round: rewrite 0's four nodes of T float where x is a Cast half ->
//      float read by those four alone, y (BNTrainingUpdate's output 0, no residual) read only by
//      Casts float -> half, the gradients' dy one Cast half -> float read by both alone (or by
//      the gradients of several batch norms that all turn half: a projection block's two, whose
//      dy is the residual add's one gradient) and dx read only by Casts float -> half (none
//      preserved, bias_grads 0) -> the four with T = half, reading x and dy in float16, the
//      statistics staying float32 (CANN's BNTraining* as allow_mix_precision's pass makes
//      them), the Casts gone (their readers read the batch norm's outputs; a Cast's control
//      inputs move to the batch norm's nodes). The kernels widen x and dy exactly and round y
//      and dx once, as the Casts did; the statistics are the same values summed in another order
//      where the convolution before then sums its own output (Conv2DBNTrainingReduce, which the
//      Cast between them kept apart): the trained weights of tests/tf/
//      test_fusion_bn_half_casts.py's CNN come out bit for bit, its moving statistics within
//      1e-6. Forward-only graphs take the reduce and update alone.
//      NPUSIM_FUSION_BN_HALF_CASTS=0 turns it alone off.
//   0f. The ReLU that rewrite 0 could not take, run by the optimizer right after 0e
//      (fold_bn_relus below): under mixed_float16 the Relu read y's Cast, not the chain's
//      AddV2, so rewrite 0 took the batch norm without it; once 0e has removed the Cast,
//      Relu(y) where y is output 0 of a BNTrainingUpdate (relu = false, no residual, not
//      preserved) that the Relu alone reads, one T (float or half) on one device, the Relu not
//      preserved and without control inputs -> that BNTrainingUpdate with relu = true, its name
//      kept, `_npusim_fused` naming the Relu, whose readers (the next layer, the ReluGrad) read
//      the batch norm's output 0 and which goes. The graph is then the one rewrite 0 makes of a
//      float32 batch norm with its ReLU, in float16: 0b (run again after 0f, on the types the
//      nodes have) folds the ReluGrad and 0c takes a residual add's AddRelu as for float32.
//      Chosen over teaching rewrite 0's match the Casts: one small pass on the fused ops that
//      reuses 0b and 0c unchanged, where the match would need the Casts' every reader checked
//      again and rewrite 0 would then carry 0e's work. The values: the kernel rounds y to half
//      after the ReLU where the unfused Relu reads y rounded (equal values: only a -0 that
//      rounding makes of a tiny negative y comes out +0), and 0b's mask is ReluGrad's on the
//      rounded y (adapter/compiler/ops/batchnorm.cpp): tests/tf/test_fusion_bn_half_relu.py
//      trains bit for bit as with the Relu. A y read by anything besides the Relu keeps the
//      Relu. NPUSIM_FUSION_BN_RELU=0 turns it alone off.
//   1. BatchNormInference: Keras 3's BatchNormalization at inference,
//        add = AddV2(variance, eps Const)  rs = Rsqrt(add)  mul = Mul(rs, scale)
//        mul_1 = Mul(x, mul)  mul_2 = Mul(mean, mul)  sub = Sub(offset, mul_2)
//        add_1 = AddV2(mul_1, sub)
//      (Mul and AddV2 operands in either order), T = float, with an optional BiasAdd (NHWC)
//      producing x and an optional Relu or Relu6 consuming add_1 (relu / relu6: the clamp in
//      the batch norm's pass, as CANN fuses Conv2D + BatchNorm + Relu6).
//   1b. Zero padding into the convolution: Pad (or PadV2 with a constant 0) of NHWC x along H
//      and W only (constant, non-negative amounts), read only by a Conv2D or
//      DepthwiseConv2dNative (NHWC, padding VALID, same device and T) as its input, not
//      preserved, no control edges: the convolution reads x with padding EXPLICIT and
//      explicit_paddings the Pad's amounts, and the Pad goes (Keras' ZeroPadding2D before
//      MobileNetV2's strided depthwise convolutions: a copy of the activation less, the same
//      values, as the window's padding is zeros). Run before 2, which copies the attributes.
//   2. Conv2DBatchNormInference: a BatchNormInference (from 1) whose x is a Conv2D (NHWC, float)
//      with no other consumer: the batch norm folded into the convolution (CANN's graph engine
//      does this at inference); the convolution's attributes, the batch norm's inputs after x.
//      A DepthwiseConv2dNative so -> DepthwiseConv2dBatchNormInference (the depthwise
//      convolution, then the batch norm's vector pass).
//  2b. The residual add in the fused convolution's epilogue (CANN's Conv2D + BNInference + Add
//      [+ ReLU]): AddV2(c, r) with c from 2 (float y, no activation) read only by the add and
//      r (either operand) an activation of the network (output 0 of a fused convolution, an
//      AddV2, AddRelu, Relu, Relu6 or BatchNormInference), float32 on the NPU, and the Relu
//      or Relu6 that is the add's only reader if there is one -> c with r as its last input
//      (attribute R = 1, r of y's type Tout) and that activation after the add, in place of
//      the last node. The operands are taken to be of one shape (the blocks' activations);
//      the compiler rejects others. MobileNetV2's projections and ResNet's last convolution of
//      a block.
//      Where all of one's (or of a BatchNormInference's) data consumers are such convolutions
//      (Conv2D or depthwise) reading it as x or as the residual, its output
//      goes to them in fp16 (Tout / Tx = half; not for preserved nodes): the cast each consumer
//      would run moves into the producer's FIXPIPE or vector pass, with the same rounding. A
//      residual has its reader's Tout: the producer and that reader go to fp16 together (a
//      fixed point over both).
//   3. AddRelu: Relu(AddV2(x, y)), T in {float, half, bfloat16} (run after 1, so a
//      BatchNormInference feeding a residual add is seen as x or y).
//   3b. Conv2DBiasAdd / MatMulBiasAdd, CANN's convolution and MatMul epilogues: Conv2D (NHWC)
//      or MatMul -> BiasAdd (NHWC) [-> Relu], all float32, the product read only by the
//      BiasAdd (the Relu taken where it is the BiasAdd's only reader) -> the fused op (x or a,
//      filter or b, bias; the product's attributes, relu) in place of the last node: the cube
//      starts from the bias (bias table) and FIXPIPE applies the ReLU (adapter/compiler/ops/
//      conv2d.cpp, matmul.cpp). Run after 1-3 (an inference batch norm takes its BiasAdd
//      first) and before 4 (which would take the Relu). Training graphs keep BiasAddGrad (it
//      reads the gradient, not these nodes). Half and bfloat16 products stay unfused (the bias
//      table holds f32). NPUSIM_FUSION_EPILOGUE=0 turns this rewrite alone off.
//   4. FusedElementwise (adapter/compiler/ops/fused_elementwise.h), run last: maximal connected
//      sets of nodes whose op is fusible (compiler::ops::fusible_elementwise), of one type T in
//      {float, half, bfloat16}, with no attribute but T, where every node but the set's single
//      sink has all of its data consumers inside the set; sets of at least 2 nodes become one
//      node computing the steps in a topological order, its inputs the set's external inputs
//      (deduplicated; a Const or ReadVariableOp feeding the set stays outside). A node whose
//      result is also used outside is the sink of its own set. A SelectV2 of T is a step too
//      (its bool condition an input: the node's Tin lists each input's type) unless
//      NPUSIM_FUSION_SELECT=0. Only while the compiler's op table has a FusedElementwise
//      kernel (fused_elementwise_registered()).
//   5. FusedVariableUpdate (fused_elementwise.h), after 4: an optimizer's variable updates as
//      one launch, like CANN's ApplyAdam. An update is an AssignAddVariableOp /
//      AssignSubVariableOp / AssignVariableOp (dtype float, half, bfloat16) whose value is a
//      FusedElementwise or one fusible step read only by it (AssignAdd / AssignSub also: a value
//      read as it is). A ReadVariableOp of an updated variable with a control input from that
//      update's assign reads its new value: updates connected by such reads form one group
//      (Keras 3's Adam: m and v, then var from the new m and v; SGD with momentum: m, then var
//      from the new m). A ReadVariableOp of an updated variable without such an edge reads its
//      value before the update (allowed where the variable has one update in the graph). Each
//      group becomes one node in place of its last assign (name kept): inputs the variables'
//      handles, then the chains' other inputs (deduplicated); steps each update's chain and its
//      AddV2 / Sub with the variable, in TensorFlow's order, so the new values are those of the
//      unfused ops bit for bit. The group's other assigns, chains and reads go (one TensorFlow
//      must preserve, e.g. a function's control outputs: its assigns and reads, stays as a NoOp
//      after the fused node); their control inputs from outside become the fused node's,
//      control edges from them come from the fused node. A group is left alone if a variable
//      has two updates in it, a read or chain has a data consumer outside it, a node is off the
//      NPU, types or devices differ, or the fused node would sit on a cycle (something it reads
//      depends on the group; this also keeps a value-before read from moving past another
//      writer of its variable). Only while kernels_optimizer.cpp registered its kernel
//      (fused_variable_update_registered()); NPUSIM_FUSION_VARIABLE_UPDATE=0 turns this
//      rewrite alone off.
//   5b. Multi-tensor updates, after 6: FusedVariableUpdate nodes of one optimizer (the same
//      device, T, M, N, steps and updates) that wait for the same NpuCollective nodes (in a
//      data-parallel step: one gradient segment's all-reduce, so a group never waits for a
//      later segment), none of which depends on another (no path between them), all of one
//      liveness class (graph_liveness.h: not of two branches of a cond, whose node would never
//      run, one of its inputs always dead), become one node
//      "npusim_multi_tensor_update_<k>" (attribute members = their count; its resources and inputs
//      the members' in turn; `_npusim_members` their names), as CANN's foreach / multi-tensor apply
//      kernels update a list of tensors in one launch: the compiler runs the small members (at most
//      1024 elements per vector core, all inputs of the variable's shape or single elements) as
//      segments of one multi-tensor launch and the others as launches of their own, each value
//      computed as by the member's own kernel, bit for bit. Members TensorFlow must preserve stay
//      as NoOps after the node; control edges from the others come from it. A group is left out if
//      contracting it would close a cycle. NPUSIM_FUSION_MULTI_TENSOR=0 turns this rewrite alone
//      off.
//   5c. Casts folded into the updates, after 6 and before 5b (CANN folds a cast into the kernel
//      consuming it): a FusedVariableUpdate input produced by a Cast (float16 / bfloat16 ->
//      float32 under allow_mix_precision: the f32 optimizer's gradients; the pairs of
//      compiler::ops::fusible_cast, Truncate false) on the update's device, read by that update
//      alone, with no control edges and not preserved, becomes the Cast's input: the update's
//      steps start with "Cast i<n>" (fused_elementwise.h; its other steps read that step) and
//      Tin names the input's own type. In a multi-tensor node (5b) an input is folded where
//      every member's is (the steps are common). Run again after the mixed precision pass,
//      which inserts the gradients' Casts (fold_update_casts below). The update computes the cast
//      in its tile, with the Cast kernel's vconv: the same values, one launch and one HBM pass less
//      per gradient. NPUSIM_FUSION_CAST=0 turns this rewrite alone off.
//   5d. A gradient's scaling folded into its update, after 6 and before 5c: an optimizer that
//      multiplies every gradient by a scale before the update (Keras' `loss_scale_factor=k`:
//      g * (1 / k), a Const; LossScaleOptimizer under mixed_float16: g / scale, a variable's
//      value, in the cond's apply branch) makes g's product a node of its own where the update
//      reads it in two chains (Adam's and AdamW's m and v: rewrite 4 leaves it out of both;
//      SGD's one chain takes it). A FusedVariableUpdate (one member) data input that is output 0
//      of a Mul or RealDiv of the update's T, on its device, not preserved, with no control
//      edges either way and read by this update alone -> the update reads its two operands
//      (deduplicated against its other inputs; a scale is broadcast as any input is) and its
//      steps start with "Mul a b" / "RealDiv a b", read where the input was; the node goes. The
//      kernel runs the step with the op's own instructions: the same values bit for bit, one
//      launch and one HBM pass over the gradient less per variable. 5c then folds a Cast the
//      gradient is read through. NPUSIM_FUSION_UPDATE_SCALE=0 turns this rewrite alone off.
//   6. Duplicates, last: grappler's common-subexpression elimination, which goes with its
//      arithmetic optimizer (below): a node of a pure op (Const, Cast, ReadVariableOp, the
//      fusible element-wise ops) on the NPU with the same op, device, attributes, data inputs and
//      set of control inputs as an earlier one (in topological order, after replacing earlier
//      duplicates) is replaced by it: its data consumers read the earlier node and it goes (its
//      control consumers then follow the earlier node), unless it is preserved (it then stays,
//      unread). Keras' optimizers compute iterations + 1 and its cast once per variable. Two
//      reads of one variable with the same control inputs read the same value: TensorFlow
//      orders every writer of a variable against its reads.
//   7-12, run first (rewrite 4 would take their element-wise steps): keras-hub's decoder
//      subgraphs onto CANN's fused ops (kernels_llm.cpp), T the model's compute type (float,
//      half, bfloat16); where T is half / bfloat16 keras-hub casts to f32 around them (the
//      optional Casts below), and the fused op takes T and computes in f32.
//   7. RmsNorm (LlamaLayerNorm, Gemma's RMSNormalization): [xf = Cast(x: T -> f32)] Mul(Mul(xf,
//      Rsqrt(a) or Reciprocal(Sqrt(a))), gamma) [-> Cast to T], a = AddV2(Mean(Pow(xf, 2.0) or
//      Square(xf), axis -1, keep_dims), eps), gamma a ReadVariableOp [through a Cast T -> f32]
//      or Gemma's AddV2(1.0, that) (kept; cast to T where T is not f32), the variable [H] with
//      H a multiple of 16 (the kernel's rows) -> RmsNorm(x, gamma; epsilon).
//      NPUSIM_FUSION_RMS_NORM=0 turns it alone off.
//   8. SwiGlu (Llama's feed-forward): Mul(up, [Cast to T](Mul(gf, Sigmoid(gf)))), gf = gate
//      [through a Cast T -> f32], gate and up Reshapes to one constant shape (Dense outputs) ->
//      SwiGlu(gate, up). NPUSIM_FUSION_SWIGLU=0 turns it alone off.
//   9. Fused attention, one of three subgraphs (graph_fusion.cpp states each node):
//      a. LlamaAttention's einsums as TensorFlow lowers them:
//        Transpose(BatchMatMulV2([Cast to T](SelectV2(mask, Softmax(SelectV2(mask, [Cast to f32]
//        (Mul(BatchMatMulV2(Transpose(q, [0,2,1,3]), Transpose(K, [0,2,3,1])), scale)), c)), 0)),
//        Transpose(V, [0,2,1,3])), [0,2,1,3])
//        K and V either k and v or keras.ops.repeat(k, G, axis=2) (ExpandDims, Tile, Reshape to
//        a constant shape: grouped-query heads; with G = 1, MHA, grappler leaves ExpandDims,
//        Reshape);
//      b. keras' ops.dot_product_attention in TensorFlow (GPT-2's CachedMultiHeadAttention):
//        Einsum([Cast to T](Softmax(SelectV2(mask, Mul([Cast to f32](Einsum(q, k;
//        "BTNH,BSNH->BNTS")), scale), c))), v; "BNTS,BSNH->BTNH") (MHA: Nkv = N);
//      c. Gemma's CachedGemmaAttention: the queries pre-scaled (Mul(q, scale): the fused op's
//        scale_value), einsums over grouped heads [B, Sq, K, G, D] without a repeat
//        (Reshapes, Transposes and BatchMatMulV2s around a masked Softmax as in a);
//      with c <= -1e4 (keras' -1e9 or -0.7 * FLT_MAX: a masked score weighs 0 either way),
//      q [B, Sq, N, D], k and v [B, L, Nkv, D], and the mask one of
//        - a bool Const [B, H.., Sq, L] (H..: 1 or the heads), causal with offset 0 or L - Sq
//          (or all true): the prefill over an empty cache -> PromptFlashAttention(q, k, v;
//          scale_value, sparse_mode 2, 3 or 0);
//        - compute_causal_mask(B, L, 1, index) as grappler leaves it (GreaterEqual of the Cast
//          int32 index against a constant range(L)), given head axes by [:, None] (a),
//          [:, None, None] (c) or ExpandDims and BroadcastTo [B, N, 1, L] (b): a decode step ->
//          IncreFlashAttention(q, k, v, AddV2(index, 1); scale_value, Tlen int32) (new nodes
//          "<name>/npusim_one", "<name>/npusim_kv_length").
//      T = float only where the precision mode lets fp32 cube operands round to fp16 (not
//      must_keep_origin_dtype): q, k and v are cast to half ("<name>/npusim_{q,k,v}_fp16"),
//      the fused op is "<name>/npusim_attention" and the matched node becomes its Cast back.
//      The mask's nodes go where nothing else reads them. NPUSIM_FUSION_ATTENTION=0 turns it
//      alone off.
//   10. RotaryPositionEmbedding (keras-hub's RotaryEmbedding: Llama's and Gemma's queries and
//      keys), run after 9, all of one type T:
//        x1, x2 = Split(-1, x; 2)   r = Reshape(Pack(Neg(x2), x1; axis -2), x's shape)
//        AddV2(Mul(x, cos), Mul(r, sin))  ->  RotaryPositionEmbedding(x, cos, sin; mode 0)
//      x [B, S, N, D] (static: the Reshape's constant shape, D a multiple of 16), cos and sin
//      [1, S, 1, D] or [S, D] (static through Const, Reshape, ExpandDims and the unary ops).
//      Then the fused ops' cos / sin tables (keras-hub computes them in every call: per layer,
//      for the queries and for the keys) are deduplicated back through their producers (Cast,
//      Einsum, Pack, Reshape, ExpandDims, Cos, Sin, ...; same op, attributes and inputs), so a
//      graph computes each table once. NPUSIM_FUSION_ROPE=0 turns it alone off.
//   11. GeGlu and Gelu (tf.nn.gelu(x, approximate=True): Gemma's and GPT-2's feed-forwards),
//      after 10, all of one type T: Mul(Mul(0.5, x), AddV2(1.0, Tanh(Mul(0.7978845608, AddV2(x,
//      Mul(0.044715, Pow(x, 3))))))) (the constants as T holds them) is
//        a. with a Mul by `up` where x and up are the same MatMul / BatchMatMulV2 of one operand
//           by variables of one shape (a gated feed-forward's two Dense layers) or of one static
//           shape -> GeGlu(x, up; approximate 1) in place of that Mul;
//        b. else -> Gelu(x; approximate 1) in place of its last Mul.
//      NPUSIM_FUSION_GEGLU=0 / NPUSIM_FUSION_GELU=0 turn 11a / 11b alone off.
//   12. LayerNorm (keras' LayerNormalization over the last axis: GPT-2's), all of one type T:
//        mean = Mean(x, [-1], keep_dims)  var = Mean(SquaredDifference(x, mean), [-1], keep_dims)
//        m = Mul(Rsqrt(AddV2(var, eps)), gamma)
//        y = AddV2(Mul(x, m), AddV2(Mul(Neg(mean), m), beta))
//      gamma and beta [H] [through Reshapes to [1, .., 1, H]], H a multiple of 16 (the
//      kernel's) -> LayerNorm(x, gamma, beta; epsilon) in place of y. NPUSIM_FUSION_LAYER_NORM=0
//      turns it alone off.
//   12b. LayerNorm in training (BERT's pre-training), before 12: 12's forward (x of static
//      rank r) together with the gradient TensorFlow's autodiff builds for it, of the same T
//      (dy: the gradient arriving at y; row sums are Sums over x's last axis, column sums over
//      the other axes; [R] a chain of Reshapes to constant shapes, each read only by the next):
//        dx_scale = Mul(dy, m)   Neg(Sum_rows(Mul(dy, m)) [R]) -> Tile to H, Mul 1/H (or RealDiv
//        by H): dx_mean   dm = AddN(Mul(dy, x), Mul(Neg(mean), dy))
//        RsqrtGrad(rsqrt, Sum_rows(Mul(dm, gamma)) [R]) -> Tile, 1/H: dv -> Mul(Mul(2, dv),
//        Sub(x, mean)): dx_var   dgamma = Sum_columns(Mul(rsqrt, dm)) [R]
//        dbeta = Sum_columns(dy) [R]   x's gradient: an AddN of dx_scale, dx_mean, dx_var [and
//        x's other gradients]
//      (the two Mul(dy, m) may be one node) become
//        LayerNormV3(x, gamma, beta; epsilon) in place of y: y, mean, rstd (f32, [.., 1])
//        LayerNormXBackpropV2(dy, x, rstd, mean, gamma) in place of the AddN: pd_x,
//          res_for_gamma (where x has other gradients, a new node "<AddN>/npusim_layer_norm_x_
//          backprop" and the AddN sums its pd_x with them)
//        LayerNormBetaGammaBackpropV2(dy, res_for_gamma) in place of dgamma's last node:
//          pd_gamma, pd_beta; dbeta's last node goes, its readers read pd_beta.
//      dgamma's and dbeta's last nodes must be [H] (a Reshape to [H], or a Sum of a 2-D x).
//      Every other matched node goes: each must have its consumers and control edges inside the
//      match (the gradient's Sub and constant 2 depend on its mean gradient by control edges),
//      not be preserved, and sit on the NPU. 4 launches per LayerNorm in place of about 28
//      (kernels: adapter/compiler/ops/norm.cpp). NPUSIM_FUSION_LAYER_NORM_TRAINING=0 turns it
//      alone off.
//   13. WeightQuantBatchMatmulV2 (Keras' weight-only int8 Dense / EinsumDense:
//      model.quantize(config=Int8QuantizationConfig(activation_quantizer=None))), run first (its
//      Reshape in place of the RealDiv is the Dense output rewrites 8-10 match), T half or
//      bfloat16:
//        RealDiv([Reshape to a constant shape](MatMul(a, Cast(w: int8 -> T)) or
//          BatchMatMulV2(a, Reshape(Cast(w: int8 -> T), 2-D constant shape))), s)
//      -> Reshape(WeightQuantBatchMatmulV2(a, w [Reshape to 2-D], Reciprocal(s)), the constant
//      shape) (new nodes "<name>/npusim_matmul", "/npusim_weight", "/npusim_antiquant_scale"):
//      s is Keras' kernel_scale, one per output column (any shape of N elements), its
//      reciprocal CANN's antiquant_scale. MatMul without transposes. NPUSIM_FUSION_WEIGHT_QUANT=0
//      turns it alone off.
//   14. A 2-D Transpose folded into its MatMul, after 13 (which takes MatMuls without
//      transposes): MatMul(a, Transpose(w, [1, 0])) -> MatMul(a, w; transpose_b flipped), and
//      input 0 with transpose_a, the Transpose read only by the MatMul; T half or bfloat16, or
//      float unless the precision mode is must_keep_origin_dtype (the cube's transposing loads
//      take 16-bit fractals). Keras' tied ReversibleEmbedding multiplies by
//      transpose(embeddings): the vocabulary table is then read as stored instead of copied
//      every call. Grappler's arithmetic optimizer, which the plugin turns off (below), has the
//      same fold. Any MatMul on the NPU, not only decoders'. NPUSIM_FUSION_TRANSPOSE_FOLD=0
//      turns it alone off.
//   15. Conv2DBNTrainingReduce, CANN's Conv2D + BNTrainingReduce fusion, run by the optimizer
//      after the mixed precision pass (fuse_conv_bn_reduces below; so a convolution and its
//      batch norm in float16 meet as they will run): BNTrainingReduce(x) (rewrite 0's) whose x
//      is output 0 of a Conv2D or Conv2DBiasAdd (NHWC, T float or half, Tbias float) on the
//      same device -> the convolution rewritten in place as Conv2DBNTrainingReduce(x, filter,
//      bias: N * float; T, N, relu and the convolution's attributes) -> y, sum, square_sum,
//      its name kept, `_npusim_fused` naming the BNTrainingReduce, whose readers now read
//      outputs 1 and 2 and which goes. The convolution's kernel computes the sums on its
//      vector cores from the y it just wrote (adapter/compiler/ops/conv2d.cpp): no launch and
//      no HBM pass of its own. The convolution's other readers are fine; the BNTrainingReduce
//      must have no control edges and not be preserved. NPUSIM_FUSION_CONV_BN_REDUCE=0 turns
//      it alone off.
//   16. A residual gradient sum and its ReLU's gradient as one pass, run by the optimizer after
//      the mixed precision pass (fuse_add_n_relu_grads below; the two in the type they run
//      in) and after 0b: ReluGrad(AddN(a0, ..., a(n-1)), y), T float, half or bfloat16, the
//      AddN read by the ReluGrad alone (not preserved, no control edges, same device) -> the
//      ReluGrad rewritten in place as FusedElementwise(a0, ..., a(n-1), y) of steps
//      "AddV2 i0 i1", "AddV2 s0 i2", ..., "ReluGrad s(n-2) in" (the AddN kernel's own steps,
//      left to right, each rounded to T, then ReluGrad's: the same bits), `_npusim_fused`
//      naming the AddN, which goes. In a ResNet's backward pass the gradient arriving at a
//      residual block's output is such a sum (the next block's input gradient and its
//      shortcut's), taken back through the block's ReLU. NPUSIM_FUSION_ADDN_RELU_GRAD=0 turns
//      it alone off.
//   17. Lamb's per-variable steps (MindSpore's Lamb as models/bert.py traces it), run before 4,
//      which takes the steps it writes; all float32 on the NPU:
//        ratio = Maximum(Minimum(SelectV2(LogicalAnd(Greater(a, 0), Greater(b, 0)), r, one),
//                hi), lo)
//      (keras.ops.where, then clip), a and b Sqrt outputs of Sum(Square(..)) (||w||, ||g||),
//      one the Const 1,
//      lo <= 1 <= hi finite Consts; the Minimum, SelectV2, LogicalAnd and Greaters read by
//      the next alone -> in place of the clip's Maximum (name kept) the element-wise steps
//        c = Sign(a) * Sign(b)   ratio = c * Maximum(Minimum(r, hi), lo) + (one - c)
//      (new nodes "<name>/npusim_lamb_*"): the same value for norms >= 0 (c is 1 exactly where
//      both are > 0, the clip moved into the branch it changes, clip(one) = one); only a NaN
//      norm gives NaN instead of one: a NaN in g makes the update NaN either way, a NaN in w
//      makes w's other elements NaN here where the unfused ratio 1 keeps them. Rewrite
//      4 takes them into the variable update's chain and 5 into its FusedVariableUpdate (the
//      ratio as uniform steps: CANN's LambUpdateWithLR, 5b grouping the small variables). The
//      norms: a, b and r's ||u|| (r = RealDiv(a, Maximum(Sqrt(..), eps))) where they are
//      Sqrt(Sum(Square(x), Const axes)) (Square read by the Sum alone) become SquareSumV1(x;
//      axis, keep_dims) in place of the Sum (CANN's op; the squares in the reduction's f32
//      pass: adapter/compiler/ops/reduce.cpp), the Square going; a norm's Sqrt with other
//      readers (||g||: the gradient's clip) is computed again for the ratio
//      ("<name>/npusim_lamb_norm_g" / "_norm_w"), so every Sqrt joins its reader's chain.
//      Reports: the AssignSubVariableOp the ratio feeds gets `_npusim_report_type`
//      LambUpdateWithLR, the moments' AssignVariableOps whose new values u reads LambNextMV
//      (CANN's op types; kept by 5, 5b, 5c; the update kernels label their launches with it).
//      NPUSIM_FUSION_LAMB=0 turns it alone off.
//   17b. Multi-tensor norms, last: SquareSumV1 nodes (one input, float32 on the NPU, not
//      preserved, axis [0, 1, ..., k-1]) of one device, axis and keep_dims, waiting for the same
//      collectives, no one of which depends on another, become one SquareSumV1 node
//      "npusim_multi_square_sum_<k>" with N = their count (input i and output i member i's;
//      `_npusim_members` their names), as 5b groups the updates (kept only where contracting
//      it closes no cycle). Its kernel reduces the members of one aligned size below the split
//      (four or more) as the rows of one reduction, each output the bits of its member's own
//      launch, and every other member in its own launches (adapter/compiler/ops/reduce.cpp).
//      Lamb: the norms of w in one node, those of the updates in another.
//      NPUSIM_FUSION_MULTI_SQUARE_SUM=0 turns it alone off.
//   18. Dropout masks on the AI CPU, first (before 4 takes the comparison into a chain):
//      GreaterEqual(StatelessRandomUniformV2(shape, key, counter, alg) [* 1] [+ 0], rate Const)
//      -> DropOutGenMask(shape, key, counter, alg; dtype, rate) in place of the GreaterEqual,
//      the uniform (and the neutral scaling) going: the same mask bits, made by one task of the
//      chip's AI CPU beside the AI cores (gen_mask_rewrite.cpp says the conditions;
//      kernels_gen_mask.cpp the op). NPUSIM_FUSION_GENMASK=0 turns it alone off.
//   19. The weights' casts of a training step, after the mixed precision pass (which inserts
//      them; group_weight_casts below): Casts between float types on the NPU, not preserved,
//      each reading a ReadVariableOp of a variable the graph also writes (an update, an Assign*
//      or ResourceApply* of its handle, directly or through the Switch / Identity that forward
//      it: Keras' LossScaleOptimizer updates in a cond's branch), or the gradients' casts
//      that only rewrite 20's AllFinite and Switches read (grouped apart), of one device, SrcT,
//      DstT and Truncate, waiting for the same collectives, no one of which depends on another,
//      become one MultiTensorCast node "npusim_multi_cast_<k>" with N = their count (input i and
//      output i member i's;
//      `_npusim_members` their names), as 17b groups the norms (kept only where contracting it
//      closes no cycle). Its kernel casts every member as Cast's own kernel does (the same
//      bits), the members as segments of a few multi-tensor launches
//      (adapter/compiler/ops/cast.cpp). A variable the graph only reads keeps its Cast, which
//      the derived-tensor cache leaves out while the variable is unchanged. CANN's graph
//      engine keeps the float16 copy with the variable instead (the update writing it: "Not
//      yet" in docs/graph_engine.md). NPUSIM_FUSION_MULTI_CAST=0 turns it alone off.
//   19b. On the chips whose MTE issue keys are > 0 (the 910b preset; NPUSIM_CONV_WEIGHTS_BLOCKED
//      =0 / =1 forces it off / on; block_conv_filters below): a float16 /
//      bfloat16 member of those nodes read as a forward convolution's filter (Conv2D,
//      Conv2DBiasAdd, Conv2DBNTrainingReduce, input 1, NHWC) is written in blocks of 16 output
//      channels
//      (attribute filter_n16; the convolution gets _npusim_filter_layout, filter_layout.h), and
//      so does its input gradient Conv2DBackpropInput (NPUSIM_CONV_WEIGHTS_BLOCKED_INPUT_GRAD=0:
//      it reads HWIO), a blocked copy as one more member where something else reads it too. The
//      convolution's weights are then whole 512-byte fractals (adapter/compiler/ops/conv.h
//      kFilterLayoutN16), written by the cast's own store (no launch of their own).
//   20. A loss scale's overflow check, first (Keras 3's and tf.keras' LossScaleOptimizer under
//      `mixed_float16`: whether every gradient is finite, before the cond that applies or skips
//      the step): All(Pack(a_0 .. a_N-1), axes [0] or [-1]) whose Pack (axis 0 or -1) reads
//      a_i = All(IsFinite(x_i), Const axes [0, 1, ..., k_i - 1]) or IsFinite(x_i) itself (k_i =
//      0: grappler drops the All of a scalar) (keep_dims false everywhere;
//      the IsFinites of one float type T; every inner node read by the next alone, removable),
//      the outer All read only as Switches' predicate (a lowered cond's: a scalar, so every
//      a_i is one and every inner All reduced every axis of its x_i; the graph has no shapes)
//      -> AllFinite(x_0 .. x_N-1; T, N, ranks = [k_i]) in place of the outer All (its name and
//      readers kept), the IsFinites, inner Alls and the Pack going: one launch for the whole
//      check (adapter/compiler/ops/all_finite.cpp) instead of four per gradient, the same bool.
//      The kernel also checks each x_i's rank against k_i when it compiles.
//      NPUSIM_FUSION_ALL_FINITE=0 turns it alone off.
// A chain is fused only if each node it removes has exactly the consumers of the pattern (no
// other data or control consumers), has no control inputs, and is not a node TensorFlow must
// preserve (fetches, keep ops: GrapplerItem::NodesToPreserve). Anything else stays as it was.
//
// NPUSIM_FUSION=0 in the environment (read once per process) turns the rewrites off.
//
// Grappler's arithmetic optimizer runs before plugin optimizers and re-associates add trees
// (AddOpsRewrite: a batch norm's final AddV2 and a residual Add become one tree of adds grouped
// by shape), which breaks the chains above. While the fusion is requested, TF_InitGraph
// therefore turns the arithmetic optimizer off (TP_OptimizerConfigs; TensorFlow applies plugin
// configs to every graph of the process, CPU ones included).
#pragma once

#include <functional>
#include <set>
#include <string>
#include <unordered_set>

namespace tensorflow {
class GraphDef;
}
// adapter/runtime/status.h; this header stays standard-library only (graph_optimizer.cpp and
// graph_fusion.cpp are built against TensorFlow's C++ headers).
namespace npusim::rt {
class Status;
}

namespace npusim::tf {

struct FusionCounts {
  int training_batch_norm = 0;  // training batch norms fused (4 nodes each, rewrite 0)
  int bn_relu_grad = 0;         // ReluGrads folded into rewrite 0's gradients (rewrite 0b)
  int batch_norm = 0;           // BatchNormInference nodes created (before 2 folds some in)
  int conv_pad = 0;             // Pads absorbed into convolutions' padding (rewrite 1b)
  int conv_batch_norm = 0;      // Conv2DBatchNormInference nodes created
  int conv_residual = 0;        // of those, residual AddV2s (and ReLUs) taken in (rewrite 2b)
  int half_handoffs = 0;        // of those, outputs handed to the next ones in fp16 (no new node)
  int add_relu = 0;             // AddRelu nodes created
  int bias_epilogue = 0;        // Conv2DBiasAdd and MatMulBiasAdd nodes created (rewrite 3b)
  int elementwise = 0;          // FusedElementwise nodes created
  int variable_update = 0;      // FusedVariableUpdate nodes created (rewrite 5)
  int multi_tensor_update = 0;  // multi-tensor FusedVariableUpdate nodes created (rewrite 5b)
  int update_casts = 0;         // Casts folded into FusedVariableUpdate nodes (rewrite 5c)
  int update_scales = 0;        // Mul / RealDiv folded into FusedVariableUpdate nodes (5d)
  int deduplicated = 0;         // duplicates removed or no longer read (rewrite 6)
  int rms_norm = 0;             // RmsNorm nodes created (rewrite 7)
  int swiglu = 0;               // SwiGlu nodes created (rewrite 8)
  int attention = 0;            // Prompt- / IncreFlashAttention nodes created (rewrite 9)
  int rope = 0;                 // RotaryPositionEmbedding nodes created (rewrite 10)
  int rope_tables = 0;          // of their cos / sin tables' nodes, duplicates removed
  int geglu = 0;                // GeGlu nodes created (rewrite 11a)
  int gelu = 0;                 // Gelu nodes created (rewrite 11b)
  int layer_norm = 0;           // LayerNorm nodes created (rewrite 12)
  int layer_norm_training = 0;  // LayerNorms fused with their gradients (3 nodes each, 12b)
  int weight_quant_matmul = 0;  // WeightQuantBatchMatmulV2 nodes created (rewrite 13)
  int matmul_transposes = 0;    // Transposes folded into MatMuls (rewrite 14)
  int lamb = 0;                 // Lamb trust ratios lowered to element-wise steps (rewrite 17)
  int multi_square_sum = 0;     // multi-tensor SquareSumV1 nodes created (rewrite 17b)
  int gen_mask = 0;             // DropOutGenMask nodes created (rewrite 18)
  int all_finite = 0;           // AllFinite nodes created (rewrite 20)
  int total() const {
    return training_batch_norm + bn_relu_grad + batch_norm + conv_pad + conv_batch_norm +
           conv_residual + add_relu + bias_epilogue + elementwise + variable_update +
           multi_tensor_update + update_casts + update_scales + deduplicated + rms_norm + swiglu +
           attention + rope + rope_tables + geglu + gelu + layer_norm + layer_norm_training +
           weight_quant_matmul + matmul_transposes + lamb + multi_square_sum + gen_mask +
           all_finite;
  }
};

// False when NPUSIM_FUSION is "0" (read once).
bool fusion_requested();
// False when NPUSIM_FUSION_BN_TRAINING is "0" (read once): rewrite 0 alone off.
bool training_fusion_requested();
// False when NPUSIM_FUSION_BN_RELU_GRAD is "0" (read once): rewrite 0b alone off.
bool bn_relu_grad_fusion_requested();
// False when NPUSIM_FUSION_VARIABLE_UPDATE is "0" (read once): rewrite 5 alone off.
bool variable_update_fusion_requested();
// False when NPUSIM_FUSION_SELECT is "0" (read once): rewrite 4 takes no SelectV2 steps.
bool select_fusion_requested();
// False when NPUSIM_FUSION_RMS_NORM / _SWIGLU / _ATTENTION is "0" (each read once): rewrite 7,
// 8 or 9 alone off.
bool rms_norm_fusion_requested();
bool swiglu_fusion_requested();
bool attention_fusion_requested();
// False when NPUSIM_FUSION_MULTI_TENSOR is "0" (read once): rewrite 5b alone off.
bool multi_tensor_update_requested();
// False when NPUSIM_FUSION_CAST is "0" (read once): rewrite 5c alone off.
bool cast_fusion_requested();
// False when NPUSIM_FUSION_UPDATE_SCALE is "0" (read once): rewrite 5d alone off.
bool update_scale_fusion_requested();
// False when NPUSIM_FUSION_EPILOGUE is "0" (read once): rewrite 3b alone off.
bool epilogue_fusion_requested();
// False when NPUSIM_FUSION_ROPE is "0" (read once): rewrite 10 alone off.
bool rope_fusion_requested();
// False when NPUSIM_FUSION_GEGLU / NPUSIM_FUSION_GELU is "0" (each read once): rewrite 11a or
// 11b alone off.
bool geglu_fusion_requested();
bool gelu_fusion_requested();
// False when NPUSIM_FUSION_LAYER_NORM is "0" (read once): rewrite 12 alone off.
bool layer_norm_fusion_requested();
// False when NPUSIM_FUSION_LAYER_NORM_TRAINING is "0" (read once): rewrite 12b alone off.
bool layer_norm_training_fusion_requested();
// False when NPUSIM_FUSION_WEIGHT_QUANT is "0" (read once): rewrite 13 alone off.
bool weight_quant_fusion_requested();
// False when NPUSIM_FUSION_TRANSPOSE_FOLD is "0" (read once): rewrite 14 alone off.
bool transpose_fold_requested();
// False when NPUSIM_FUSION_LAMB is "0" (read once): rewrite 17 alone off.
bool lamb_fusion_requested();
// False when NPUSIM_FUSION_MULTI_SQUARE_SUM is "0" (read once): rewrite 17b alone off.
bool multi_square_sum_requested();
// False when NPUSIM_FUSION_GENMASK is "0" (read once): rewrite 18 alone off.
bool gen_mask_fusion_requested();
// False when NPUSIM_FUSION_MULTI_CAST is "0" (read once): rewrite 19 alone off.
bool multi_cast_requested();
// False when NPUSIM_FUSION_ALL_FINITE is "0" (read once): rewrite 20 alone off.
bool all_finite_fusion_requested();
// Rewrite 18 (above, gen_mask_rewrite.cpp) on `graph` where DropOutGenMask is registered: the
// nodes it removes into *removed; returns the DropOutGenMask nodes created.
int fuse_dropout_gen_masks(tensorflow::GraphDef& graph,
                           const std::unordered_set<std::string>& preserve,
                           std::set<std::string>* removed);
// fusion_requested() and the fused ops are registered.
bool fusion_enabled();
// False when NPUSIM_FUSION_CONV_BN_REDUCE is "0" (read once): rewrite 15 alone off.
bool conv_bn_reduce_fusion_requested();
// Rewrite 15 (above) on `graph` while fusion_enabled() and requested; returns the
// Conv2DBNTrainingReduce nodes created.
int fuse_conv_bn_reduces(tensorflow::GraphDef& graph,
                         const std::unordered_set<std::string>& preserve);

// False when NPUSIM_FUSION_BN_BIAS_GRAD is "0" (read once): rewrite 0d alone off.
bool bn_bias_grad_fusion_requested();
// Rewrite 0d (above) on `graph` while fusion_enabled() and rewrites 0 and 0d are requested;
// returns the BiasAddGrads folded.
int fuse_bn_bias_grads(tensorflow::GraphDef& graph,
                       const std::unordered_set<std::string>& preserve);

// Rewrite 0b (above) on `graph` while fusion_enabled() and rewrites 0 and 0b are requested,
// after allow_mix_precision's pass (which fuse_npu_graph leaves it to); returns the ReluGrads
// folded.
int fold_bn_relu_grads(tensorflow::GraphDef& graph,
                       const std::unordered_set<std::string>& preserve);

// False when NPUSIM_FUSION_BN_ADD_RELU is "0" (read once): rewrite 0c alone off.
bool bn_add_relu_fusion_requested();
// Rewrite 0c (above) on `graph` while fusion_enabled() and rewrites 0 and 0c are requested,
// after allow_mix_precision's pass; returns the AddRelus taken into batch norms.
int fuse_bn_add_relus(tensorflow::GraphDef& graph, const std::unordered_set<std::string>& preserve);

// Rewrite 0e (above) on `graph` while fusion_enabled() and rewrite 0 is requested, unless
// NPUSIM_FUSION_BN_HALF_CASTS is "0"; returns the batch norms turned float16.
int fold_bn_half_casts(tensorflow::GraphDef& graph,
                       const std::unordered_set<std::string>& preserve);

// False when NPUSIM_FUSION_BN_RELU is "0" (read once): rewrite 0f alone off.
bool bn_relu_fusion_requested();
// Rewrite 0f (above) on `graph` while fusion_enabled() and rewrites 0 and 0f are requested,
// after rewrite 0e; returns the Relus folded into batch norms.
int fold_bn_relus(tensorflow::GraphDef& graph, const std::unordered_set<std::string>& preserve);

// Rewrite 16 (above) on `graph` while fusion_enabled(), requested and FusedElementwise is
// registered; returns the ReluGrads rewritten.
int fuse_add_n_relu_grads(tensorflow::GraphDef& graph,
                          const std::unordered_set<std::string>& preserve);

// Rewrite 5c (above) on `graph` while fusion_enabled() and requested, for the Casts the mixed
// precision pass (mixed_precision.h) puts before the updates after the other rewrites ran;
// returns the Casts folded.
int fold_update_casts(tensorflow::GraphDef& graph, const std::unordered_set<std::string>& preserve);

// Rewrite 19 (above) on `graph` while fusion_enabled() and requested, after the mixed
// precision pass has inserted the weights' Casts; returns the MultiTensorCast nodes created.
int group_weight_casts(tensorflow::GraphDef& graph,
                       const std::unordered_set<std::string>& preserve);

// Rewrite 19b (graph_fusion.cpp block_conv_filters: the forward convolutions' filters written
// blocked by the weights' MultiTensorCast) on `graph` while fusion_enabled() and rewrite 19 are
// requested and NPUSIM_CONV_WEIGHTS_BLOCKED (read once per process) says so: "1" on, "0" off,
// unset `chip_default` (the caller's choice for the device's chip: graph_optimizer.cpp, on
// where the chip's MTE issue keys are > 0); after group_weight_casts. Returns the members
// written blocked.
int block_conv_filters(tensorflow::GraphDef& graph, bool chip_default);

// The first edge of a graph TensorFlow would refuse when it rebuilds a function's graph from the
// optimizer's output (a producer's output type that its consumer's op definition does not take
// there), described; empty if none (graph_optimizer.cpp's is first_type_error, mixed_precision.h).
using TypeCheck = std::function<std::string(const tensorflow::GraphDef&)>;

// Applies the rewrites to `graph`; returns how many fused nodes were created (0: unchanged).
// With `type_error`, on a graph that passes it: a rewrite after which the graph does not is
// taken back on its own (logged "npusim: graph fusion: the <rewrite> rewrite left out: ..."), so
// TensorFlow never drops the optimized graph, and every other rewrite, for one bad node.
FusionCounts fuse_npu_graph(tensorflow::GraphDef& graph,
                            const std::unordered_set<std::string>& preserve,
                            const TypeCheck& type_error = {});

// Whether kernels_fused.cpp registered the fused ops' definitions and NPU kernels
// (register_fused_kernels, kernel_families.h).
bool fused_ops_registered();
// fused_ops_registered() and the compiler's op table gave FusedElementwise an NPU kernel.
bool fused_elementwise_registered();
// fused_ops_registered() and kernels_optimizer.cpp registered FusedVariableUpdate's NPU kernel.
bool fused_variable_update_registered();
// kernels_llm.cpp registered the decoder-model ops and their NPU kernels (rewrites 7-13).
bool llm_ops_registered();

}  // namespace npusim::tf
