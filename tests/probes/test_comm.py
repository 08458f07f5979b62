"""The collective recorder: every API name, every wrapper's training step, and the unrecorded-collective detector,
each against sizes computed here from the call or the toy's shapes (`probe_spec`), never from a recording."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest

from checks.naming import ROOT
from checks.probes.comm import Collective, CommLog
from checks.probes.crosscheck import BackendEvent, compare
from checks.ranks.protocol import Patch
from tests.probes.probe_spec import FP32, expected_comm, flat_numel, ring_bytes, theta


def _api_expectations(n: int) -> dict[str, list[tuple[str, int, str]]]:
    """(op, full payload elements, API name) each call must be recorded as, from the call's own arguments."""
    obj = len(pickle.dumps(0))  # all_gather_object pickles each rank's int: sizes first (int64), then bytes
    return {
        "all_reduce": [("all_reduce", 6, "all_reduce")],
        "all_reduce_coalesced": [("all_reduce", 8, "all_reduce_coalesced")],
        "async all_reduce": [("all_reduce", 6, "all_reduce")],
        "all_gather_single": [("all_gather", 4 * n, "all_gather_single")],
        "all_gather_into_tensor": [("all_gather", 4 * n, "all_gather_into_tensor")],
        "_all_gather_base": [("all_gather", 4 * n, "_all_gather_base")],
        "from-imported all_gather_single": [("all_gather", 4 * n, "all_gather_single")],
        "from-imported all_gather_into_tensor": [("all_gather", 4 * n, "all_gather_into_tensor")],
        "all_gather (list)": [("all_gather", 4 * n, "all_gather")],
        "all_gather_coalesced": [("all_gather", 8 * n, "all_gather_coalesced")],
        "coalescing manager all_gather": [("all_gather", 8 * n, "_coalescing_manager")],
        "reduce_scatter_single": [("reduce_scatter", 2 * n, "reduce_scatter_single")],
        "reduce_scatter_tensor": [("reduce_scatter", 2 * n, "reduce_scatter_tensor")],
        "_reduce_scatter_base": [("reduce_scatter", 2 * n, "_reduce_scatter_base")],
        "reduce_scatter (list)": [("reduce_scatter", 2 * n, "reduce_scatter")],
        "coalescing manager reduce_scatter": [("reduce_scatter", 8 * n, "_coalescing_manager")],
        "broadcast": [("broadcast", 6, "broadcast")],
        "barrier": [("barrier", 0, "barrier")],
        "all_gather_object": [("all_gather", n, "all_gather_object"), ("all_gather", obj * n, "all_gather_object")],
        "funcol all_reduce": [("all_reduce", 6, "funcol.all_reduce")],
        "funcol all_gather_tensor": [("all_gather", 4 * n, "funcol.all_gather_tensor")],
        # an operator with an autograd formula: its forward all-gather, then the reduce-scatter of its backward
        "funcol all_gather_tensor_autograd": [
            ("all_gather", 4 * n, "funcol.all_gather_tensor_autograd"),
            ("reduce_scatter", 4 * n, "funcol.all_gather_into_tensor_backward"),
        ],
        "funcol reduce_scatter_tensor": [("reduce_scatter", 2 * n, "funcol.reduce_scatter_tensor")],
        "DTensor full_tensor": [("all_gather", 12 * n, "funcol.all_gather_single")],
    }


def _check_api_records(per_rank: list[dict[str, object]], n: int, cases: list[str]) -> None:
    expected = _api_expectations(n)
    for name in cases:
        logs = [values[name] for values in per_rank]
        assert all(isinstance(log, CommLog) for log in logs), f"{name}: {logs[0]}"
        log = logs[0]
        got = [(r.op, r.numel, r.api) for r in log]
        assert got == expected[name], f"{name}: recorded {got}, expected {expected[name]}"
        for r in log:
            element = {"torch.float32": 4, "torch.int64": 8, "torch.uint8": 1, "": 0}[r.dtype]  # "": barrier
            assert r.nbytes == r.numel * element
            assert r.ring_bytes == (0 if r.op == "barrier" else ring_bytes(r.op, r.nbytes, n))
            assert r.group_size == n and r.group_ranks == tuple(range(n))
            assert r.object_collective == (name == "all_gather_object")
            assert r.backend == "gloo"
        assert log.crosscheck is not None and log.crosscheck.ok, log.crosscheck.explain()
        assert log.crosscheck.observed, f"{name}: the backend showed no events at all"
        assert all(other.keys() == log.keys() for other in logs), f"{name}: ranks recorded differently"


