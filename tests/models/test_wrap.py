"""The wrap model: hand-worked trees first (torch-free), then agreement with torch's own walks on real modules and
on drawn trees. torch's ``_auto_wrap`` needs no process group when the wrapper it is given only records what it
wraps (`Recorder`, which takes the parameters no earlier unit took, as ``_get_orig_params`` does); FSDP2's
``_get_managed_modules`` / ``_get_managed_states`` take the set of modules already sharded as a function. The torch
side only checks the model; the model never imports torch (`test_torch_free.py`)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp import wrap as torch_wrap
from torch.distributed.fsdp._fully_shard._fsdp_init import _get_managed_modules, _get_managed_states
from torch.distributed.fsdp._wrap_utils import _auto_wrap

from checks.models import wrap as wm
from checks.naming import ROOT, clean
from checks.workloads.edge import build
from checks.workloads.module_tree import module_paths, tree_of
from checks.workloads.wrap_policies import known_classes, model_policy, torch_policy

P, M = wm.Param, wm.Module


def linear(name: str, i: int, o: int, bias: bool = True) -> wm.Module:
    params = (P("weight", i * o), P("bias", o)) if bias else (P("weight", i * o),)
    return M(name, "Linear", params, bases=("Module",))


def edge_block(name: str) -> wm.Module:
    """`EdgeBlock` by hand: attention 288 (a forced leaf), BatchNorm 16, up 288, down 264."""
    attn = M("attn", "MultiheadAttention", (P("in_proj_weight", 192), P("in_proj_bias", 24)),
             (M("out_proj", "NonDynamicallyQuantizableLinear", (P("weight", 64), P("bias", 8)), bases=("Linear",)),),
             bases=("Module",))  # fmt: skip
    norm = M("norm", "BatchNorm1d", (P("weight", 8), P("bias", 8)), bases=("_BatchNorm", "_NormBase", "Module"))
    return M(name, "EdgeBlock", (), (attn, norm, linear("up", 8, 32), linear("down", 32, 8)))


EDGE = M(
    "",
    "Edge",
    (),
    (
        M("embed", "Embedding", (P("weight", 128),)),
        M("blocks", "ModuleList", (), (edge_block("0"), edge_block("1"))),
        M("head", "Linear", (P("weight", 128, tied_to="embed.weight"),)),
    ),
)


def names(wrap: wm.Wrap) -> list[str]:
    return wrap.names


# -- hand-worked: the size policy ------------------------------------------------------------------------------------
def test_a_threshold_crossed_mid_block() -> None:
    wrap = wm.wrap(EDGE, wm.SizeBased(288))
    assert names(wrap) == ["blocks.0.up", "blocks.0", "blocks.1.up", "blocks.1", ROOT]
    assert wrap.unit("blocks.0").numel == 856 - 288  # the attention stays in: a forced leaf is not wrapped
    assert wrap.unit(ROOT).params == (("embed.weight", 128),) and wrap.unit(ROOT).shared == ("head.weight",)
    assert wrap.walk == "recursive wrap" and not wrap.split_ties


def test_strictly_above_the_threshold_is_not_needed() -> None:
    # 288 >= 288: at 289 neither up nor attention reaches it, and each block's 856 is wrapped whole.
    assert names(wm.wrap(EDGE, wm.SizeBased(289))) == ["blocks.0", "blocks.1", ROOT]


def test_the_module_list_is_excluded() -> None:
    wrap = wm.wrap(EDGE, wm.SizeBased(1000))
    assert names(wrap) == [ROOT] and wrap.unit(ROOT).numel == 1840
    assert names(wm.wrap(EDGE, wm.SizeBased(1000, exclude=()))) == ["blocks", ROOT]


def test_a_forced_leaf_without_the_default() -> None:
    # The attention (288) is wrapped too, and what each block has left (280) no longer reaches 288.
    wrap = wm.wrap(EDGE, wm.SizeBased(288, force_leaf=()))
    assert names(wrap) == ["blocks.0.attn", "blocks.0.up", "blocks.1.attn", "blocks.1.up", ROOT]


def test_the_walk_visits_only_large_modules() -> None:
    # Root, embed, blocks, both blocks and their four children, head: the small ones are entered, not descended.
    assert wm.wrap(EDGE, wm.SizeBased(288)).visits == 1 + 1 + 1 + 2 * (1 + 4) + 1
    # Nothing large: the root's question says no, and the walk stops there.
    assert wm.wrap(EDGE, wm.SizeBased()).visits == 1


# -- hand-worked: policies, mixed precision ------------------------------------------------------------------------
def test_module_wrap_and_transformer_give_the_same_units() -> None:
    by_module = wm.wrap(EDGE, wm.ModuleWrap(("EdgeBlock",)))
    by_callable = wm.wrap(EDGE, wm.Transformer(("EdgeBlock",)))
    assert by_module.units == by_callable.units
    assert (by_module.walk, by_callable.walk) == ("post-order apply", "recursive wrap")
    assert by_callable.visits == sum(1 for _ in wm.walk(EDGE))  # always descends: every module


def test_mixed_precision_under_a_policy() -> None:
    wrap = wm.wrap(EDGE, wm.ModuleWrap(("EdgeBlock",)), mixed_precision_ignore=wm.MODULE_CLASSES_TO_IGNORE)
    assert names(wrap) == ["blocks.0.norm", "blocks.0", "blocks.1.norm", "blocks.1", ROOT]
    assert wrap.unit("blocks.0.norm").kwargs == wm.NO_MIXED_PRECISION and wrap.unit("blocks.0").kwargs == ()


def test_mixed_precision_defeats_the_forced_leaf() -> None:
    wrap = wm.wrap(EDGE, wm.SizeBased(288), mixed_precision_ignore=wm.MODULE_CLASSES_TO_IGNORE)
    assert names(wrap) == ["blocks.0.attn", "blocks.0.norm", "blocks.0.up", "blocks.1.attn", "blocks.1.norm",
                           "blocks.1.up", ROOT]  # fmt: skip
    assert [name for name, _ in wrap.unit(ROOT).params] == [
        "embed.weight", "blocks.0.down.weight", "blocks.0.down.bias", "blocks.1.down.weight", "blocks.1.down.bias",
    ]  # fmt: skip


def test_custom_rules_and_their_kwargs() -> None:
    slower = (("sharding_strategy", "SHARD_GRAD_OP"),)
    later = wm.Custom(((wm.Match(paths=("blocks.1",)), slower), (wm.Match(types=("EdgeBlock",)), True)))
    wrap = wm.wrap(EDGE, later)
    assert wrap.unit("blocks.1").kwargs == slower and wrap.unit("blocks.0").kwargs == ()
    # An empty dict takes nothing, and the first rule that matches decides.
    nothing = wm.Custom(((wm.Match(paths=("blocks.1",)), ()), (wm.Match(types=("EdgeBlock",)), True)))
    assert names(wm.wrap(EDGE, nothing)) == ["blocks.0", ROOT]


def test_the_root_is_never_a_target() -> None:
    assert names(wm.wrap(EDGE, wm.ModuleWrap(("Edge",)))) == [ROOT]


def test_or_of_a_lambda_and_the_size() -> None:
    policy = wm.Or((wm.Lambda(wm.Match(types=("BatchNorm1d",))), wm.SizeBased(600)))
    assert names(wm.wrap(EDGE, policy)) == ["blocks.0.norm", "blocks.0", "blocks.1.norm", "blocks.1", ROOT]


# -- hand-worked: ties -----------------------------------------------------------------------------------------------
def test_a_tie_split_across_units() -> None:
    wrap = wm.wrap(EDGE, wm.ModuleWrap(("Linear",)))
    assert wrap.unit("head").params == (("weight", 128),)
    assert wrap.split_ties == (wm.SplitTie("embed.weight", "head", ("embed.weight",)),)


def test_a_tie_counted_after_an_earlier_unit_sharded_it_is_refused() -> None:
    # The embedding alone reaches 100 and is wrapped first; the head's count would meet its sharded tensor.
    with pytest.raises(wm.RankDependentCount):
        wm.wrap(EDGE, wm.SizeBased(100))


def test_a_tie_must_name_a_registered_tensor_of_its_size() -> None:
    with pytest.raises(ValueError, match="does not register"):
        wm.wrap(M("", "R", (P("a", 4, tied_to="b"),)), None)
    with pytest.raises(ValueError, match="elements"):
        wm.wrap(M("", "R", (P("b", 4), P("a", 5, tied_to="b"))), None)


# -- hand-worked: FSDP2 ----------------------------------------------------------------------------------------------
def test_fsdp2_bottom_up_groups_are_the_units() -> None:
    wrap = wm.wrap(EDGE, wm.SizeBased(288))
    groups = wm.fsdp2_groups(EDGE, [u.path for u in wrap.units])
    assert [sorted(g.params) for g in groups] == [sorted(u.params) for u in wrap.units]
    assert not any(g.already_sharded for g in groups)


def test_fsdp2_root_first_meets_sharded_parameters() -> None:
    root, block = wm.fsdp2_groups(EDGE, ["", "blocks.0"])
    assert len(root.params) == 21 and len(block.already_sharded) == len(block.params) == 10


# -- hand-worked: what a granularity costs ---------------------------------------------------------------------------
def tiny_like(blocks: int = 3) -> wm.Module:
    """mini_gpt tiny's shape: 36 wide, vocabulary 32, context 64, tied head."""

    def block(name: str) -> wm.Module:
        ln = lambda n: M(n, "LayerNorm", (P("weight", 36), P("bias", 36)))  # noqa: E731
        attn = M("attn", "CausalSelfAttention", (), (linear("qkv", 36, 108), linear("proj", 36, 36)))
        mlp = M("mlp", "MLP", (), (linear("fc", 36, 144), linear("proj", 144, 36)))
        return M(name, "Block", (), (ln("ln_1"), attn, ln("ln_2"), mlp))

    return M("", "GPT", (), (
        M("tok_emb", "Embedding", (P("weight", 1152),)),
        M("pos_emb", "Embedding", (P("weight", 2304),)),
        M("blocks", "ModuleList", (), tuple(block(str(i)) for i in range(blocks))),
        M("ln_f", "LayerNorm", (P("weight", 36), P("bias", 36))),
        M("lm_head", "Linear", (P("weight", 1152, tied_to="tok_emb.weight"),)),
    ))  # fmt: skip


