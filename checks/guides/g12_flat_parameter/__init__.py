"""Checks for guide 12, the flat parameter: FSDP1's ``FlatParameter`` against the spec, value by value, through an
all-gather and an optimizer step; its layout drawn from the real metadata; what summon_full_params' arguments keep;
and what CPU offload does on a CPU.

The property claims take one drawn unit (`checks.models.flat_param_draws`, plain data drawn in the pytest process)
and build it in the ranks, identically on every rank (`checks.workloads.drawn_unit`, which says why every value
is exact). Expected values never come from FSDP: layouts from the spec (`checks.models.flat_param`), parameter
values from an unwrapped replica of the same unit built in the rank, the update from that replica's own backward
and SGD step, and the diagram from the guide's ``expect layout-at-4`` block.

- `flat_values`: the spec's layout filled from a replica, the exact tensor comparison, a rank's slice checked.
- `properties`: (a) the ``FlatParameter`` is the spec, (b) each rank holds its slice, (c) summon_full_params
  gathers the originals, (d) one step matches the unwrapped unit, and all four on 200 draws.
- `layout`: the layout drawn from the real metadata (`real_layout`) and compared with the guide's diagram.
- `summon`: summon_full_params' ``writeback``, ``with_grads`` and ``rank0_only``.
- `offload`: FSDP1's parameter offload, summon_full_params' ``offload_to_cpu`` on a CPU, FSDP2's offload policy.
- `recipes`: the break-it recipes the tests apply.
"""
