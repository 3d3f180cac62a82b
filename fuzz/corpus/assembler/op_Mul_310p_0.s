.kernel Mul_f32
.arg in0, f32[3, 1]
.arg in1, f32[1, 5]
.arg out, f32[3, 5]
.section aicore
    ldarg x1, 0                                  ; argument in0
    ldarg x2, 1                                  ; argument in1
    ldarg x3, 2                                  ; argument out
    get_block_id x4                              ; block range: 40 elements per block
    mul x4, x4, 40                               ; block range: 40 elements per block
    add x5, x4, 40                               ; block range: 40 elements per block
    min x5, x5, 15                               ; block range: 40 elements per block
    set_flag mte3, v, 0                          ; all buffers start free
    set_flag mte3, v, 1                          ; all buffers start free
    set_flag v, mte2, 0                          ; all buffers start free
    movi x7, 0                                   ; resident: position 0
    movi x8, 40                                  ; resident: elements
    add x9, x7, x8                               ; gather: pieces from the end of the tile
gather_in1_0:
    sub x10, x9, 1                               ; gather in1: dims [3,5] strides [0,1]
    div x10, x10, 5                              ; row = (piece end - 1) / inner dim
    mov x12, x2                                  ; gather in1: dims [3,5] strides [0,1]
    mul x10, x10, 5                              ; row start
    max x11, x10, x7                             ; piece start = max(row start, tile start)
    sub x13, x11, x10                            ; gather in1: dims [3,5] strides [0,1]
    mul x13, x13, 4                              ; gather in1: dims [3,5] strides [0,1]
    add x12, x12, x13                            ; source of the piece start
    sub x13, x11, x7                             ; piece start in the tile
    shr x14, x13, 3                              ; gather in1: dims [3,5] strides [0,1]
    shl x14, x14, 3                              ; rounded down to a 32-byte block
    sub x13, x13, x14                            ; gather in1: dims [3,5] strides [0,1]
    mul x13, x13, 4                              ; gather in1: dims [3,5] strides [0,1]
    sub x12, x12, x13                            ; load from the block start: the piece lands at its phase
    sub x9, x9, x7                               ; gather in1: dims [3,5] strides [0,1]
    sub x9, x9, x14                              ; elements from the block start to the piece end
    mul x14, x14, 4                              ; gather in1: dims [3,5] strides [0,1]
    add x14, x14, 320                            ; destination in the tile
    mul x13, x9, 4                               ; gather in1: dims [3,5] strides [0,1]
    add x13, x13, 31                             ; gather in1: dims [3,5] strides [0,1]
    shr x13, x13, 5                              ; blocks to load
    wait_flag v, mte2, 0                         ; gather scratch free
    movi x15, 800                                ; load the piece
    copy_gm2ub x15, x12, 1, x13, 0, 0            ; load the piece
    set_flag mte2, v, 0                          ; gather in1: dims [3,5] strides [0,1]
    wait_flag mte2, v, 0                         ; gather in1: dims [3,5] strides [0,1]
    set_mask_count x9                            ; gather in1: dims [3,5] strides [0,1]
    movi x15, 800                                ; gather in1: dims [3,5] strides [0,1]
    vcopy.s32 x14, x15, 0, 1, 1, 8, 8            ; gather in1: dims [3,5] strides [0,1]
    set_flag v, mte2, 0                          ; gather in1: dims [3,5] strides [0,1]
    mov x9, x11                                  ; gather in1: dims [3,5] strides [0,1]
    blt x7, x9, gather_in1_0                     ; gather in1: dims [3,5] strides [0,1]
tile_loop_0:
    bge x4, x5, drain_0                          ; tile (ping)
    sub x6, x5, x4                               ; tile (ping)
    min x6, x6, 40                               ; elements in this tile
    add x7, x4, x6                               ; gather: pieces from the end of the tile
