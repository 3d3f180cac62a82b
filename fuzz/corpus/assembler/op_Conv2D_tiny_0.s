.kernel Conv2D_f16
.arg x, f16[1, 9, 9, 4]
.arg w, f16
.arg y, f16[1, 9, 9, 8]
.section aic
    set_l3d_geom 3, 3, 1, 1, 1, 1                ; window geometry (fixed)
    get_block_id x2                              ; my tiles: [block * 1, min(1, block * 1 + 1))
    mul x2, x2, 1                                ; my tiles: [block * 1, min(1, block * 1 + 1))
    movi x1, 1                                   ; my tiles: [block * 1, min(1, block * 1 + 1))
    sub x1, x1, x2                               ; my tiles: [block * 1, min(1, block * 1 + 1))
    min x1, x1, 1                                ; my tiles: [block * 1, min(1, block * 1 + 1))
    mul x1, x1, 1                                ; my tiles: [block * 1, min(1, block * 1 + 1))
    set_flag mte1, mte2, 0                       ; all buffers start free
    set_flag m, mte1, 0                          ; all buffers start free
    set_flag fix, m, 0                           ; all buffers start free
    set_flag mte1, mte2, 1                       ; all buffers start free
    set_flag m, mte1, 1                          ; all buffers start free
    set_flag fix, m, 1                           ; all buffers start free
    movi x3, 0                                   ; L0 steps so far (parity of the L0 buffers)
    movi x4, -2                                  ; resident weights: 2 * (group * n_tiles + n tile) + loading (-2: none)
    movi x5, 0                                   ; pipeline iteration t: load step t, compute step t-1
    beq x1, 0, done_0
step_loop_0:
    bge x5, x1, endif_0
    rem x6, x5, 1                                ; step -> tile (group, n tile, stack, m tile) and chunk
    div x8, x5, 1                                ; step -> tile (group, n tile, stack, m tile) and chunk
    add x8, x8, x2                               ; tile
    rem x11, x8, 1                               ; step -> tile (group, n tile, stack, m tile) and chunk
    div x8, x8, 1                                ; step -> tile (group, n tile, stack, m tile) and chunk
    rem x7, x8, 1                                ; step -> tile (group, n tile, stack, m tile) and chunk
    div x8, x8, 1                                ; step -> tile (group, n tile, stack, m tile) and chunk
    mul x12, x11, 96                             ; first output position of the tile
    movi x13, 81                                 ; load: slab (and weights) into L1
    sub x13, x13, x12                            ; load: slab (and weights) into L1
    min x13, x13, 96                             ; positions in the tile
    div x9, x12, 9                               ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    mul x9, x9, 1                                ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    sub x9, x9, 1                                ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    add x10, x12, x13                            ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    sub x10, x10, 1                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    div x10, x10, 9                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    mul x10, x10, 1                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    add x10, x10, 2                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    min x10, x10, 9                              ; end row
    max x9, x9, 0                                ; first row
    sub x10, x10, x9                             ; rows
    and x11, x5, 1                               ; load: slab (and weights) into L1
    bne x11, 0, odd_0                            ; load: slab (and weights) into L1
    wait_flag mte1, mte2, 0                      ; L1 buffers free
    jmp parity_end_0                             ; load: slab (and weights) into L1
odd_0:
    wait_flag mte1, mte2, 1                      ; L1 buffers free
