"""``fsdp-readings inspect``: the guides' models and probes pointed at a user's own ``nn.Module``.

- `loading`: ``MODULE:CALLABLE`` to a factory, and a module built on the meta device (shared with ``estimate``);
- `policy`: ``--wrap`` text to a policy description both the wrap model and torch read;
- `reach`: what the unwrapped model did on each rank (modules run, parameters that got a gradient), and which
  strategies cannot take it (torch-free);
- `sharing`: weights and modules two units share, and which strategies cannot take them (torch-free);
- `predict`: what the torch-free models say one step does (torch-free);
- `measure`: the same step run on the rank pool, measured by the probes (rank side);
- `compare`: prediction against measurement, section by section.
- `examples`: factories to point ``inspect`` at (mini_gpt, nn.Transformer, GPT-2, ResNet-18) and their batches.

It runs the guides' own measurements (a unit's recorded post-forward order, its flat layout, DDP's buckets) on
the user's model, so it sits above the guides.

May import: guides, models, probes, ranks, workloads, zero.
"""
