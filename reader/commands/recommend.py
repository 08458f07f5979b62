"""``fsdp-readings estimate --recommend``: seed 001's recipe walked for a model on a cluster
(`checks.models.recommend`), every step with its memory per GPU by category against the GPU's and its
communication per link level, and the first step that fits. Exit 0 when one fits, 1 when none does, 2 on bad
input (the option named)."""

from __future__ import annotations

import argparse
import textwrap
from fractions import Fraction
from typing import Any

from rich.console import Console, RenderableType
from rich.text import Text

from checks.models import cost
from checks.models import recommend as recipe
from reader.commands.job_inputs import InputError, links, model_of, num
from reader.views.fit import Column, fit_table, indented

GB = 10**9

# Beside the data-parallel step, what tensor and pipeline parallelism are in torch.
TENSOR = (
    "parallelize_module with ColwiseParallel / RowwiseParallel (RowwiseParallel on an nn.Embedding shards its "
    "rows, the vocabulary) and FSDP2 on the mesh's dp dimension (guide 21)"
)
PIPELINE = "torch.distributed.pipelining, Schedule1F1B (guide 21)"


def configure(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--recommend: walk seed 001's recipe on a cluster")
    group.add_argument("--recommend", action="store_true", help="the first step of the recipe that fits")
    group.add_argument("--gpu-memory-gb", default=None, metavar="G", help="memory of one GPU, GB (10^9 B)")
    group.add_argument(
        "--reserve-gb",
        default="0",
        metavar="R",
        help="per GPU, kept for what is not modelled: activations, workspace (default 0)",
    )
    group.add_argument(
        "--tokens",
        default=None,
        metavar="T",
        help="tokens one data-parallel replica runs per step, to price TP and PP (default for mini_gpt shapes: "
        "one sequence of its context)",
    )
    group.add_argument("--microbatches", type=int, default=8, metavar="M", help="pipeline microbatches (default 8)")


def job_of(args: argparse.Namespace, params: int | tuple[Any, ...], config: Any) -> recipe.Job:

    if args.strategy:
        raise InputError("--recommend chooses the strategy: drop --strategy")
    if args.precision not in (*cost.PRECISIONS, "bf16", "fp16"):
        raise InputError(f"--precision is fp32 or mixed (bf16 and fp16 are mixed), not {args.precision!r}")
    if args.gpu_memory_gb is None:
        raise InputError("--recommend needs --gpu-memory-gb, the memory of one GPU")
    memory = cost.exact(args.gpu_memory_gb, "--gpu-memory-gb") * GB
    if memory <= 0:
        raise InputError(f"--gpu-memory-gb must be positive, not {args.gpu_memory_gb}")
    if args.world_size < 1:
        raise InputError(f"-n/--world-size must be at least 1 GPU, not {args.world_size}")
    if args.nodes < 1 or args.world_size % args.nodes:
        raise InputError(f"--nodes {args.nodes} cannot split {args.world_size} GPUs evenly; give a divisor of -n")
    reserve = cost.exact(args.reserve_gb, "--reserve-gb") * GB
    if reserve < 0:
        raise InputError(f"--reserve-gb cannot be negative, not {args.reserve_gb}")
    if reserve >= memory:
        raise InputError(f"--reserve-gb {args.reserve_gb} leaves nothing of a {args.gpu_memory_gb} GB GPU")
    if args.microbatches < 1:
        raise InputError(f"--microbatches must be at least 1, not {args.microbatches}")
    tokens = cost.parse_count(args.tokens, "--tokens") if args.tokens is not None else None
    if tokens == 0:
        raise InputError("--tokens must be positive")
    inter, intra = links(args)
    shape = None
    if config is not None:
        shape = recipe.Shape(config.n_layer, config.n_embd, 4 * config.n_embd)
        tokens = tokens if tokens is not None else config.block_size
    k = cost.exact(args.optimizer_bytes, "--optimizer-bytes") if args.optimizer_bytes is not None else None
    cluster = recipe.Cluster(memory, args.world_size // args.nodes, args.nodes, intra or inter, inter)
    return recipe.Job(
        params, cluster, args.precision, k, reserve, shape, tokens, args.microbatches, optimizer=args.optimizer
    )


def run(args: argparse.Namespace, console: Console) -> tuple[int, dict[str, Any]]:
    """Raises InputError / PlanError on bad input; returns the exit code and the JSON document."""

    model = model_of(args)
    job = job_of(args, model.params, model.config)
    result = recipe.recommend(job)
    if not args.json:
        render(console, model.description, result)
    return (0 if result.fits else 1), as_json(model.description, result)


# -- text -------------------------------------------------------------------------------------------------------
def header(description: str, job: recipe.Job) -> str:
    c = job.cluster
    psi = job.params if isinstance(job.params, int) else sum(p.numel for p in job.params)
    links = (
        f"links {_gbps(c.intra)} in a node, {_gbps(c.inter)} between nodes" if c.nodes > 1 else f"link {_gbps(c.intra)}"
    )
    reserve = f", {cost.human_bytes(job.reserve)} of each reserved" if job.reserve else ""
    return (
        f"{description}: Ψ = {psi:,} · {c.world_size} GPUs ({c.nodes} node{'s' * (c.nodes != 1)} × "
        f"{c.gpus_per_node}) of {cost.human_bytes(c.gpu_memory)}{reserve} · {job.precision} · {links}"
    )


def render(console: Console, description: str, result: recipe.Recommendation) -> None:
    job, width = result.job, console.width
    console.print(indented(header(description, job), width, style="bold", indent=""), soft_wrap=False)
    console.print(memory_table(console, result), soft_wrap=False)
    for a in result.attempts:
        style = "green" if a is result.chosen else "dim" if not a.tried else ""
        console.print(hanging(f"step {a.step}, {a.name}: {a.verdict}", width, style), soft_wrap=False)
    console.print(traffic_table(console, result), soft_wrap=False)
    if not job.per_module:
        console.print(
            indented(
                "a parameter count: the closed form, no units, so no working memory (--model gives it)",
                width,
                style="dim",
                indent="",
            ),
            soft_wrap=False,
        )
    chosen = result.chosen
    if chosen is None:
        console.print(
            Text.assemble(("nothing fits: ", "bold red"), f"no step of the recipe fits {_available(job)} per GPU"),
            soft_wrap=False,
        )
        return
    layout = chosen.layout
    assert layout is not None
    line = f"step {chosen.step}, {layout.describe(job.cluster)}: {cost.human_bytes(chosen.total)} of {_available(job)}"
    console.print(Text.assemble(("recommend: ", "bold green"), line), soft_wrap=False)
    console.print(indented(f"in torch: {in_torch(job, chosen)}", width, indent="  "), soft_wrap=False)


def hanging(text: str, width: int, style: str = "") -> Text:
    """``text`` wrapped at words, its continuation lines indented under the first."""
    lines = textwrap.wrap(text, width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    return Text("\n".join(lines), style=style, no_wrap=True, overflow="ignore")


def _available(job: recipe.Job) -> str:
    return cost.human_bytes(job.available)


def in_torch(job: recipe.Job, attempt: recipe.Attempt) -> str:
    layout = attempt.layout
    assert layout is not None
    form = recipe.in_torch(job, attempt)
    parts = []
    if layout.tp > 1 or layout.pp > 1:
        hybrid = "FSDP1 HYBRID_SHARD or FSDP2 on a 2-D (replicate, shard) mesh" if layout.hybrid else "FSDP2"
        parts.append(f"{hybrid} for the data-parallel part")
    else:
        line = form.name
        if form.total is not None:
            verdict = "fits" if form.fits else "does not fit"
            line += f": {cost.human_bytes(form.total)} per GPU here, because {form.why}; that {verdict}"
        parts.append(line)
    if layout.tp > 1:
        parts.append(TENSOR)
    if layout.pp > 1:
        parts.append(PIPELINE)
    return "; ".join(parts)


def memory_table(console: Console, result: recipe.Recommendation) -> RenderableType:
    hb = cost.human_bytes
    rows: list[list[str | Text]] = []
    for a in result.attempts:
        if not a.tried:
            rows.append([str(a.step), Text(a.name, style="dim"), *([Text("–", style="dim")] * 5)])
            continue
        total = Text(hb(a.total), style="bold green" if a is result.chosen else "bold")
        m = a.memory
        rows.append([str(a.step), a.layout.describe(result.job.cluster), *(hb(m[c]) for c in recipe.CATEGORIES), total])  # type: ignore[union-attr]
    columns = [
        Column("step", "right"),
        Column("layout", prose=True),
        *(Column(c, "right") for c in (*recipe.CATEGORIES, "total")),
    ]
    title = (
        f"memory per GPU, step by step, against {_available(result.job)} (optim: AdamW's state and the fp32 "
        "master; working: what a sharded step also holds while it computes, at least)"
    )
    return fit_table(console, title, columns, rows)


def traffic_table(console: Console, result: recipe.Recommendation) -> RenderableType:
    rows: list[list[str | Text]] = []
    for a in result.attempts:
        for t in a.traffic:
            sent = cost.human_bytes(t.sent) if t.sent is not None else "–"
            seconds = cost.human_seconds(t.seconds) if t.seconds is not None else t.note
            rows.append([str(a.step), t.level, t.what, t.ops, sent, seconds])
    columns = [
        Column("step", "right"),
        Column("link"),
        Column("what", prose=True),
        Column("ops", prose=True),
        Column("sent", "right"),
        Column("time", "right"),
    ]
    title = (
        "communication per step on each link (ring model, per GPU, summed, not overlapped; AR all-reduce, "
        "AG all-gather, RS reduce-scatter)"
    )
    return fit_table(console, title, columns, rows)


def _gbps(link: cost.Link) -> str:
    return f"{cost.number(link.bandwidth * 8 / 10**9)} Gbps"


# -- JSON -------------------------------------------------------------------------------------------------------
def as_json(description: str, result: recipe.Recommendation) -> dict[str, Any]:

    job = result.job
    c = job.cluster

    def bytes_(value: Fraction | None) -> int | float | None:
        return None if value is None else num(value)

    return {
        "model": {"description": description, "per_module": job.per_module},
        "cluster": {
            "gpu_memory_bytes": num(c.gpu_memory),
            "gpus_per_node": c.gpus_per_node,
            "nodes": c.nodes,
            "intra_bandwidth_bytes_per_s": num(c.intra.bandwidth),
            "inter_bandwidth_bytes_per_s": num(c.inter.bandwidth),
            "limited_inter_node": c.limited,
        },
        "precision": job.precision,
        "available_bytes": num(job.available),
        "steps": [
            {
                "step": a.step,
                "name": a.name,
                "tried": a.tried,
                "layout": None
                if a.layout is None
                else {
                    "description": a.layout.describe(c),
                    "zero_stage": a.layout.stage,
                    "shard": a.layout.shard,
                    "tp": a.layout.tp,
                    "pp": a.layout.pp,
                    "hybrid": a.layout.hybrid,
                    "replicas": a.layout.replicas(c),
                },
                "memory_bytes": {k: num(v) for k, v in a.memory.items()},
                "total_bytes": num(a.total) if a.tried else None,
                "fits": a is result.chosen,
                "largest": a.largest or None,
                "verdict": a.verdict,
                "traffic": [
                    {
                        "level": t.level,
                        "what": t.what,
                        "ops": t.ops,
                        "sent_bytes": bytes_(t.sent),
                        "seconds": bytes_(t.seconds),
                        "note": t.note or None,
                    }
                    for t in a.traffic
                ],
            }
            for a in result.attempts
        ],
        "recommended_step": result.chosen.step if result.chosen else None,
    }
