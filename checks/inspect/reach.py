"""What the user's model, unwrapped, did with one batch on each rank, and which strategies can take it. Torch-free.

Before any strategy runs, every rank runs one forward and backward of the plain model on its own batch and
records which modules ran, which of them returned a tensor that needs a gradient (only those get FSDP's
pre-backward hook), and which parameters got a gradient (`checks.inspect.measure.reach_of`). One
``all_gather_object`` (the same call on every rank) gives every rank the whole picture, so every rank refuses,
or none does: a refusal here is what keeps the tool from issuing a collective some ranks never reach.

A parameter is *frozen* when it does not require a gradient (LoRA's base weights); *unreached* when it requires
one and gets none on some rank (an expert no token of that rank's batch reached). What each strategy does with
them, from the source (torch 2.13.0):

- DDP builds its reducer over the parameters that require a gradient (``_build_params_for_reducer``,
  ``nn/parallel/distributed.py`` 1523-1551): a frozen parameter has no bucket. Without
  ``find_unused_parameters``, a parameter that requires a gradient and gets none leaves its bucket unreduced and
  the next forward raises; with it, the reducer marks such parameters ready itself.
- FSDP1 (``use_orig_params=True``) flattens frozen and trained parameters together; the flat parameter gets one
  gradient when any view of it does (its ``AccumulateGrad`` hook is the post-backward hook), and a unit whose flat
  parameter gets none issues no reduce-scatter. A unit some ranks run and others do not issues its all-gather on
  some ranks only.
- FSDP2 reduce-scatters, per group, the parameters that got a gradient on this rank (``post_backward``,
  ``_fsdp_param_group.py``): ranks that disagree on that set issue reduce-scatters of different sizes.
- The reference ZeRO stages (`checks.zero`) reduce a group when all its parameters' gradients are in; they leave
  frozen parameters out of their groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from checks.naming import ROOT

FSDP_STRATEGIES = ("full-shard", "shard-grad-op", "no-shard", "fsdp2", "fsdp2-default", "fsdp2-no-reshard")
DDP_STRATEGIES = ("ddp", "torch-zero")
REFERENCE_STRATEGIES = ("zero1", "zero2", "zero3")
SHOWN = 4  # names listed in a message before "and N more"


@dataclass(frozen=True)
class RankReach:
    """One rank's forward and backward of the plain model: module paths that ran, those whose output needs a
    gradient, parameter names that got one, and the modules whose output the model returns unchanged."""

    ran: frozenset[str]
    grad_output: frozenset[str]
    grads: frozenset[str]
    returned_by: tuple[str, ...] = ()  # modules whose output tensor the model returns as it is, in forward order

    def as_json(self) -> dict[str, list[str]]:
        return {"ran": sorted(self.ran), "grad_output": sorted(self.grad_output), "grads": sorted(self.grads),
                "returned_by": list(self.returned_by)}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Mapping[str, Sequence[str]]) -> RankReach:
        return cls(frozenset(doc["ran"]), frozenset(doc["grad_output"]), frozenset(doc["grads"]),
                   tuple(doc.get("returned_by", ())))  # fmt: skip


@dataclass(frozen=True)
class Reach:
    """Every rank's `RankReach`, rank 0 first, and the parameters that require a gradient."""

    ranks: tuple[RankReach, ...]
    trainable: frozenset[str]

    def everywhere(self, field: str) -> frozenset[str]:
        sets = [getattr(r, field) for r in self.ranks]
        return frozenset.intersection(*sets)

    def anywhere(self, field: str) -> frozenset[str]:
        sets = [getattr(r, field) for r in self.ranks]
        return frozenset.union(*sets)

    def unreached(self) -> list[str]:
        """Parameters that require a gradient and miss it on some rank, in name order."""
        return sorted(self.trainable - self.everywhere("grads"))

    def differing(self, field: str) -> list[str]:
        """Names in ``field`` on some ranks but not all."""
        return sorted(self.anywhere(field) - self.everywhere(field))

    def where(self, field: str, name: str) -> list[int]:
        return [rank for rank, r in enumerate(self.ranks) if name in getattr(r, field)]