def test_costs_of_three_granularities() -> None:
    tree = tiny_like()
    one = wm.cost(wm.wrap(tree, None), 2)
    block = wm.cost(wm.wrap(tree, wm.ModuleWrap(("Block",))), 2)
    per_linear = wm.cost(wm.wrap(tree, wm.Lambda(wm.Match(types=("Linear",), except_paths=("lm_head",)))), 2)
    assert (one.largest_all_gather, one.unsharded_peak, one.collectives_per_step) == (51588, 4 * 51588, 2)
    assert (block.largest_all_gather, block.unsharded_peak, block.collectives) == (
        16020, 4 * (3528 + 2 * 16020), {"all_gather": 7, "reduce_scatter": 4},
    )  # fmt: skip
    assert per_linear.unsharded_peak == 4 * (3960 + 5220 + 5328)  # the root and mlp.proj with mlp.fc
    assert per_linear.collectives_per_step == 3 * 13 - 1 and one.padding == block.padding == per_linear.padding == 0


def test_bf16_alignment_pads_the_layer_norms() -> None:
    block = wm.cost(wm.wrap(tiny_like(), wm.ModuleWrap(("Block",))), 2, element_bytes=2)
    assert block.padded["blocks.0"] == 16020 + 24 and block.padded[ROOT] == 3528 + 4 and block.padding == 76