def test_every_collective_api_is_recorded_once_with_its_full_payload(ranks) -> None:
    values = ranks("api_coverage")
    _check_api_records(values, 2, list(_api_expectations(2)))
    first = values[0]
    assert first["async all_reduce"][0].async_op and not first["all_reduce"][0].async_op
    assert first["DTensor full_tensor"][0].caller.startswith("torch.distributed.tensor.")
    assert first["all_gather_single"][0].caller == "tests.probes.on_ranks:_api_cases.<locals>.<lambda>"


@pytest.mark.world_size(4)
def test_four_ranks_list_reduce_scatter_and_coalesced_forms(ranks) -> None:
    """At N=4 gloo runs a list reduce-scatter as 4 all-reduces of S/4: the cross-check's model must hold there."""
    cases = ["reduce_scatter (list)", "coalescing manager reduce_scatter", "all_gather_single", "all_reduce"]
    _check_api_records(ranks("api_coverage", world_size=4, cases=cases), 4, cases)


STEPS = [
    pytest.param("ddp", {}, id="ddp"),
    pytest.param("fsdp1", {"strategy": "FULL_SHARD"}, id="fsdp1-full_shard"),
    pytest.param("fsdp1", {"strategy": "SHARD_GRAD_OP"}, id="fsdp1-shard_grad_op"),
    pytest.param("fsdp1", {"strategy": "NO_SHARD"}, id="fsdp1-no_shard"),
    pytest.param("fsdp2", {}, id="fsdp2"),
    pytest.param("zero", {}, id="zero"),
]
APIS = {  # the Python API each wrapper goes through in torch 2.13 ("<C++>": DDP's reducer)
    "ddp": {"all_reduce": "<C++>"},
    "fsdp1": {"all_gather": "all_gather", "reduce_scatter": "reduce_scatter_single", "all_reduce": "all_reduce"},
    "fsdp2": {"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single"},
    "zero": {"all_reduce": "<C++>", "broadcast": "broadcast"},
}


@pytest.mark.parametrize(("kind", "options"), STEPS)
def test_training_step_comm_matches_spec(ranks, kind: str, options: dict[str, str]) -> None:
    n = 2
    steps = ranks("step_probes", kind=kind, **options)
    logs = [s.comm for s in steps]
    expected = expected_comm(kind, n, **options)
    log = logs[0]
    assert [(r.op, r.numel) for r in log] == expected
    assert all(r.dtype == "torch.float32" and r.nbytes == r.numel * FP32 for r in log)
    assert [r.ring_bytes for r in log] == [ring_bytes(op, numel * FP32, n) for op, numel in expected]
    for r in log:
        assert r.api == APIS[kind][r.op]
    assert log.ring_bytes() == sum(ring_bytes(op, numel * FP32, n) for op, numel in expected)
    assert all(other.keys() == log.keys() for other in logs), "ranks recorded different collectives"
    assert log.crosscheck is not None and log.crosscheck.ok, log.crosscheck.explain()


def test_ddp_ratio_is_one_and_fsdp1_full_shard_counts_the_kept_root(ranks) -> None:
    """Ring bytes per rank over |θ|·4 at N=2: DDP 2(N−1)/N = 1; FSDP1 FULL_SHARD (3|θ|−|root|)/2|θ| when the sizes
    divide (they do at N=2), because the root is not resharded after forward."""
    ddp, fsdp1 = (ranks("step_probes", kind=k)[0].comm for k in ("ddp", "fsdp1"))
    assert ddp.ring_bytes() == theta() * FP32
    root = flat_numel(ROOT, 2)
    assert Fraction(fsdp1.ring_bytes()) / (theta() * FP32) == Fraction(3 * theta() - root, 2 * theta())


