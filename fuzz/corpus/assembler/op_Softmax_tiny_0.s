.kernel Softmax_rows
.arg in0, f32[8, 100]
.arg out, f32[8, 100]
.section aiv
    ldarg x1, 0                                  ; argument in0
    ldarg x2, 1                                  ; argument out
    set_mask_count 8                             ; alternating vsel pattern
    movi x3, 16224                               ; alternating vsel pattern
    movi x4, 21845                               ; alternating vsel pattern
    vdup.u16 x3, x4, 0, 1, 8                     ; alternating vsel pattern
    movi x3, 0                                   ; load parity (ping 0 / pong 1)
    movi x4, 0                                   ; output parity (ping 0 / pong 1)
    set_flag v, mte2, 0                          ; both copies start free
    set_flag mte3, v, 0                          ; both copies start free
    set_flag v, mte2, 1                          ; both copies start free
    set_flag mte3, v, 1                          ; both copies start free
    get_block_id x5                              ; block range: 8 rows per block
    mul x5, x5, 8                                ; block range: 8 rows per block
    add x6, x5, 8                                ; block range: 8 rows per block
    min x6, x6, 8                                ; block range: 8 rows per block
    mov x11, x5
    sub x12, x6, x11
    add x12, x12, 7
    div x12, x12, 8
    movi x13, 0                                  ; pipeline iteration t: load step t, compute step t-1
    beq x12, 0, done_0
step_loop_0:
    bge x13, x12, endif_0
    and x14, x13, 1
    bne x14, 0, odd_0
    mul x5, x13, 8                               ; load the group
    add x5, x5, x11                              ; load the group
    sub x7, x6, x5                               ; load the group
    min x7, x7, 8                                ; load the group
    add x8, x7, 1                                ; load the group
    shr x8, x8, 1                                ; load the group
    mul x9, x8, 2                                ; load the group
    mul x10, x8, 200                             ; load the group
    wait_flag v, mte2, 0                         ; load the group
    mul x16, x7, 400                             ; load the group
    add x16, x16, 31                             ; load the group
    shr x16, x16, 5                              ; load the group
    mul x15, x5, 400                             ; load the group
    add x15, x15, x1                             ; load the group
    copy_gm2ub x0, x15, 1, x16, 0, 0             ; features
    set_flag mte2, v, 0                          ; load the group
    jmp endif_0
odd_0:
    mul x5, x13, 8                               ; load the group
    add x5, x5, x11                              ; load the group
    sub x7, x6, x5                               ; load the group
    min x7, x7, 8                                ; load the group
    add x8, x7, 1                                ; load the group
    shr x8, x8, 1                                ; load the group
    mul x9, x8, 2                                ; load the group
    mul x10, x8, 200                             ; load the group
    wait_flag v, mte2, 1                         ; load the group
    mul x16, x7, 400                             ; load the group
    add x16, x16, 31                             ; load the group
    shr x16, x16, 5                              ; load the group
    mul x15, x5, 400                             ; load the group
    add x15, x15, x1                             ; load the group
    movi x17, 3200                               ; features
    copy_gm2ub x17, x15, 1, x16, 0, 0            ; features
    set_flag mte2, v, 1                          ; load the group
endif_0:
parity_end_0:
    beq x13, 0, endif_1
    sub x14, x13, 1
    and x15, x14, 1
    bne x15, 0, odd_1
    mul x5, x14, 8
    add x5, x5, x11
    sub x7, x6, x5
    min x7, x7, 8
    add x8, x7, 1
    shr x8, x8, 1
    mul x9, x8, 2
    mul x10, x8, 200
    wait_flag mte2, v, 0
    mul x16, x9, 64                              ; row reduction: rows -> lane slots
    set_mask_count x16                           ; row reduction: rows -> lane slots
    movi x17, 12800                              ; row reduction: rows -> lane slots
    movi x18, 0xffffffffff800000                 ; row reduction: rows -> lane slots
    vdup.s32 x17, x18, 0, 1, 8                   ; row reduction: rows -> lane slots
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 12800                          ; row reduction: rows -> lane slots
    movi x19, -1                                 ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 0                              ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xfffffffff                        ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 256                            ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 13056                          ; row reduction: rows -> lane slots
    movi x19, -16                                ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 384                            ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xffffffffff                       ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 640                            ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x16, -1                                 ; row reduction: lane slots -> one value per row
    set_mask x0, x16                             ; row reduction: lane slots -> one value per row
    movi x16, 14848                              ; row reduction: lane slots -> one value per row
    movi x17, 12800                              ; row reduction: lane slots -> one value per row
    vcmax.f32 x16, x17, x9, 1, 8                 ; row reduction: lane slots -> one value per row
    add x16, x9, 7                               ; replicate one value per row to a block per row
    shr x16, x16, 3                              ; replicate one value per row to a block per row
    mul x17, x16, 128                            ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15200                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15456                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    movi x18, 0                                  ; replicate one value per row to a block per row
    bge x18, x16, loop_end_0                     ; replicate one value per row to a block per row
