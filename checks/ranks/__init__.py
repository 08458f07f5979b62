"""The rank pool: long-lived rank processes with a process group, that run checks and report every rank.

- `protocol`: the messages and results (plain dataclasses, no torch); `context`: what a check receives.
- `pool`, `worker`: N rank processes of one world size; `zygote`: the process that imported torch once and forks
  them; `manager`: a pool per world size, rebuilt when broken; `inplace`: torchrun mode, where the pytest
  processes are the ranks; `backend`: gloo or nccl.
- `execute`: one check on one rank (isolation, patches, runtime evidence, structured failure); `isolation`: what
  keeps one check from leaking into the next; `failure`: the readable report of a failed run; `patching`: a
  break-it `Patch` applied rank-side (the replacement reaches every module that holds the original); `capture`:
  every probe log a captured check records (``fsdp-readings timeline``), with its torch source line.
- `symbols`: ``module:qualname`` to live objects; `marks`: runtime evidence (which functions ran), by a mark on
  each function's first call; `codeswap`: the one owner of a function's swapped code; `tracing`: the one trace
  function every frame observer shares.
- `pytest_plugin`: ``--world-size``, ``--backend``, ``--pool-mode``, ``--check-timeout`` and the ``pool`` fixture.
- `selftest`: rank-side functions the pool's own tests run.

How a check watches a torch function is the probes room's map (`checks.probes`): `marks`, `codeswap`, `tracing`
and `symbols` are here because runtime evidence, which the pool runs around every check, needs them.

May import: nothing else of checks.
"""
