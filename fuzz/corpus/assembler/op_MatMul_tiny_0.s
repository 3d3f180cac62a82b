.kernel MatMul_f16_f16
.arg a, f16[32, 48]
.arg b, f16[48, 16]
.arg c, f16[32, 16]
.section aic
    get_block_id x2                              ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    get_block_num x3                             ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    movi x1, 2                                   ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    sub x1, x1, x2                               ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    add x1, x1, x3                               ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    sub x1, x1, 1                                ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    div x1, x1, x3                               ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    mul x1, x1, 1                                ; my tiles = ceil((2 tiles - block) / blocks), 1 k chunks each
    set_flag mte1, mte2, 0                       ; all buffers start free
    set_flag m, mte1, 0                          ; all buffers start free
    set_flag fix, m, 0                           ; all buffers start free
    set_flag mte1, mte2, 1                       ; all buffers start free
    set_flag m, mte1, 1                          ; all buffers start free
    set_flag fix, m, 1                           ; all buffers start free
    movi x2, 0                                   ; L0 steps so far (parity of the L0 buffers)
    movi x3, 0                                   ; pipeline iteration t: load step t, compute step t-1
    beq x1, 0, done_0
step_loop_0:
    bge x3, x1, endif_0
    div x4, x3, 1                                ; step -> tile and k chunk
    rem x5, x3, 1                                ; step -> tile and k chunk
    get_block_num x6                             ; step -> tile and k chunk
    mul x6, x6, x4                               ; step -> tile and k chunk
    get_block_id x7                              ; step -> tile and k chunk
    add x6, x6, x7                               ; tile = block + j * blocks
    rem x7, x6, 1                                ; step -> tile and k chunk
    div x6, x6, 1                                ; step -> tile and k chunk
    mul x6, x6, 16                               ; first row
    mul x7, x7, 16                               ; first column
    mul x8, x5, 48                               ; first k
    movi x9, 32                                  ; step -> tile and k chunk
    sub x9, x9, x6                               ; step -> tile and k chunk
    min x9, x9, 16                               ; rows in the tile
    movi x10, 16                                 ; step -> tile and k chunk
    sub x10, x10, x7                             ; step -> tile and k chunk
    min x10, x10, 16                             ; columns in the tile
    movi x11, 48                                 ; step -> tile and k chunk
    sub x11, x11, x8                             ; step -> tile and k chunk
    min x11, x11, 48                             ; k in the chunk
    and x12, x3, 1                               ; load: A and B chunks into L1
    bne x12, 0, odd_0                            ; load: A and B chunks into L1
    wait_flag mte1, mte2, 0                      ; L1 buffer free
    jmp parity_end_0                             ; load: A and B chunks into L1
odd_0:
    wait_flag mte1, mte2, 1                      ; L1 buffer free
parity_end_0:
    mul x13, x12, 3072                           ; load: A and B chunks into L1
    add x13, x13, 0                              ; load: A and B chunks into L1
    mul x14, x6, 48                              ; load: A and B chunks into L1
    add x14, x14, x8                             ; load: A and B chunks into L1
    add x15, x9, 15                              ; load: A and B chunks into L1
    shr x15, x15, 4                              ; load: A and B chunks into L1
    shl x15, x15, 4                              ; load: A and B chunks into L1
    mul x14, x14, 2                              ; load: A and B chunks into L1
    ldarg x16, 0                                 ; argument a
    add x14, x14, x16                            ; load: A and B chunks into L1
    nd2nz.f16 x13, x14, x9, x11, 48, x15         ; A chunk (m x k)
    mul x13, x12, 3072                           ; load: A and B chunks into L1
    add x13, x13, 1536                           ; load: A and B chunks into L1
    mul x14, x8, 16                              ; load: A and B chunks into L1
    add x14, x14, x7                             ; load: A and B chunks into L1
    add x15, x11, 15                             ; load: A and B chunks into L1
    shr x15, x15, 4                              ; load: A and B chunks into L1
    shl x15, x15, 4                              ; load: A and B chunks into L1
    mul x14, x14, 2                              ; load: A and B chunks into L1
    ldarg x16, 1                                 ; argument b
    add x14, x14, x16                            ; load: A and B chunks into L1
    nd2nz.f16 x13, x14, x11, x10, 16, x15        ; B chunk (k x n)
    bne x12, 0, odd_1                            ; load: A and B chunks into L1
    set_flag mte2, mte1, 0                       ; L1 chunk loaded
    jmp endif_0                                  ; load: A and B chunks into L1
odd_1:
    set_flag mte2, mte1, 1                       ; L1 chunk loaded