loop_0:
    mul x19, x18, 1024                           ; replicate one value per row to a block per row
    add x19, x19, 15200                          ; replicate one value per row to a block per row
    add x20, x19, 512                            ; replicate one value per row to a block per row
    vtranspose x20, x19                          ; replicate one value per row to a block per row
    add x18, x18, 1                              ; replicate one value per row to a block per row
    blt x18, x16, loop_0                         ; replicate one value per row to a block per row
loop_end_0:
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 14944                              ; replicate one value per row to a block per row
    movi x19, 15712                              ; replicate one value per row to a block per row
    movi x20, 15744                              ; replicate one value per row to a block per row
    movi x21, 16224                              ; replicate one value per row to a block per row
    vsel.u16 x18, x19, x20, x21, 0, 1, 2, 2, 8, 32, 32 ; replicate one value per row to a block per row
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vsub)
    add x18, x18, 14944                          ; per-row value applied to every lane of the row (vsub)
    movi x20, -1                                 ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 0                              ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 0                              ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    movi x20, 0xfffffffff                        ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 256                            ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 256                            ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vsub)
    add x18, x18, 14976                          ; per-row value applied to every lane of the row (vsub)
    movi x20, -16                                ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 384                            ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 384                            ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    movi x20, 0xffffffffff                       ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 640                            ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 640                            ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    set_mask_count x10
    vexp.f32 x0, x0, 0, 1, 1, 8, 8
    mul x16, x9, 64                              ; row reduction: rows -> lane slots
    set_mask_count x16                           ; row reduction: rows -> lane slots
    movi x17, 12800                              ; row reduction: rows -> lane slots
    vdup.s32 x17, x0, 0, 1, 8                    ; row reduction: rows -> lane slots
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 12800                          ; row reduction: rows -> lane slots
    movi x19, -1                                 ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 0                              ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xfffffffff                        ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 256                            ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 13056                          ; row reduction: rows -> lane slots
    movi x19, -16                                ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 384                            ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xffffffffff                       ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 640                            ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x16, -1                                 ; row reduction: lane slots -> one value per row
    set_mask x0, x16                             ; row reduction: lane slots -> one value per row
    movi x16, 14848                              ; row reduction: lane slots -> one value per row
    movi x17, 12800                              ; row reduction: lane slots -> one value per row
    vcadd.f32 x16, x17, x9, 1, 8                 ; row reduction: lane slots -> one value per row
    wait_flag mte3, v, 0
    add x16, x9, 7                               ; replicate one value per row to a block per row
    shr x16, x16, 3                              ; replicate one value per row to a block per row
    mul x17, x16, 128                            ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15200                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15456                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    movi x18, 0                                  ; replicate one value per row to a block per row
    bge x18, x16, loop_end_1                     ; replicate one value per row to a block per row
loop_1:
    mul x19, x18, 1024                           ; replicate one value per row to a block per row
    add x19, x19, 15200                          ; replicate one value per row to a block per row
    add x20, x19, 512                            ; replicate one value per row to a block per row
    vtranspose x20, x19                          ; replicate one value per row to a block per row
    add x18, x18, 1                              ; replicate one value per row to a block per row
    blt x18, x16, loop_1                         ; replicate one value per row to a block per row
loop_end_1:
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 14944                              ; replicate one value per row to a block per row
    movi x19, 15712                              ; replicate one value per row to a block per row
    movi x20, 15744                              ; replicate one value per row to a block per row
    movi x21, 16224                              ; replicate one value per row to a block per row
    vsel.u16 x18, x19, x20, x21, 0, 1, 2, 2, 8, 32, 32 ; replicate one value per row to a block per row
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vdiv)
    add x18, x18, 14944                          ; per-row value applied to every lane of the row (vdiv)
    movi x20, -1                                 ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 0                              ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 6400                           ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    movi x20, 0xfffffffff                        ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 256                            ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 6656                           ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vdiv)
    add x18, x18, 14976                          ; per-row value applied to every lane of the row (vdiv)
    movi x20, -16                                ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 384                            ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 6784                           ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    movi x20, 0xffffffffff                       ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 640                            ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 7040                           ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    set_flag v, mte2, 0
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    mul x16, x5, 400
    add x16, x16, x2
    mul x17, x7, 400
    add x17, x17, 31
    shr x17, x17, 5
    movi x18, 6400                               ; output rows
    copy_ub2gm x16, x18, 1, x17, 0, 0            ; output rows
    set_flag mte3, v, 0
    jmp endif_1
