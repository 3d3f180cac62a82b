; Directives and expression forms of docs/assembly.md.
.kernel features
.arg n
.arg x, f16[n, 16]
.arg y, f32
.equ TILE, (1 << 12) - 0x10 + 0b11 * 2
.equ MASK, ~TILE & 0xffff_ffff | 3 ^ 5
.equ NEG, -(7 / 2) % 3 + +1
.section aiv
start:
    ldarg x1, n
    ldarg x2, x
    movi x3, f32(0.5)
    movi x4, f16(-2e-3)
    movi x5, bf16(inf)
    movi x6, TILE * 2 >> 1
    movi x7, MASK
    movi x8, NEG
    add x9, x1, 16
    bge x9, x1, done
    jmp @0
done:
    end
