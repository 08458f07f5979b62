"""Guide 14's all-reduces, built from point-to-point messages so that every byte and every step can be counted.

- `checks.ring.ring`: the ring all-reduce of the seed's derivation (reduce-scatter, then all-gather, N−1 steps
  each), over ``dist.isend`` / ``dist.irecv``, chunked with zero padding when N does not divide the size.
- `checks.ring.naive`: reduce to rank 0, then broadcast from it, over ``dist.send`` / ``dist.recv``.
- `checks.ring.traffic`: what both count on each rank: bytes and messages sent and received, and the steps.
- `checks.ring.inputs`: each rank's values for an example (small integers, so every sum is exact).
- `checks.ring.timing`: rank-side timings for ``benchmarks/test_ring_model.py``.

Their expected values live in `checks.models.ring` (torch-free); the claims in `checks.guides.g14_ring_all_reduce`.

May import: ranks.
"""
