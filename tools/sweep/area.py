"""Area proxy: an estimate of the silicon area (mm^2) of a resolved chip config, for comparing
configs of one sweep (Pareto front of simulated time vs area). Not a floorplan: it counts what
the sweep varies (buffers, MACs, vector lanes, cores) and leaves out what it does not (HBM PHYs,
NoC, host interface, ...). Reasoning and caveats: docs/sweep.md, "Area proxy".

    area = sram_core_mm2_per_mib * sum over core kinds (count x local buffer MiB)
         + sram_l2_mm2_per_mib * L2 MiB
         + mac_mm2 * cube.m * cube.k * cube.n * (cores with a cube pipe)
         + vector_lane_mm2 * (vector.bytes_per_cycle / 2) * (cores with a vector pipe)
         + core_overhead_mm2 * (all cores)

All coefficients are ours, for a 7 nm-class process; the reference
(../shared/reference/ascend-architecture.md) publishes no area figures.
"""

MIB = 1 << 20

COEFFICIENTS = {
    # estimate: a 7 nm high-density 6T SRAM bit cell is about 0.027 um^2 (the figure TSMC
    # published for N7), so 1 MiB = 8.39 Mbit of cells is 0.23 mm^2; large macros reach roughly
    # 50 % array efficiency (sense amplifiers, decoders, redundancy), so 0.45 mm^2 per MiB.
    "sram_l2_mm2_per_mib": 0.45,
    # estimate: the core buffers (L1, L0A/B/C, UB, BT, FB) are built of many small banks with wide
    # ports (256-512 B per cycle, D S1 rates) and faster cells, so about half the L2 density.
    "sram_core_mm2_per_mib": 0.9,
    # estimate: one fp16 multiplier with an fp32 accumulating adder and its pipeline registers is
    # about 50 k transistors; at a practical 7 nm logic density of about 60 MTr/mm^2 (below the
    # ~90 MTr/mm^2 peak quoted for N7) that is 0.0008 mm^2 per MAC (a 16x16x16 cube: 3.3 mm^2).
    "mac_mm2": 0.0008,
    # estimate: a vector lane (fp16/fp32 ALU with compare, convert and iterative special
    # functions) is taken as twice a cube MAC; lanes = vector.bytes_per_cycle / 2 (fp16 lanes).
    "vector_lane_mm2": 0.0016,
    # estimate: scalar unit, instruction fetch/queues, MTE engines and control per core.
    "core_overhead_mm2": 0.3,
}

# Buffers counted as core-local SRAM (every on-chip buffer of the schema).
CORE_BUFFERS = ("l1", "l0a", "l0b", "l0c", "ub", "bt", "fb")

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(v):
    """A size from a resolved config: an integer or "<int> <unit>" (binary units)."""
    if isinstance(v, int):
        return v
    num, _, unit = str(v).strip().partition(" ")
    return int(num) * _UNITS[unit.strip() or "B"]


def area_breakdown(cfg, coeff=COEFFICIENTS):
    """Area terms in mm^2 of a resolved config (the dict of `npusim config` YAML)."""
    cores = cfg.get("cores", {})
    core_mib = 0.0
    cube_cores = vector_cores = all_cores = 0
    for kind in cores.values():
        n = int(kind.get("count", 0))
        all_cores += n
        bufs = kind.get("buffers", {}) or {}
        core_mib += n * sum(parse_bytes(bufs[b]) for b in CORE_BUFFERS if b in bufs) / MIB
        pipes = kind.get("pipes", []) or []
        if "m" in pipes:
            cube_cores += n
        if "v" in pipes:
            vector_cores += n
    cube = cfg.get("cube", {})
    macs = int(cube.get("m", 0)) * int(cube.get("k", 0)) * int(cube.get("n", 0)) * cube_cores
    lanes = int(cfg.get("vector", {}).get("bytes_per_cycle", 0)) // 2 * vector_cores
    l2_mib = parse_bytes(cfg.get("memory", {}).get("l2", {}).get("bytes", 0)) / MIB
    return {
        "core_sram": coeff["sram_core_mm2_per_mib"] * core_mib,
        "l2_sram": coeff["sram_l2_mm2_per_mib"] * l2_mib,
        "cube": coeff["mac_mm2"] * macs,
        "vector": coeff["vector_lane_mm2"] * lanes,
        "core_overhead": coeff["core_overhead_mm2"] * all_cores,
    }


def area_mm2(cfg, coeff=COEFFICIENTS):
    return sum(area_breakdown(cfg, coeff).values())
