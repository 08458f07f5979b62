"""The gradient-ready recorder and the storages the collective recorder notes, on the toy under DDP: every
expectation from the toy's structure (three Linear layers, parameters in registration order), not a recording."""

from __future__ import annotations

from checks.probes.grad_ready import DDP_UNIT, READY, ready_order

NAMES = ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]


def test_each_forward_opens_an_iteration_and_each_gradient_is_ready_once(ranks) -> None:
    log = ranks("ddp_grad_ready")[0]["ready"]
    forwards = log.select("root_pre_forward")
    assert [(e.unit, e.iteration) for e in forwards] == [(DDP_UNIT, 1), (DDP_UNIT, 2)]
    for iteration in (1, 2):
        ready = log.select("post_backward", iteration=iteration)
        assert sorted(e.unit for e in ready) == sorted(NAMES) and {e.detail for e in ready} == {READY}
        assert sorted(ready_order(log, iteration)) == list(range(6))
        # the output layer's gradients are computed first, the first layer's last
        assert {ready_order(log, iteration)[i] for i in (0, 1)} == {4, 5}
        assert {ready_order(log, iteration)[i] for i in (4, 5)} == {0, 1}
    assert log.completed_iterations == 2


def test_ready_ticks_share_the_clock_with_the_all_reduce(ranks) -> None:
    values = ranks("ddp_grad_ready")[0]
    log, comm = values["ready"], values["comm"]
    for iteration in (1, 2):
        # one bucket (the toy is 392 bytes): its all-reduce is issued after every gradient of the step is ready
        ready = [e.seq for e in log.select("post_backward", iteration=iteration)]
        forward = log.select("root_pre_forward", iteration=iteration)[0].seq
        reduces = [c.seq for c in comm.select("all_reduce") if forward < c.seq]
        assert forward < min(ready) and max(ready) < reduces[0]


def test_the_all_reduced_storage_is_the_gradients_with_bucket_views(ranks) -> None:
    values = ranks("ddp_grad_ready")[0]
    last = values["comm"].select("all_reduce")[-1]
    assert len(last.storages) == 1 and last.storages[0] != 0
    assert set(values["grad_storages"]) == {last.storages[0]}
