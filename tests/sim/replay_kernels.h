// Kernels shared by the replay tests (test_sim_translated_replay.cpp,
// test_sim_l2_graph_run_translated.cpp): mix kernels with cross-core flags and a gather steered by
// its loaded values.
#pragma once

namespace npusim::test {

// A mix kernel whose cores meet at cross-core flags (the pattern of a fused convolution with
// its batch-norm reduction): per block, the cube core loads its 2 KiB slice of x into L1, spins
// for a time that grows with its block id, then lets its two vector cores go (cc_set mode 2);
// each scales its half of the slice into y (and both store the slice's first 32 bytes: two
// cores writing the same bytes), signals the cube core from MTE3 (after its stores landed) and
// meets the other at a barrier (mode 1); the cube core waits for both and loads the slice of y
// they stored. Its timing thus depends on the cores' progress, and the cube core reads bytes
// the vector cores write.
inline const char* kHandoff = R"(
.arg x, f16[2048]
.arg s, f32[1]
.arg y, f16[2048]
.section aic
    ldarg x1, x
    ldarg x3, y
    get_block_id x2
    mul x4, x2, 2048
    add x1, x1, x4
    add x3, x3, x4
    movi x6, 0
    copy_gm2l1 x6, x1, 1, 64, 0, 0
    mul x8, x2, 40
    add x8, x8, 20
    movi x7, 0
spin:
    add x7, x7, 1
    blt x7, x8, spin
    cc_set s, 2, 0
    cc_wait s, 1
    cc_wait s, 1
    copy_gm2l1 x6, x3, 1, 64, 0, 0
    end
.section aiv
    ldarg x1, x
    ldarg x3, y
    get_block_id x2
    get_subblock_id x5
    mul x4, x2, 2048
    add x11, x3, x4
    mul x9, x5, 1024
    add x4, x4, x9
    add x1, x1, x4
    add x3, x3, x4
    movi x6, 0
    movi x7, 1024
    movi x9, 2
    cc_wait s, 0
    copy_gm2ub x6, x1, 1, 32, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vmuls.f16 x7, x6, x9, 4, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x3, x7, 1, 32, 0, 0
    copy_ub2gm x11, x7, 1, 1, 0, 0
    cc_set mte3, 2, 1
    cc_set mte3, 1, 2
    cc_wait s, 2
    end
)";

// A gather steered by loaded values (the pattern of GatherV2 and UnsortedSegmentSum): the scalar
// unit loads a row count n and a first row r from idx (each taken mod 8; n + 1 rows) and copies
// rows r to r + n of x (512 bytes each) into the UB, then stores the last into y. Its loop count
// and GM addresses follow the loaded values, so its timing follows the data
// (AddressFlow::steered).
inline const char* kPick = R"(
.arg x, f16[4096]
.arg idx, s64[2]
.arg y, f16[256]
.section aiv
    ldarg x1, x
    ldarg x2, idx
    ldarg x3, y
    ld x5, x2
    and x5, x5, 7
    add x5, x5, 1
    add x2, x2, 8
    ld x8, x2
    and x8, x8, 7
    shl x8, x8, 9
    add x1, x1, x8
    movi x6, 0
rows:
    copy_gm2ub x6, x1, 1, 16, 0, 0
    add x1, x1, 512
    sub x5, x5, 1
    bne x5, 0, rows
    set_flag mte2, mte3, 0
    wait_flag mte2, mte3, 0
    copy_ub2gm x3, x6, 1, 16, 0, 0
    end
)";

}  // namespace npusim::test
