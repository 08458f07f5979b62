"""Checks for guide 17, prefetch in FSDP2: which group each ``fully_shard`` hook all-gathers, for itself or ahead,
and when the post-forward order that backward reads is cleared.

Expected sequences come from the torch-free rule model (`checks.models.fsdp2_prefetch`: `step_sequence`, fed the
units' structural forward order and the targets the check sets) and from the guide's expect blocks, which each
check receives as a `checks.expected.Expected` and fails through, naming the row a run makes false; the
all-gather counts from the guide's derivation (`all_gathers_by_formula`). Nothing expected is recorded from torch.
Torch's own post-forward order (``FSDPCommContext.post_forward_order``) is compared with the structural order
first, so the model's input is what torch used.

Modules:

- `steps`: the workloads built and run one step at a time, under the recorders, and compared with the model.
- `prefetches`: no implicit forward prefetch; the implicit backward one; explicit targets; a reordered step.
- `all_gathers`: all-gathers per step by ``reshard_after_forward``; a setting per unit; a root without parameters.
- `several_forwards`: two forwards before backward, five cases against the model and the guide's table.
- `order_clearing`: the watched post-forward order, cleared at the step's end; torch 2.15's manual finalization.
- `recipes`: the break-it recipes.
"""