parity_end_0:
    div x12, x8, 1                               ; load: slab (and weights) into L1
    mul x12, x12, 4                              ; first input channel of the group
    movi x13, 4                                  ; load: slab (and weights) into L1
    sub x13, x13, x12                            ; load: slab (and weights) into L1
    min x13, x13, 4                              ; input channels of the group
    mul x14, x6, 1                               ; first channel block of the chunk
    add x15, x13, 15                             ; load: slab (and weights) into L1
    shr x15, x15, 4                              ; load: slab (and weights) into L1
    sub x15, x15, x14                            ; load: slab (and weights) into L1
    min x15, x15, 1                              ; load: slab (and weights) into L1
    max x15, x15, 0                              ; channel blocks in the chunk
    ldarg x17, 0                                 ; argument x
    mul x16, x11, 3584                           ; load: slab (and weights) into L1
    add x16, x16, 32                             ; load: slab (and weights) into L1
    mul x18, x10, 9                              ; slab: NHWC rows -> 16-channel planes in L1
    add x25, x18, 15                             ; slab: NHWC rows -> 16-channel planes in L1
    shr x25, x25, 4                              ; slab: NHWC rows -> 16-channel planes in L1
    shl x25, x25, 4                              ; slab: NHWC rows -> 16-channel planes in L1
    mul x19, x7, 9                               ; slab: NHWC rows -> 16-channel planes in L1
    add x19, x19, x9                             ; slab: NHWC rows -> 16-channel planes in L1
    mul x19, x19, 36                             ; slab: NHWC rows -> 16-channel planes in L1
    add x19, x19, x12                            ; slab: NHWC rows -> 16-channel planes in L1
    mul x21, x14, 16                             ; slab: NHWC rows -> 16-channel planes in L1
    add x19, x19, x21                            ; slab: NHWC rows -> 16-channel planes in L1
    mul x19, x19, 2                              ; slab: NHWC rows -> 16-channel planes in L1
    add x19, x19, x17                            ; source of the first block
    mov x22, x16                                 ; slab: NHWC rows -> 16-channel planes in L1
    add x23, x14, x15                            ; slab: NHWC rows -> 16-channel planes in L1
    mov x20, x14                                 ; slab: NHWC rows -> 16-channel planes in L1
    bge x20, x23, loop_end_0                     ; slab: NHWC rows -> 16-channel planes in L1
loop_0:
    mul x21, x20, 16                             ; slab: NHWC rows -> 16-channel planes in L1
    sub x21, x13, x21                            ; slab: NHWC rows -> 16-channel planes in L1
    min x21, x21, 16                             ; channels in the block
    nd2nz.f16 x22, x19, x18, x21, 4, x25         ; one 16-channel plane
    add x19, x19, 32                             ; slab: NHWC rows -> 16-channel planes in L1
    mul x21, x18, 32                             ; slab: NHWC rows -> 16-channel planes in L1
    add x22, x22, x21                            ; slab: NHWC rows -> 16-channel planes in L1
    add x20, x20, 1                              ; slab: NHWC rows -> 16-channel planes in L1
    blt x20, x23, loop_0                         ; slab: NHWC rows -> 16-channel planes in L1
loop_end_0:
    bne x11, 0, odd_1                            ; load: slab (and weights) into L1
    set_flag mte2, mte1, 0                       ; L1 buffers loaded
    jmp endif_0                                  ; load: slab (and weights) into L1
odd_1:
    set_flag mte2, mte1, 1                       ; L1 buffers loaded
