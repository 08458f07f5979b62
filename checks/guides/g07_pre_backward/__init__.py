"""Checks for guide 07, the pre-backward hook: on which outputs FSDP1 registers it, how often it runs and does
work, and how the root queues the final callback once per backward.

Expected values never come from FSDP. They follow from how the fan-out model (`checks.workloads.fan_out`) is
built (which of its units' outputs require grad, which reach the loss), and the guide states them in its expect
blocks (``pre-backward-calls``, ``hooked-outputs``). What torch did is observed from the code that ran.

Modules:

- `backward_observer`: the pre-backward calls, the guard, the per-handle work and the final callback, observed.
- `once_per_backward`: a call per output that requires grad; one gets past the guard and does the work.
- `hooked_outputs`: the hook sits on exactly the outputs that require grad, bound to their unit.
- `final_callback`: the root queues the final callback once, and nothing queues it without a root output.
- `recipes`: the break-it recipes and `EXERCISES`.
"""
