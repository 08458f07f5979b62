"""``fsdp-readings inspect MODULE:CALLABLE``: a user's model under the suite's models and probes. The model is
built on the meta device for what needs no run (`checks.inspect.predict`: units, flat-parameter layout, bytes per
rank, collectives, prefetch hooks); then, unless ``--meta``, one FSDP run on the rank pool measures the same
things (`checks.inspect.measure`), and every measured value is printed beside its prediction
(`checks.inspect.compare`). A difference is a finding and is shown as one, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rich.console import Console
from rich.text import Text

from checks.inspect import compare, loading, policy, sharing
from checks.inspect.predict import DDP, Usage, predict
from checks.inspect.reach import RankReach, Reach
from checks.models import cost
from checks.models import wrap as wrap_model
from checks.models.cost import STRATEGIES, Plan, PlanError
from checks.models.zero_memory import OPTIMIZERS
from checks.naming import clean
from reader.commands import estimate as estimate_command
from reader.commands import inspect_views as views
from reader.commands import job_inputs
from reader.format.errors import CommandProblem
from reader.study.session import CLEAN, FAILED
from reader.views.fit import Column, fit_table
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings inspect checks.inspect.examples:transformer --input checks.inspect.examples:transformer_batch \\
      --wrap TransformerEncoderLayer,TransformerDecoderLayer
  fsdp-readings inspect checks.inspect.examples:gpt2 --input checks.inspect.examples:gpt2_batch --wrap GPT2Block -n 4
  fsdp-readings inspect checks.inspect.examples:gpt2_1b --meta --wrap GPT2Block -n 64    # no run: any GPU count

--input names a callable returning one batch (a tensor, a tuple of arguments or a dict of keyword arguments); each
rank calls it under its own seed. The run is on gloo, fp32: FSDP1 (use_orig_params=True) for --strategy
full-shard, shard-grad-op or no-shard; FSDP2 (fully_shard on the modules the policy picks) for fsdp2,
fsdp2-default, fsdp2-no-reshard; DDP for ddp, and with ZeroRedundancyOptimizer for torch-zero (no --wrap: DDP has
no units); guide 13's reference ZeRO stages (checks/zero) for zero1, zero2, zero3, one group per unit the policy
picks (units that do not nest). --meta predicts for every strategy estimate knows.
exit: 0 every measured value is its prediction, 1 a difference (shown), 2 bad input, a model the strategy
cannot take (refused before the run, with what to do), or a run that failed (the rank, what it raised)"""

VIEWS = ("layout", "memory", "timeline")
# Every forward of one step on one rank draws the same random numbers (`checks.inspect.measure.forward`)
SEEDED = "each forward seeded by its rank and step (dropout draws the same masks under every strategy)"
MAX_RUN_PARAMS = 50_000_000  # a run holds a few copies per rank, on this machine's CPU memory


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("model", metavar="MODULE:CALLABLE", help="a callable returning the nn.Module")
    parser.add_argument("--input", metavar="MODULE:CALLABLE", help="a callable returning one batch (runs need it)")
    parser.add_argument("--wrap", default="none", help="none, size[:N], a count (1M), [module:]CLASS[,CLASS], "
                        "transformer:CLASS[,CLASS] (default: none, one unit)")  # fmt: skip
    parser.add_argument("--strategy", default=None, help=f"one of {', '.join(STRATEGIES)} (a run: default "
                        "full-shard; --meta: all by default)")  # fmt: skip
    parser.add_argument("-n", "--world-size", type=int, default=2, help="ranks (a run: 2 or 4)")
    parser.add_argument("--precision", default="fp32", help="fp32 (a run), or mixed with --meta")
    parser.add_argument("--optimizer", default="adamw", choices=sorted(OPTIMIZERS))
    parser.add_argument("--find-unused-parameters", action="store_true", help="ddp and torch-zero: DDP's "
                        "find_unused_parameters=True, for a model whose parameters may get no gradient")  # fmt: skip
    parser.add_argument("--meta", action="store_true", help="no run: what the models predict, then estimate's tables")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the run may take (default 300)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument("--view", action="append", choices=VIEWS, default=[], help="also draw the run's layout "
                        "diagrams, memory over the measured step, or its timeline (repeatable)")  # fmt: skip
    parser.add_argument("--rank", type=int, default=0, help="whose run --view draws (default: rank 0)")


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    """The report; with ``--json`` a refusal or a failure is JSON too: the error, its fix and the exit code."""
    try:
        return _run(args, console)
    except CommandProblem as problem:
        if not args.json:
            raise
        what, *details = problem.message.split("\n")
        doc = {"model": args.model, "error": what, "reason": getattr(problem, "reason", "") or "bad-input",
               "details": "\n".join(details), "fix": problem.fix, "exit": problem.code}  # fmt: skip
        console.print_json(json.dumps(doc))
        return problem.code