endif_0:
parity_end_1:
    beq x3, 0, endif_1
    sub x4, x3, 1
    div x11, x4, 1                               ; step -> tile and k chunk
    rem x5, x4, 1                                ; step -> tile and k chunk
    get_block_num x12                            ; step -> tile and k chunk
    mul x12, x12, x11                            ; step -> tile and k chunk
    get_block_id x13                             ; step -> tile and k chunk
    add x12, x12, x13                            ; tile = block + j * blocks
    rem x13, x12, 1                              ; step -> tile and k chunk
    div x12, x12, 1                              ; step -> tile and k chunk
    mul x12, x12, 16                             ; first row
    mul x13, x13, 16                             ; first column
    mul x14, x5, 48                              ; first k
    movi x6, 32                                  ; step -> tile and k chunk
    sub x6, x6, x12                              ; step -> tile and k chunk
    min x6, x6, 16                               ; rows in the tile
    movi x7, 16                                  ; step -> tile and k chunk
    sub x7, x7, x13                              ; step -> tile and k chunk
    min x7, x7, 16                               ; columns in the tile
    movi x8, 48                                  ; step -> tile and k chunk
    sub x8, x8, x14                              ; step -> tile and k chunk
    min x8, x8, 48                               ; k in the chunk
    mul x9, x12, 16                              ; compute: L1 -> L0 -> cube
    add x9, x9, x13                              ; compute: L1 -> L0 -> cube
    mul x9, x9, 2                                ; compute: L1 -> L0 -> cube
    ldarg x15, 2                                 ; argument c
    add x9, x9, x15                              ; C tile address
    and x10, x11, 1                              ; L0C buffer: tile index & 1
    and x11, x4, 1                               ; compute: L1 -> L0 -> cube
    bne x11, 0, odd_2                            ; compute: L1 -> L0 -> cube
    wait_flag mte2, mte1, 0                      ; L1 chunk loaded
    jmp parity_end_2                             ; compute: L1 -> L0 -> cube
odd_2:
    wait_flag mte2, mte1, 1                      ; L1 chunk loaded
parity_end_2:
    movi x12, 0                                  ; compute: L1 -> L0 -> cube
    bge x12, x8, loop_end_0                      ; compute: L1 -> L0 -> cube
loop_0:
    sub x13, x8, x12                             ; mmad step
    min x13, x13, 48                             ; k in this step
    and x14, x2, 1                               ; mmad step
    bne x14, 0, odd_3                            ; mmad step
    wait_flag m, mte1, 0                         ; L0 buffers free
    jmp parity_end_3                             ; mmad step
odd_3:
    wait_flag m, mte1, 1                         ; L0 buffers free
parity_end_3:
    mul x16, x14, 1536                           ; L0A: one load2d per 16-row block
    add x16, x16, 0                              ; L0A: one load2d per 16-row block
    mul x15, x11, 3072                           ; L0A: one load2d per 16-row block
    add x15, x15, 0                              ; L0A: one load2d per 16-row block
    add x18, x6, 15                              ; L0A: one load2d per 16-row block
    shr x18, x18, 4                              ; L0A: one load2d per 16-row block
    shl x18, x18, 4                              ; L0A: one load2d per 16-row block
    mul x19, x12, 2                              ; L0A: one load2d per 16-row block
    mul x19, x19, x18                            ; L0A: one load2d per 16-row block
    add x15, x15, x19                            ; k block kk/C0: kk * size * R bytes
    shr x18, x18, 4                              ; source stride R/16 fractals
    add x17, x13, 15                             ; L0A: one load2d per 16-row block
    div x17, x17, 16                             ; L0A: one load2d per 16-row block
    add x19, x6, 15                              ; L0A: one load2d per 16-row block
    shr x19, x19, 4                              ; L0A: one load2d per 16-row block
    shl x19, x19, 4                              ; L0A: one load2d per 16-row block
    shr x19, x19, 4                              ; L0A: one load2d per 16-row block
    movi x20, 0                                  ; L0A: one load2d per 16-row block
    bge x20, x19, loop_end_1                     ; L0A: one load2d per 16-row block
loop_1:
    load2d.f16 l0a, x16, x15, x17, x18, 0        ; L0A: one load2d per 16-row block
    add x15, x15, 512                            ; L0A: one load2d per 16-row block
    mul x21, x17, 512                            ; L0A: one load2d per 16-row block
    add x16, x16, x21                            ; L0A: one load2d per 16-row block
    add x20, x20, 1                              ; L0A: one load2d per 16-row block
    blt x20, x19, loop_1                         ; L0A: one load2d per 16-row block
loop_end_1:
    mul x16, x14, 1536                           ; L0B: one load2d per k block
    add x16, x16, 0                              ; L0B: one load2d per k block
    mul x15, x11, 3072                           ; L0B: one load2d per k block
    add x15, x15, 1536                           ; L0B: one load2d per k block
    add x17, x7, 15                              ; L0B: one load2d per k block
    div x17, x17, 16                             ; L0B: one load2d per k block
    add x18, x8, 15                              ; L0B: one load2d per k block
    shr x18, x18, 4                              ; L0B: one load2d per k block
    shl x18, x18, 4                              ; L0B: one load2d per k block
    shr x18, x18, 4                              ; source stride K/16 fractals
    mul x19, x12, 32                             ; L0B: one load2d per k block
    add x15, x15, x19                            ; k block kk/16: kk*32 bytes
    add x19, x13, 15                             ; L0B: one load2d per k block
    div x19, x19, 16                             ; L0B: one load2d per k block
    movi x20, 0                                  ; L0B: one load2d per k block
    bge x20, x19, loop_end_2                     ; L0B: one load2d per k block
