"""Probes a check uses inside its rank: collectives, FSDP events and per-rank memory, as plain picklable records.

Three lines record one training step::

    with record_comm() as comm, record_events(model) as events, account_memory(model, optim) as mem:
        loss = model(x).sum(); loss.backward(); optim.step()

or, the same in one line, ``with record_step(model, optim) as step:`` (`step`; ``step.comm``, ``step.events``,
``step.memory``). Every record can be returned from the rank and compared across ranks (``.keys()``). Import
each from its module (``from checks.probes.comm import record_comm``): this ``__init__`` imports nothing, so a
check pays only for the probes it uses.

Collectives:
- `comm`: ``record_comm`` records every collective at the dispatcher (a kernel at the collective operators'
  Autograd key), any API name, C++ callers included; `collectives` says what each operator means and holds the
  `Collective` record; `crosscheck` is its witness, the backend's own profiler events.
- `by_unit`: which FSDP1 unit each recorded collective served (the comm and event logs on one clock).
- `payload_witness`: which storage a tensor-parallel payload is (guide 21).

FSDP's own steps:
- `events`: ``record_events``, FSDP1 and FSDP2 unshard / prefetch / reshard / hooks / gradient reduction / final
  callback; `fsdp_hooks` says which functions it watches and how a frame becomes an event; `recording` is what
  those hooks write into; `event_log` holds the records it returns.
- `timeline`: one FSDP1 step written as the guides write it (``<phase> <unit> <action>``).
- `call_tree`: ``record_call_tree``, which of some chosen torch functions ran, nested as they called each other
  (FSDP2's step map, guide 22).
- `compute_marks`: when each FSDP1 unit's backward computation starts (a hook on its output tensors).
- `grad_ready`: when each parameter's gradient is ready (DDP's buckets, guide 19).
- `stages`: what a pipeline stage computes, in order (guide 21).
- `built_units`: what FSDP built, read off a wrapped model: each unit, its module's class and its parameters.
- `clock`: the one sequence counter every recorder shares, so their records interleave.

Memory:
- `memory`: ``account_memory``, bytes per category from distinct live storages; `peaks`: peaks from torch's
  memory trackers when asked (``peaks=True``: a dispatch mode, several times the step), CUDA allocator stats on
  GPU; `memory_series`: a snapshot after each unit's forward and backward.

Showing and asserting: `render` (rich tables for failure messages and the terminal), `expect`
(``assert_sequence``: assertions that fail with them).

Watching a torch function (did it run, with which arguments, what did it return):
- `calls` is the one way a check watches a function: ``with calls.subscribed({code: hook}) as sub:``, the code
  from ``calls.function_code("module:qualname")``. It swaps the function's ``__code__`` for a trampoline while the
  block is open (`checks.ranks.codeswap`), which is how runtime evidence watches too, so a claim's ``evidence``
  and its check may watch one function at once; no trace function slows the other frames. The event recorder is
  built on it.
- `checks.ranks.marks` is runtime evidence itself (which functions ran: a mark on each one's first call). The pool
  runs it around every check from the claim's ``evidence = [...]``; a check does not call it.
- `checks.ranks.tracing` (one shared ``sys.settrace``) does only what a code swap cannot, and a check that needs
  it says which: read a function's own locals when it returns (the hooks of `calls` see the trampoline's frame,
  whose locals are the arguments: guide 08 reads ``_reduce_grad``'s reduced shard); watch without putting a frame
  between a function and its caller (a ``warnings.warn`` with a ``stacklevel`` inside it must point where it
  points unwatched: guide 09); watch whatever function a module's name holds now, a break-it replacement
  included (``calls.function_code`` unwraps to the original, which a replacement may never call: guide 18); and
  generators or coroutines. It is also `marks`' fallback on an interpreter whose bytecode `marks` cannot write.
  It takes the same hooks as `calls`. A C function (autograd's ``queue_callback``) is seen by neither: guide 07
  adds a ``sys.setprofile`` for it.

What each costs on a step: ``pytest benchmarks/test_probes_overhead.py`` (ratios to a bare step in its
``extra_info``); where the time goes: ``tests.probes.on_ranks:mini_gpt_profile`` (cProfile of probed steps).

May import: ranks.
"""
