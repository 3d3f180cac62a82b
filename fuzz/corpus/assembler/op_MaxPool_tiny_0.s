.kernel MaxPool_f16
.arg x, f16[1, 8, 8, 16]
.arg y, f16[1, 4, 4, 16]
.section aiv
    set_flag v, mte2, 0
    set_flag mte3, v, 0
    get_block_id x1
    mul x1, x1, 1
    add x2, x1, 1
    min x2, x2, 4
    mov x1, x1
    bge x1, x2, loop_end_0
loop_0:
    rem x3, x1, 1
    div x4, x1, 1
    div x5, x4, 4
    rem x4, x4, 4
    wait_flag v, mte2, 0                         ; output row: taps over the valid input rows
    mul x6, x4, 2                                ; output row: taps over the valid input rows
    add x6, x6, 0                                ; output row: taps over the valid input rows
    blt x6, 0, endif_0                           ; output row: taps over the valid input rows
    bge x6, 8, endif_0                           ; output row: taps over the valid input rows
    mul x7, x5, 8                                ; output row: taps over the valid input rows
    add x7, x7, x6                               ; output row: taps over the valid input rows
    mul x7, x7, 256                              ; output row: taps over the valid input rows
    mul x8, x3, 32                               ; output row: taps over the valid input rows
    add x7, x7, x8                               ; output row: taps over the valid input rows
    ldarg x9, 0                                  ; argument x
    add x7, x7, x9                               ; output row: taps over the valid input rows
    movi x10, 768                                ; row destination
    copy_gm2ub x10, x7, 8, 1, 0, 0               ; x row, 16 channels per pixel
endif_0:
endif_1:
    mul x6, x4, 2                                ; output row: taps over the valid input rows
    add x6, x6, 1                                ; output row: taps over the valid input rows
    blt x6, 0, endif_2                           ; output row: taps over the valid input rows
    bge x6, 8, endif_2                           ; output row: taps over the valid input rows
    mul x7, x5, 8                                ; output row: taps over the valid input rows
    add x7, x7, x6                               ; output row: taps over the valid input rows
    mul x7, x7, 256                              ; output row: taps over the valid input rows
    mul x8, x3, 32                               ; output row: taps over the valid input rows
    add x7, x7, x8                               ; output row: taps over the valid input rows
    ldarg x9, 0                                  ; argument x
    add x7, x7, x9                               ; output row: taps over the valid input rows
    movi x10, 2048                               ; row destination
    copy_gm2ub x10, x7, 8, 1, 0, 0               ; x row, 16 channels per pixel
endif_2:
endif_3:
    set_flag mte2, v, 0                          ; output row: taps over the valid input rows
    wait_flag mte2, v, 0                         ; output row: taps over the valid input rows
    wait_flag mte3, v, 0                         ; output row: taps over the valid input rows
    movi x7, 0xff800000                          ; fill value
    set_mask_count 64                            ; output row: taps over the valid input rows
    movi x8, 2560                                ; output row: taps over the valid input rows
    vdup.s32 x8, x7, 0, 1, 8                     ; output row: taps over the valid input rows
    mul x6, x4, 2                                ; output row: taps over the valid input rows
    add x6, x6, 0                                ; output row: taps over the valid input rows
    blt x6, 0, endif_4                           ; output row: taps over the valid input rows
    bge x6, 8, endif_4                           ; output row: taps over the valid input rows
    movi x7, 128                                 ; elements
    set_mask_count x7                            ; output row: taps over the valid input rows
    movi x8, 768                                 ; output row: taps over the valid input rows
    vconv.f32.f16 x0, x8, 0, 1, 1, 8, 4, 0       ; output row: taps over the valid input rows
    movi x7, 65535                               ; mask: channels of the part
    set_mask x0, x7                              ; output row: taps over the valid input rows
    movi x7, 2560                                ; output row: taps over the valid input rows
    movi x8, 2560                                ; output row: taps over the valid input rows
    vmax.f32 x7, x8, x0, 4, 1, 1, 1, 2, 2, 4     ; output row: taps over the valid input rows
    movi x7, 65535                               ; mask: channels of the part
    set_mask x0, x7                              ; output row: taps over the valid input rows
    movi x7, 2560                                ; output row: taps over the valid input rows
    movi x8, 2560                                ; output row: taps over the valid input rows
    movi x9, 64                                  ; output row: taps over the valid input rows
    vmax.f32 x7, x8, x9, 4, 1, 1, 1, 2, 2, 4     ; output row: taps over the valid input rows
endif_4:
endif_5:
    mul x6, x4, 2                                ; output row: taps over the valid input rows
    add x6, x6, 1                                ; output row: taps over the valid input rows
    blt x6, 0, endif_6                           ; output row: taps over the valid input rows
    bge x6, 8, endif_6                           ; output row: taps over the valid input rows
    movi x7, 128                                 ; elements
    set_mask_count x7                            ; output row: taps over the valid input rows
    movi x8, 1280                                ; output row: taps over the valid input rows
    movi x9, 2048                                ; output row: taps over the valid input rows
    vconv.f32.f16 x8, x9, 0, 1, 1, 8, 4, 0       ; output row: taps over the valid input rows
    movi x7, 65535                               ; mask: channels of the part
    set_mask x0, x7                              ; output row: taps over the valid input rows
    movi x7, 2560                                ; output row: taps over the valid input rows
    movi x8, 2560                                ; output row: taps over the valid input rows
    movi x9, 1280                                ; output row: taps over the valid input rows
    vmax.f32 x7, x8, x9, 4, 1, 1, 1, 2, 2, 4     ; output row: taps over the valid input rows
    movi x7, 65535                               ; mask: channels of the part
    set_mask x0, x7                              ; output row: taps over the valid input rows
    movi x7, 2560                                ; output row: taps over the valid input rows
    movi x8, 2560                                ; output row: taps over the valid input rows
    movi x9, 1344                                ; output row: taps over the valid input rows
    vmax.f32 x7, x8, x9, 4, 1, 1, 1, 2, 2, 4     ; output row: taps over the valid input rows
endif_6:
endif_7:
    set_flag v, mte2, 0                          ; output row: taps over the valid input rows
    movi x7, 64                                  ; elements
    set_mask_count x7                            ; output row: taps over the valid input rows
    movi x8, 3072                                ; output row: taps over the valid input rows
    movi x9, 2560                                ; output row: taps over the valid input rows
    vconv.f16.f32 x8, x9, 0, 1, 1, 4, 8, 0       ; output row: taps over the valid input rows
    set_flag v, mte3, 0                          ; output row: taps over the valid input rows
    wait_flag v, mte3, 0                         ; output row: taps over the valid input rows
    mul x7, x5, 4                                ; output row: taps over the valid input rows
    add x7, x7, x4                               ; output row: taps over the valid input rows
    mul x7, x7, 128                              ; output row: taps over the valid input rows
    mul x8, x3, 32                               ; output row: taps over the valid input rows
    add x7, x7, x8                               ; output row: taps over the valid input rows
    ldarg x9, 1                                  ; argument y
    add x7, x7, x9                               ; output row: taps over the valid input rows
    movi x10, 3072                               ; row source
    copy_ub2gm x7, x10, 4, 1, 0, 0               ; y row
    set_flag mte3, v, 0                          ; output row: taps over the valid input rows
    add x1, x1, 1
    blt x1, x2, loop_0
loop_end_0:
    wait_flag v, mte2, 0
    wait_flag mte3, v, 0
    end                                          ; end of kernel
