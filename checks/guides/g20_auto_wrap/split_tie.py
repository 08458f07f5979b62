"""A tie split across units: ``ModuleWrapPolicy({nn.Linear})`` puts mini_gpt's tied weight in ``lm_head``'s unit,
the root's embedding then holds ``lm_head``'s 1-D shard, and the first forward fails."""

from __future__ import annotations

from typing import Any

import torch

from checks.expected import Expected
from checks.guides.g20_auto_wrap.wrapping import expected_units, require_units_built, require_units_stated, wrap_fsdp1
from checks.models import flat_param as fp
from checks.models import wrap as wm
from checks.naming import ROOT, unit_name
from checks.probes.built_units import fsdp1_units
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.edge import build, step_loss
from checks.workloads.module_tree import module_paths, tree_of
from checks.workloads.wrap_policies import model_policy, torch_policy


def split_tie_breaks(ctx: RankContext, policy: dict[str, Any], expected: Expected, error: str) -> dict[str, Any]:
    """``ModuleWrapPolicy({nn.Linear})`` on mini_gpt: the model's units, and the tie it splits (the head's unit
    flattens the weight the root's embedding also registers); FSDP builds exactly that, the embedding's weight is
    then the head's 1-D shard (the head's own parameter, a view of its unit's flat parameter where the
    flat-parameter model puts this rank's slice, holding the original weight's elements there), and the first
    forward raises ``error`` on every rank. The units are the guide's rows."""
    model = build("gpt", ctx.device)
    paths = module_paths(model)
    tree = tree_of(model)
    predicted = wm.wrap(tree, model_policy(policy))
    lines = require_units_stated(expected, predicted)
    original = model.tok_emb.weight.detach().flatten().clone()
    wrapped, _, _ = wrap_fsdp1(model, ctx, torch_policy(policy, paths), paths)
    require_units_built(expected, fsdp1_units(wrapped), expected_units(predicted, None), what="the units FSDP built")
    ties = [f"{t.tensor} in {t.holder or ROOT}, also at {' '.join(t.outside)}" for t in predicted.split_ties]
    require(len(predicted.split_ties) == 1, "no-split-tie", f"the model splits {ties}", observed=ties)
    tie = predicted.split_ties[0]
    holder = predicted.unit(tie.holder)
    # Where the flat-parameter model puts the tied tensor in this rank's shard of the holder's flat parameter.
    names = [name for name, _ in holder.params]
    (index,) = [names.index(wm.relative(r.fqn, tie.holder)) for r in wm.registrations(tree)
                if r.tensor == tie.tensor and wm.within(r.module, tie.holder)]  # fmt: skip
    spec = fp.flat_param([fp.Param(name, (n,)) for name, n in holder.params], ctx.world_size, use_orig_params=True)
    info = spec.shard_param_infos(ctx.rank)[index]
    weight = model.tok_emb.weight
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    fsdp_units = {unit_name(path): m for path, m in wrapped.named_modules() if isinstance(m, FSDP)}
    flat = fsdp_units[holder.name]._handle.flat_param
    require(
        weight is flat._params[index],
        "tied-weight-not-the-shard",
        f"tok_emb.weight is not the Parameter {tie.holder}'s unit flattened",
        part="identity",
    )
    require_equal(tuple(weight.shape), (info.numel_in_shard,), reason="tied-weight-not-the-shard",
                  what="tok_emb.weight's shape", part="shape")  # fmt: skip
    storage = (weight.untyped_storage().data_ptr(), weight.storage_offset())
    in_flat = (flat.untyped_storage().data_ptr(), flat.storage_offset() + info.offset_in_shard)
    require(storage == in_flat, "tied-weight-not-the-shard",
            f"tok_emb.weight is no view of {tie.holder}'s flat parameter at element {info.offset_in_shard}",
            part="storage", observed=storage, expected=in_flat)  # fmt: skip
    start = info.intra_param_start_idx
    require(
        torch.equal(weight.detach(), original[start : start + info.numel_in_shard]),
        "tied-weight-not-the-shard",
        f"tok_emb.weight does not hold elements {start}.. of the original weight",
        part="values",
    )
    try:
        step_loss(wrapped, ctx, "gpt")
    except RuntimeError as raised:
        seen = str(raised).splitlines()[0]
    else:
        seen = "no error"
    require_equal(seen, error, reason="forward-did-not-fail", what="the first forward")
    return {"units": lines, "split_ties": ties, "embedding_shape": list(weight.shape), "error": seen}
