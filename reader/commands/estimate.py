"""``fsdp-readings estimate``: memory per GPU by category, bytes and seconds of communication per step, and the
cost of a run, for every data-parallel strategy, from `checks.models.cost`; ``--seeds`` prints the seeds' figures
recomputed (`checks.models.seed_figures`); ``--budget`` refuses a plan over budget (exit 1), with the arithmetic.

The model is a parameter count (``7B``) or a real ``nn.Module`` built on the meta device (no memory, no RNG):
``--model mini_gpt:grammar`` (a preset, wrapped root + one unit per block as the guides wrap it) or
``--model package.module:callable`` (any callable returning a module; ``--units`` names the submodules that
become FSDP units). Per-module sizes give the exact per-rank bytes guide 13 measured, padding included.
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from typing import Any

from rich.console import Console, RenderableType
from rich.text import Text

from checks.models import cost
from checks.models.cost import PRECISIONS, STRATEGIES, Estimate, Plan, PlanError
from checks.models.seed_figures import figure_1, figures, zero_table
from checks.models.zero_memory import OPTIMIZERS, Param
from reader.commands import recommend as recommend_command
from reader.commands.job_inputs import InputError, Model, links, model_of, num
from reader.format.errors import CommandProblem
from reader.study.session import CLEAN, DRIFT
from reader.views.fit import Column, fit_table, indented
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings estimate 7B --world-size 8                      # every strategy, fp32 Adam
  fsdp-readings estimate 7B -n 8 --precision mixed --strategy zero1 --strategy zero2
  fsdp-readings estimate --model mini_gpt:grammar -n 4          # per-module sizes, padding included
  fsdp-readings estimate --model mypkg.models:build --units 'layers.*' -n 16 --nodes 2 --bandwidth-gbps 200
  fsdp-readings estimate 500k -n 2 --price-per-gpu-hour 0.35 --hours 3 --budget 3.00   # exit 1 if over
  fsdp-readings estimate --seeds                                # the seeds' figures and the ZeRO paper's Figure 1
  fsdp-readings estimate 7B -n 8 --json
  fsdp-readings estimate --recommend 7B -n 8 --gpu-memory-gb 80 --precision mixed   # seed 001's recipe; 1 if none fits
  fsdp-readings estimate --recommend --model mini_gpt:gpt-100b -n 256 --nodes 32 --gpu-memory-gb 80 \
      --intra-bandwidth-gbps 7200 --bandwidth-gbps 400 --precision mixed --tokens 8192

bytes are decimal (1 GB = 10^9 B); memory is what a GPU holds between steps (activations and the all-gathered
unit come on top); communication time is the ring's 2(N-1)·τ + bytes·β per collective, summed, not overlapped.
exit: 0 ok, 1 over budget (or, with --recommend, nothing fits), 2 bad input"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("params", nargs="?", metavar="PARAMS", help="a parameter count: 7B, 7e9, 500k, 7000000000")
    parser.add_argument("--model", metavar="MODULE:CALLABLE", help="mini_gpt:PRESET, or a callable returning a module")
    parser.add_argument(
        "--units",
        action="append",
        metavar="PATTERN",
        default=None,
        help="submodules that become units, per dotted component ('blocks.*'); repeatable; "
        "default for mini_gpt: blocks.*, otherwise the root alone",
    )
    parser.add_argument("-n", "--world-size", type=int, default=8, metavar="N", help="GPUs (default: 8)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes the GPUs are spread over (default: 1)")
    parser.add_argument(
        "--strategy",
        action="append",
        metavar="NAME",
        default=None,
        help=f"repeatable; default: all of {', '.join(STRATEGIES)}",
    )
    parser.add_argument("--precision", default="fp32", metavar="P", help=f"{' or '.join(PRECISIONS)} (default fp32)")
    parser.add_argument(
        "--optimizer",
        default="adamw",
        metavar="NAME",
        help=f"the optimizer whose state is held: {', '.join(OPTIMIZERS)} (default adamw)",
    )
    parser.add_argument(
        "--optimizer-bytes",
        metavar="K",
        default=None,
        help="optimizer bytes per parameter, master copy included, for a count (default: --optimizer's; AdamW 8, "
        "12 mixed)",
    )
    parser.add_argument(
        "--bandwidth-gbps",
        default="100",
        metavar="G",
        help="the link the ring crosses between nodes (or the only one), Gbit/s (default 100)",
    )
    parser.add_argument("--latency-us", default="5", metavar="T", help="its per-step latency τ, µs (default 5)")
    parser.add_argument("--intra-bandwidth-gbps", default=None, metavar="G", help="inside a node, if different")
    parser.add_argument("--intra-latency-us", default="0", metavar="T", help="inside a node (default 0)")
    parser.add_argument("--price-per-gpu-hour", default=None, metavar="P", help="dollars per GPU-hour")
    parser.add_argument("--hours", default=None, metavar="H", help="hours the job runs, setup included")
    parser.add_argument("--budget", default=None, metavar="B", help="ceiling in dollars: over it, exit 1")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--seeds", action="store_true", help="the seeds' figures, recomputed, and Figure 1")
    recommend_command.configure(parser)


def plans(args: argparse.Namespace, model: Model) -> list[Plan]:
    names = [cost.strategy_name(s) for s in args.strategy] if args.strategy else list(STRATEGIES)
    link, intra = links(args)
    k = cost.exact(args.optimizer_bytes, "--optimizer-bytes") if args.optimizer_bytes is not None else None
    price = cost.exact(args.price_per_gpu_hour, "--price-per-gpu-hour") if args.price_per_gpu_hour else None
    hours = cost.exact(args.hours, "--hours") if args.hours else None
    if args.budget is not None and (price is None or hours is None):
        raise InputError("--budget needs --price-per-gpu-hour and --hours")
    return [
        Plan(
            model.params,
            args.world_size,
            name,
            nodes=args.nodes,
            precision=args.precision,
            optimizer_bytes=k,
            optimizer=args.optimizer,
            link=link,
            intra_link=intra,
            price_per_gpu_hour=price,
            hours=hours,
        )
        for name in names
    ]


# -- run --------------------------------------------------------------------------------------------------------------
@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    out: dict[str, Any] = {}
    try:
        if args.seeds:
            out["seeds"] = seeds_json()
            if not args.json:
                print_seeds(console)
            if args.params is None and args.model is None:
                return _finish(args, console, out, CLEAN)
        if args.recommend:
            code, doc = recommend_command.run(args, console)
            out.update(recommend=doc)
            return _finish(args, console, out, CLEAN if code == 0 else DRIFT)
        model = model_of(args)
        estimates = [cost.estimate(plan) for plan in plans(args, model)]
        verdict = cost.budget(estimates[0].plan, args.budget) if args.budget is not None else None
    except PlanError as exc:  # a plan the cost model refuses, found in checks/: broken input to this command
        raise CommandProblem(str(exc)) from None
    code = CLEAN if verdict is None or verdict.ok else DRIFT
    out.update(estimates_json(model, estimates, verdict))
    if not args.json:
        print_estimates(console, model, estimates, verdict)
    return _finish(args, console, out, code)


def _finish(args: argparse.Namespace, console: Console, out: dict[str, Any], code: int) -> int:
    if args.json:
        console.print(json.dumps(out, indent=2, ensure_ascii=False), markup=False, highlight=False, soft_wrap=True)
    return code


# -- tables ---------------------------------------------------------------------------------------------------------
def print_estimates(console: Console, model: Model, estimates: list[Estimate], verdict: cost.Budget | None) -> None:
    plan = estimates[0].plan
    link = plan.ring_link
    header = (
        f"{model.description}: Ψ = {plan.psi:,} · {plan.world_size} GPUs on {plan.nodes} "
        f"node{'s' if plan.nodes != 1 else ''} · {plan.precision} · ring link "
        f"{cost.number(link.bandwidth * 8 / 10**9)} Gbps, τ {cost.human_seconds(link.latency)}"
    )
    console.print(Text(header, style="bold"), soft_wrap=False)
    if isinstance(plan.params, tuple):
        console.print(units_table(console, plan.params), soft_wrap=False)
    console.print(memory_table(console, estimates), soft_wrap=False)
    console.print(comm_table(console, estimates), soft_wrap=False)
    exact = isinstance(plan.params, tuple)
    console.print(
        Text(
            "per module: zero_memory's exact per-rank bytes (padding, AdamW step scalars), on the fullest rank"
            if exact
            else "a parameter count: the closed form (no padding, no step scalars); --model gives the exact bytes",
            style="dim",
        ),
        soft_wrap=False,
    )
    if estimates[0].cost is not None:
        if verdict is not None:
            style = "green" if verdict.ok else "bold red"
            console.print(Text.assemble(("budget: ", style), verdict.arithmetic()), soft_wrap=False)
        else:
            c = estimates[0].cost
            console.print(
                f"cost: {plan.world_size} GPUs × {cost.dollars(plan.price_per_gpu_hour)}/GPU-hour × "  # type: ignore[arg-type]
                f"{cost.number(plan.hours)} h = {cost.dollars(c)}",
                soft_wrap=False,
            )  # type: ignore[arg-type]


def units_table(console: Console, params: tuple[Param, ...]) -> RenderableType:
    from checks.models.zero_memory import units

    rows = []
    for unit, members in units(params).items():
        numel = sum(p.numel for p in members)
        rows.append([unit, str(len(members)), f"{numel:,}", cost.human_bytes(4 * numel)])
    columns = [Column("unit"), *(Column(c, "right") for c in ("tensors", "elements", "fp32"))]
    return fit_table(console, "units (per-module sizes, built on meta)", columns, rows)


def memory_table(console: Console, estimates: list[Estimate]) -> RenderableType:
    rows: list[list[str | Text]] = []
    for e in estimates:
        m = e.memory.by_category
        rows.append(
            [
                e.plan.strategy,
                cost.human_bytes(m["params"]),
                cost.human_bytes(m["grads"]),
                cost.human_bytes(m["optim"] + m["master"]),
                Text(cost.human_bytes(e.memory.total), style="bold"),
                _ratio(e.of_ddp),
            ]
        )
    columns = [Column("strategy"), *(Column(c, "right") for c in ("params", "grads", "optim", "total", "× DDP"))]
    title = "memory per GPU between steps (optim: the K bytes, an fp32 master included)"
    return fit_table(console, title, columns, rows)


def comm_table(console: Console, estimates: list[Estimate]) -> RenderableType:
    short = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "broadcast": "BC"}
    rows: list[list[str | Text]] = []
    for e in estimates:
        ops = e.comm.volume.by_op()
        rows.append(
            [
                e.plan.strategy,
                " ".join(f"{v['count']}{short[k]}" for k, v in ops.items()),
                cost.human_bytes(e.comm.ring_bytes),
                cost.human_seconds(e.comm.latency),
                Text(cost.human_seconds(e.comm.time), style="bold"),
            ]
        )
    columns = [Column("strategy"), *(Column(c, "right") for c in ("ops", "sent", "latency", "time"))]
    title = (
        "communication per step (ring model, per rank; ops: AR all-reduce, AG all-gather, RS reduce-scatter, "
        "BC broadcast)"
    )
    return fit_table(console, title, columns, rows)


def _ratio(value: Fraction) -> str:
    return cost.number(value) if (value * 10**5).denominator == 1 else f"≈{float(value):.4f}"


SEEDS = (
    "The seeds are the course documents this suite serves, written in Spanish and not shipped here ("
    "`fsdp-readings glossary seeds`): why distribute, data parallel with ZeRO and FSDP, the ring all-reduce with "
    "its strategy table, ZeRO-1/2/3 from scratch. Each figure below is one of theirs, as they state it, then "
    "checked."
)


def print_seeds(console: Console) -> None:
    console.print(indented(SEEDS, console.width, indent=""), soft_wrap=False)
    rows: list[list[str | Text]] = []
    for f in figures():
        rows.append(
            [
                f"{f.seed} · {f.quantity}",
                Text.assemble((f.seed_says, "bold"), f"\n{f.convention}"),
                Text.assemble(f"{_value(f.exact, f.unit)} ", (f.verdict, _VERDICT[f.verdict])),
                Text.assemble((_value(f.corrected, f.unit), "bold"), f"\n{f.corrected_convention}"),
                Text(f.note or "", style="dim"),
            ]
        )
    columns = [
        Column("figure", prose=True),
        Column("seed says", prose=True),
        Column("exact"),
        Column("corrected", prose=True),
        Column("note", prose=True),
    ]
    title = (
        "the seeds' figures: what the seed says (in its convention), the exact value in that convention, and the "
        "corrected or other-convention value"
    )
    console.print(fit_table(console, title, columns, rows), soft_wrap=False)
    stages = zero_table()
    for which, label in ((1, "fp32 Adam (4+4+8)"), (2, "mixed precision (2+2+12)")):
        rows = []
        for stage in stages:
            by = stage[which]
            total = sum(by.values())
            rows.append([stage[0], *(cost.number(v) for v in (by["params"], by["grads"], by["optim"] + by["master"]))])
            rows[-1].append(cost.number(total))
        columns = [Column("stage"), *(Column(c, "right") for c in ("params", "grads", "optim", "total"))]
        title = f"seed 002's table: 7B on 8 GPUs, GB per GPU, {label}"
        console.print(fit_table(console, title, columns, rows), soft_wrap=False)
    rows = [[name, said, f"{cost.number(value)} GB"] for name, said, value in figure_1()]
    columns = [Column("stage"), Column("paper", "right"), Column("exact", "right")]
    title = "ZeRO paper, Figure 1: Ψ = 7.5B, K = 12, N = 64, GB per GPU"
    console.print(fit_table(console, title, columns, rows), soft_wrap=False)


def _value(value: Fraction, unit: str) -> str:
    return cost.dollars(value) if unit == "$" else f"{cost.number(value)} {unit}"


_VERDICT = {"exact": "green", "rounded": "yellow", "differs": "red"}


# -- JSON -------------------------------------------------------------------------------------------------------------


def seeds_json() -> dict[str, Any]:
    return {
        "figures": [
            {
                "seed": f.seed,
                "quantity": f.quantity,
                "seed_says": f.seed_says,
                "convention": f.convention,
                "exact": num(f.exact),
                "verdict": f.verdict,
                "corrected": num(f.corrected),
                "corrected_convention": f.corrected_convention,
                "unit": f.unit,
                "note": f.note,
            }
            for f in figures()
        ],
        "zero_table_gb": {
            name: {"fp32": {c: num(v) for c, v in fp32.items()}, "mixed": {c: num(v) for c, v in mixed.items()}}
            for name, fp32, mixed in zero_table()
        },
        "figure_1_gb": {name: {"paper": said, "exact": num(value)} for name, said, value in figure_1()},
    }


def estimates_json(model: Model, estimates: list[Estimate], verdict: cost.Budget | None) -> dict[str, Any]:
    plan = estimates[0].plan
    out: dict[str, Any] = {
        "model": {"description": model.description, "psi": plan.psi, "per_module": isinstance(plan.params, tuple)},
        "plan": {
            "world_size": plan.world_size,
            "nodes": plan.nodes,
            "precision": plan.precision,
            "ring_link": {
                "bandwidth_bytes_per_s": num(plan.ring_link.bandwidth),
                "latency_s": num(plan.ring_link.latency),
            },
        },
        "strategies": {},
    }
    if isinstance(plan.params, tuple):
        from checks.models.zero_memory import units

        out["model"]["units"] = {u: sum(p.numel for p in m) for u, m in units(plan.params).items()}
    for e in estimates:
        out["strategies"][e.plan.strategy] = {
            "label": e.plan.rule.label,
            "memory_bytes": {c: num(v) for c, v in e.memory.by_category.items()},
            "total_bytes": num(e.memory.total),
            "padding_bytes": e.memory.padding,
            "rank": e.memory.rank,
            "of_ddp": num(e.of_ddp),
            "comm": {
                "collectives": e.comm.volume.by_op(),
                "logical_bytes": e.comm.volume.logical,
                "ring_bytes_per_rank": num(e.comm.ring_bytes),
                "time_s": num(e.comm.time),
                "latency_s": num(e.comm.latency),
            },
        }
    if estimates[0].cost is not None:
        out["cost_dollars"] = num(estimates[0].cost)
    if verdict is not None:
        out["budget"] = {
            "ceiling": num(verdict.ceiling),
            "cost": num(verdict.cost),
            "left": num(verdict.left),
            "ok": verdict.ok,
            "arithmetic": verdict.arithmetic(),
        }
    return out
