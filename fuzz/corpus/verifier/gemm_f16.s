; C = A x B in fp16 with fp32 accumulation, on every cube core; double-buffered in L1 and L0.
; Arguments: a (M x K), b (K x N), c (M x N), all fp16 row-major (ND) in GM; M, N, K with
; M % 128 == 0, N % 256 == 0, K % 256 == 0.
;
; Tiling (910B AIC buffers: L1 512 KiB, L0A/L0B 64 KiB, L0C 128 KiB):
;   output tile  128 x 256   fp32 in L0C: 128 KiB (one buffer)
;   L1 chunk     A 128 x 256 (64 KiB) + B 256 x 256 (128 KiB), two of each: 384 KiB
;   L0 step      A 128 x 64 (16 KiB) + B 64 x 256 (32 KiB), two of each: L0A 32, L0B 64 KiB
; Block b takes output tiles b, b+B, b+2B, ... (row-major over the 128x256 tile grid). Its work
; is a flat list of steps s = (tile j, k chunk), S = tiles * K/256. Iteration t loads step t
; (MTE2, nd2nz into L1 buffer t&1) and computes step t-1 (MTE1 load2d into L0 buffer kk&1, cube
; mmad, and after a tile's last chunk FIXPIPE to GM), so MTE2, MTE1, cube and FIXPIPE overlap.
; Flags (id = buffer): mte2->mte1 "L1 chunk full", mte1->mte2 "L1 chunk free", mte1->m "L0 step
; full", m->mte1 "L0 step free", m->fix "L0C tile done", fix->m "L0C free". Flag ids are
; immediates, so each wait/set on a buffer parity is a two-way branch.
.kernel gemm_f16
.arg a, f16[M, K]
.arg b, f16[K, N]
.arg c, f16[M, N]
.arg M
.arg N
.arg K
.equ TM, 128
.equ TN, 256
.equ TK_L1, 256                  ; k per L1 chunk
.equ TK_L0, 64                   ; k per mmad
.equ L1_A, 0                     ; two 64 KiB A chunks
.equ L1_A_BYTES, TM * TK_L1 * 2
.equ L1_B, 2 * L1_A_BYTES        ; two 128 KiB B chunks
.equ L1_B_BYTES, TK_L1 * TN * 2
.equ L0A_BYTES, TM * TK_L0 * 2   ; 16 KiB per L0A buffer
.equ L0B_BYTES, TK_L0 * TN * 2   ; 32 KiB per L0B buffer
.equ FRAC, 512                   ; bytes per fractal

.section aic
    ldarg x1, a
    ldarg x2, b
    ldarg x3, c
    ldarg x4, M
    ldarg x5, N
    ldarg x6, K
    get_block_id x7
    get_block_num x8
    div x9, x5, TN              ; x9: tiles per row of C
    div x10, x4, TM
    mul x10, x10, x9            ; x10: tiles in C
    div x11, x6, TK_L1          ; x11: k chunks per tile
    bge x7, x10, done           ; no tile for this block
    sub x12, x10, x7            ; my tiles = ceil((tiles - b) / B)
    add x12, x12, x8
    sub x12, x12, 1
    div x12, x12, x8
    mul x12, x12, x11           ; x12: S, my steps
    set_flag mte1, mte2, 0      ; both L1 chunks, both L0 steps and L0C start free
    set_flag mte1, mte2, 1
    set_flag m, mte1, 0
    set_flag m, mte1, 1
    set_flag fix, m, 0
    movi x13, 0                 ; x13: t
iter:
    ; ---------------- load step t (if t < S) into L1 buffer t&1 ----------------
    bge x13, x12, compute
    div x15, x13, x11           ; j: my tile index
    rem x16, x13, x11           ; chunk
    mul x17, x15, x8            ; tile = b + j*B
    add x17, x17, x7
    div x18, x17, x9            ; mb
    rem x19, x17, x9            ; nb
    mul x20, x18, TM            ; A src = a + (mb*TM*K + chunk*TK_L1) * 2
    mul x20, x20, x6
    mul x30, x16, TK_L1
    add x20, x20, x30
    shl x20, x20, 1
    add x20, x20, x1
    mul x21, x16, TK_L1         ; B src = b + (chunk*TK_L1*N + nb*TN) * 2
    mul x21, x21, x5
    mul x30, x19, TN
    add x21, x21, x30
    shl x21, x21, 1
    add x21, x21, x2
    and x14, x13, 1             ; x14: buffer parity
    mul x22, x14, L1_A_BYTES
    add x22, x22, L1_A
    mul x23, x14, L1_B_BYTES
    add x23, x23, L1_B
    bne x14, 0, ld_wait1
    wait_flag mte1, mte2, 0
    jmp ld_copy
ld_wait1:
    wait_flag mte1, mte2, 1
ld_copy:
    nd2nz.f16 x22, x20, TM, TK_L1, x6, TM
    nd2nz.f16 x23, x21, TK_L1, TN, x5, TK_L1
    bne x14, 0, ld_set1
    set_flag mte2, mte1, 0
    jmp compute
ld_set1:
    set_flag mte2, mte1, 1
compute:
    ; ---------------- compute step t-1 (if t >= 1) from L1 buffer (t-1)&1 ----------------
    beq x13, 0, next
    sub x24, x13, 1             ; x24: step
    rem x25, x24, x11           ; x25: chunk
    and x14, x24, 1
    mul x22, x14, L1_A_BYTES
    add x22, x22, L1_A
    mul x23, x14, L1_B_BYTES
    add x23, x23, L1_B
    bne x14, 0, cp_wait1
    wait_flag mte2, mte1, 0
    jmp cp_steps
cp_wait1:
    wait_flag mte2, mte1, 1
cp_steps:
    movi x26, 0                 ; x26: kk, the L0 step within the chunk
kstep:
    and x27, x26, 1             ; x27: L0 buffer parity
    mul x28, x27, L0A_BYTES     ; x28: L0A buffer
    mul x29, x27, L0B_BYTES     ; x29: L0B buffer
    bne x27, 0, ks_wait1
    wait_flag m, mte1, 0
    jmp ks_load
ks_wait1:
    wait_flag m, mte1, 1
ks_load:
    ; A: row block i -> 4 fractals, from L1 fractal (col block kk*4, row block i), stride TM/16
    mul x30, x26, TK_L0 / 16 * TM * 32
    add x30, x30, x22           ; x30: L1 source of row block 0
    mov x31, x28                ; x31: L0A destination
    movi x15, 0
ks_a:
    load2d.f16 l0a, x31, x30, TK_L0 / 16, TM / 16, 0
    add x30, x30, FRAC
    add x31, x31, TK_L0 / 16 * FRAC
    add x15, x15, 1
    blt x15, TM / 16, ks_a
    ; B: k block ki -> 16 fractals transposed, from L1 fractal (row block kk*4+ki, col block 0),
    ; stride TK_L1/16
    mul x30, x26, TK_L0 / 16 * FRAC
    add x30, x30, x23
    mov x31, x29
    movi x15, 0
ks_b:
    load2d.f16 l0b, x31, x30, TN / 16, TK_L1 / 16, 1
    add x30, x30, FRAC
    add x31, x31, TN / 16 * FRAC
    add x15, x15, 1
    blt x15, TK_L0 / 16, ks_b
    bne x27, 0, ks_full1
    set_flag mte1, m, 0
    wait_flag mte1, m, 0
    jmp ks_mmad
ks_full1:
    set_flag mte1, m, 1
    wait_flag mte1, m, 1
ks_mmad:
    movi x31, 0                 ; x31: L0C
    bne x26, 0, ks_acc
    bne x25, 0, ks_acc
    wait_flag fix, m, 0         ; first step of a tile: L0C must be free
    mmad.f16 x31, x28, x29, TM, TK_L0, TN, 0, x0
    jmp ks_free
ks_acc:
    mmad.f16 x31, x28, x29, TM, TK_L0, TN, 1, x0
ks_free:
    bne x27, 0, ks_free1
    set_flag m, mte1, 0
    jmp ks_next
ks_free1:
    set_flag m, mte1, 1
ks_next:
    add x26, x26, 1
    blt x26, TK_L1 / TK_L0, kstep
    bne x14, 0, cp_free1        ; L1 chunk free once MTE1 has read it
    set_flag mte1, mte2, 0
    jmp cp_out
cp_free1:
    set_flag mte1, mte2, 1
cp_out:
    sub x30, x11, 1             ; last chunk of the tile: FIXPIPE L0C -> C
    bne x25, x30, next
    div x15, x24, x11           ; tile = b + (step / chunks) * B
    mul x17, x15, x8
    add x17, x17, x7
    div x18, x17, x9            ; mb
    rem x19, x17, x9            ; nb
    mul x30, x18, TM            ; C dst = c + (mb*TM*N + nb*TN) * 2
    mul x30, x30, x5
    mul x31, x19, TN
    add x30, x30, x31
    shl x30, x30, 1
    add x30, x30, x3
    movi x31, 0
    set_flag m, fix, 0
    wait_flag m, fix, 0
    fixpipe.f32.f16 gm, x30, x31, TM, TN, x5, 1, 0, x0
    set_flag fix, m, 0
next:
    add x13, x13, 1
    sub x30, x13, 1             ; loop while t <= S
    blt x30, x12, iter
    wait_flag mte1, mte2, 0     ; consume the "free" flags left set
    wait_flag mte1, mte2, 1
    wait_flag m, mte1, 0
    wait_flag m, mte1, 1
    wait_flag fix, m, 0
done:
    end
