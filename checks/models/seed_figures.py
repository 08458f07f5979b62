"""The seeds' numbers, recomputed by the cost model (`checks.models.cost`), each in the convention its seed used.

Every `Figure` carries three values: what the seed printed (its text, rounded as it rounded), the exact value in
the seed's own convention (the same inputs, computed without rounding), and a corrected or other-convention value,
with the convention each is in. The seeds mix conventions:

- seed 000 counts mixed-precision Adam, 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter, and 4 bytes per parameter on
  the wire; seed 002 counts fp32 Adam, 4 + 4 + 8 = 16: the DDP and ZeRO-3 totals agree by coincidence, ZeRO-1/2 do
  not (63 / 38.5 GB fp32, 38.5 / 26.25 GB mixed);
- seed 001 takes S = 1 MB for 500k parameters: 2 bytes per parameter, where seed 000 counts 4;
- seeds 000 and 001 take the ring's 2(N−1)/N·S as 2S (N large) even where N is given.

Bytes are decimal (GB = 10⁹ B), as the seeds and the ZeRO paper write them. Values are Fractions in the figure's
display unit. Torch-free, like every model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from checks.models.cost import Budget, Link, Plan, budget, collective_time, element_bytes, estimate, textbook
from checks.models.ring import ring_bytes

GB, MB = 10**9, 10**6
PSI_7B = 7 * 10**9
PSI_GRAMMAR = 500_000  # the seeds' "MiniGPT-grammar (~500k params)"
# Per-element bytes of the two conventions, from the model's own rule (`cost.element_bytes`):
MIXED_ADAM = element_bytes(Plan(1, 1, "zero3", precision="mixed"))  # 2 + 2 + (4 master + 8 Adam): seed 000, paper
FP32_ADAM = element_bytes(Plan(1, 1, "ddp"))  # 4 + 4 + 8: seed 002
NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
SEED_001 = Link(bandwidth=Fraction(10**9), latency=Fraction(50, 10**6))  # gloo/loopback: 1 GB/s, τ = 50 µs


@dataclass(frozen=True)
class Figure:
    seed: str  # the seed file's number: 000, 001, 002, 003, or "ZeRO" for the paper the seeds cite
    quantity: str
    seed_says: str  # the seed's text, its own rounding
    convention: str  # the seed's convention
    exact: Fraction  # the seed's convention, computed exactly (display unit)
    corrected: Fraction  # the corrected or other-convention value (display unit)
    corrected_convention: str
    unit: str
    note: str = ""

    @property
    def said(self) -> Fraction:
        """The number the seed printed (a decimal comma read as a point)."""
        return Fraction(self._said_digits().replace(",", "."))

    def _said_digits(self) -> str:
        match = NUMBER.search(self.seed_says)
        assert match, self.seed_says
        return match.group()

    @property
    def verdict(self) -> str:
        """``exact``: the seed's number is the exact value in its own convention; ``rounded``: it is that value
        rounded to the digits it printed; ``differs``: neither (the note says why)."""
        if self.said == self.exact:
            return "exact"
        places = len(self._said_digits().replace(",", ".").partition(".")[2])
        return "rounded" if abs(self.said - self.exact) < Fraction(1, 2 * 10**places) else "differs"


def total(stage: int, psi: int, n: int, per_element: dict[str, Fraction]) -> Fraction:
    return sum(textbook(stage, psi, n, per_element).values(), Fraction(0))


def _all_reduce(nbytes: int | Fraction, n: int, link: Link) -> Fraction:
    return collective_time("all_reduce", nbytes, n, link)


def figures() -> list[Figure]:
    rows: list[Figure] = []
    add = rows.append
    # -- seed 000: memory ------------------------------------------------------------------------------------------
    add(
        Figure(
            "000",
            "bytes per parameter, Adam",
            "16 B/param",
            "mixed precision: 2 fp16 weights + 2 grads + 4 master + 4 momentum + 4 variance",
            sum(MIXED_ADAM.values()),
            sum(FP32_ADAM.values()),
            "fp32 Adam, 4 + 4 + 8 (seed 002; PyTorch DDP under autocast)",
            "B/param",
            "the same 16 either way; PyTorch's AdamW adds a 4-byte step per parameter tensor (guide 13)",
        )
    )
    add(
        Figure(
            "000",
            "DDP memory per GPU, 7B",
            "112 GB",
            "16Ψ mixed precision, GB = 10⁹ B",
            total(0, PSI_7B, 1, MIXED_ADAM) / GB,
            total(0, PSI_7B, 1, FP32_ADAM) / GB,
            "fp32 Adam (seed 002)",
            "GB",
            "104.3 GiB; more than an 80 GB A100 either way, before activations",
        )
    )
    add(
        Figure(
            "000",
            "ZeRO-3 memory per GPU, 7B, N=8",
            "14 GB",
            "16Ψ/N mixed precision",
            total(3, PSI_7B, 8, MIXED_ADAM) / GB,
            total(3, PSI_7B, 8, FP32_ADAM) / GB,
            "fp32 Adam (seed 002)",
            "GB",
            "model state only: the all-gathered unit and activations come on top",
        )
    )
    # -- seed 002: the ZeRO table ------------------------------------------------------------------------------------
    for stage, said, note in (
        (1, "63 GB", "the seed's text drops DDP's figure: \"(en lugar de GB)\", 112 GB"),
        (2, "38.5 GB", ""),
        (3, "14 GB", ""),
    ):
        add(
            Figure(
                "002",
                f"ZeRO-{stage} memory per GPU, 7B, N=8",
                said,
                "fp32 Adam 4 + 4 + 8",
                total(stage, PSI_7B, 8, FP32_ADAM) / GB,
                total(stage, PSI_7B, 8, MIXED_ADAM) / GB,
                "mixed precision 2 + 2 + 12 (seed 000, the ZeRO paper)",
                "GB",
                note,
            )
        )
    # -- seed 000: communication -------------------------------------------------------------------------------------
    fp32_grammar = 4 * PSI_GRAMMAR
    limit = 2 * fp32_grammar  # 2(N−1)/N·S → 2S for N large: the seed's 8·|θ|
    at_2 = ring_bytes("all_reduce", fp32_grammar, 2)  # the course's lab: DDP over 2 CPU processes
    ten_gbps = Link.gbps(10)
    lab_link = Link(ten_gbps.bandwidth, SEED_001.latency)
    add(
        Figure(
            "000",
            "DDP bytes per step, 500k params",
            "4 MB",
            "8·|θ| fp32 (2S, N large)",
            Fraction(limit, MB),
            at_2 / MB,
            "ring at N = 2 (the course's 2-process lab): 2(N−1)/N·S",
            "MB",
        )
    )
    seed_time = Fraction(limit) / ten_gbps.bandwidth
    add(
        Figure(
            "000",
            "all-reduce time at 10 Gbps, 500k params",
            "~3 ms",
            "4 MB at 1.25 GB/s, no latency",
            seed_time * 1000,
            _all_reduce(fp32_grammar, 2, lab_link) * 1000,
            "ring at N = 2, τ = 50 µs (seed 001's gloo)",
            "ms",
        )
    )
    add(
        Figure(
            "000",
            "comm overhead at 50 ms of compute",
            "6 %",
            "3 ms / 50 ms",
            seed_time / Fraction(50, 1000) * 100,
            _all_reduce(fp32_grammar, 2, lab_link) / Fraction(50, 1000) * 100,
            "the corrected time / 50 ms",
            "%",
        )
    )
    fp32_7b = 4 * PSI_7B
    add(
        Figure(
            "000",
            "DDP bytes per step, 7B",
            "56 GB",
            "8·|θ| fp32 (2S, N large)",
            Fraction(2 * fp32_7b, GB),
            ring_bytes("all_reduce", fp32_7b, 8) / GB,
            "ring at N = 8: 2·7/8·28 GB",
            "GB",
        )
    )
    effective = Link(bandwidth=Fraction(12 * GB))  # the seed's "~12 GB/s efectivos" for 100 Gbps InfiniBand
    add(
        Figure(
            "000",
            "DDP all-reduce time, 7B, 100 Gbps",
            "4.7 s",
            "56 GB at ~12 GB/s effective",
            Fraction(2 * fp32_7b) / effective.bandwidth,
            _all_reduce(fp32_7b, 8, effective),
            "ring at N = 8, the same 12 GB/s",
            "s",
            "at the line rate (12.5 GB/s): 4.48 s for N large, 3.92 s at N = 8",
        )
    )
    zero3 = estimate(Plan(PSI_7B, 8, "zero3")).comm.ring_bytes / estimate(Plan(PSI_7B, 8, "ddp")).comm.ring_bytes
    add(
        Figure(
            "000",
            "ZeRO-3 communication against DDP's",
            "1.5 ×",
            "3|θ| / 2|θ|",
            zero3,
            zero3,
            "the same ratio at every N; FSDP1 FULL_SHARD keeps its root: (3|θ| − |root|)/(2|θ|), guide 15",
            "×",
        )
    )
    # -- seed 001: the 1 MB ring on 4 CPU workers --------------------------------------------------------------------
    half = 2 * PSI_GRAMMAR  # S = 1 MB for 500k parameters: 2 bytes each
    add(
        Figure(
            "001",
            "S, 500k params",
            "1 MB",
            "2 bytes per parameter",
            Fraction(half, MB),
            Fraction(fp32_grammar, MB),
            "4 bytes per parameter, fp32 (seed 000, mini_gpt trains in fp32)",
            "MB",
        )
    )
    add(
        Figure(
            "001",
            "bytes per worker per all-reduce, N=4",
            "2 MB",
            "S = 1 MB (2 B/param), N = 4, 2(N−1)/N taken as 2",
            ring_bytes("all_reduce", half, 4) / MB,
            ring_bytes("all_reduce", fp32_grammar, 4) / MB,
            "fp32, S = 2 MB",
            "MB",
            "exact is 2(N−1)/N·S = 1.5 MB; the seed rounds 2(N−1)/N up to 2",
        )
    )
    bandwidth = 2 * (4 - 1) * Fraction(half, 4) * SEED_001.beta
    add(
        Figure(
            "001",
            "bandwidth time, N=4, 1 GB/s",
            "2 ms",
            "2S at 1 GB/s, S = 1 MB, N = 4",
            bandwidth * 1000,
            2 * 3 * Fraction(fp32_grammar, 4) * SEED_001.beta * 1000,
            "fp32, S = 2 MB",
            "ms",
        )
    )
    latency = 2 * (4 - 1) * SEED_001.latency
    add(
        Figure(
            "001",
            "latency time, N=4, τ = 50 µs",
            "300 µs",
            "2(N−1)·τ",
            latency * 10**6,
            latency * 10**6,
            "the same: latency does not depend on S",
            "µs",
        )
    )
    add(
        Figure(
            "001",
            "all-reduce time, N=4",
            "~2.3 ms",
            "S = 1 MB, N = 4, τ = 50 µs, 1 GB/s",
            _all_reduce(half, 4, SEED_001) * 1000,
            _all_reduce(fp32_grammar, 4, SEED_001) * 1000,
            "fp32, S = 2 MB",
            "ms",
            "the seed adds 2S's bandwidth (2 ms) to the exact-N latency; at N = 4 the ring sends 1.5 MB",
        )
    )
    # -- seed 000: the embedding table ---------------------------------------------------------------------------------
    table = 600_000 * 4096
    add(
        Figure(
            "000",
            "embedding table 600k × 4096, fp32 weights",
            "10 GB",
            "600k × 4096 × 4 bytes",
            Fraction(4 * table, GB),
            total(0, table, 1, FP32_ADAM) / GB,
            "trained with Adam: 16 B/param",
            "GB",
            "9.16 GiB; the weights alone fit an 80 GB GPU, training state too (39.3 GB), before activations",
        )
    )
    # -- seed 003 ----------------------------------------------------------------------------------------------------
    add(
        Figure(
            "003",
            "7B inference weights, fp16",
            "14 GB",
            "2 bytes per parameter",
            Fraction(2 * PSI_7B, GB),
            Fraction(4 * PSI_7B, GB),
            "fp32 weights",
            "GB",
        )
    )
    spend = seed_budget()
    add(
        Figure(
            "003",
            "2 × RTX 4090 at $0.35/h for 3 h",
            "$2.10",
            "GPUs × price × hours",
            spend.cost,
            spend.cost,
            "the same",
            "$",
            spend.arithmetic(),
        )
    )
    add(
        Figure(
            "003",
            "buffer left of the $3.00 budget",
            "$0.90",
            "budget − cost",
            spend.left,
            spend.left,
            "the same",
            "$",
        )
    )
    # -- the ZeRO paper's Figure 1 -------------------------------------------------------------------------------------
    for name, said, value in figure_1():
        add(
            Figure(
                "ZeRO",
                f"Figure 1 {name}",
                said,
                "Ψ = 7.5B, K = 12, N = 64, (2 + 2 + K)Ψ",
                value,
                value,
                "the same",
                "GB",
                "the paper rounds to one decimal",
            )
        )
    return rows


def seed_budget() -> Budget:
    """Seed 003's sentence: 2 × RTX 4090 spot at ~$0.35/h each, ~3 hours, budget $3.00."""
    return budget(Plan(1, 2, price_per_gpu_hour=Fraction("0.35"), hours=Fraction(3)), "3.00")


FIGURE_1 = (("baseline", "120 GB", 0), ("Pos", "31.4 GB", 1), ("Pos+g", "16.6 GB", 2), ("Pos+g+p", "1.9 GB", 3))


def figure_1() -> list[tuple[str, str, Fraction]]:
    """The ZeRO paper's Figure 1: Ψ = 7.5B, K = 12, N = 64, each stage's GB per GPU, exact."""
    psi, n = 7_500_000_000, 64
    return [(name, said, total(stage, psi, n, MIXED_ADAM) / GB) for name, said, stage in FIGURE_1]


def zero_table(psi: int = PSI_7B, n: int = 8) -> list[tuple[str, dict[str, Fraction], dict[str, Fraction]]]:
    """Seed 002's table: DDP and ZeRO-1/2/3 per category in GB, fp32 Adam beside mixed precision."""
    names = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
    out = []
    for stage, name in enumerate(names):
        fp32 = {c: v / GB for c, v in textbook(stage, psi, n, FP32_ADAM).items()}
        mixed = {c: v / GB for c, v in textbook(stage, psi, n, MIXED_ADAM).items()}
        out.append((name, fp32, mixed))
    return out
