"""Cost and power proxies of a resolved chip config (docs/sweep.md, "Cost and power").

Cost: the die (area proxy plus the HBM PHYs, priced per good die from a wafer cost and a yield
model) plus the HBM stacks the config's capacity and bandwidth need. Power: dynamic energy from a
point's activity counters (cube MACs, vector repeats, bytes on each data path, L2 and HBM bytes)
plus static power over its simulated time.
"""
import math

from sweep.area import area_breakdown, parse_bytes

GIB = 1 << 30

# HBM generations, slowest first: (name, GB/s per stack, USD per stack).
# GB/s per stack = pin rate x 1024 data pins / 8: HBM2 2.0 Gb/s (JEDEC JESD235A), HBM2E 3.6 Gb/s
# (the fastest HBM2E parts sold, e.g. SK hynix), HBM3 6.4 Gb/s (JEDEC JESD238), HBM3E 9.6 Gb/s
# (the fastest HBM3E parts announced).
# estimate: the prices are not sourced; they follow the order trade-press figures give (about
# 8 to 20 USD per GB from HBM2 to HBM3E, a 16 GiB stack) and include its share of the interposer
# and assembly; only their order and rough ratios matter for a front.
HBM_GENERATIONS = (
    ("HBM2", 256.0, 130.0),
    ("HBM2E", 460.8, 180.0),
    ("HBM3", 819.2, 250.0),
    ("HBM3E", 1228.8, 330.0),
)
# estimate: an 8-high stack of 16 Gbit dies (the common HBM2E and HBM3 part); 910B's 64 GiB is
# then 4 stacks, matching the four stacks third-party teardowns show.
STACK_BYTES = 16 * GIB

COST = {
    # estimate: the die's HBM PHY and controller per stack, mm^2 (7 nm-class; IP vendors do not
    # publish areas; a 1024-bit interface at the die edge with its controller taken as 10 mm^2).
    "hbm_phy_mm2_per_stack": 10.0,
    # estimate: a processed 300 mm wafer of a 7 nm-class node, USD (trade-press figures range
    # about 9,000-10,000 USD).
    "wafer_usd": 10000.0,
    "wafer_diameter_mm": 300.0,
    # estimate: defect density per cm^2 of a mature 7 nm-class node, Poisson yield exp(-A D0).
    "defects_per_cm2": 0.1,
}

# Energy per event, pJ, for a 7 nm-class process. The 45 nm figures are M. Horowitz, "Computing's
# energy problem", ISSCC 2014 (fp16 multiply 1.1 pJ, fp32 add 0.9 pJ; a 64-bit read of an 8 KB
# SRAM 10 pJ, 32 KB 20 pJ, 1 MB 100 pJ). estimate: scaled by 1/4 from 45 nm to 7 nm (logic and
# SRAM energy fell about 4x over those nodes; no published figure for this chip).
ENERGY_PJ = {
    "mac": (1.1 + 0.9) / 4,            # one fp16 multiply with fp32 accumulate: 0.5 pJ
    # estimate: one vector repeat is 128 fp16 lane operations with their UB operand reads and
    # result write (~0.5 pJ per lane: an fp16 op plus small-SRAM accesses).
    "vector_repeat": 128 * 0.5,
    # core-local paths (L1 -> L0A/L0B/BT/FB, L0C -> L1): a 32 KB-class SRAM read and write,
    # 2 x 20 pJ / 8 B at 45 nm -> 1.25 pJ per byte
    "local_byte": 2 * 20 / 8 / 4,
    # estimate: paths to and from GM (gm->l1, gm->ub, l0c->gm, ub->gm) cross the on-chip network
    # to the L2 slices: ~1 pJ per byte of wire and router energy over a die of ~20 mm.
    "gm_path_byte": 1.0,
    # L2 access (hits and the fill of misses): a MB-class SRAM, 100 pJ / 8 B at 45 nm -> 3.1 pJ/B
    "l2_byte": 100 / 8 / 4,
    # HBM: about 3.9 pJ per bit for an HBM2 access, I/O included (O'Connor et al., "Fine-grained
    # DRAM", MICRO 2017) -> 31 pJ per byte; used for every generation (estimate: HBM3 lowers it
    # by perhaps a quarter, not modelled).
    "hbm_byte": 3.9 * 8,
}
STATIC = {
    # estimate: leakage and clock tree per mm^2 of the area proxy; with 0.1 W/mm^2 the 910b's
    # 221 mm^2 leak ~22 W, a tenth of a ~300 W class accelerator's board power.
    "w_per_mm2": 0.1,
    # estimate: HBM refresh and PHY idle power per stack.
    "w_per_hbm_stack": 1.0,
}
GM_PATHS = ("gm_to_l1", "gm_to_ub", "l0c_to_gm", "ub_to_gm")