def test_one_block_per_unit_holds_the_root_and_two_blocks_at_any_depth() -> None:
    for depth in (2, 5, 8):
        cost = wm.cost(wm.wrap(tiny_like(depth), wm.ModuleWrap(("Block",))), 2)
        assert cost.unsharded_peak == 4 * (3528 + 2 * 16020)
        assert cost.collectives_per_step == 3 * (depth + 1) - 1


# -- against torch's walks -------------------------------------------------------------------------------------------
class Recorder(nn.Module):
    """A wrapper for ``_auto_wrap`` that records each module it wraps and the parameters it takes: those of its
    subtree no earlier unit took (``_get_orig_params``)."""

    built: ClassVar[list[tuple[nn.Module, dict[str, Any], list[tuple[str, int]]]]] = []
    taken: ClassVar[set[int]] = set()

    def __init__(self, module: nn.Module, **kwargs: Any) -> None:
        super().__init__()
        self._fsdp_wrapped_module = module
        Recorder.built.append((module, kwargs, take(module)))


def take(module: nn.Module) -> list[tuple[str, int]]:
    held = []
    for name, param in module.named_parameters():
        if id(param) not in Recorder.taken:
            Recorder.taken.add(id(param))
            held.append((clean(name), param.numel()))
    return held


def torch_units(model: nn.Module, policy: Any, mixed: bool) -> list[tuple[Any, ...]]:
    """(unit, what it holds, mixed precision off, its own sharding strategy) in build order, by torch's
    ``_auto_wrap``, the root last."""
    paths = module_paths(model)
    Recorder.built, Recorder.taken = [], set()
    root_kwargs = {"mixed_precision": MixedPrecision(param_dtype=torch.bfloat16) if mixed else None}
    if policy is not None:
        _auto_wrap(model, policy, set(), set(), root_kwargs, Recorder)
    units = [(paths[id(m)] or ROOT, tuple(held), mixed and kwargs["mixed_precision"] is None, _strategy(kwargs))
             for m, kwargs, held in Recorder.built]  # fmt: skip
    return [*units, (ROOT, tuple(take(model)), False, None)]


