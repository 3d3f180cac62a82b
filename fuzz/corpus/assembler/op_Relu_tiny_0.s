.kernel Relu_f16
.arg in0, f16[1000]
.arg out, f16[1000]
.section aiv
    ldarg x1, 0                                  ; argument in0
    ldarg x2, 1                                  ; argument out
    get_block_id x3                              ; block range: 256 elements per block
    mul x3, x3, 256                              ; block range: 256 elements per block
    add x4, x3, 256                              ; block range: 256 elements per block
    min x4, x4, 1000                             ; block range: 256 elements per block
    set_flag v, mte2, 0                          ; all buffers start free
    set_flag mte3, v, 0                          ; all buffers start free
    set_flag v, mte2, 1                          ; all buffers start free
    set_flag mte3, v, 1                          ; all buffers start free
tile_loop_0:
    bge x3, x4, drain_0                          ; tile (ping)
    sub x5, x4, x3                               ; tile (ping)
    min x5, x5, 256                              ; elements in this tile
    wait_flag v, mte2, 0                         ; tile (ping)
    mul x6, x3, 2                                ; tile (ping)
    add x6, x6, x1                               ; tile (ping)
    mul x7, x5, 2                                ; tile (ping)
    add x7, x7, 31                               ; tile (ping)
    shr x7, x7, 5                                ; tile (ping)
    copy_gm2ub x0, x6, 1, x7, 0, 0               ; load in0 tile
    set_flag mte2, v, 0                          ; tile (ping)
    wait_flag mte2, v, 0                         ; tile (ping)
    wait_flag mte3, v, 0                         ; tile (ping)
    set_mask_count x5                            ; compute
    movi x6, 1024                                ; compute
    vrelu.f16 x6, x0, 0, 1, 1, 8, 8              ; compute
    set_flag v, mte2, 0                          ; tile (ping)
    set_flag v, mte3, 0                          ; tile (ping)
    wait_flag v, mte3, 0                         ; tile (ping)
    mul x6, x3, 2                                ; tile (ping)
    add x6, x6, x2                               ; tile (ping)
    mul x7, x5, 2                                ; tile (ping)
    add x7, x7, 31                               ; tile (ping)
    shr x7, x7, 5                                ; tile (ping)
    movi x8, 1024                                ; store the output tile
    copy_ub2gm x6, x8, 1, x7, 0, 0               ; store the output tile
    set_flag mte3, v, 0                          ; tile (ping)
    add x3, x3, x5                               ; tile (ping)
    bge x3, x4, drain_0                          ; tile (pong)
    sub x5, x4, x3                               ; tile (pong)
    min x5, x5, 256                              ; elements in this tile
    wait_flag v, mte2, 1                         ; tile (pong)
    mul x6, x3, 2                                ; tile (pong)
    add x6, x6, x1                               ; tile (pong)
    mul x7, x5, 2                                ; tile (pong)
    add x7, x7, 31                               ; tile (pong)
    shr x7, x7, 5                                ; tile (pong)
    movi x8, 512                                 ; load in0 tile
    copy_gm2ub x8, x6, 1, x7, 0, 0               ; load in0 tile
    set_flag mte2, v, 1                          ; tile (pong)
    wait_flag mte2, v, 1                         ; tile (pong)
    wait_flag mte3, v, 1                         ; tile (pong)
    set_mask_count x5                            ; compute
    movi x6, 1536                                ; compute
    movi x7, 512                                 ; compute
    vrelu.f16 x6, x7, 0, 1, 1, 8, 8              ; compute
    set_flag v, mte2, 1                          ; tile (pong)
    set_flag v, mte3, 1                          ; tile (pong)
    wait_flag v, mte3, 1                         ; tile (pong)
    mul x6, x3, 2                                ; tile (pong)
    add x6, x6, x2                               ; tile (pong)
    mul x7, x5, 2                                ; tile (pong)
    add x7, x7, 31                               ; tile (pong)
    shr x7, x7, 5                                ; tile (pong)
    movi x8, 1536                                ; store the output tile
    copy_ub2gm x6, x8, 1, x7, 0, 0               ; store the output tile
    set_flag mte3, v, 1                          ; tile (pong)
    add x3, x3, x5                               ; tile (pong)
    jmp tile_loop_0
drain_0:
    wait_flag v, mte2, 0                         ; drain: consume the free flags
    wait_flag mte3, v, 0                         ; drain: consume the free flags
    wait_flag v, mte2, 1                         ; drain: consume the free flags
    wait_flag mte3, v, 1                         ; drain: consume the free flags
    end                                          ; end of kernel
