"""Checks for guide 21, the seeds' strategy table row by row: DDP, ZeRO-1/2/3 and FSDP, tensor parallel, pipeline
parallel and FSDP over tensor parallel, each row's communication per step and memory, measured.

Expected values come from the torch-free models, never from the runs: `checks.models.cost` (the collectives of a
data-parallel step, built on `checks.models.comm_volume`), `checks.models.zero_memory` (bytes per category),
`checks.models.tensor_parallel` (shards and all-reduces of a Megatron block), `checks.models.pipeline` (stage
orders, slots, transfers); the guide's expect blocks hold the numbers it states, compared last, and a model
comparison that fails names the rows the same run makes false (`checks.expected.Expected.naming_false_rows`);
references for numerics are the unsharded block or one process on the whole batch. The workloads are
`checks.workloads.tensor_parallel_block` and `checks.workloads.pipeline_stages`.

What the probes see: every collective at the dispatcher (`record_comm`; DTensor's all-reduces are
``_c10d_functional::all_reduce``, pipelining's sends and receives ``c10d::send`` / ``c10d::recv_`` with their
peer), witnessed by gloo's own profiler events; which storage each tensor-parallel all-reduce moved
(`checks.probes.payload_witness`); each pipeline stage's forwards and backwards in call order
(`checks.probes.stages`).

Modules:

- `data_parallel`: DDP, ZeRO-1/2/3, SHARD_GRAD_OP, FULL_SHARD and FSDP2 on mini_gpt tiny, one steady step each.
- `tensor_parallel`: the block's shards, its all-reduces and what each moves, its equivalence to the unsharded one.
- `pipeline_traffic`: a stage's point-to-point messages per step, and the first step's extra functions.
- `pipeline_schedules`: GPipe's and 1F1B's orders, slots, bubble, microbatches held and IR; their equivalence.
- `two_d`: FSDP2 over tensor parallelism: placements, each mesh dimension's collectives, equivalence.
- `ratios`: a ratio as the guide writes it.
- `unsharded_reference`: a rank's chunk of the unsharded tensor, and the bound against the unsharded block.
- `recipes`: the break-it recipes (the guide has no exercises).
"""