endif_0:
parity_end_1:
    beq x5, 0, endif_1
    sub x6, x5, 1
    rem x7, x6, 1                                ; step -> tile (group, n tile, stack, m tile) and chunk
    div x15, x6, 1                               ; step -> tile (group, n tile, stack, m tile) and chunk
    add x15, x15, x2                             ; tile
    rem x19, x15, 1                              ; step -> tile (group, n tile, stack, m tile) and chunk
    div x15, x15, 1                              ; step -> tile (group, n tile, stack, m tile) and chunk
    rem x17, x15, 1                              ; step -> tile (group, n tile, stack, m tile) and chunk
    div x15, x15, 1                              ; step -> tile (group, n tile, stack, m tile) and chunk
    mul x18, x19, 96                             ; first output position of the tile
    movi x8, 81                                  ; compute: L1 -> L0 -> cube
    sub x8, x8, x18                              ; compute: L1 -> L0 -> cube
    min x8, x8, 96                               ; positions in the tile
    div x19, x18, 9                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    mul x19, x19, 1                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    sub x19, x19, 1                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    add x20, x18, x8                             ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    sub x20, x20, 1                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    div x20, x20, 9                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    mul x20, x20, 1                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    add x20, x20, 2                              ; slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))
    min x20, x20, 9                              ; end row
    max x19, x19, 0                              ; first row
    sub x20, x20, x19                            ; rows
    set_fmatrix x20, 9, 1, 1, 1, 1               ; set_fmatrix: the tile's slab and paddings
    div x9, x18, 9                               ; compute: L1 -> L0 -> cube
    mul x9, x9, 9                                ; compute: L1 -> L0 -> cube
    sub x9, x18, x9                              ; m0 - oh0 * OW
    div x12, x15, 1                              ; compute: L1 -> L0 -> cube
    mul x12, x12, 8                              ; compute: L1 -> L0 -> cube
    movi x16, 8                                  ; compute: L1 -> L0 -> cube
    sub x12, x16, x12                            ; compute: L1 -> L0 -> cube
    min x12, x12, 8                              ; output channels of the group
    rem x16, x15, 1                              ; compute: L1 -> L0 -> cube
    mul x16, x16, 16                             ; first output channel (in the group)
    sub x12, x12, x16                            ; compute: L1 -> L0 -> cube
    min x12, x12, 16                             ; output channels of the tile
    mul x13, x17, 81                             ; compute: L1 -> L0 -> cube
    add x13, x13, x18                            ; compute: L1 -> L0 -> cube
    mul x13, x13, 8                              ; compute: L1 -> L0 -> cube
    div x18, x15, 1                              ; compute: L1 -> L0 -> cube
    mul x18, x18, 8                              ; compute: L1 -> L0 -> cube
    add x13, x13, x18                            ; compute: L1 -> L0 -> cube
    add x13, x13, x16                            ; compute: L1 -> L0 -> cube
    mul x13, x13, 2                              ; compute: L1 -> L0 -> cube
    ldarg x19, 2                                 ; argument y
    add x13, x13, x19                            ; output tile address
    div x17, x15, 1                              ; compute: L1 -> L0 -> cube
    mul x17, x17, 4                              ; first input channel of the group
    movi x18, 4                                  ; compute: L1 -> L0 -> cube
    sub x18, x18, x17                            ; compute: L1 -> L0 -> cube
    min x18, x18, 4                              ; input channels of the group
    mul x17, x7, 1                               ; first channel block of the chunk
    add x19, x18, 15                             ; compute: L1 -> L0 -> cube
    shr x19, x19, 4                              ; compute: L1 -> L0 -> cube
    sub x19, x19, x17                            ; compute: L1 -> L0 -> cube
    min x19, x19, 1                              ; compute: L1 -> L0 -> cube
    max x19, x19, 0                              ; channel blocks in the chunk
    mul x10, x17, 16                             ; compute: L1 -> L0 -> cube
    sub x10, x18, x10                            ; channels from the chunk's first block
    mul x11, x19, 144                            ; k of the chunk
    add x14, x12, 15                             ; compute: L1 -> L0 -> cube
    shr x14, x14, 4                              ; compute: L1 -> L0 -> cube
    shl x14, x14, 4                              ; compute: L1 -> L0 -> cube
    mul x14, x14, x17                            ; compute: L1 -> L0 -> cube
    mul x14, x14, 288                            ; compute: L1 -> L0 -> cube
    add x14, x14, 7168                           ; B of the chunk in L1
    bne x7, 0, endif_2                           ; compute: L1 -> L0 -> cube
    add x20, x15, x15                            ; compute: L1 -> L0 -> cube
    shr x21, x4, 1                               ; compute: L1 -> L0 -> cube
    shl x21, x21, 1                              ; compute: L1 -> L0 -> cube
    beq x20, x21, same_weights_0                 ; compute: L1 -> L0 -> cube
    add x20, x20, 1                              ; compute: L1 -> L0 -> cube
    set_flag mte1, mte2, 2                       ; MTE1 done with the old weights
    wait_flag mte1, mte2, 2                      ; weights of a new (group, n tile)
