// Transposition as a building block (Transpose, Cumsum along inner axes, Einsum): appends the
// launches computing out = transpose(in, perm) to a LaunchPlan. See transpose.cpp for the
// strategies (inner dim kept: MTE copies of whole-block rows, or runs; inner dim moved: 16x16
// vtranspose blocks, or element by element).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "adapter/compiler/ops/compose.h"

namespace npusim::compiler::ops {

// perm: output dim i is input dim perm[i] (a permutation of 0..rank-1, already normalized).
// `in` / `out` are where the tensors live (op inputs/outputs or workspace slices). Appends
// nothing when the tensor is empty; a single copy when the permutation only moves size-1 dims.
void append_transpose(LaunchPlan& plan, const std::string& op, const ChipConfig& cfg,
                      DataType dtype, const std::vector<int64_t>& in_shape,
                      const std::vector<int64_t>& perm, ArgRef in, ArgRef out);

// The batched 2-d transpose [P, Q, R] -> [P, R, Q] on vtranspose blocks, when it applies
// (block_transpose_applies: 2- or 4-byte elements, Q of at least two 32-byte blocks or exactly
// one). Input rows (of R) are `ri` elements apart (ri >= R); output rows (of Q) are `qo` elements
// apart (qo >= Q, default Q; the elements between Q and qo are unspecified). Rows that are not
// whole 32-byte blocks go through a padded workspace and a copy.
bool block_transpose_applies(DataType dtype, int64_t nq);
void append_block_transpose(LaunchPlan& plan, const std::string& op, const ChipConfig& cfg,
                            DataType dtype, int64_t np, int64_t nq, int64_t nr, int64_t ri,
                            ArgRef in, ArgRef out, const std::string& what, int64_t qo = 0);

// The shape of transpose(shape, perm).
std::vector<int64_t> permuted_shape(const std::vector<int64_t>& shape,
                                    const std::vector<int64_t>& perm);

}  // namespace npusim::compiler::ops
