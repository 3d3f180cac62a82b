// MatMul's tiling, exposed so tests and tools can see how a config shapes the kernel.
#pragma once

#include <cstdint>
#include <string>

#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler::ops {

// C (m x n) = A (m x k) * B (k x n) on the cube, A stored k x m if trans_a, B stored n x k if
// trans_b. All sizes in elements.
struct MatmulTiling {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  isa::Dtype in_type = isa::Dtype::F16;   // cube input type (f16, bf16 or f32)
  isa::Dtype out_type = isa::Dtype::F16;  // FIXPIPE output type
  int64_t tm = 0, tn = 0;   // output tile (multiples of 16); one tile = one L0C buffer
  int64_t tk_l0 = 0;        // k per mmad (multiple of 16); two L0A and two L0B buffers
  int64_t tk_l1 = 0;        // k per L1 chunk (multiple of tk_l0); two L1 buffers of A and B
  int l0c_buffers = 1;      // 2: FIXPIPE of a tile overlaps the next tile's mmads
  int64_t tiles_m = 0, tiles_n = 0;
  int block_dim = 0;        // cube cores used: min(cores, tiles)
  bool via_ub = false;      // no l0c->gm path: C leaves L0C through the UB (coupled chips)
  int64_t c_pitch = 0;      // elements per row of C as the cube kernel writes it (n, or n
                            // padded to 32 bytes via the UB; the caller then unpads)
  // "128x128x1024 AB f16->f16: tiles 64x128 (2x1 = 2 over 2 blocks), k 128 per mmad, ..."
  std::string str() const;
};

// Chooses the tiling for the cube cores of cfg (sizes from their L1/L0A/L0B/L0C capacities,
// core count, cube shape and the gm->l1 rate). op names the op in errors (CompileError when no
// tile fits).
MatmulTiling plan_matmul_tiling(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                isa::Dtype in_type, isa::Dtype out_type, const ChipConfig& cfg,
                                const std::string& op);

}  // namespace npusim::compiler::ops
