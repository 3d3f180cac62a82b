// The cube skeleton's tile-choice helpers (ops/cube_pipeline.h) against real
// KernelBuilder::alloc calls on every chip config: cube_k_step is the largest k step whose two
// L0A and two L0B buffers allocate, l0c_buffer_count the most L0C tiles (of two) that allocate;
// contiguous_split covers every tile exactly once with as few tiles per block as the cores allow.
#include <catch2/catch.hpp>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "sim/config/chip_config.h"

using namespace npusim;
using namespace npusim::compiler;

namespace {

// Whether `copies` buffers of `bytes` each allocate in `buf` on a fresh cube core.
bool allocates(const ChipConfig& cfg, isa::Buf buf, uint64_t bytes, int copies) {
  KernelBuilder b("k", "CubeTest", cfg);
  b.begin_section(b.cube_core_kind());
  try {
    for (int q = 0; q < copies; ++q) b.alloc(buf, bytes, "tile");
    return true;
  } catch (const CompileError&) {
    return false;
  }
}

}  // namespace

TEST_CASE("cube_k_step is the largest k step whose L0A and L0B buffers allocate") {
  for (const char* chip : {"tiny", "910b", "910", "310p"}) {
    const ChipConfig cfg = load_chip_config(chip);
    const CoreKindConfig& core = ops::cube_core(cfg, "CubeTest");
    for (int64_t isz : {2, 4})
      for (int64_t tm : {16, 48, 128, 256})
        for (int64_t tn : {16, 64, 256})
          for (int64_t max_k : {16, 100, 4095}) {
            int64_t expect = 0;  // the largest multiple of 16 <= max_k that allocates
            for (int64_t k = max_k / 16 * 16; k >= 16 && !expect; k -= 16)
              if (allocates(cfg, isa::Buf::L0A, static_cast<uint64_t>(tm * k * isz), 2) &&
                  allocates(cfg, isa::Buf::L0B, static_cast<uint64_t>(tn * k * isz), 2))
                expect = k;
            INFO(chip << " tm " << tm << " tn " << tn << " isz " << isz << " max " << max_k);
            REQUIRE(ops::cube_k_step(core, cfg, tm, tn, isz, max_k) == expect);
          }
  }
}

TEST_CASE("l0c_buffer_count is the most L0C tiles (up to two) that allocate") {
  for (const char* chip : {"tiny", "910b", "910", "310p"}) {
    const ChipConfig cfg = load_chip_config(chip);
    const CoreKindConfig& core = ops::cube_core(cfg, "CubeTest");
    const uint64_t cap = core.capacity(isa::Buf::L0C);
    for (uint64_t bytes :
         {uint64_t{1024}, cap / 3, cap / 2, cap / 2 + 32, cap - 64, cap, cap + 1}) {
      const int expect = allocates(cfg, isa::Buf::L0C, bytes, 2)   ? 2
                         : allocates(cfg, isa::Buf::L0C, bytes, 1) ? 1
                                                                   : 0;
      INFO(chip << " tile bytes " << bytes);
      REQUIRE(ops::l0c_buffer_count(core, cfg, static_cast<int64_t>(bytes)) == expect);
    }
  }
}

TEST_CASE("contiguous_split covers every tile once with ceil(tiles / cores) per block") {
  for (int64_t cores = 1; cores <= 40; ++cores)
    for (int64_t tiles = 1; tiles <= 300; ++tiles) {
      const ops::CubeSplit s = ops::contiguous_split(tiles, cores);
      INFO(tiles << " tiles over " << cores << " cores");
      REQUIRE(s.block_dim >= 1);
      REQUIRE(s.block_dim <= cores);
      REQUIRE(s.per == (tiles + cores - 1) / cores);
      int64_t covered = 0;
      for (int64_t b = 0; b < s.block_dim; ++b) {
        const int64_t n = std::min(tiles, (b + 1) * s.per) - b * s.per;
        REQUIRE(n >= 1);  // no idle block
        covered += n;
      }
      REQUIRE(covered == tiles);
    }
}