loop_2:
    load2d.f16 l0b, x16, x15, x17, x18, 1        ; L0B: one load2d per k block
    add x15, x15, 512                            ; L0B: one load2d per k block
    mul x21, x17, 512                            ; L0B: one load2d per k block
    add x16, x16, x21                            ; L0B: one load2d per k block
    add x20, x20, 1                              ; L0B: one load2d per k block
    blt x20, x19, loop_2                         ; L0B: one load2d per k block
loop_end_2:
    bne x14, 0, odd_4                            ; mmad step
    set_flag mte1, m, 0                          ; L0 step loaded
    jmp parity_end_4                             ; mmad step
odd_4:
    set_flag mte1, m, 1                          ; L0 step loaded
parity_end_4:
    bne x14, 0, odd_5                            ; mmad step
    wait_flag mte1, m, 0                         ; mmad step
    jmp parity_end_5                             ; mmad step
odd_5:
    wait_flag mte1, m, 1                         ; mmad step
parity_end_5:
    mul x15, x14, 1536                           ; mmad step
    add x15, x15, 0                              ; mmad step
    mul x16, x14, 1536                           ; mmad step
    add x16, x16, 0                              ; mmad step
    mul x17, x10, 1024                           ; mmad step
    add x17, x17, 0                              ; mmad step
    bne x5, 0, accumulate_0                      ; mmad step
    bne x12, 0, accumulate_0                     ; mmad step
    bne x10, 0, odd_6                            ; mmad step
    wait_flag fix, m, 0                          ; first step of the tile: L0C free
    jmp parity_end_6                             ; mmad step
odd_6:
    wait_flag fix, m, 1                          ; first step of the tile: L0C free
parity_end_6:
    mmad.f16 x17, x15, x16, x6, x13, x7, 0, x0   ; C = A * B
    jmp mmad_issued_0                            ; mmad step
accumulate_0:
    mmad.f16 x17, x15, x16, x6, x13, x7, 1, x0   ; C += A * B
mmad_issued_0:
    bne x14, 0, odd_7                            ; mmad step
    set_flag m, mte1, 0                          ; L0 buffers read
    jmp parity_end_7                             ; mmad step
odd_7:
    set_flag m, mte1, 1                          ; L0 buffers read
parity_end_7:
    add x2, x2, 1                                ; mmad step
    add x12, x12, 48                             ; compute: L1 -> L0 -> cube
    blt x12, x8, loop_0                          ; compute: L1 -> L0 -> cube
loop_end_0:
    bne x11, 0, odd_8                            ; compute: L1 -> L0 -> cube
    set_flag mte1, mte2, 0                       ; L1 chunk read
    jmp parity_end_8                             ; compute: L1 -> L0 -> cube
odd_8:
    set_flag mte1, mte2, 1                       ; L1 chunk read
parity_end_8:
    bne x5, 0, endif_1                           ; compute: L1 -> L0 -> cube
    bne x10, 0, odd_9                            ; store: L0C -> C
    set_flag m, fix, 0                           ; store: L0C -> C
    jmp parity_end_9                             ; store: L0C -> C
odd_9:
    set_flag m, fix, 1                           ; store: L0C -> C
parity_end_9:
    bne x10, 0, odd_10                           ; store: L0C -> C
    wait_flag m, fix, 0                          ; store: L0C -> C
    jmp parity_end_10                            ; store: L0C -> C
odd_10:
    wait_flag m, fix, 1                          ; store: L0C -> C
parity_end_10:
    mul x13, x10, 1024                           ; store: L0C -> C
    add x13, x13, 0                              ; store: L0C -> C
    fixpipe.f32.f16 gm, x9, x13, x6, x7, 16, 1, 0, x0 ; C tile to GM (ND)
    bne x10, 0, odd_11                           ; store: L0C -> C
    set_flag fix, m, 0                           ; store: L0C -> C
    jmp endif_1                                  ; store: L0C -> C
odd_11:
    set_flag fix, m, 1                           ; store: L0C -> C
endif_1:
endif_2:
parity_end_11:
    add x3, x3, 1
    bge x1, x3, step_loop_0
done_0:
    wait_flag mte1, mte2, 0                      ; drain: consume the free flags
    wait_flag m, mte1, 0                         ; drain: consume the free flags
    wait_flag fix, m, 0                          ; drain: consume the free flags
    wait_flag mte1, mte2, 1                      ; drain: consume the free flags
    wait_flag m, mte1, 1                         ; drain: consume the free flags
    wait_flag fix, m, 1                          ; drain: consume the free flags
    end                                          ; end of kernel