same_weights_0:
    mov x4, x20                                  ; weights of a new (group, n tile)
endif_2:
    and x20, x4, 1                               ; compute: L1 -> L0 -> cube
    beq x20, 0, endif_3                          ; compute: L1 -> L0 -> cube
    div x20, x15, 1                              ; weights: one nd2nz per (16 input channels, tap)
    mul x20, x20, 8                              ; weights: one nd2nz per (16 input channels, tap)
    add x20, x20, x16                            ; weights: one nd2nz per (16 input channels, tap)
    mul x20, x20, 2                              ; weights: one nd2nz per (16 input channels, tap)
    ldarg x23, 1                                 ; argument w
    add x20, x20, x23                            ; weights: one nd2nz per (16 input channels, tap)
    add x23, x12, 15                             ; weights: one nd2nz per (16 input channels, tap)
    shr x23, x23, 4                              ; weights: one nd2nz per (16 input channels, tap)
    shl x23, x23, 4                              ; weights: one nd2nz per (16 input channels, tap)
    mov x21, x14                                 ; weights: one nd2nz per (16 input channels, tap)
    add x25, x17, x19                            ; weights: one nd2nz per (16 input channels, tap)
    mov x24, x17                                 ; weights: one nd2nz per (16 input channels, tap)
    bge x24, x25, loop_end_1                     ; weights: one nd2nz per (16 input channels, tap)
loop_1:
    mul x26, x24, 16                             ; weights: one nd2nz per (16 input channels, tap)
    sub x26, x18, x26                            ; weights: one nd2nz per (16 input channels, tap)
    min x26, x26, 16                             ; weights: one nd2nz per (16 input channels, tap)
    movi x28, 0                                  ; weights: one nd2nz per (16 input channels, tap)
    bge x28, 9, loop_end_2                       ; weights: one nd2nz per (16 input channels, tap)
loop_2:
    mov x27, x28                                 ; weights: one nd2nz per (16 input channels, tap)
    mul x27, x27, 32                             ; weights: one nd2nz per (16 input channels, tap)
    mul x22, x24, 128                            ; weights: one nd2nz per (16 input channels, tap)
    add x27, x27, x22                            ; weights: one nd2nz per (16 input channels, tap)
    mul x27, x27, 2                              ; weights: one nd2nz per (16 input channels, tap)
    add x27, x27, x20                            ; weights: one nd2nz per (16 input channels, tap)
    nd2nz.f16 x21, x27, x26, x12, 8, 16          ; k-block: 16 input channels x n (fractal rows = k)
    mul x22, x23, 32                             ; weights: one nd2nz per (16 input channels, tap)
    add x21, x21, x22                            ; next k-block: nb * 512 bytes
    add x28, x28, 1                              ; weights: one nd2nz per (16 input channels, tap)
    blt x28, 9, loop_2                           ; weights: one nd2nz per (16 input channels, tap)
loop_end_2:
    add x24, x24, 1                              ; weights: one nd2nz per (16 input channels, tap)
    blt x24, x25, loop_1                         ; weights: one nd2nz per (16 input channels, tap)
loop_end_1:
    set_flag mte2, mte1, 2                       ; resident weights: this chunk's k-blocks
    wait_flag mte2, mte1, 2                      ; resident weights: this chunk's k-blocks
endif_3:
    and x15, x6, 1                               ; compute: L1 -> L0 -> cube
    div x16, x6, 1                               ; compute: L1 -> L0 -> cube
    and x16, x16, 1                              ; L0C buffer: tile index in the block & 1
    bne x15, 0, odd_2                            ; compute: L1 -> L0 -> cube
    wait_flag mte2, mte1, 0                      ; L1 buffers loaded
    jmp parity_end_2                             ; compute: L1 -> L0 -> cube