def hbm_plan(cfg):
    """(generation, stacks) for the config's HBM: the fewest stacks that hold memory.hbm.bytes,
    then the slowest generation whose stacks reach memory.hbm.gbps; if even the fastest does not,
    more stacks of the fastest."""
    hbm = cfg.get("memory", {}).get("hbm", {})
    stacks = max(1, math.ceil(parse_bytes(hbm.get("bytes", 0)) / STACK_BYTES))
    gbps = float(hbm.get("gbps", 0))
    for name, per_stack, _ in HBM_GENERATIONS:
        if stacks * per_stack >= gbps:
            return name, stacks
    name, per_stack, _ = HBM_GENERATIONS[-1]
    return name, math.ceil(gbps / per_stack)


def die_cost_usd(die_mm2, c=COST):
    """Cost of one good die: wafer cost / (dies per wafer x Poisson yield)."""
    d = c["wafer_diameter_mm"]
    dies = math.pi * (d / 2) ** 2 / die_mm2 - math.pi * d / math.sqrt(2 * die_mm2)
    good = max(dies, 1.0) * math.exp(-die_mm2 / 100 * c["defects_per_cm2"])
    return c["wafer_usd"] / good


def config_cost(cfg):
    """The cost side of a config: area proxy, die area with the HBM PHYs, HBM plan, cost (USD)."""
    area = sum(area_breakdown(cfg).values())
    gen, stacks = hbm_plan(cfg)
    die = area + stacks * COST["hbm_phy_mm2_per_stack"]
    stack_usd = {g: usd for g, _, usd in HBM_GENERATIONS}[gen]
    return {"area_mm2": area, "die_mm2": die, "hbm_gen": gen, "hbm_stacks": stacks,
            "cost_usd": die_cost_usd(die) + stacks * stack_usd}


def dynamic_energy_pj(activity):
    """Dynamic energy of a point's activity counters (runner: the JSON's `activity`), pJ."""
    e = ENERGY_PJ
    pj = activity.get("macs", 0) * e["mac"] + activity.get("vector_repeats", 0) * e["vector_repeat"]
    for k, v in activity.items():
        if k.startswith("bytes."):
            pj += v * (e["gm_path_byte"] if k[6:] in GM_PATHS else e["local_byte"])
    l2 = activity.get("l2_read_bytes", 0) + activity.get("l2_write_bytes", 0)
    hbm = activity.get("hbm_read_bytes", 0) + activity.get("hbm_write_bytes", 0)
    return pj + (l2 + hbm) * e["l2_byte"] + hbm * e["hbm_byte"]


def point_power(cost, activity, sim_time_us):
    """(energy uJ, average power W) of a point: dynamic energy plus static power x its time."""
    static_w = STATIC["w_per_mm2"] * cost["area_mm2"] + STATIC["w_per_hbm_stack"] * cost["hbm_stacks"]
    energy_uj = dynamic_energy_pj(activity) * 1e-6 + static_w * sim_time_us
    return energy_uj, energy_uj / sim_time_us if sim_time_us else None