def _run(args: argparse.Namespace, console: Console) -> int:
    try:
        meta, shapes, buffers = _structure(args.model)
        trainable = frozenset(clean(n) for n, p in meta.named_parameters() if p.requires_grad)
        spec = _policy(args.wrap, meta)
        tree = _tree(meta)
        from checks.workloads.wrap_policies import model_policy

        strategy = cost.strategy_name(args.strategy or "full-shard")
        if args.meta:
            return _meta_report(args, console, tree, shapes, model_policy=model_policy(spec), strategy=strategy)
        _runnable(args, strategy, shapes, spec)
        static = Usage(trainable=trainable, find_unused_parameters=args.find_unused_parameters)

        def prediction_for(usage: Usage) -> dict[str, Any]:
            return predict(tree, shapes, model_policy(spec), strategy=strategy, world_size=args.world_size,
                           optimizer=args.optimizer, buffers=buffers, usage=usage)  # fmt: skip

        prediction_for(static)  # a model the models cannot take is refused before anything runs
        if why := sharing.refusal(tree, wrap_model.wrap(tree, model_policy(spec)), strategy):
            raise Refused(why.message, why.reason)
    except (loading.LoadError, PlanError, ValueError) as exc:
        if reason := getattr(exc, "reason", None):
            raise Refused(str(exc), reason) from None
        raise CommandProblem(str(exc)) from None
    if not 0 <= args.rank < args.world_size:
        raise CommandProblem(f"--rank {args.rank} is not one of the {args.world_size} ranks",
                             f"give a rank from 0 to {args.world_size - 1}")  # fmt: skip
    measured, captured = _measure(args, spec, strategy)
    prediction = prediction_for(usage_of(measured[0]["reach"], static))

    rows = compare.report(prediction, measured, strategy=strategy, world_size=args.world_size, shapes=shapes,
                          buffers=buffers)  # fmt: skip
    agree = all(row.agrees for row in rows)
    if args.json:
        doc = {"model": args.model, "policy": policy.describe(spec), "strategy": strategy, "forwards": SEEDED,
               "world_size": args.world_size, "agree": agree, "rows": [r.as_json() for r in rows]}  # fmt: skip
        console.print_json(json.dumps(doc))
    else:
        _print_rows(console, args, spec, strategy, rows)
        views.draw(console, args.view, measured[args.rank], captured[args.rank], model=args.model, rank=args.rank)
    return CLEAN if agree else FAILED


def _structure(spec: str) -> tuple[Any, dict[str, tuple[int, ...]], list[Any]]:
    """The model on meta (or, when it cannot be built there, on the CPU, where a factory that raises says why),
    each parameter's shape (a tied one once) and each buffer DDP broadcasts, in ``named_buffers()`` order (a
    shared one once): elements, size, dtype."""
    from checks.models.ddp_buckets import Param

    build, _ = loading.factory(spec, "the model")
    model = loading.build_on_meta_or_cpu(spec, build)
    shapes = {clean(n): tuple(p.shape) for n, p in model.named_parameters()}
    if not shapes:
        raise loading.LoadError(f"{spec} has no parameters: there is nothing to shard")
    buffers = [Param(b.numel(), b.element_size(), str(b.dtype).removeprefix("torch.")) for b in model.buffers()]
    return model, shapes, buffers


def usage_of(reach: list[dict[str, list[str]]], static: Usage) -> Usage:
    """What the unwrapped run every rank made first says the step does (`checks.inspect.reach`): a parameter
    gets a gradient, and a module runs, when it does on some rank (the run refuses a unit some ranks skip)."""
    gathered = Reach(tuple(RankReach.from_json(doc) for doc in reach), static.trainable or frozenset())
    return Usage(static.trainable, gathered.anywhere("grads"), gathered.anywhere("ran"),
                 gathered.anywhere("grad_output"), static.find_unused_parameters,
                 gathered.ranks[0].returned_by)  # fmt: skip


