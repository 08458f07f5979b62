"""Checks for guide 20, how FSDP units are formed: FSDP1's ``auto_wrap_policy`` (``wrap.py``, ``_wrap_utils.py``),
FSDP2's ``fully_shard`` by hand, and what the granularity costs.

Every claim builds a real model (`checks.workloads.edge`: mini_gpt tiny, the edge-case tree, ``nn.Transformer``),
converts it to the plain tree the torch-free wrap model reads (`checks.workloads.module_tree.tree_of`), asks the model
(`checks.models.wrap`) for the units under a policy given as data (`checks.workloads.wrap_policies`: one
description, read as the model's policy and as torch's), then wraps the real model and compares: the units FSDP
built (`checks.probes.built_units`: their module, what each flat parameter holds, its shared parameters, its
settings), the order they were built in (``_init_param_handle_from_module`` calls, observed with
`checks.probes.calls`) and the walk that built them (``_post_order_apply`` or ``_recursive_wrap`` calls). The
units, the dtypes, the errors and the costs the guide states come from its expect blocks, each a typed
`checks.expected.Expected` a check fails through, naming the row; the costs of a granularity also come from
`checks.models.wrap.cost`, which reuses the flat-parameter, communication and prefetch models, against a run's
collectives and memory peaks.

- `wrapping`: FSDP1 built under a policy and watched; the model's units as FSDP1's and as the guide's rows; a
  step that must run; an error in one line.
- `units`: the units each policy forms (``units_match_model``), the size policy's defaults.
- `nesting`: what ``_auto_wrap`` refuses, a tree that already holds an FSDP module.
- `mixed_precision`: each BatchNorm its own float32 unit under mixed precision, and the dtypes of one forward.
- `split_tie`: the tied weight in ``lm_head``'s unit, the embedding holding its 1-D shard, the failing forward.
- `fsdp2`: ``fully_shard`` by hand gives FSDP1's groups; the root's call first, and the errors that follow.
- `granularity`: what one unit, one per block and one per Linear layer cost, against the models and the guide.
- `recipes`: the break-it recipes and ``EXERCISES``.
"""
