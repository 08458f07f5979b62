"""What the checks train: mini_gpt, the toy model and each guide's own models, wrapped for FSDP1, FSDP2, DDP and
ZeRO, named as in `checks.naming`. A model a claim trains lives here, not in its guide's module.

Shared by many guides:
- `gpt`: mini_gpt with each block its own FSDP1 unit (or FSDP2 group); its per-unit parameter sizes and shapes
  for the models; the DDP replica whose gradients FSDP's are compared with.
- `toy`: ``Sequential(Linear(3, 7), Linear(7, 5), Linear(5, 5))`` and one wrapper per strategy.
- `data_parallel`: DDP, ZeroRedundancyOptimizer, the reference ZeRO stages, FSDP1's strategies and FSDP2 on
  mini_gpt behind one interface (`Trained`), and the bytes each holds (guides 13, 21, ``inspect``).
- `reorderable`: mini_gpt whose blocks run in an order set between iterations (guides 04, 06, 17, 18).
- `groups`: process groups built beside the world, by every rank in one order.

One guide's model:
- `fan_out`: guide 07's root over three units, one per kind of output.
- `drawn_unit`: guide 12's drawn units as modules, their batch, FSDP1 wrapping one whole.
- `drawn_fsdp2`: guide 16's drawn FSDP2 model: bare parameters and an optional child.
- `rank_ordered`: guide 19's model whose ranks make their gradients ready in different orders.
- `edge`: the trees guide 20 wraps (`Edge`, mini_gpt, ``nn.Transformer``); `wrap_policies`: a wrap policy as
  data, read as the wrap model's and as torch's; `module_tree`: an ``nn.Module`` as the wrap model's tree
  (guide 20 and ``inspect``).
- `tensor_parallel_block`: guide 21's pre-LN block under ``parallelize_module``, and under FSDP2 on a 2 × 2 mesh.
- `pipeline_stages`: guide 21's eight layers cut into one pipeline stage per rank (GPipe or 1F1B).
- `nested_units`: guide 06's units inside units (a parent with a projection of its own, two units in it).
- `pass_through`: guide 13's T5-shaped blocks that return the bias they were given (and ``inspect``'s tests).

May import: models, probes, ranks, zero.
"""
