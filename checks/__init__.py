"""What proves the guides' claims, in rooms:

- `ranks`: the rank pool that runs a check on N ranks and reports every rank (and its pytest plugin).
- `probes`: what a check records inside its ranks: collectives, FSDP events, memory per category.
- `models`: torch-free oracles: the rules the guides read, as pure functions the claims compare against.
- `workloads`: mini_gpt and the toy model, wrapped for FSDP1 / FSDP2 / DDP / ZeRO.
- `breakit`: how break-it tests bend torch inside the ranks.
- `guides`: one module per guide: its claim functions and its break-it recipes.
- `naming` (one vocabulary for units) and `violation` (how a check says a claim does not hold).
"""
