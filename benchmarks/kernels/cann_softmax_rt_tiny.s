; CANN's SoftmaxV2 reduce-transpose branch (docs/validation.md, "CANN's Softmax kernel against
; npusim's"; cann_softmax_rt.s has the f32 rows of 67) for f16 [1000003, 2] over the last axis
; (CANN-Bench's softmax case 13), timing only. Each core takes 20834 rows (the last 20805) in
; tiles of 512 rows (2 KiB; the tiling's UB budget is not public), the last tile stepped back,
; one buffer. Per tile: one load of 64 blocks; the f16 tile transposed (4 vtranspose), the max of
; the two transposed rows (one vmax.f16 of 4 repeats), broadcast back (4); the subtract in f16
; (8 repeats), widened to f32 (16), exp (16); the f32 tile transposed (8), the sum (one vadd of 8
; repeats), broadcast back (8); the divide (16), narrowed to f16 (16); one store of 64 blocks.
; Arguments: x, y (f16 rows of 2; nothing is checked).
.kernel cann_softmax_rt_tiny
.arg x, f16[1000003, 2]
.arg y, f16[1000003, 2]
.equ X_BUF, 0                            ; the f16 tile, then the f16 output
.equ T_BUF, 8192                         ; the transposed tile
.equ B_BUF, 16384                        ; the broadcast per-row value
.equ W_BUF, 24576                        ; the f32 differences, then their exponentials
.equ Q_BUF, 32768                        ; the f32 quotients
.equ R_BUF, 40960                        ; the reduced row
.section aiv
    ldarg x1, x
    ldarg x2, y
    get_block_id x3
    mul x4, x3, 20834
    movi x5, 1000003
    sub x5, x5, x4
    min x5, x5, 20834
    add x6, x4, x5
    sub x6, x6, 512
    movi x20, X_BUF
    movi x21, T_BUF
    movi x22, B_BUF
    movi x23, R_BUF
    movi x24, W_BUF
    movi x25, Q_BUF
    movi x26, T_BUF + 1024               ; the second transposed row, f16
    movi x27, T_BUF + 2048               ; the second transposed row, f32
    set_flag v, mte2, 0
    set_flag mte3, v, 0
    movi x7, 0
tile:
    mul x8, x7, 512
    add x8, x8, x4
    min x8, x8, x6
    mul x9, x8, 4                        ; byte offset of the tile's first row
    add x10, x9, x1
    wait_flag v, mte2, 0
    copy_gm2ub x20, x10, 1, 64, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    wait_flag mte3, v, 0
    movi x28, X_BUF                      ; the transposes' source: the f16 tile, then W
    movi x29, 4                          ; their count: 4 for the f16 tile, 8 for the f32 one
    movi x11, 0                          ; 0: the max's pass, 1: the sum's
transposes:
    movi x12, 0
transpose_pair:
    vtranspose x21, x28                  ; in (the reduction's operand), then back (its broadcast)
    vtranspose x22, x21
    add x12, x12, 1
    blt x12, x29, transpose_pair
    bne x11, 0, sum_pass
    vmax.f16 x23, x21, x26, 4, 1, 1, 1, 8, 8, 8
    vsub.f16 x22, x20, x22, 8, 1, 1, 1, 8, 8, 8
    vconv.f32.f16 x24, x22, 16, 1, 1, 8, 4, 0
    vexp.f32 x24, x24, 16, 1, 1, 8, 8
    movi x28, W_BUF
    movi x29, 8
    movi x11, 1
    jmp transposes
sum_pass:
    vadd.f32 x23, x21, x27, 8, 1, 1, 1, 8, 8, 8
    vdiv.f32 x25, x24, x22, 16, 1, 1, 1, 8, 8, 8
    vconv.f16.f32 x20, x25, 16, 1, 1, 4, 8, 0
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    add x15, x9, x2
    copy_ub2gm x15, x20, 1, 64, 0, 0
    set_flag mte3, v, 0
    set_flag mte3, mte2, 0               ; the next load overwrites the stored tile
    wait_flag mte3, mte2, 0
    set_flag v, mte2, 0
    add x7, x7, 1
    blt x7, 41, tile
    wait_flag mte3, v, 0
    wait_flag v, mte2, 0
    end