odd_1:
    mul x5, x14, 8
    add x5, x5, x11
    sub x7, x6, x5
    min x7, x7, 8
    add x8, x7, 1
    shr x8, x8, 1
    mul x9, x8, 2
    mul x10, x8, 200
    wait_flag mte2, v, 1
    mul x16, x9, 64                              ; row reduction: rows -> lane slots
    set_mask_count x16                           ; row reduction: rows -> lane slots
    movi x17, 12800                              ; row reduction: rows -> lane slots
    movi x18, 0xffffffffff800000                 ; row reduction: rows -> lane slots
    vdup.s32 x17, x18, 0, 1, 8                   ; row reduction: rows -> lane slots
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 12800                          ; row reduction: rows -> lane slots
    movi x19, -1                                 ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3200                           ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xfffffffff                        ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3456                           ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 13056                          ; row reduction: rows -> lane slots
    movi x19, -16                                ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3584                           ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xffffffffff                       ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3840                           ; row reduction: rows -> lane slots
    vmax.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x16, -1                                 ; row reduction: lane slots -> one value per row
    set_mask x0, x16                             ; row reduction: lane slots -> one value per row
    movi x16, 14848                              ; row reduction: lane slots -> one value per row
    movi x17, 12800                              ; row reduction: lane slots -> one value per row
    vcmax.f32 x16, x17, x9, 1, 8                 ; row reduction: lane slots -> one value per row
    add x16, x9, 7                               ; replicate one value per row to a block per row
    shr x16, x16, 3                              ; replicate one value per row to a block per row
    mul x17, x16, 128                            ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15200                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15456                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    movi x18, 0                                  ; replicate one value per row to a block per row
    bge x18, x16, loop_end_2                     ; replicate one value per row to a block per row
loop_2:
    mul x19, x18, 1024                           ; replicate one value per row to a block per row
    add x19, x19, 15200                          ; replicate one value per row to a block per row
    add x20, x19, 512                            ; replicate one value per row to a block per row
    vtranspose x20, x19                          ; replicate one value per row to a block per row
    add x18, x18, 1                              ; replicate one value per row to a block per row
    blt x18, x16, loop_2                         ; replicate one value per row to a block per row
loop_end_2:
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 14944                              ; replicate one value per row to a block per row
    movi x19, 15712                              ; replicate one value per row to a block per row
    movi x20, 15744                              ; replicate one value per row to a block per row
    movi x21, 16224                              ; replicate one value per row to a block per row
    vsel.u16 x18, x19, x20, x21, 0, 1, 2, 2, 8, 32, 32 ; replicate one value per row to a block per row
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vsub)
    add x18, x18, 14944                          ; per-row value applied to every lane of the row (vsub)
    movi x20, -1                                 ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 3200                           ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 3200                           ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    movi x20, 0xfffffffff                        ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 3456                           ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 3456                           ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vsub)
    add x18, x18, 14976                          ; per-row value applied to every lane of the row (vsub)
    movi x20, -16                                ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 3584                           ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 3584                           ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    movi x20, 0xffffffffff                       ; per-row value applied to every lane of the row (vsub)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vsub)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x17, x17, 3840                           ; per-row value applied to every lane of the row (vsub)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vsub)
    add x19, x19, 3840                           ; per-row value applied to every lane of the row (vsub)
    vsub.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vsub)
    set_mask_count x10
    movi x16, 3200
    movi x17, 3200
    vexp.f32 x16, x17, 0, 1, 1, 8, 8
    mul x16, x9, 64                              ; row reduction: rows -> lane slots
    set_mask_count x16                           ; row reduction: rows -> lane slots
    movi x17, 12800                              ; row reduction: rows -> lane slots
    vdup.s32 x17, x0, 0, 1, 8                    ; row reduction: rows -> lane slots
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 12800                          ; row reduction: rows -> lane slots
    movi x19, -1                                 ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3200                           ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xfffffffff                        ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3456                           ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    mul x18, x16, 512                            ; row reduction: rows -> lane slots
    add x18, x18, 13056                          ; row reduction: rows -> lane slots
    movi x19, -16                                ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3584                           ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x19, 0xffffffffff                       ; row reduction: rows -> lane slots
    set_mask x0, x19                             ; row reduction: rows -> lane slots
    mul x17, x16, 800                            ; row reduction: rows -> lane slots
    add x17, x17, 3840                           ; row reduction: rows -> lane slots
    vadd.f32 x18, x18, x17, x8, 1, 1, 1, 16, 16, 25 ; row reduction: rows -> lane slots
    movi x16, -1                                 ; row reduction: lane slots -> one value per row
    set_mask x0, x16                             ; row reduction: lane slots -> one value per row
    movi x16, 14848                              ; row reduction: lane slots -> one value per row
    movi x17, 12800                              ; row reduction: lane slots -> one value per row
    vcadd.f32 x16, x17, x9, 1, 8                 ; row reduction: lane slots -> one value per row
    wait_flag mte3, v, 1
    add x16, x9, 7                               ; replicate one value per row to a block per row
    shr x16, x16, 3                              ; replicate one value per row to a block per row
    mul x17, x16, 128                            ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15200                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 15456                              ; replicate one value per row to a block per row
    movi x19, 14848                              ; replicate one value per row to a block per row
    vcopy.u16 x18, x19, 0, 1, 0, 32, 1           ; replicate one value per row to a block per row
    movi x18, 0                                  ; replicate one value per row to a block per row
    bge x18, x16, loop_end_3                     ; replicate one value per row to a block per row
