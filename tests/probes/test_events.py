"""The FSDP event recorder: prefetch orders, reshard/free, hooks, iterations, on FSDP1 and FSDP2, each against an
order derived from the toy's wrap structure (`probe_spec`), plus its coexistence with the runtime evidence."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from checks.models import comm_volume, prefetch
from checks.probes.event_log import EventLog
from checks.probes.expect import assert_sequence
from checks.ranks.protocol import Patch
from checks.workloads.toy import TOY_LAYERS
from tests.probes.probe_spec import POST_FORWARD, ROOT, UNITS, fsdp1_backward, fsdp1_forward

BACKWARD = ("pre_backward", "prefetch", "post_backward")
FORWARD = ("root_pre_forward", "unshard", "prefetch", "free", "reshard")


def forward_part(log: EventLog, iteration: int = 1) -> EventLog:
    """The events of an iteration before its first pre-backward hook."""
    events = log.select(iteration=iteration)
    first = next(i for i, e in enumerate(events) if e.kind == "pre_backward")
    return EventLog(log.rank, log.world_size, events[:first])


def same_on_all_ranks(logs: list[EventLog]) -> EventLog:
    assert all(log.keys() == logs[0].keys() for log in logs), "ranks recorded different event sequences"
    return logs[0]


@pytest.mark.parametrize("policy", ["BACKWARD_PRE", "BACKWARD_POST", None])
def test_fsdp1_backward_prefetch_order(ranks, policy: str | None) -> None:
    log = same_on_all_ranks([s.events for s in ranks("step_probes", kind="fsdp1", backward_prefetch=policy)])
    assert_sequence(log.sequence(BACKWARD, iteration=1), fsdp1_backward(policy), what=f"FSDP1 {policy} backward")
    assert_sequence(forward_part(log).sequence(FORWARD), fsdp1_forward("FULL_SHARD"), what="FSDP1 forward")
    prefetched = {target for _, target in log.prefetches()}
    backward_unshards = [e for e in log.select("unshard") if e.state == "BACKWARD_PRE"]
    # Every unit is all-gathered in backward exactly once, by a prefetch or by its own pre-backward, except the
    # root, which FULL_SHARD kept unsharded after forward.
    gathered = sorted([*prefetched, *(e.unit for e in backward_unshards if e.detail == "all-gather")])
    assert gathered == sorted(UNITS)
    assert [e.detail for e in backward_unshards if e.unit == ROOT] == ["no all-gather"]
    assert [e.kind for e in log][-1] == "final_callback" and log.completed_iterations == 1


def test_fsdp1_shard_grad_op_keeps_everything_unsharded(ranks) -> None:
    log = ranks("step_probes", kind="fsdp1", strategy="SHARD_GRAD_OP")[0].events
    assert_sequence(forward_part(log).sequence(FORWARD), fsdp1_forward("SHARD_GRAD_OP"), what="SHARD_GRAD_OP forward")
    assert all(e.detail == "no all-gather" for e in log.select(("unshard", "prefetch")) if e.state != "FORWARD")
    assert [e.unit for e in log.select("free")] == ["1", "0", ROOT]  # freed in backward, post-backward order


def test_fsdp1_forward_prefetch_starts_in_iteration_two(ranks) -> None:
    """forward_prefetch follows the forward order FSDP recorded in iteration 1: nothing to follow in iteration 1."""
    steps = ranks("step_probes", kind="fsdp1", steps=2, forward_prefetch=True, backward_prefetch=None)
    log = same_on_all_ranks([s.events for s in steps])
    forward_order = [ROOT, *UNITS]
    assert log.completed_iterations == 2 and {e.iteration for e in log} == {1, 2}
    assert log.prefetches(iteration=1) == []
    assert log.prefetches(iteration=2) == list(pairwise(forward_order))
    assert all(e.state == "FORWARD" for e in log.select("prefetch"))


def test_fsdp2_implicit_prefetch_and_late_post_backward(ranks) -> None:
    """FSDP2 prefetches the previous unit in post-forward order from each pre-backward. Its post-backward runs
    through autograd on the module's inputs: unit 1's input comes from unit 0 and requires grad; unit 0's and the
    root's is x, which does not, so theirs run in the root's final callback."""
    log = same_on_all_ranks([s.events for s in ranks("step_probes", kind="fsdp2")])
    expected = [(POST_FORWARD[i], POST_FORWARD[i - 1]) for i in range(len(POST_FORWARD) - 1, 0, -1)]
    assert log.prefetches() == expected
    late = {e.unit: e.detail for e in log.select("post_backward")}
    assert late == {"1": "", ROOT: "from final callback", "0": "from final callback"}
    kinds = [e.kind for e in log]
    assert kinds.index("final_callback") < max(i for i, k in enumerate(kinds) if k == "post_backward")
    assert [e.unit for e in forward_part(log).select("free")] == [*UNITS, ROOT]  # the root reshards too
    assert all(e.api == "fsdp2" for e in log)


def test_fsdp2_explicit_prefetch_lists(ranks) -> None:
    lists = {"forward": {"": ["0", "1"]}, "backward": {"": ["1", "0"]}}
    log = ranks("step_probes", kind="fsdp2", explicit_prefetch=lists)[0].events
    assert forward_part(log).prefetches() == [(ROOT, t) for t in lists["forward"][""]]
    backward = [(e.unit, e.target) for e in log.select("prefetch") if e.state == "PRE_BACKWARD"]
    assert backward == [(ROOT, t) for t in lists["backward"][""]]


def test_recorder_sees_prefetch_sabotaged_away(ranks) -> None:
    """Make FSDP1's ``_get_handle_to_prefetch`` find nothing: BACKWARD_PRE must then record exactly what no
    prefetch records, with each unit all-gathered by its own pre-backward instead."""
    sabotage = Patch("torch.distributed.fsdp._runtime_utils:_get_handle_to_prefetch", "checks.breakit.sabotage:returns")
    log = ranks("step_probes", kind="fsdp1", backward_prefetch="BACKWARD_PRE", patches=(sabotage,))[0].events
    assert log.prefetches() == []
    assert_sequence(log.sequence(BACKWARD), fsdp1_backward(None), what="sabotaged BACKWARD_PRE")
    gathered = [e.unit for e in log.select("unshard") if e.state == "BACKWARD_PRE" and e.detail == "all-gather"]
    assert gathered == ["1", "0"]


TRACED = ("torch.distributed.fsdp._runtime_utils:_pre_backward_hook", "torch.distributed.fsdp._runtime_utils:_reshard")


def test_event_recorder_and_runtime_evidence_watch_the_same_functions(ranks) -> None:
    """The pool's ``watch`` (runtime evidence) marks ``_pre_backward_hook`` for the whole check; the event recorder
    runs the same function through its trampoline inside it, which fires the mark. Both see what ran, and neither
    installs a trace function."""
    values = ranks("events_with_evidence", trace=TRACED)
    assert ranks.last.executed == frozenset(TRACED)
    for value in values:
        assert not value["tracer_during"] and not value["tracer_after"]
        assert value["events"].sequence(BACKWARD) == fsdp1_backward("BACKWARD_PRE")


def test_watch_may_end_before_the_event_recorder(ranks) -> None:
    value = ranks("nested_watch_and_events")[0]
    assert value["seen"] == ["torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup.post_backward"]
    log = value["events"]
    assert log.completed_iterations == 2  # the second backward was recorded after watch had left
    assert len(log.select("post_backward", iteration=2)) == len(log.select("post_backward", iteration=1)) == 3
    assert value["tracer_left"]


# -- a root without parameters: each of the toy's three layers its own unit -----------------------------------------
ALL_LAYERS = ("0", "1", "2")


def _layer_shapes() -> dict[str, list[tuple[int, ...]]]:
    """Each layer unit's parameter shapes, from the toy's layer sizes (weight out×in, bias out); the root none."""
    return {ROOT: [], **{u: [(o, i), (o,)] for u, (i, o) in zip(ALL_LAYERS, TOY_LAYERS, strict=True)}}


def _ops(volume: comm_volume.Volume) -> Counter[tuple[str, int, bool]]:
    return Counter((op.op, op.numel, op.backward) for op in volume.ops)


@pytest.mark.parametrize("policy", ["BACKWARD_PRE", "BACKWARD_POST", None])
def test_fsdp1_root_without_parameters_is_the_models(ranks, policy: str | None) -> None:
    """The FSDP1 models with ``root_params=False``: no root handle, so no root hook event and no root collective;
    FULL_SHARD keeps nothing after forward, so backward all-gathers every unit, the one that produces the output
    too (by its own pre-backward)."""
    steps = ranks("step_probes", kind="fsdp1", units=ALL_LAYERS, backward_prefetch=policy)
    log = same_on_all_ranks([s.events for s in steps])
    expected = prefetch.backward_sequence(ALL_LAYERS, policy, root_params=False)
    assert_sequence(log.sequence(BACKWARD, iteration=1), expected, what=f"FSDP1 {policy}, root without parameters")
    forward = prefetch.forward_sequence(ROOT, ALL_LAYERS, "FULL_SHARD", root_params=False)
    assert_sequence(forward_part(log).sequence(FORWARD), forward, what="FSDP1 forward, root without parameters")
    volume = comm_volume.step("full-shard", _layer_shapes(), 2, root=ROOT, use_orig_params=False)
    recorded = Counter((c.op, c.numel, c.in_backward) for c in steps[0].comm)
    assert recorded == _ops(volume)
    assert sum(op.op == "all_gather" and op.backward for op in volume.ops) == len(ALL_LAYERS)


@pytest.mark.parametrize(("reshard", "strategy"), [(True, "fsdp2"), (False, "fsdp2-no-reshard")])
def test_fsdp2_root_without_parameters_communicates_as_modelled(ranks, reshard: bool, strategy: str) -> None:
    steps = ranks("step_probes", kind="fsdp2", units=ALL_LAYERS, reshard_after_forward=reshard)
    recorded = Counter((c.op, c.numel, c.in_backward) for c in steps[0].comm)
    assert recorded == _ops(comm_volume.step(strategy, _layer_shapes(), 2, root=ROOT))
