; GM -> UB copies and nothing else: the MTE2 pattern of Huawei's Ascend C DataCopy sample's
; GM -> UB scenarios (cannmirror/asc-devkit examples/01_simd_cpp_api/05_best_practices/
; 04_memory_access/data_copy, kernel_data_copy_pad_gm2ub), on the vector cores, to compare
; npusim's MTE2 with the sample's msprof figures (validation/cases.yaml `datacopy_gm2ub_*`).
; The GM -> L1 twin is nd2nz_load.s, with the same arguments.
; Arguments: x (an M x N fp16 matrix in GM, N a multiple of 16: copy_gm2ub moves whole 32-byte
; blocks), TR x TC (the tile of one copy: TR rows of TC columns, TC a multiple of 16, TR * TC * 2
; bytes at most the UB's; the last column tile of a row takes what is left of N), EVERY (0: block
; b of B copies its own M / B rows, TR-row bands in order; 1: every block copies all M rows),
; STAGGER (with EVERY = 1: block b starts at band b and wraps, so the blocks read different bands
; at a time), SLICES (the columns in that many equal slices, copied one after another) and REPEAT
; (each slice copied that many times over the block's rows before the next slice).
; Every copy lands at the start of the UB; nothing reads it (run with --timing-only).
.kernel gm2ub_load
.arg x, f16[M, N]
.arg M
.arg N
.arg TR
.arg TC
.arg EVERY
.arg STAGGER
.arg SLICES
.arg REPEAT

.section aiv
    ldarg x1, x
    ldarg x2, M
    ldarg x3, N
    ldarg x4, TR
    ldarg x5, TC
    ldarg x6, EVERY
    ldarg x7, STAGGER
    get_block_id x8
    get_block_num x9
    div x10, x2, x4             ; x10: TR-row bands in the matrix
    movi x11, 0                 ; x11: this block's first band
    mov x12, x10                ; x12: bands this block copies
    bne x6, 0, bands_set
    div x12, x10, x9
    mul x11, x8, x12
bands_set:
    ldarg x18, SLICES
    add x18, x3, x18            ; x18: columns per slice, rounded up
    sub x18, x18, 1
    ldarg x19, SLICES
    div x18, x18, x19
    ldarg x19, REPEAT
    movi x20, 0                 ; x20: UB address of every copy
    movi x21, 0                 ; x21: the slice's first column
slice_loop:
    bge x21, x3, done
    add x22, x21, x18           ; x22: the slice's end column
    min x22, x22, x3
    movi x23, 0                 ; x23: repeats done
repeat_loop:
    bge x23, x19, repeat_done
    movi x13, 0                 ; x13: bands done
band_loop:
    bge x13, x12, band_done
    add x14, x13, x11           ; x14: the band
    beq x7, 0, band_set
    add x14, x13, x8
    rem x14, x14, x10
band_set:
    mul x15, x14, x4            ; GM address of the band's first row
    mul x15, x15, x3
    shl x15, x15, 1
    add x15, x15, x1
    mov x16, x21                ; x16: the tile's first column
col_loop:
    bge x16, x22, col_done
    sub x24, x22, x16           ; x24: the tile's columns
    min x24, x24, x5
    shl x17, x16, 1
    add x17, x17, x15
    shr x25, x24, 4             ; x25: 32-byte blocks of a tile row
    sub x26, x3, x24            ; x26: blocks from one tile row's end to the next one's start
    shr x26, x26, 4
    copy_gm2ub x20, x17, x4, x25, x26, 0
    add x16, x16, x24
    jmp col_loop
col_done:
    add x13, x13, 1
    jmp band_loop
band_done:
    add x23, x23, 1
    jmp repeat_loop
repeat_done:
    mov x21, x22
    jmp slice_loop
done:
    end