def _policy(text: str, model: Any) -> dict[str, Any] | None:
    from checks.workloads.module_tree import classes_of

    spec = policy.parse_wrap(text)
    available = classes_of(model)
    if unknown := policy.unknown_classes(spec, available):
        raise ValueError(f"--wrap names {', '.join(unknown)}, which no module of the model is; its classes: "
                         f"{', '.join(sorted(available))}")  # fmt: skip
    return spec


def _tree(model: Any) -> Any:
    from checks.workloads.module_tree import tree_of

    return tree_of(model)


def _runnable(args: argparse.Namespace, strategy: str, shapes: dict[str, tuple[int, ...]],
              spec: dict[str, Any] | None) -> None:  # fmt: skip
    if args.input is None:
        raise ValueError("a run needs --input MODULE:CALLABLE (one batch for the model); --meta needs none")
    if args.find_unused_parameters and strategy not in DDP:
        raise ValueError(f"--find-unused-parameters is DDP's option; {strategy} has none: FSDP reduces a unit's "
                         "gradient when its backward runs, used or not")  # fmt: skip
    if strategy in DDP and spec is not None:
        raise ValueError(f"--wrap {args.wrap} picks FSDP units, and {strategy} has none: DDP all-reduces gradient "
                         "buckets; drop --wrap, or pick an FSDP strategy")  # fmt: skip
    if args.world_size not in (2, 4):
        raise ValueError(f"a run takes -n 2 or 4 ranks on this machine, not {args.world_size}; --meta takes any")
    if args.precision != "fp32":
        raise ValueError(f"a run measures fp32, not {args.precision}; --meta predicts {args.precision}")
    total = sum(math.prod(shape) for shape in shapes.values())
    if total > MAX_RUN_PARAMS:
        raise ValueError(f"{args.model} has {total:,} parameters, more than a CPU run here takes "
                         f"({MAX_RUN_PARAMS:,}); use --meta")  # fmt: skip


def _measure(args: argparse.Namespace, spec: dict[str, Any] | None, strategy: str) -> tuple[list[Any], list[Any]]:
    """Every rank's measurements and what each captured (``--view timeline``); `CommandProblem` saying why there
    are none."""
    from checks.ranks.manager import PoolManager
    from checks.ranks.protocol import CheckRequest

    request = CheckRequest("checks.inspect.measure:measure", world_size=args.world_size, timeout=args.timeout,
                           capture="timeline" in args.view,
                           kwargs={"model": args.model, "batch": args.input, "wrap": spec, "strategy": strategy,
                                   "optimizer": args.optimizer,
                                   "find_unused_parameters": args.find_unused_parameters})  # fmt: skip
    manager = PoolManager(timeout=args.timeout)
    try:
        outcome = manager.run(request)
    finally:
        manager.close()
    if outcome.skipped:
        raise CommandProblem(f"the rank pool cannot run here: {outcome.skipped}")
    if outcome.failure:
        own = [r for r in outcome.results if r.error_type in INPUT_ERRORS and r.message]
        if own:
            raise Refused(own[0].message, own[0].reason or "")  # type: ignore[arg-type]
        raise rank_failure(outcome, args, strategy)
    return outcome.values(), [r.captured for r in outcome.results]


class Refused(CommandProblem):
    """A model the strategy cannot take, a batch it rejects, or a run that failed: exit 2 with a stable reason
    (``--json`` gives it)."""

    def __init__(self, message: str, reason: str = "", fix: str = "") -> None:
        super().__init__(message, fix)
        self.reason = reason


def rank_failure(outcome: Any, args: argparse.Namespace, strategy: str) -> Refused:
    """A run that failed for a reason no refusal foresaw: which rank, what it raised (or the signal it died of, or
    that it hung), in one line; the ranks' own report as details; and what to try."""
    failed = outcome.failed
    first = failed[0] if failed else None
    run = f"the {strategy} run of {args.model} on {args.world_size} ranks"
    if first is None:
        what = f"{run} failed"
    elif first.signal:
        what = f"{run}: rank {first.rank} died of {first.signal}"
    elif first.error_type:
        message = (first.message or "").strip().splitlines()
        what = f"{run}: rank {first.rank} raised {first.error_type.removeprefix('builtins.')}" + (
            f": {message[0]}" if message else "")  # fmt: skip
    else:
        what = f"{run}: rank {first.rank} gave no answer within {args.timeout:g} s (a collective some rank never "
        what += "reached, or a step longer than --timeout)"
    fix = ("torch or the model raised this under the strategy, not a prediction: run --strategy ddp to see whether "
           "the model trains without units, --wrap none for one unit, or --meta for what needs no run")  # fmt: skip
    return Refused(f"{what}\n{outcome.failure}", "run-failed", fix)


