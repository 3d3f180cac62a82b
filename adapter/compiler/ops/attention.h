// Fused attention (FlashAttention-style) for decoder models: the tiling, exposed so tests and
// tools can see how a config shapes the kernel (ops/attention.cpp has the algorithm).
#pragma once

#include <cstdint>
#include <string>

#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler::ops {

// O = softmax(Q K^T * scale + mask) V per (batch, head), layout BSND (Keras' and keras-hub's
// (batch, seq, heads, head_dim)): Q and O [B, Sq, N, D], K and V [B, Skv, Nkv, D], query head
// n reading KV head n / (N / Nkv) (grouped-query attention).
struct AttentionProblem {
  int64_t batch = 0, seq_q = 0, seq_kv = 0, heads = 0, kv_heads = 0, dim = 0;
  int64_t kv_len = 0;  // keys taken: the first kv_len of the seq_kv (a KV cache's valid length)
  // Causal mask: query i sees keys j <= i + offset. offset = kv_len - seq_q (CANN sparse_mode 3,
  // "right-down": the last query sees every key, as a decoder with a KV cache needs) or 0
  // (sparse_mode 2, "left-up"); equal when seq_q == kv_len.
  bool causal = false;
  int64_t causal_offset = 0;
  double scale = 1.0;
  isa::Dtype type = isa::Dtype::F16;  // Q, K, V and O (f16 or bf16); f32 accumulation
};

// How the kernel cuts the problem. A UNIT is one row block of queries against its KV head:
// per-head units take mq consecutive positions of one query head; when seq_q == 1 (a decode
// step) a unit takes the group of query heads sharing a KV head (their rows are adjacent in
// BSND), so the KV cache is read once per group, not once per head.
struct AttentionTiling {
  bool grouped = false;  // seq_q == 1: a unit's rows are the G = N / Nkv heads of a group
  int64_t group = 1;     // G
  int64_t mq = 0;        // rows per unit (multiple of 16): the cube's m
  int64_t half = 0;      // rows per vector core: mq / aiv_per_aic
  int64_t tk = 0;        // keys per tile (multiple of 64): S is mq x tk
  int64_t q_blocks = 0;  // row blocks per head (per-head units)
  int64_t units = 0;     // B * (N or Nkv) * q_blocks
  int block_dim = 0;     // mix groups used: min(aic cores, units)
  // Per mix group, in the GM workspace (rounded to L2 lines): two S tiles (f32, the cube's
  // ping/pong), one P tile (the input type) and one P V tile (f32).
  uint64_t s_bytes = 0, p_bytes = 0, pv_bytes = 0, slot_bytes = 0;
  std::string str() const;  // "mq 128 (2 x 64) tk 128, 64 units over 24 groups"
};

// Chooses mq and tk (the largest that fit L1, L0A, L0B, L0C of the cube core and the UB of a
// vector core); CompileError naming op if none fits or the chip is not split.
AttentionTiling plan_attention(const AttentionProblem& p, const ChipConfig& cfg,
                               const std::string& op);

}  // namespace npusim::compiler::ops
