; The schedule of CANN's Maximum (the TBE DSL op impl/dynamic/maximum.py under the broadcast
; auto-schedule, CANN 8.1) for an input whose last axis is broadcast from 1 in a pattern the
; tiling has no special case for: x [OUTER, ROWS, ROWW] against y [1, ROWS, 1] (CANN-Bench's
; maximum cases 20 and 12), on the 910B's 48 vector cores, timing only, to put that schedule on
; npusim's rates (docs/validation.md, "CANN's broadcasting Maximum against npusim's"). The tiling
; splits the row axis into tiles of R rows (TPO per outer index, the last stepped back to end on
; the last row) and the fused (outer, tile) loop over the cores, TPC tiles each (the global tile
; index clamped to the last). Per tile, no double buffering (the tiling sets it only for its
; COMMON_BROADCAST pattern): one load of R row bursts into rows padded to whole blocks (the 910B's
; padded move), y's value of each row put on its padded row (a scalar read and one vdup per row;
; how CANN's compiler emits the broadcast, vnchwconv or duplicates, is not public), one vmax over
; the tile, one store of R row bursts. The row pitch in GM is W whole blocks (416 B for rows of
; 101 f32, 160 B for 37) so that the bursts are whole blocks; the bytes moved are within 3 % (c20)
; and 8 % (c12) of the real rows'. Scalar arguments: ROWS (rows per outer index), R (rows per
; tile), W (blocks per padded row), TPO, TPC, NT (tiles in all), DUP (vdup repeats per row), REP
; (vmax repeats per tile), OUTER, ROWW (W * 8). Nothing is checked.
.kernel cann_maximum_brc_last
.arg x, f32[OUTER, ROWS, ROWW]
.arg y, f32[ROWS, 2]
.arg z, f32[OUTER, ROWS, ROWW]
.arg ROWS
.arg R
.arg W
.arg TPO
.arg TPC
.arg NT
.arg DUP
.arg REP
.arg OUTER
.arg ROWW
.equ X_BUF, 0                            ; the tile of x as loaded
.equ B_BUF, 57344                        ; y broadcast onto the tile's rows
.equ O_BUF, 114688                       ; the maxima
.section aiv
    ldarg x1, x
    ldarg x2, y
    ldarg x3, z
    ldarg x10, ROWS
    ldarg x11, R
    ldarg x12, W
    ldarg x13, TPO
    ldarg x14, TPC
    ldarg x15, NT
    ldarg x16, DUP
    ldarg x17, REP
    get_block_id x4
    mul x4, x4, x14                      ; the core's first tile
    sub x15, x15, 1                      ; the last tile
    mul x18, x12, 32                     ; bytes per padded row
    sub x19, x10, x11                    ; the last tile's first row
    movi x20, X_BUF
    movi x21, B_BUF
    movi x22, O_BUF
    set_flag v, mte2, 0                  ; the x tile starts free
    set_flag mte3, v, 0                  ; the output tile starts free
    movi x5, 0                           ; tile of this core
tile:
    add x6, x4, x5
    min x6, x6, x15                      ; the global tile
    div x7, x6, x13                      ; its outer index
    rem x8, x6, x13
    mul x8, x8, x11
    min x8, x8, x19                      ; its first row
    mul x9, x7, x10
    add x9, x9, x8
    mul x9, x9, x18                      ; its byte offset in x and z
    add x23, x9, x1
    wait_flag v, mte2, 0
    copy_gm2ub x20, x23, x11, x12, 0, 0  ; R rows of W blocks
    set_flag mte2, v, 0
    mul x24, x8, 8
    add x24, x24, x2                     ; y's value of the first row (8 bytes a row here)
    movi x25, B_BUF
    movi x26, 0
    wait_flag mte3, v, 0
row:
    ld x27, x24
    vdup.f32 x25, x27, x16, 1, 8
    add x24, x24, 8
    add x25, x25, x18
    add x26, x26, 1
    blt x26, x11, row
    wait_flag mte2, v, 0
    vmax.f32 x22, x20, x21, x17, 1, 1, 1, 8, 8, 8
    set_flag v, mte2, 0
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    add x28, x9, x3
    copy_ub2gm x28, x22, x11, x12, 0, 0  ; R rows of W blocks
    set_flag mte3, v, 0
    add x5, x5, 1
    blt x5, x14, tile
    wait_flag mte3, v, 0
    wait_flag v, mte2, 0
    end
