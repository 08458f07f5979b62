"""Checks for guide 06, backward prefetch: which unit each backward hook unshards ahead of time, and when.

Expected prefetches, candidates, unit counts, peaks, collective orders and record lengths are the guide's expect
blocks; the checks hold them to the torch-free rule model (`checks.models.prefetch`: `backward_sequence`,
`post_forward_record`, `backward_sequence_of_uses`), fed the post-forward order the model's structure implies,
never the order torch recorded. Sizes come from the flat-parameter model (`checks.workloads.gpt.padded_sizes`).
A unit's backward *compute* is marked by `checks.probes.compute_marks.ComputeMarks`: right after FSDP's
pre-backward hook, before autograd computes the unit's gradients.

Modules:

- `backward_runs`: the modes, the workloads and their post-forward order, one backward's hooks, torch's record.
- `prefetch_hooks`: BACKWARD_PRE's and BACKWARD_POST's prefetches, each inside its hook; None prefetches nothing.
- `rule_model`: the rule model predicts every hook and prefetch of a backward, on mini_gpt and the toy.
- `held_and_issued`: the units alive and the peak bytes, and the collectives' issue order, per mode.
- `record`: the post-forward record with a unit used twice, and in an eval-only loop.
- `recipes`: the break-it recipes and `EXERCISES`.
"""