def names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown if len(items) <= SHOWN else f"{shown} and {len(items) - SHOWN} more"


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def within(name: str, unit_path: str) -> bool:
    return unit_path in ("", name) or name.startswith(unit_path + ".")


def owner(name: str, units: Sequence[str]) -> str:
    """The unit that holds parameter or module ``name``: the innermost unit path prefixing it (units given as
    paths, "" for the root)."""
    best = ""
    for path in units:
        if path and within(name, path) and len(path) > len(best):
            best = path
    return best


@dataclass(frozen=True)
class Refusal:
    """Why a strategy cannot take the model: a stable kebab-case ``reason`` (tests and ``--json`` read it) and the
    message for the user, with what to do."""

    reason: str
    message: str


def refusal(reach: Reach, strategy: str, unit_params: Mapping[str, Sequence[str]], *,
            find_unused_parameters: bool = False) -> Refusal | None:  # fmt: skip
    """Why ``strategy`` cannot take this model and batch, in the user's terms with what to do, or None.
    ``unit_params``: each unit's path ("" the root) and the parameters it holds, by full name (FSDP's units, the
    reference stages' groups; empty under DDP)."""
    unreached = reach.unreached()
    if strategy in DDP_STRATEGIES:
        if unreached and not find_unused_parameters:
            per_rank = [(rank, sorted(reach.trainable - r.grads)) for rank, r in enumerate(reach.ranks)]
            where = "; ".join(f"rank {rank}: {names(missing)}" for rank, missing in per_rank if missing)
            return Refusal("no-gradient-under-ddp", f"{len(unreached)} parameter(s) that require a gradient got "
                           f"none ({where}). DDP without find_unused_parameters waits for them and raises at the "
                           "next forward: rerun with --find-unused-parameters, or freeze them "
                           "(requires_grad_(False))")  # fmt: skip
        return None
    gathered = strategy in FSDP_STRATEGIES or strategy == "zero3"  # all-gathers a unit in its forward
    differing_runs = [path for path in reach.differing("ran") if path in unit_params and path != "" and gathered]
    if differing_runs:
        path = differing_runs[0]
        return Refusal("unit-runs-on-some-ranks", f"unit {path} runs its forward on "
                       f"{_ranks(reach.where('ran', path))} and not on the others, so its all-gather would be "
                       "issued on some ranks only: the collectives would pair with another unit's, or hang. Make "
                       "the modules that only some ranks run part of a unit every rank runs (wrap their parent, "
                       "not them), or run every one on every rank")  # fmt: skip
    if strategy in REFERENCE_STRATEGIES and unreached:
        return Refusal("no-gradient-under-reference-zero", f"{len(unreached)} parameter(s) that require a "
                       f"gradient got none on some rank ({names(unreached)}); the reference ZeRO stages reduce a "
                       "group when all of its gradients are in, so that group would never be reduced: freeze "
                       "them, or inspect FSDP or DDP")  # fmt: skip
    for path, params in unit_params.items():
        with_grad = [[p for p in params if p in r.grads] for r in reach.ranks]
        if strategy in FSDP_STRATEGIES[3:]:  # FSDP2: the set of parameters reduced must agree
            if any(g != with_grad[0] for g in with_grad):
                odd = sorted(set().union(*map(set, with_grad)) - set.intersection(*map(set, with_grad)))
                return Refusal("gradient-on-some-ranks-fsdp2", f"unit {path or ROOT}: {names(odd)} get a "
                               "gradient on some ranks only, and FSDP2 reduce-scatters the parameters that have "
                               "one, so the ranks' reduce-scatters would differ in size. Call "
                               "set_reduce_scatter_unused_params(True) on the FSDP modules (it reduce-scatters "
                               "zeros for them), or make every rank reach them")  # fmt: skip
        elif any(bool(g) != bool(with_grad[0]) for g in with_grad):  # FSDP1: one flat gradient, or none
            has = [rank for rank, g in enumerate(with_grad) if g]
            return Refusal("gradient-on-some-ranks-fsdp1", f"unit {path or ROOT} gets a gradient on "
                           f"{_ranks(has)} only, and FSDP1 reduce-scatters a unit's flat gradient only where it "
                           "has one: the ranks' collectives would not match. Make every rank reach the unit, or "
                           "wrap it with modules every rank uses")  # fmt: skip
    return None