def _strategy(kwargs: dict[str, Any]) -> str | None:
    strategy = kwargs.get("sharding_strategy")
    return None if strategy is None else strategy.name


def model_units(tree: wm.Module, policy: wm.Policy | None, mixed: bool) -> list[tuple[Any, ...]]:
    wrap = wm.wrap(tree, policy, mixed_precision_ignore=wm.MODULE_CLASSES_TO_IGNORE if mixed else None)
    return [(u.name, u.params, "mixed_precision" in dict(u.kwargs), dict(u.kwargs).get("sharding_strategy"))
            for u in wrap.units]  # fmt: skip


SPECS = [
    ("gpt", {"kind": "module", "classes": ["Block"]}),
    ("gpt", {"kind": "transformer", "classes": ["Block"]}),
    ("gpt", {"kind": "module", "classes": ["Linear"]}),
    ("gpt", {"kind": "lambda", "types": ["Linear"], "except_paths": ["lm_head"]}),
    ("gpt", {"kind": "size", "min_num_params": 5000}),
    ("edge", {"kind": "size", "min_num_params": 288}),
    ("edge", {"kind": "size", "min_num_params": 1000}),
    ("edge", {"kind": "module", "classes": ["EdgeBlock"]}),
    (
        "edge",
        {
            "kind": "custom",
            "rules": [
                {"paths": ["blocks.1"], "kwargs": {"sharding_strategy": "SHARD_GRAD_OP"}},
                {"types": ["EdgeBlock"]},
            ],
        },
    ),
    (
        "edge",
        {
            "kind": "or",
            "policies": [{"kind": "lambda", "types": ["BatchNorm1d"]}, {"kind": "size", "min_num_params": 600}],
        },
    ),
    ("transformer", {"kind": "transformer", "classes": ["TransformerEncoderLayer", "TransformerDecoderLayer"]}),
    ("transformer", {"kind": "size", "min_num_params": 500}),
    ("transformer", {"kind": "size", "min_num_params": 2000}),
]


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize(("workload", "spec"), SPECS)
def test_the_model_is_torchs_walk_on_the_guides_models(workload: str, spec: dict[str, Any], mixed: bool) -> None:
    model = build(workload)
    tree = tree_of(model)
    assert torch_units(model, torch_policy(spec, module_paths(model)), mixed) == model_units(
        tree, model_policy(spec), mixed
    )


def test_the_size_defaults_are_torchs() -> None:
    assert {c.__name__ for c in torch_wrap.size_based_auto_wrap_policy.FORCE_LEAF_MODULES} == set(wm.FORCE_LEAF_MODULES)
    assert {c.__name__ for c in torch_wrap.size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES} == set(
        wm.EXCLUDE_WRAP_MODULES
    )
    assert MixedPrecision()._module_classes_to_ignore[0].__name__ == wm.MODULE_CLASSES_TO_IGNORE[0]


# -- drawn trees -----------------------------------------------------------------------------------------------------
class Box(nn.Module):
    """A container with an optional parameter of its own."""

    def __init__(self, own: int, children: list[nn.Module]) -> None:
        super().__init__()
        if own:
            self.own = nn.Parameter(torch.empty(own, device="meta"))
        for i, child in enumerate(children):
            self.add_module(f"c{i}", child)


def modules() -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.tuples(st.just("linear"), st.sampled_from([2, 3, 4]), st.sampled_from([2, 3, 5])),
        st.tuples(st.just("bn"), st.integers(1, 6)),
        st.just(("mha",)),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(st.just("box"), st.integers(0, 20), st.lists(inner, min_size=1, max_size=3)),
            st.tuples(st.just("list"), st.lists(inner, min_size=1, max_size=3)),
        ),
        max_leaves=8,
    )


def make(spec: Any) -> nn.Module:
    kind = spec[0]
    with torch.device("meta"):
        if kind == "linear":
            return nn.Linear(spec[1], spec[2])
        if kind == "bn":
            return nn.BatchNorm1d(spec[1])
        if kind == "mha":
            return nn.MultiheadAttention(4, 1)
    if kind == "box":
        return Box(spec[1], [make(s) for s in spec[2]])
    return nn.ModuleList([make(s) for s in spec[1]])


