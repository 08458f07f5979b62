"""What the checks train: mini_gpt and the toy model, wrapped for FSDP1, FSDP2, DDP and ZeRO, named as in
`checks.naming`.

- `gpt`: mini_gpt with each block its own FSDP1 unit; its per-unit parameter sizes for the models.
- `toy`: ``Sequential(Linear(3, 7), Linear(7, 5), Linear(5, 5))`` and one wrapper per strategy.

May import: models, probes, ranks, zero.
"""