odd_2:
    wait_flag mte2, mte1, 1                      ; L1 buffers loaded
parity_end_2:
    mul x17, x15, 3584                           ; compute: L1 -> L0 -> cube
    add x17, x17, 32                             ; compute: L1 -> L0 -> cube
    mul x18, x16, 6144                           ; compute: L1 -> L0 -> cube
    add x18, x18, 0                              ; compute: L1 -> L0 -> cube
    add x19, x8, 15                              ; compute: L1 -> L0 -> cube
    shr x19, x19, 4                              ; compute: L1 -> L0 -> cube
    shl x19, x19, 4                              ; compute: L1 -> L0 -> cube
    add x20, x12, 15                             ; compute: L1 -> L0 -> cube
    shr x20, x20, 4                              ; compute: L1 -> L0 -> cube
    shl x20, x20, 4                              ; compute: L1 -> L0 -> cube
    shr x20, x20, 4                              ; nb
    mov x21, x14                                 ; compute: L1 -> L0 -> cube
    mul x22, x20, 4608                           ; tk0/16 * nb * 512
    movi x24, 0                                  ; compute: L1 -> L0 -> cube
    bge x24, x11, loop_end_3                     ; compute: L1 -> L0 -> cube
loop_3:
    sub x25, x11, x24                            ; mmad step: load3d A, load2d B, mmad
    min x25, x25, 144                            ; k in this step
    shr x29, x25, 4                              ; mmad step: load3d A, load2d B, mmad
    mul x29, x29, x20                            ; fractals of the step
    and x26, x3, 1                               ; mmad step: load3d A, load2d B, mmad
    bne x26, 0, odd_3                            ; mmad step: load3d A, load2d B, mmad
    wait_flag m, mte1, 0                         ; L0 buffers free
    movi x27, 0                                  ; mmad step: load3d A, load2d B, mmad
    load3d.f16 x27, x17, x10, x9, x19, x24, x25  ; img2col rows of the tile, k [kk, kk + ks)
    movi x28, 0                                  ; mmad step: load3d A, load2d B, mmad
    load2d.f16 l0b, x28, x21, x29, 1, 1          ; B of the step
    set_flag mte1, m, 0                          ; L0 step loaded
    wait_flag mte1, m, 0                         ; mmad step: load3d A, load2d B, mmad
    bne x7, 0, accumulate_0                      ; mmad step: load3d A, load2d B, mmad
    bne x24, 0, accumulate_0                     ; mmad step: load3d A, load2d B, mmad
    bne x16, 0, odd_4                            ; mmad step: load3d A, load2d B, mmad
    wait_flag fix, m, 0                          ; first step of the tile: L0C free
    jmp parity_end_4                             ; mmad step: load3d A, load2d B, mmad
odd_4:
    wait_flag fix, m, 1                          ; first step of the tile: L0C free
parity_end_4:
    mmad.f16 x18, x27, x28, x8, x25, x12, 0, x0  ; C = A * B
    jmp mmad_issued_0                            ; mmad step: load3d A, load2d B, mmad
accumulate_0:
    mmad.f16 x18, x27, x28, x8, x25, x12, 1, x0  ; C += A * B
mmad_issued_0:
    set_flag m, mte1, 0                          ; L0 buffers read
    jmp parity_end_3                             ; mmad step: load3d A, load2d B, mmad
odd_3:
    wait_flag m, mte1, 1                         ; L0 buffers free
    movi x27, 27648                              ; mmad step: load3d A, load2d B, mmad
    load3d.f16 x27, x17, x10, x9, x19, x24, x25  ; img2col rows of the tile, k [kk, kk + ks)
    movi x28, 4608                               ; mmad step: load3d A, load2d B, mmad
    load2d.f16 l0b, x28, x21, x29, 1, 1          ; B of the step
    set_flag mte1, m, 1                          ; L0 step loaded
    wait_flag mte1, m, 1                         ; mmad step: load3d A, load2d B, mmad
    bne x7, 0, accumulate_1                      ; mmad step: load3d A, load2d B, mmad
    bne x24, 0, accumulate_1                     ; mmad step: load3d A, load2d B, mmad
    bne x16, 0, odd_5                            ; mmad step: load3d A, load2d B, mmad
    wait_flag fix, m, 0                          ; first step of the tile: L0C free
    jmp parity_end_5                             ; mmad step: load3d A, load2d B, mmad
