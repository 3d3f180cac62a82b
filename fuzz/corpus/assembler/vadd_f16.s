; z = x + y over n fp16 elements, on every vector core.
; Arguments: x, y, z (GM addresses of n fp16 elements), n (element count, a multiple of 16 so
; every GM transfer is whole 32-byte blocks).
; Block b of B takes the slice [b*per, min(n, (b+1)*per)), per = ceil(n/16/B)*16, and streams it
; through the UB in tiles of up to TILE elements, double-buffered: while V adds tile t, MTE2 loads
; tile t+1 and MTE3 stores tile t-1. The ping (buffers 0, flag id 0) and pong (buffers 1, flag
; id 1) halves of the loop differ only in those numbers: flag ids are immediates in the ISA.
.kernel vadd_f16
.arg x, f16[n]
.arg y, f16[n]
.arg z, f16[n]
.arg n
.equ TILE, 8192                  ; elements per tile: 16 KiB of fp16
.equ TILE_BYTES, TILE * 2
.equ UB_X, 0                     ; UB layout: x ping/pong, y ping/pong, z ping/pong
.equ UB_Y, 2 * TILE_BYTES
.equ UB_Z, 4 * TILE_BYTES

.section aiv
    ldarg x1, x
    ldarg x2, y
    ldarg x3, z
    ldarg x4, n
    get_block_id x5
    get_block_num x6
    add x7, x4, 15              ; 16-element groups in n
    shr x7, x7, 4
    add x8, x7, x6              ; groups per block, rounded up
    sub x8, x8, 1
    div x8, x8, x6
    shl x8, x8, 4               ; per: elements per block
    mul x9, x5, x8              ; x9: next element to process
    bge x9, x4, done            ; nothing for this block
    add x10, x9, x8             ; x10: end of this block's slice
    min x10, x10, x4
    movi x20, UB_X
    movi x21, UB_Y
    movi x22, UB_Z
    movi x23, UB_X + TILE_BYTES
    movi x24, UB_Y + TILE_BYTES
    movi x25, UB_Z + TILE_BYTES
    set_flag v, mte2, 0         ; x/y buffers start free
    set_flag v, mte2, 1
    set_flag mte3, v, 0         ; z buffers start free
    set_flag mte3, v, 1
loop:
    bge x9, x10, drain          ; ---- ping: buffers 0
    sub x11, x10, x9            ; x11: elements in this tile
    min x11, x11, TILE
    shl x12, x9, 1              ; byte offset of the tile in x, y, z
    shr x13, x11, 4             ; 32-byte blocks in the tile
    add x14, x1, x12
    add x15, x2, x12
    add x16, x3, x12
    wait_flag v, mte2, 0
    copy_gm2ub x20, x14, 1, x13, 0, 0
    copy_gm2ub x21, x15, 1, x13, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    wait_flag mte3, v, 0
    set_mask_count x11
    vadd.f16 x22, x20, x21, 0, 1, 1, 1, 8, 8, 8
    set_flag v, mte2, 0
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x16, x22, 1, x13, 0, 0
    set_flag mte3, v, 0
    add x9, x9, x11
    bge x9, x10, drain          ; ---- pong: buffers 1
    sub x11, x10, x9
    min x11, x11, TILE
    shl x12, x9, 1
    shr x13, x11, 4
    add x14, x1, x12
    add x15, x2, x12
    add x16, x3, x12
    wait_flag v, mte2, 1
    copy_gm2ub x23, x14, 1, x13, 0, 0
    copy_gm2ub x24, x15, 1, x13, 0, 0
    set_flag mte2, v, 1
    wait_flag mte2, v, 1
    wait_flag mte3, v, 1
    set_mask_count x11
    vadd.f16 x25, x23, x24, 0, 1, 1, 1, 8, 8, 8
    set_flag v, mte2, 1
    set_flag v, mte3, 1
    wait_flag v, mte3, 1
    copy_ub2gm x16, x25, 1, x13, 0, 0
    set_flag mte3, v, 1
    add x9, x9, x11
    jmp loop
drain:
    wait_flag v, mte2, 0        ; consume the "free" flags set for the next tiles
    wait_flag v, mte2, 1
    wait_flag mte3, v, 0
    wait_flag mte3, v, 1
done:
    end