@pytest.mark.parametrize("how", ["backend", "inference"])
def test_unrecorded_collective_is_caught(ranks, how: str) -> None:
    """A call on the backend object skips the dispatcher; ``inference_mode`` skips the Autograd key the recorder's
    kernels sit at. Neither is recorded, and the cross-check must say so (5 elements: the tensor both reduce)."""
    for message in ranks("unwrapped_collective", how=how):
        assert message.startswith("caught:"), message
        assert "ran but not recorded: gloo:all_reduce (5 elements)" in message


def test_collective_from_a_thread_is_recorded(ranks) -> None:
    """The recorder's kernels are process-wide, so a Python thread started in the block is no blind spot."""
    for message in ranks("unwrapped_collective", how="thread"):
        assert message == "missed: recorded 2 collectives and the cross-check passed", message


def test_recorder_follows_a_sabotaged_reduce_scatter(ranks) -> None:
    """Replace torch's reduce_scatter_single (in every module that holds it) by an all-reduce plus a local copy:
    FSDP1's three gradient reductions must show up as all-reduces of the padded flat gradient, at twice the ring
    bytes, called from the replacement."""
    sabotage = Patch("torch.distributed.distributed_c10d:reduce_scatter_single",
                     "tests.probes.on_ranks:reduce_scatter_via_all_reduce")  # fmt: skip
    log = ranks("step_probes", kind="fsdp1", patches=(sabotage,))[0].comm
    assert log.count("reduce_scatter") == 0
    reductions = log.select("all_reduce")
    assert [r.numel for r in reductions] == [flat_numel(u, 2) for u in ("1", "0", ROOT)]
    assert {r.caller for r in reductions} == {
        "tests.probes.on_ranks:reduce_scatter_via_all_reduce.<locals>.replacement"
    }
    assert [r.ring_bytes for r in reductions] == [2 * ring_bytes("reduce_scatter", r.nbytes, 2) for r in reductions]
    assert log.crosscheck is not None and log.crosscheck.ok


# -- the cross-check's model, in-process ---------------------------------------------------------------------------
def _record(op: str, torch_op: str, numel: int, n: int = 4, numels: tuple[int, ...] = ()) -> Collective:
    return Collective(1, op, torch_op, "x", "y", "torch.float32", numel, 4 * numel, 0.0, n, tuple(range(n)), "gloo",
                      numels or (numel,))  # fmt: skip


def test_crosscheck_model_of_gloo() -> None:
    records = [
        _record("reduce_scatter", "c10d::reduce_scatter_", 8),  # list form: 4 all-reduces of 2
        _record("reduce_scatter", "c10d::_reduce_scatter_base_", 8),  # one all-reduce of 8
        _record("reduce_scatter", "c10d::reduce_scatter_tensor_coalesced_", 20, numels=(12, 8)),
        _record("all_gather", "c10d::_allgather_base_", 8),  # this rank's input: 2
    ]
    events = [BackendEvent("gloo", "all_reduce", 2)] * 4 + [
        BackendEvent("gloo", "all_reduce", 8),
        BackendEvent("gloo", "all_reduce", 12),
        BackendEvent("gloo", "all_reduce", 8),
        BackendEvent("gloo", "all_gather", 2),
    ]
    assert compare(records, events, "test").ok
    extra = compare(records, [*events, BackendEvent("gloo", "broadcast", 3)], "test")
    assert [(e.name, e.numel) for e in extra.unrecorded] == [("broadcast", 3)]
    assert "ran but not recorded: gloo:broadcast (3 elements)" in extra.explain()
    missing = compare(records, events[1:], "test")
    assert not missing.ok and len(missing.unseen) == 1 and missing.unseen[0].numel == 2
    unknown = compare([_record("unknown:c10d::new_op", "c10d::new_op", 1)], [], "test")
    assert unknown.unmodelled and not unknown.ok


@pytest.mark.parametrize("world_size", [2, 4])
def test_sends_and_receives_record_their_peer(ranks, world_size: int) -> None:
    """Blocking and batched point-to-point calls name the global rank at their other end; the ring's neighbours
    are computed here, not read from a recording."""
    for rank, recorded in enumerate(ranks("point_to_point_peers", world_size)):
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        blocking = [("send", right, 3), ("recv", left, 3)] if rank % 2 == 0 else [("recv", left, 3), ("send", right, 3)]
        assert recorded == [*blocking, ("send", left, 5), ("recv", right, 5)]