odd_5:
    wait_flag fix, m, 1                          ; first step of the tile: L0C free
parity_end_5:
    mmad.f16 x18, x27, x28, x8, x25, x12, 0, x0  ; C = A * B
    jmp mmad_issued_1                            ; mmad step: load3d A, load2d B, mmad
accumulate_1:
    mmad.f16 x18, x27, x28, x8, x25, x12, 1, x0  ; C += A * B
mmad_issued_1:
    set_flag m, mte1, 1                          ; L0 buffers read
parity_end_3:
    add x21, x21, x22                            ; mmad step: load3d A, load2d B, mmad
    add x3, x3, 1                                ; mmad step: load3d A, load2d B, mmad
    add x24, x24, 144                            ; compute: L1 -> L0 -> cube
    blt x24, x11, loop_3                         ; compute: L1 -> L0 -> cube
loop_end_3:
    bne x15, 0, odd_6                            ; compute: L1 -> L0 -> cube
    set_flag mte1, mte2, 0                       ; L1 buffers read
    jmp parity_end_6                             ; compute: L1 -> L0 -> cube
odd_6:
    set_flag mte1, mte2, 1                       ; L1 buffers read
parity_end_6:
    bne x7, 0, endif_1                           ; compute: L1 -> L0 -> cube
    bne x16, 0, odd_7                            ; store: L0C -> y (ND rows of the tile's channels)
    set_flag m, fix, 0                           ; store: L0C -> y (ND rows of the tile's channels)
    jmp parity_end_7                             ; store: L0C -> y (ND rows of the tile's channels)
odd_7:
    set_flag m, fix, 1                           ; store: L0C -> y (ND rows of the tile's channels)
parity_end_7:
    bne x16, 0, odd_8                            ; store: L0C -> y (ND rows of the tile's channels)
    wait_flag m, fix, 0                          ; store: L0C -> y (ND rows of the tile's channels)
    jmp parity_end_8                             ; store: L0C -> y (ND rows of the tile's channels)
odd_8:
    wait_flag m, fix, 1                          ; store: L0C -> y (ND rows of the tile's channels)
parity_end_8:
    mul x9, x16, 6144                            ; store: L0C -> y (ND rows of the tile's channels)
    add x9, x9, 0                                ; store: L0C -> y (ND rows of the tile's channels)
    fixpipe.f32.f16 gm, x13, x9, x8, x12, 8, 1, 0, x0 ; store: L0C -> y (ND rows of the tile's channels)
    bne x16, 0, odd_9                            ; store: L0C -> y (ND rows of the tile's channels)
    set_flag fix, m, 0                           ; store: L0C -> y (ND rows of the tile's channels)
    jmp endif_1                                  ; store: L0C -> y (ND rows of the tile's channels)
odd_9:
    set_flag fix, m, 1                           ; store: L0C -> y (ND rows of the tile's channels)
endif_1:
endif_4:
parity_end_9:
    add x5, x5, 1
    bge x1, x5, step_loop_0
done_0:
    wait_flag mte1, mte2, 0                      ; drain: consume the free flags
    wait_flag m, mte1, 0                         ; drain: consume the free flags
    wait_flag fix, m, 0                          ; drain: consume the free flags
    wait_flag mte1, mte2, 1                      ; drain: consume the free flags
    wait_flag m, mte1, 1                         ; drain: consume the free flags
    wait_flag fix, m, 1                          ; drain: consume the free flags
    end                                          ; end of kernel
