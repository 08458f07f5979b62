"""The claims of each guide: ``readings/NN-<slug>.md``'s claim functions in ``gNN_<slug>``, then the break-it
recipes that bend what they assert (``tests/break_it/test_NN_<slug>.py`` applies them).

A guide of 500 lines or fewer is one module: its claims in the order the guide states them, its recipes and
``EXERCISES`` at the end. A longer one is a package: one module per subject, claims in guide order, a module for
what two subjects share (named for what it holds), and ``recipes`` (the recipes and ``EXERCISES``); its
``__init__`` is a map and imports nothing. A guide imports no other guide: what two use goes down to
`checks.workloads`, `checks.probes` or `checks.models`.

A claim function is SPMD code: ``fn(ctx: RankContext, **kwargs)`` runs on every rank, raises a
`checks.violation.Violation` when its claim does not hold (through `checks.expected.Expected` when the guide's
expect row is what is false), and returns plain data (the observed value).

FSDP1's runtime:
- `g01_step_map`, `g02_root_and_lazy_init`, `g03_unshard_reshard`, `g04_forward_prefetch`, `g05_mixed_precision`;
- `g06_backward_prefetch`, `g07_pre_backward`, `g08_post_backward_reduce_scatter` (packages);
- `g09_no_shard_is_ddp`, `g10_no_sync_and_frozen_params`, `g11_final_callback_and_hybrid_shard` (packages);
- `g12_flat_parameter` (package).

Strategies side by side: `g13_zero_stages` (package), `g14_ring_all_reduce`, `g15_communication_volume`.

FSDP2: `g22_fsdp2_step_map`, `g16_fsdp2_per_parameter_sharding`, `g17_fsdp2_prefetch`,
`g18_fsdp2_reshard_and_gradients` (packages).

Around FSDP: `g19_ddp_buckets`, `g20_auto_wrap`, `g21_strategy_table` (packages).

May import: breakit, models, probes, ranks, ring, workloads, zero.
"""
