// A chip description built in code for unit tests of the SystemC-free layers (isa, exec,
// verifier), so they do not depend on the YAML loader. Numbers follow the 910B AIC/AIV
// (../shared/reference/ascend-architecture.md, S1/S2) on one coupled core kind that has every
// pipe and buffer, so any instruction can be tested on it.
#pragma once

#include "sim/config/chip_config.h"

namespace npusim::test {

inline ChipConfig coupled_test_chip() {
  using isa::Buf;
  using isa::Pipe;
  ChipConfig c;
  c.name = "unit-test";
  c.source_file = "tests/common/test_chip.h";
  c.clock_mhz = 1850;
  c.split = false;
  c.aiv_per_aic = 0;  // coupled: no mix groups
  CoreKindConfig k;
  k.kind = isa::CoreKind::AICORE;
  k.count = 2;
  k.pipes = {Pipe::S, Pipe::MTE1, Pipe::MTE2, Pipe::MTE3, Pipe::M, Pipe::V, Pipe::FIX};
  k.buffer_bytes = {{Buf::L1, 512 * 1024}, {Buf::L0A, 64 * 1024}, {Buf::L0B, 64 * 1024},
                    {Buf::L0C, 128 * 1024}, {Buf::UB, 192 * 1024}, {Buf::BT, 1024},
                    {Buf::FB, 7 * 1024}};
  c.core_kinds = {k};
  c.align_bytes = {{Buf::GM, 1}, {Buf::L1, 32}, {Buf::L0A, 512}, {Buf::L0B, 512},
                   {Buf::L0C, 64}, {Buf::UB, 32}, {Buf::BT, 64}, {Buf::FB, 64}};
  c.ub_banks = 48;
  c.ub_bank_groups = 16;
  c.ub_bank_width_bytes = 32;
  c.cube_fp32_rate_divisor = 4;
  c.cube_latency_cycles = 8;
  c.vector_latency_cycles = 8;
  auto path = [&](Buf s, Buf d, double rate, int lat) {
    c.path_bytes_per_cycle[{s, d}] = rate;
    c.path_latency_cycles[{s, d}] = lat;
  };
  path(Buf::GM, Buf::L1, 32, 20);
  path(Buf::GM, Buf::UB, 32, 20);
  path(Buf::L1, Buf::L0A, 512, 4);
  path(Buf::L1, Buf::L0B, 256, 4);
  path(Buf::L1, Buf::UB, 128, 4);
  path(Buf::L1, Buf::BT, 64, 4);
  path(Buf::L0C, Buf::GM, 32, 20);
  path(Buf::L0C, Buf::L1, 256, 4);
  path(Buf::L0C, Buf::UB, 256, 4);
  path(Buf::UB, Buf::GM, 64, 20);
  path(Buf::UB, Buf::L1, 128, 4);
  c.hbm_bytes = 1ull << 30;
  c.hbm_gbps = 1800;
  c.l2_bytes = 8ull << 20;
  c.l2_gbps = 5000;
  c.l2_read_bytes_per_cycle = 110;
  c.l2_write_bytes_per_cycle = 86;
  c.hdc_gbps = 64;
  c.hdc_latency_us = 2;
  return c;
}

}  // namespace npusim::test
