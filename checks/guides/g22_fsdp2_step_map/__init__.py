"""Checks for guide 22, the FSDP2 step map: which hooks one ``fully_shard`` step runs, and which of FSDP's
functions each calls that does something, against the guide's expect blocks and the torch-free rule model
(`checks.models.fsdp2_step_map`).

Modules:

- `calls`: the functions the call recorder watches, and how a recorded call becomes a row of the map.
- `steps`: the workload (mini_gpt, ``fully_shard`` per block and on the model) run for a few steps under the
  recorder, and the model's rows for it.
- `claims`: the step map, the first step, the hooks on the step's tensors, methods other than forward, direct
  unshard and reshard, the reshard settings changed after ``fully_shard``, one map on every rank.
- `methods`: the other ``FSDPModule`` methods that change a step: unshard in backward, custom collectives and
  the all-reduce hook, the divide factor, the reduce-scatter group and buffers, ``reset_iter_state``,
  ``share_comm_ctx``.
- `recipes`: the break-it recipes.
"""
