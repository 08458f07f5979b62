"""The rank pool: long-lived rank processes with a process group, that run checks and report every rank.

- `protocol`: the messages and results (plain dataclasses, no torch); `context`: what a check receives.
- `pool`, `worker`: N rank processes of one world size; `manager`: a pool per world size, rebuilt when broken;
  `inplace`: torchrun mode, where the pytest processes are the ranks; `backend`: gloo or nccl.
- `execute`: one check on one rank (isolation, patches, tracing, structured failure); `isolation`: what keeps one
  check from leaking into the next; `failure`: the readable report of a failed run.
- `symbols`: ``module:qualname`` to live objects; `tracing`: the one trace function every observer shares.
- `pytest_plugin`: ``--world-size``, ``--backend``, ``--pool-mode``, ``--check-timeout`` and the ``pool`` fixture.
- `selftest`: rank-side functions the pool's own tests run.
"""