gather_in0_0:
    sub x8, x7, 1                                ; gather in0: dims [3,5] strides [1,0]
    div x8, x8, 5                                ; row = (piece end - 1) / inner dim
    mov x10, x1                                  ; gather in0: dims [3,5] strides [1,0]
    mov x12, x8                                  ; gather in0: dims [3,5] strides [1,0]
    rem x11, x12, 3                              ; index in dim 0
    mul x11, x11, 4                              ; gather in0: dims [3,5] strides [1,0]
    add x10, x10, x11                            ; gather in0: dims [3,5] strides [1,0]
    mul x8, x8, 5                                ; row start
    max x9, x8, x4                               ; piece start = max(row start, tile start)
    sub x11, x9, x4                              ; piece start in the tile
    shr x12, x11, 3                              ; gather in0: dims [3,5] strides [1,0]
    shl x12, x12, 3                              ; rounded down to a 32-byte block
    sub x7, x7, x4                               ; gather in0: dims [3,5] strides [1,0]
    sub x7, x7, x12                              ; elements from the block start to the piece end
    mul x12, x12, 4                              ; gather in0: dims [3,5] strides [1,0]
    add x12, x12, 0                              ; destination in the tile
    ld x11, x10                                  ; the broadcast element (low bits)
    set_mask_count x7                            ; gather in0: dims [3,5] strides [1,0]
    vdup.s32 x12, x11, 0, 1, 8                   ; gather in0: dims [3,5] strides [1,0]
    mov x7, x9                                   ; gather in0: dims [3,5] strides [1,0]
    blt x4, x7, gather_in0_0                     ; gather in0: dims [3,5] strides [1,0]
    wait_flag mte3, v, 0                         ; tile (ping)
    set_mask_count x6                            ; compute
    movi x7, 480                                 ; compute
    movi x8, 320                                 ; compute
    vmul.f32 x7, x0, x8, 0, 1, 1, 1, 8, 8, 8     ; compute
    set_flag v, mte3, 0                          ; tile (ping)
    wait_flag v, mte3, 0                         ; tile (ping)
    mul x7, x4, 4                                ; tile (ping)
    add x7, x7, x3                               ; tile (ping)
    mul x8, x6, 4                                ; tile (ping)
    add x8, x8, 31                               ; tile (ping)
    shr x8, x8, 5                                ; tile (ping)
    movi x9, 480                                 ; store the output tile
    copy_ub2gm x7, x9, 1, x8, 0, 0               ; store the output tile
    set_flag mte3, v, 0                          ; tile (ping)
    add x4, x4, x6                               ; tile (ping)
    bge x4, x5, drain_0                          ; tile (pong)
    sub x6, x5, x4                               ; tile (pong)
    min x6, x6, 40                               ; elements in this tile
    add x7, x4, x6                               ; gather: pieces from the end of the tile
gather_in0_1:
    sub x8, x7, 1                                ; gather in0: dims [3,5] strides [1,0]
    div x8, x8, 5                                ; row = (piece end - 1) / inner dim
    mov x10, x1                                  ; gather in0: dims [3,5] strides [1,0]
    mov x12, x8                                  ; gather in0: dims [3,5] strides [1,0]
    rem x11, x12, 3                              ; index in dim 0
    mul x11, x11, 4                              ; gather in0: dims [3,5] strides [1,0]
    add x10, x10, x11                            ; gather in0: dims [3,5] strides [1,0]
    mul x8, x8, 5                                ; row start
    max x9, x8, x4                               ; piece start = max(row start, tile start)
    sub x11, x9, x4                              ; piece start in the tile
    shr x12, x11, 3                              ; gather in0: dims [3,5] strides [1,0]
    shl x12, x12, 3                              ; rounded down to a 32-byte block
    sub x7, x7, x4                               ; gather in0: dims [3,5] strides [1,0]
    sub x7, x7, x12                              ; elements from the block start to the piece end
    mul x12, x12, 4                              ; gather in0: dims [3,5] strides [1,0]
    add x12, x12, 160                            ; destination in the tile
    ld x11, x10                                  ; the broadcast element (low bits)
    set_mask_count x7                            ; gather in0: dims [3,5] strides [1,0]
    vdup.s32 x12, x11, 0, 1, 8                   ; gather in0: dims [3,5] strides [1,0]
    mov x7, x9                                   ; gather in0: dims [3,5] strides [1,0]
    blt x4, x7, gather_in0_1                     ; gather in0: dims [3,5] strides [1,0]
    wait_flag mte3, v, 1                         ; tile (pong)
    set_mask_count x6                            ; compute
    movi x7, 640                                 ; compute
    movi x8, 160                                 ; compute
    movi x9, 320                                 ; compute
    vmul.f32 x7, x8, x9, 0, 1, 1, 1, 8, 8, 8     ; compute
    set_flag v, mte3, 1                          ; tile (pong)
    wait_flag v, mte3, 1                         ; tile (pong)
    mul x7, x4, 4                                ; tile (pong)
    add x7, x7, x3                               ; tile (pong)
    mul x8, x6, 4                                ; tile (pong)
    add x8, x8, 31                               ; tile (pong)
    shr x8, x8, 5                                ; tile (pong)
    movi x9, 640                                 ; store the output tile
    copy_ub2gm x7, x9, 1, x8, 0, 0               ; store the output tile
    set_flag mte3, v, 1                          ; tile (pong)
    add x4, x4, x6                               ; tile (pong)
    jmp tile_loop_0
drain_0:
    wait_flag mte3, v, 0                         ; drain: consume the free flags
    wait_flag mte3, v, 1                         ; drain: consume the free flags
    wait_flag v, mte2, 0                         ; drain: consume the free flags
    end                                          ; end of kernel