def tie_some(model: nn.Module, ties: int) -> None:
    """Tie up to ``ties`` later Linear weights to an earlier one of the same shape."""
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    done = 0
    for i, later in enumerate(linears):
        earlier = next((e for e in linears[:i] if e.weight.shape == later.weight.shape), None)
        if earlier is not None and done < ties:
            later.weight = earlier.weight
            done += 1


POLICIES = st.one_of(
    st.builds(lambda c: {"kind": "module", "classes": c}, st.sampled_from([["Linear"], ["Box"], ["BatchNorm1d"]])),
    st.builds(lambda c: {"kind": "transformer", "classes": c}, st.sampled_from([["Box"], ["Linear"]])),
    st.builds(lambda c: {"kind": "lambda", "types": c}, st.sampled_from([["BatchNorm1d"], ["MultiheadAttention"]])),
    st.builds(lambda n: {"kind": "size", "min_num_params": n}, st.integers(1, 120)),
    st.builds(
        lambda n: {
            "kind": "or",
            "policies": [{"kind": "lambda", "types": ["Box"]}, {"kind": "size", "min_num_params": n}],
        },
        st.integers(1, 120),
    ),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(spec=st.tuples(st.just("box"), st.integers(0, 20), st.lists(modules(), min_size=1, max_size=4)),
       ties=st.integers(0, 2), policy=POLICIES, mixed=st.booleans())  # fmt: skip
def test_the_model_is_torchs_walk_on_drawn_trees(spec: Any, ties: int, policy: dict[str, Any], mixed: bool) -> None:
    model = make(spec)
    tie_some(model, ties)
    tree = tree_of(model)
    try:
        expected = model_units(tree, model_policy(policy), mixed)
    except wm.RankDependentCount:
        assume(False)  # FSDP itself would count a sharded tensor: rank-dependent, nothing to compare
    classes = {**known_classes(), "Box": Box}
    assert torch_units(model, torch_policy(policy, module_paths(model), classes), mixed) == expected


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(spec=st.tuples(st.just("box"), st.integers(0, 20), st.lists(modules(), min_size=1, max_size=4)),
       ties=st.integers(0, 2), data=st.data())  # fmt: skip
def test_fsdp2_groups_are_torchs(spec: Any, ties: int, data: st.DataObject) -> None:
    model = make(spec)
    tie_some(model, ties)
    tree = tree_of(model)
    paths = [path for path, _ in model.named_modules()]
    calls = data.draw(st.lists(st.sampled_from(paths), unique=True, max_size=4))
    by_path = dict(model.named_modules())
    sharded: set[int] = set()
    owner: set[int] = set()
    for call, group in zip(calls, wm.fsdp2_groups(tree, calls), strict=True):
        managed = _get_managed_modules((by_path[call],), get_state_fn=lambda m: True if id(m) in sharded else None)
        params, _ = _get_managed_states(managed)
        prefix = {id(m): p for p, m in by_path[call].named_modules()}
        named: dict[int, str] = {}
        for m in managed:
            for n, p in m.named_parameters(recurse=False):
                named.setdefault(id(p), wm.join(prefix[id(m)], n))
        assert [name for name, _ in group.params] == [named[id(p)] for p in params]
        assert list(group.already_sharded) == [named[id(p)] for p in params if id(p) in owner]
        owner |= {id(p) for p in params}
        sharded.add(id(by_path[call]))


def test_a_root_left_without_parameters_costs_nothing_and_keeps_nothing() -> None:
    # Two Linear(3, 4) children wrapped, nothing left in the root (worked by hand at N=2, 16 elements each, no
    # padding): forward gathers both, backward gathers both again (no kept root), two reduce-scatters; the peak is
    # both unsharded at once in backward (1's own, 0 prefetched by it), 32 elements of 4 bytes.
    linear = [M(name, "Linear", (P("weight", 12), P("bias", 4))) for name in ("0", "1")]
    wrapped = wm.wrap(M("", "Sequential", (), tuple(linear)), wm.ModuleWrap(("Linear",)))
    assert [(u.name, u.numel) for u in wrapped.units] == [("0", 16), ("1", 16), (ROOT, 0)]
    cost = wm.cost(wrapped, 2)
    assert cost.padded == {"0": 16, "1": 16}
    assert cost.collectives == {"all_gather": 4, "reduce_scatter": 2}
    assert cost.unsharded_peak == 128 and cost.padding == 0
    with pytest.raises(ValueError, match="hold no parameters or do not exist"):
        wm.cost(wrapped, 2, post_forward=["0", "1", ROOT])