loop_3:
    mul x19, x18, 1024                           ; replicate one value per row to a block per row
    add x19, x19, 15200                          ; replicate one value per row to a block per row
    add x20, x19, 512                            ; replicate one value per row to a block per row
    vtranspose x20, x19                          ; replicate one value per row to a block per row
    add x18, x18, 1                              ; replicate one value per row to a block per row
    blt x18, x16, loop_3                         ; replicate one value per row to a block per row
loop_end_3:
    set_mask_count x17                           ; replicate one value per row to a block per row
    movi x18, 14944                              ; replicate one value per row to a block per row
    movi x19, 15712                              ; replicate one value per row to a block per row
    movi x20, 15744                              ; replicate one value per row to a block per row
    movi x21, 16224                              ; replicate one value per row to a block per row
    vsel.u16 x18, x19, x20, x21, 0, 1, 2, 2, 8, 32, 32 ; replicate one value per row to a block per row
    movi x16, 0                                  ; all super-rows at once
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vdiv)
    add x18, x18, 14944                          ; per-row value applied to every lane of the row (vdiv)
    movi x20, -1                                 ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 3200                           ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 9600                           ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    movi x20, 0xfffffffff                        ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 3456                           ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 9856                           ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    mul x18, x16, 64                             ; per-row value applied to every lane of the row (vdiv)
    add x18, x18, 14976                          ; per-row value applied to every lane of the row (vdiv)
    movi x20, -16                                ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 3584                           ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 9984                           ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    movi x20, 0xffffffffff                       ; per-row value applied to every lane of the row (vdiv)
    set_mask x0, x20                             ; per-row value applied to every lane of the row (vdiv)
    mul x17, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x17, x17, 3840                           ; per-row value applied to every lane of the row (vdiv)
    mul x19, x16, 800                            ; per-row value applied to every lane of the row (vdiv)
    add x19, x19, 10240                          ; per-row value applied to every lane of the row (vdiv)
    vdiv.f32 x19, x17, x18, x8, 1, 1, 0, 25, 25, 2 ; per-row value applied to every lane of the row (vdiv)
    set_flag v, mte2, 1
    set_flag v, mte3, 1
    wait_flag v, mte3, 1
    mul x16, x5, 400
    add x16, x16, x2
    mul x17, x7, 400
    add x17, x17, 31
    shr x17, x17, 5
    movi x18, 9600                               ; output rows
    copy_ub2gm x16, x18, 1, x17, 0, 0            ; output rows
    set_flag mte3, v, 1
endif_1:
parity_end_1:
    add x13, x13, 1
    bge x12, x13, step_loop_0
done_0:
    wait_flag v, mte2, 0                         ; drain: consume the free flags of both copies
    wait_flag mte3, v, 0                         ; drain: consume the free flags of both copies
    wait_flag v, mte2, 1                         ; drain: consume the free flags of both copies
    wait_flag mte3, v, 1                         ; drain: consume the free flags of both copies
    end                                          ; end of kernel
