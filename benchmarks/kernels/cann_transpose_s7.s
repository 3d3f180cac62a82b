; The schedule of CANN's Transpose kernel (the TIK impl/dynamic/transpose.py, scenario 7 of its
; tiling) for f16 [1023, 1023] perm [1, 0] (CANN-Bench's transpose case 7) on the 910B's 48 vector
; cores, timing only, to put what that kernel issues on npusim's rates (docs/validation.md,
; "CANN's Transpose kernel against npusim's"). The tiling splits the input's rows over the cores
; (21 or 22 each; every core takes 21 here, rows 21 * block id on); per core 2 row tiles of 16
; (the second stepped back over the first, 5 rows on) by 8 column tiles of 128 = 16 tiles. Per
; tile: one load of 16 bursts of 256 B, a 16x16 transpose of its 8 blocks (vnchwconv there,
; vtranspose here), one store of 128 bursts of 32 B. One UB slot each way, synchronised as TIK
; does: the next load after the transposes, the next transposes after the store. The row pitch is
; 2048 B instead of 2046 so that the copies' gaps are whole 32-byte blocks (the bytes moved and
; the bursts are the same). Arguments: x, y (1023 rows of 1024 f16; nothing is checked).
.kernel cann_transpose_s7
.arg x, f16[1023, 1024]
.arg y, f16[1023, 1024]
.equ IN_SLOT, 0
.equ OUT_SLOT, 8192
.section aiv
    ldarg x1, x
    ldarg x2, y
    get_block_id x3
    mul x3, x3, 21                        ; the core's first input row
    movi x20, IN_SLOT
    movi x21, OUT_SLOT
    set_flag v, mte2, 0                   ; the input slot starts free
    set_flag mte3, v, 0                   ; the output slot starts free
    movi x4, 0                            ; row tile
row_tile:
    movi x5, 0                            ; column tile
column_tile:
    mul x6, x4, 5
    add x6, x6, x3                        ; the tile's first input row
    mul x7, x6, 2048
    mul x8, x5, 256
    add x7, x7, x8
    add x7, x7, x1                        ; element (row, 128 * column tile) of x
    wait_flag v, mte2, 0
    copy_gm2ub x20, x7, 16, 8, 56, 0      ; 16 rows of 256 B, 2048 B apart
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    wait_flag mte3, v, 0
    movi x9, 0
    movi x10, OUT_SLOT
block:
    vtranspose x10, x20
    add x9, x9, 1
    add x10, x10, 512
    add x20, x20, 512
    blt x9, 8, block
    movi x20, IN_SLOT
    set_flag v, mte2, 0
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    mul x11, x5, 128
    mul x11, x11, 2048
    mul x12, x6, 2
    add x11, x11, x12
    add x11, x11, x2                      ; element (128 * column tile, row) of y
    copy_ub2gm x11, x21, 128, 1, 0, 63    ; 128 rows of 32 B, 2048 B apart
    set_flag mte3, v, 0
    add x5, x5, 1
    blt x5, 8, column_tile
    add x4, x4, 1
    blt x4, 2, row_tile
    wait_flag mte3, v, 0
    wait_flag v, mte2, 0
    end