INPUT_ERRORS = (
    "checks.inspect.measure.BatchRejected",
    "checks.inspect.measure.ModelRefused",
    "checks.inspect.loading.LoadError",
)


def _meta_report(
    args: argparse.Namespace, console: Console, tree: Any, shapes: dict[str, tuple[int, ...]], *,
    model_policy: Any, strategy: str,
) -> int:  # fmt: skip
    """What needs no run: the units and their layouts (FSDP1 at this world size), then estimate's memory and
    communication for the strategy, from the parameters as the units group them."""
    from checks.inspect.predict import ELEMENT_BYTES, parameters, units_of
    from checks.models import wrap as wm
    from checks.models.flat_param import layout

    wrap = wm.wrap(tree, model_policy)
    params = tuple(parameters(wrap, shapes))
    plans = [Plan(params, args.world_size, s, precision=args.precision, optimizer=args.optimizer)
             for s in ([strategy] if args.strategy else STRATEGIES)]  # fmt: skip
    estimates = [cost.estimate(p) for p in plans]
    units = units_of(wrap)
    layouts = {u.name: layout(u.numels, ELEMENT_BYTES, args.world_size) for u in wrap.units if u.params}
    if args.json:
        sizes = {n: {"padded": lay.padded_numel, "padding": lay.padded_numel - sum(lay.numels)}
                 for n, lay in layouts.items()}  # fmt: skip
        model = job_inputs.Model(params, args.model)
        doc = {"model": args.model, "policy": policy.describe(policy.parse_wrap(args.wrap)), "units": units,
               "layout": sizes, **estimate_command.estimates_json(model, estimates, None)}  # fmt: skip
        console.print_json(json.dumps(doc, default=str))
        return CLEAN
    rows = [[u["name"], u["type"], str(len(u["params"])), f"{layouts[u['name']].padded_numel:,}" if u["name"] in
             layouts else "0", f"{layouts[u['name']].padded_numel - sum(n for _, n in u['params']):,}" if u["name"] in
             layouts else "0"] for u in units]  # fmt: skip
    columns = [Column("unit"), Column("class"), *(Column(c, "right") for c in ("tensors", "padded", "padding"))]
    title = f"units of {policy.describe(policy.parse_wrap(args.wrap))}, FSDP1 at {args.world_size} ranks (elements)"
    console.print(fit_table(console, title, columns, rows))
    estimate_command.print_estimates(console, job_inputs.Model(params, args.model), estimates, None)
    return CLEAN


def _text(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _print_rows(console: Console, args: argparse.Namespace, spec: dict[str, Any] | None, strategy: str,
                rows: list[compare.Row]) -> None:  # fmt: skip
    console.print(Text.assemble(("inspect ", "bold"), f"{args.model}: {policy.describe(spec)}, {strategy}, "
                                f"{args.world_size} ranks, fp32, {args.optimizer}; {SEEDED}"),
                  soft_wrap=False)  # fmt: skip
    sections: dict[str, list[compare.Row]] = {}
    for row in rows:
        sections.setdefault(row.section, []).append(row)
    for section, members in sections.items():
        table_rows: list[list[str | Text]] = []
        for row in members:
            verdict = Text("same", style="green") if row.agrees else Text(f"DIFFERS ({row.culprit})", style="bold red")
            notes = [row.note] if any(r.note for r in members) else []
            table_rows.append([row.item, _text(row.predicted), _text(row.measured), verdict, *notes])
        long = any(len(_text(r.predicted)) > 24 for r in members)  # wrap long values, keep short rows one line
        columns = [Column("item"), Column("predicted", prose=long), Column("measured", prose=long), Column(""),
                   *([Column("note", prose=True)] if any(r.note for r in members) else [])]  # fmt: skip
        console.print(fit_table(console, section, columns, table_rows))
    differing = [r for r in rows if not r.agrees]
    if differing:
        console.print(Text(f"{len(differing)} measured value(s) differ from the prediction (the rows marked "
                           "DIFFERS):", style="bold red"))  # fmt: skip
        for culprit, meaning in compare.CULPRITS.items():
            if count := sum(r.culprit == culprit for r in differing):
                console.print(Text(f"  {count} × {culprit}: {meaning}", style="red"))
    else:
        console.print(Text(f"all {len(rows)} measured values are their predictions", style="green"))
