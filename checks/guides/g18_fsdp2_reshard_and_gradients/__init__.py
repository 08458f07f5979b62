"""Checks for guide 18, FSDP2's ``reshard_after_forward``, the root, mixed precision and gradients.

Expected values never come from FSDP: counts, group sizes and bytes from `checks.models.fsdp2_reshard` over the
model's parameter shapes (`checks.models.comm_volume.fsdp2_padded`); divide factors and reduce ops from
`checks.models.divide_factors.fsdp2_factors`; dtypes from `checks.models.fsdp2_precision`; gradients and trained
parameters from DDP (and FSDP1) on the same data, or from a plain replica's per-rank gradients combined by the
formula the guide derives. The guide's tables (its expect blocks) reach the checks as `checks.expected.Expected`,
compared after the models, and a row a run makes false is named. Every comparison is exact.

Modules:

- `units`: mini_gpt's units, their padded sizes and their parameter groups.
- `reductions`: the divide factors every reduction chose, observed; sharded gradients against expected rows.
- `reshard`: what each ``reshard_after_forward`` does and costs, on two ranks and (an int) on four.
- `gradients`: AVG is DDP's slice; the SUM paths; the tied weight's fp16 gradient, rounded by release.
- `precision`: each ``MixedPrecisionPolicy``'s dtypes; accumulation without gradient sync.
- `used_twice`: a unit run twice in one forward.
- `training`: five AdamW steps, bitwise FSDP1's and DDP's.
- `recipes`: the break-it recipes.
"""
