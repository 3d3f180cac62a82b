; The schedule of CANN's SoftmaxV2 (the TBE norm schedule's reduce-transpose branch, sch_type 4
; of its norm tiling) for f32 [162877, 67] over the last axis (CANN-Bench's softmax case 14) on
; the 910B's 48 vector cores, timing only, to put what that branch is published to issue on
; npusim's rates (docs/validation.md, "CANN's Softmax kernel against npusim's"). Each core takes
; 3394 rows (the last 3359) in tiles of 112 rows (the tiling's UB budget is not public; 100-150
; rows); the last tile steps back to end on the core's last row. Per tile, one buffer, no double
; buffering (the dynamic tiling never sets it): one contiguous load of 112 rows (938 blocks);
; the tile transposed (59 16x16 vtranspose of 512 B), the max across the 67 transposed rows (66
; vmax / vadd of 2 repeats), the max broadcast back onto the rows by transposes (59), the subtract and
; the exp over the tile (118 repeats each), the same transpose / 66 vadd / broadcast for the sum,
; the divide (118 repeats), one contiguous store. How CANN's compiler lowers its transposed
; reductions and broadcasts is not public: the transposes here are the count of 16-bit
; transposes that move the tile's bytes once, nothing more. Arguments: x, y (f32 rows of 67;
; nothing is checked).
.kernel cann_softmax_rt
.arg x, f32[162877, 67]
.arg y, f32[162877, 67]
.equ X_BUF, 0                            ; the tile as loaded, then its exponentials
.equ T_BUF, 32768                        ; the transposed tile
.equ B_BUF, 65536                        ; the broadcast per-row value, then the output
.equ R_BUF, 98304                        ; the reduced row (2 repeats)
.equ TILE_BYTES, 30016                   ; 112 rows of 67 f32
.section aiv
    ldarg x1, x
    ldarg x2, y
    get_block_id x3
    mul x4, x3, 3394                     ; the core's first row
    movi x5, 162877
    sub x5, x5, x4
    min x5, x5, 3394                     ; the core's rows
    add x6, x4, x5
    sub x6, x6, 112                      ; the last tile's first row
    movi x20, X_BUF
    movi x21, T_BUF
    movi x22, B_BUF
    movi x23, R_BUF
    set_flag v, mte2, 0                  ; the tile buffer starts free
    set_flag mte3, v, 0                  ; the output buffer starts free
    movi x7, 0                           ; tile
tile:
    mul x8, x7, 112
    add x8, x8, x4
    min x8, x8, x6                       ; the tile's first row
    mul x9, x8, 268                      ; its byte offset
    add x10, x9, x1
    wait_flag v, mte2, 0
    copy_gm2ub x20, x10, 1, 938, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    wait_flag mte3, v, 0                 ; the previous tile's store has left the output buffer
    movi x11, 0                          ; two reductions: max, then the sum of exponentials
reduction:
    movi x12, 0
    movi x13, X_BUF
    movi x14, T_BUF
transpose_in:
    vtranspose x14, x13
    add x13, x13, 512
    add x14, x14, 512
    add x12, x12, 1
    blt x12, 59, transpose_in
    movi x12, 1
    movi x14, T_BUF
    bne x11, 0, sum_rows
max_rows:
    add x14, x14, 448                    ; the next transposed row: 112 f32
    vmax.f32 x23, x23, x14, 2, 1, 1, 1, 8, 8, 8
    add x12, x12, 1
    blt x12, 67, max_rows
    jmp broadcast_back
sum_rows:
    add x14, x14, 448
    vadd.f32 x23, x23, x14, 2, 1, 1, 1, 8, 8, 8
    add x12, x12, 1
    blt x12, 67, sum_rows
broadcast_back:
    movi x12, 0
    movi x13, T_BUF
    movi x14, B_BUF
broadcast:
    vtranspose x14, x13
    add x13, x13, 512
    add x14, x14, 512
    add x12, x12, 1
    blt x12, 59, broadcast
    bne x11, 0, divide
    vsub.f32 x22, x20, x22, 118, 1, 1, 1, 8, 8, 8
    vexp.f32 x20, x22, 118, 1, 1, 8, 8
    movi x11, 1
    jmp reduction
divide:
    vdiv.f32 x22, x20, x22, 118, 1, 1, 1, 8, 8, 8
    set_flag v, mte2, 0
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    add x15, x9, x2
    copy_ub2gm x15, x22, 1, 938, 0, 0
    set_flag mte3, v, 0
    add x7, x7, 1
    blt x7, 31, tile
    wait_flag mte3, v, 0
    wait_flag v, mte2, 0
    end
