.kernel AddV2_f16
.arg in0, f16[64]
.arg in1, f16[64]
.arg out, f16[64]
.section aiv
    ldarg x1, 0                                  ; argument in0
    ldarg x2, 1                                  ; argument in1
    ldarg x3, 2                                  ; argument out
    get_block_id x4                              ; block range: 16 elements per block
    mul x4, x4, 16                               ; block range: 16 elements per block
    add x5, x4, 16                               ; block range: 16 elements per block
    min x5, x5, 64                               ; block range: 16 elements per block
    set_flag v, mte2, 0                          ; all buffers start free
    set_flag mte3, v, 0                          ; all buffers start free
    set_flag v, mte2, 1                          ; all buffers start free
    set_flag mte3, v, 1                          ; all buffers start free
tile_loop_0:
    bge x4, x5, drain_0                          ; tile (ping)
    sub x6, x5, x4                               ; tile (ping)
    min x6, x6, 16                               ; elements in this tile
    wait_flag v, mte2, 0                         ; tile (ping)
    mul x7, x4, 2                                ; tile (ping)
    add x7, x7, x1                               ; tile (ping)
    mul x8, x6, 2                                ; tile (ping)
    add x8, x8, 31                               ; tile (ping)
    shr x8, x8, 5                                ; tile (ping)
    copy_gm2ub x0, x7, 1, x8, 0, 0               ; load in0 tile
    mul x7, x4, 2                                ; tile (ping)
    add x7, x7, x2                               ; tile (ping)
    mul x8, x6, 2                                ; tile (ping)
    add x8, x8, 31                               ; tile (ping)
    shr x8, x8, 5                                ; tile (ping)
    movi x9, 64                                  ; load in1 tile
    copy_gm2ub x9, x7, 1, x8, 0, 0               ; load in1 tile
    set_flag mte2, v, 0                          ; tile (ping)
    wait_flag mte2, v, 0                         ; tile (ping)
    wait_flag mte3, v, 0                         ; tile (ping)
    set_mask_count x6                            ; compute
    movi x7, 128                                 ; compute
    movi x8, 64                                  ; compute
    vadd.f16 x7, x0, x8, 0, 1, 1, 1, 8, 8, 8     ; compute
    set_flag v, mte2, 0                          ; tile (ping)
    set_flag v, mte3, 0                          ; tile (ping)
    wait_flag v, mte3, 0                         ; tile (ping)
    mul x7, x4, 2                                ; tile (ping)
    add x7, x7, x3                               ; tile (ping)
    mul x8, x6, 2                                ; tile (ping)
    add x8, x8, 31                               ; tile (ping)
    shr x8, x8, 5                                ; tile (ping)
    movi x9, 128                                 ; store the output tile
    copy_ub2gm x7, x9, 1, x8, 0, 0               ; store the output tile
    set_flag mte3, v, 0                          ; tile (ping)
    add x4, x4, x6                               ; tile (ping)
    bge x4, x5, drain_0                          ; tile (pong)
    sub x6, x5, x4                               ; tile (pong)
    min x6, x6, 16                               ; elements in this tile
    wait_flag v, mte2, 1                         ; tile (pong)
    mul x7, x4, 2                                ; tile (pong)
    add x7, x7, x1                               ; tile (pong)
    mul x8, x6, 2                                ; tile (pong)
    add x8, x8, 31                               ; tile (pong)
    shr x8, x8, 5                                ; tile (pong)
    movi x9, 32                                  ; load in0 tile
    copy_gm2ub x9, x7, 1, x8, 0, 0               ; load in0 tile
    mul x7, x4, 2                                ; tile (pong)
    add x7, x7, x2                               ; tile (pong)
    mul x8, x6, 2                                ; tile (pong)
    add x8, x8, 31                               ; tile (pong)
    shr x8, x8, 5                                ; tile (pong)
    movi x9, 96                                  ; load in1 tile
    copy_gm2ub x9, x7, 1, x8, 0, 0               ; load in1 tile
    set_flag mte2, v, 1                          ; tile (pong)
    wait_flag mte2, v, 1                         ; tile (pong)
    wait_flag mte3, v, 1                         ; tile (pong)
    set_mask_count x6                            ; compute
    movi x7, 160                                 ; compute
    movi x8, 32                                  ; compute
    movi x9, 96                                  ; compute
    vadd.f16 x7, x8, x9, 0, 1, 1, 1, 8, 8, 8     ; compute
    set_flag v, mte2, 1                          ; tile (pong)
    set_flag v, mte3, 1                          ; tile (pong)
    wait_flag v, mte3, 1                         ; tile (pong)
    mul x7, x4, 2                                ; tile (pong)
    add x7, x7, x3                               ; tile (pong)
    mul x8, x6, 2                                ; tile (pong)
    add x8, x8, 31                               ; tile (pong)
    shr x8, x8, 5                                ; tile (pong)
    movi x9, 160                                 ; store the output tile
    copy_ub2gm x7, x9, 1, x8, 0, 0               ; store the output tile
    set_flag mte3, v, 1                          ; tile (pong)
    add x4, x4, x6                               ; tile (pong)
    jmp tile_loop_0
drain_0:
    wait_flag v, mte2, 0                         ; drain: consume the free flags
    wait_flag mte3, v, 0                         ; drain: consume the free flags
    wait_flag v, mte2, 1                         ; drain: consume the free flags
    wait_flag mte3, v, 1                         ; drain: consume the free flags
    end                                          ; end of kernel
