"""FSDP1's auto wrap as a pure function of a module tree and a policy: which modules become units, in which order
they are built, and what each one holds (torch-free). FSDP2's ``fully_shard`` calls by hand, over the same tree.

Written from a reading of ``torch/distributed/fsdp/wrap.py`` and ``_wrap_utils.py`` (torch 2.13.0; line numbers
are those files'), never by calling them. The input is plain data: a tree of `Module` (its attribute name, class
name and base class names, its own parameters with their element counts, its children), where a `Param` that is
another parameter's tensor (a tied weight) says so with ``tied_to``; and a policy description (`ModuleWrap`,
`Custom`, `Transformer`, `Lambda`, `SizeBased`, `Or`). `wrap` returns the `Wrap`: the units, root last.

The rules, with where they are read:

1. Two walks (``_auto_wrap``, ``_wrap_utils.py`` 26-102). A ``_Policy`` (``ModuleWrapPolicy``, ``CustomPolicy``)
   picks its targets first, over ``root.modules()`` in registration order (``_run_policy``, wrap.py 189-267),
   then ``_post_order_apply`` (31-72) builds them children first; the root is never a target
   (``_construct_wrap_fn``, 89). Any other callable goes through ``_recursive_wrap`` (488-565) with
   ``only_wrap_children=True``: it asks the policy ``recurse=True`` before descending, builds the children, then
   asks ``recurse=False`` with the numel its children did not take. In both the root's own FSDP, built last, takes
   whatever no unit took.
2. Counting (``_recursive_wrap`` 532-534, 557). A module's numel is its subtree's distinct tensors, counted before
   any of its children is wrapped; a wrapped child reports its whole count, an unwrapped one what its own
   descendants took. A tensor a unit outside the subtree already took (a tie across subtrees) would be counted
   (``use_orig_params=True``) at the size of the rank's slice of that unit's shard, which may differ between
   ranks: the model refuses that case (`RankDependentCount`).
3. The policies. ``ModuleWrapPolicy`` / ``transformer_auto_wrap_policy``: every instance of the classes
   (``_module_wrap_policy`` 173-175). ``lambda_auto_wrap_policy``: where ``lambda_fn`` says True (293-295).
   ``size_based_auto_wrap_policy`` (372-392): large is ``numel >= min_num_params`` (default ``int(1e8)``);
   descend into a large module unless it is a ``force_leaf_modules`` instance (default ``{nn.MultiheadAttention}``,
   397), so such a module is neither descended into nor, on its own, wrapped; wrap a large remainder unless the
   module is an ``exclude_wrap_modules`` instance (default ``{nn.ModuleList, nn.ModuleDict}``, 396).
   ``CustomPolicy``: its function's dict updates a copy of the root's kwargs, True takes them as they are (259-266).
   ``_or_policy``: any of its policies (335-338).
4. Mixed precision (``_wrap_utils.py`` 53-64, 84-101). With a ``MixedPrecision``, every instance of its
   ``_module_classes_to_ignore`` (default ``(_BatchNorm,)``) becomes a unit of its own with ``mixed_precision``
   None. A ``_Policy`` adds them to its targets (``_run_mixed_precision_override_policy``, wrap.py 97-114); a
   callable is or-ed with ``_wrap_module_cls_individually`` (313-322), which always answers ``recurse=True``: so
   the walk then descends everywhere, into ``force_leaf_modules`` and small modules too, and a large
   ``MultiheadAttention`` remainder is wrapped.
5. What a unit holds (``_init_utils._get_orig_params``, ``_flat_param.py`` 688-755). Its subtree's tensors, in
   registration order, less those a unit built before it took. A tensor is named by its first registration in the
   unit's subtree; later ones there are shared parameters. A registration outside the unit that took its tensor is
   a `SplitTie`: under ``use_orig_params=True`` that module then reads the holder's 1-D shard.
6. FSDP2 (`fsdp2_groups`; ``_fully_shard/_fsdp_init.py`` 276-366). Each ``fully_shard`` call manages its module's
   subtree in post-order, stopping at modules an earlier call sharded, and takes their own parameters, each
   tensor once. A tensor an earlier call sharded is a DTensor by then, and the call takes it for a tensor-parallel
   one (``already_sharded``).

`cost` turns units into what the granularity costs on N ranks, by the models that already say it: each unit's
padded flat parameter (`checks.models.flat_param`), the collectives of a FULL_SHARD step
(`checks.models.comm_volume`), and the unsharded parameters alive at once under the default BACKWARD_PRE
(`checks.models.prefetch`'s backward sequence, walked by `checks.models.fsdp2_reshard.unsharded_peak`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from checks.models.comm_volume import freed_after_forward, sharded_step
from checks.models.flat_param import padded_numel
from checks.models.fsdp2_reshard import unsharded_peak
from checks.models.prefetch import backward_sequence
from checks.naming import ROOT

DEFAULT_MIN_NUM_PARAMS = int(1e8)  # size_based_auto_wrap_policy's default, wrap.py:346
FORCE_LEAF_MODULES = ("MultiheadAttention",)  # size_based_auto_wrap_policy.FORCE_LEAF_MODULES, wrap.py:397
EXCLUDE_WRAP_MODULES = ("ModuleList", "ModuleDict")  # size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES, wrap.py:396
MODULE_CLASSES_TO_IGNORE = ("_BatchNorm",)  # MixedPrecision._module_classes_to_ignore, api.py:226
NO_MIXED_PRECISION = (("mixed_precision", None),)  # what the override sets, wrap.py:113 and _common_utils.py:651

Kwargs = tuple[tuple[str, Any], ...]  # keyword arguments as sorted pairs, so units compare and hash


# -- the tree -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """A parameter registered on a module: its attribute name, its elements, and, for a tied weight, the fully
    qualified name of the parameter whose tensor it is."""

    name: str
    numel: int
    tied_to: str | None = None


@dataclass(frozen=True)
class Module:
    """A module: its attribute name under its parent (``""`` for the root), its class name and its base classes'
    names (``isinstance`` matches either), its own parameters and its children, in registration order. A module
    object registered under a second name appears there too, with ``alias_of`` its first path and its
    parameters tied to the first registration's: ``modules()`` yields it once, so no policy sees the alias."""

    name: str
    type: str
    params: tuple[Param, ...] = ()
    children: tuple[Module, ...] = ()
    bases: tuple[str, ...] = ()
    alias_of: str | None = None  # a module registered again: the path of its first registration

    def is_a(self, classes: Iterable[str]) -> bool:
        wanted = set(classes)
        return self.type in wanted or not wanted.isdisjoint(self.bases)


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def walk(module: Module, path: str = "") -> Iterator[tuple[str, Module]]:
    """Every module with its path, in ``named_modules()`` order: a module, then each child's subtree."""
    yield path, module
    for child in module.children:
        yield from walk(child, join(path, child.name))


def first_registrations(module: Module, path: str = "") -> Iterator[tuple[str, Module]]:
    """`walk` without the subtrees of modules registered a second time (``root.modules()``, which dedups)."""
    if module.alias_of is not None:
        return
    yield path, module
    for child in module.children:
        yield from first_registrations(child, join(path, child.name))


def post_order(module: Module, path: str = "") -> Iterator[tuple[str, Module]]:
    """Every module with its path, children first (``_post_order_apply``'s order)."""
    for child in module.children:
        yield from post_order(child, join(path, child.name))
    yield path, module


def within(path: str, unit: str) -> bool:
    """Is the module at ``path`` in the subtree of the module at ``unit``?"""
    return unit in ("", path) or path.startswith(unit + ".")


def relative(fqn: str, unit: str) -> str:
    return fqn[len(unit) + 1 :] if unit else fqn


@dataclass(frozen=True)
class Registration:
    """One parameter attribute: where it is registered and which tensor it is (its first registration's name)."""

    fqn: str
    module: str
    tensor: str
    numel: int


def registrations(tree: Module) -> list[Registration]:
    """Every parameter attribute of the tree, in ``named_parameters(remove_duplicate=False)`` order."""
    found = [
        Registration(join(path, p.name), path, p.tied_to or join(path, p.name), p.numel)
        for path, module in walk(tree)
        for p in module.params
    ]
    numel = {r.tensor: r.numel for r in found if r.fqn == r.tensor}
    for r in found:
        if r.tensor not in numel:
            raise ValueError(f"{r.fqn} is tied to {r.tensor}, which the tree does not register")
        if r.numel != numel[r.tensor]:
            raise ValueError(f"{r.fqn} has {r.numel} elements, but the tensor it is tied to has {numel[r.tensor]}")
    return found


# -- policies -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Match:
    """Which modules a lambda or a CustomPolicy rule selects: instances of ``types``, or the modules at ``paths``,
    but never those at ``except_paths``."""

    types: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    except_paths: tuple[str, ...] = ()

    def __call__(self, path: str, module: Module) -> bool:
        return path not in self.except_paths and (module.is_a(self.types) or path in self.paths)


@dataclass(frozen=True)
class ModuleWrap:
    """``ModuleWrapPolicy(classes)``: a ``_Policy``."""

    classes: tuple[str, ...]


@dataclass(frozen=True)
class Custom:
    """``CustomPolicy(lambda_fn)``, a ``_Policy``: ``lambda_fn`` returns the value of the first rule that matches
    (True, or keyword arguments that override the root's), and False where none does."""

    rules: tuple[tuple[Match, bool | Kwargs], ...]


@dataclass(frozen=True)
class Transformer:
    """``functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)``: a callable."""

    classes: tuple[str, ...]


@dataclass(frozen=True)
class Lambda:
    """``functools.partial(lambda_auto_wrap_policy, lambda_fn=match)``: a callable."""

    match: Match


@dataclass(frozen=True)
class SizeBased:
    """``functools.partial(size_based_auto_wrap_policy, ...)``; None takes the function's attributes."""

    min_num_params: int = DEFAULT_MIN_NUM_PARAMS
    force_leaf: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Individually:
    """``partial(_wrap_module_cls_individually, module_classes=classes)``: what mixed precision or-s in."""

    classes: tuple[str, ...]


@dataclass(frozen=True)
class Or:
    """``functools.partial(_or_policy, policies=[...])``."""

    policies: tuple[Callable_, ...]


Callable_ = Transformer | Lambda | SizeBased | Individually | Or
Policy = ModuleWrap | Custom | Callable_


def decide(policy: Callable_, path: str, module: Module, recurse: bool, numel: int) -> bool:
    """What a callable policy answers for ``module`` with ``nonwrapped_numel=numel``."""
    if isinstance(policy, Or):
        return any(decide(p, path, module, recurse, numel) for p in policy.policies)
    if isinstance(policy, SizeBased):
        large = numel >= policy.min_num_params
        if recurse:
            leaf = policy.force_leaf if policy.force_leaf is not None else FORCE_LEAF_MODULES
            return large and not module.is_a(leaf)
        exclude = policy.exclude if policy.exclude is not None else EXCLUDE_WRAP_MODULES
        return large and not module.is_a(exclude)
    if recurse:
        return True  # every other callable always descends
    if isinstance(policy, Transformer | Individually):
        return module.is_a(policy.classes)
    if isinstance(policy, Lambda):
        return policy.match(path, module)
    raise TypeError(f"not a callable policy: {policy!r}")


# -- the result -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """One FSDP unit: its module's path and class, what it flattens (names relative to its module, elements, in
    flattening order), the other names its tensors have inside it, and the keyword arguments in which it differs
    from the root (``(("mixed_precision", None),)`` for a module mixed precision leaves alone)."""

    path: str
    type: str
    params: tuple[tuple[str, int], ...]
    shared: tuple[str, ...] = ()
    kwargs: Kwargs = ()

    @property
    def name(self) -> str:
        return self.path or ROOT

    @property
    def numels(self) -> list[int]:
        return [numel for _, numel in self.params]

    @property
    def numel(self) -> int:
        return sum(self.numels)


@dataclass(frozen=True)
class SplitTie:
    """A tensor whose registrations lie in more than one unit: ``holder`` flattened it; the modules registering it
    at ``outside`` are in other units and see the holder's shard."""

    tensor: str
    holder: str
    outside: tuple[str, ...]


@dataclass(frozen=True)
class Wrap:
    units: tuple[Unit, ...]  # in construction order: each unit after the units inside it, the root last
    walk: str  # "post-order apply" (a _Policy), "recursive wrap" (a callable), "none" (no policy)
    split_ties: tuple[SplitTie, ...] = ()
    visits: int = 0  # calls of _recursive_wrap: the modules its walk entered

    def unit(self, name: str) -> Unit:
        for unit in self.units:
            if unit.name == name:
                return unit
        raise KeyError(f"no unit {name!r}; units: {[u.name for u in self.units]}")

    @property
    def names(self) -> list[str]:
        return [u.name for u in self.units]


class RankDependentCount(ValueError):
    """``_recursive_wrap`` would count a tensor that a unit outside the subtree already sharded: at its shard's
    size, which differs between ranks, so the ranks may wrap differently."""


# -- the walks ------------------------------------------------------------------------------------------------------
def wrap(tree: Module, policy: Policy | None, *, mixed_precision_ignore: Sequence[str] | None = None) -> Wrap:
    """The units FSDP1 builds for ``FullyShardedDataParallel(tree, auto_wrap_policy=policy)``.
    ``mixed_precision_ignore``: None without a ``MixedPrecision``, else its ``_module_classes_to_ignore``."""
    regs = registrations(tree)
    modules = dict(walk(tree))
    visits: list[str] = []
    if policy is None:
        targets: dict[str, Kwargs] = {}
        walk_name = "none"
    elif isinstance(policy, ModuleWrap | Custom):
        targets = _policy_targets(tree, policy, mixed_precision_ignore)
        walk_name = "post-order apply"
    else:
        targets = _recursive_targets(tree, policy, regs, mixed_precision_ignore, visits)
        walk_name = "recursive wrap"
    order = [*targets, ""]
    taken: dict[str, str] = {}
    units = [_build(path, modules[path], regs, taken, targets.get(path, ())) for path in order]
    return Wrap(tuple(units), walk_name, _split_ties(regs, taken, order), len(visits))


def _policy_targets(tree: Module, policy: ModuleWrap | Custom, ignore: Sequence[str] | None) -> dict[str, Kwargs]:
    """A ``_Policy``'s targets with their kwargs, then in post-order (the order ``_post_order_apply`` builds them);
    the root is left out (``_construct_wrap_fn``)."""
    chosen: dict[str, Kwargs] = {}
    for path, module in first_registrations(tree):
        if isinstance(policy, ModuleWrap):
            if module.is_a(policy.classes):
                chosen[path] = ()
            continue
        for match, value in policy.rules:
            if match(path, module):
                if value:  # False and an empty dict take nothing
                    chosen[path] = () if value is True else tuple(sorted(dict(value).items()))
                break
    if ignore is not None:
        for path, module in first_registrations(tree):
            if module.is_a(ignore):
                chosen[path] = _with(chosen.get(path, ()), NO_MIXED_PRECISION)
    return {path: chosen[path] for path, _ in post_order(tree) if path in chosen and path != ""}


def _recursive_targets(tree: Module, policy: Callable_, regs: list[Registration], ignore: Sequence[str] | None,
                       visits: list[str]) -> dict[str, Kwargs]:  # fmt: skip
    """``_recursive_wrap``'s units in the order it builds them, each with the ``_wrap_overrides`` mixed precision
    puts on instances of the ignored classes; ``visits`` gets the path of every module the walk enters."""
    if ignore is not None:
        policy = Or((policy, Individually(tuple(ignore))))
    built: dict[str, Kwargs] = {}
    holder: dict[str, str] = {}  # tensor -> the unit that took it

    def count(path: str) -> int:
        tensors = {r.tensor: r.numel for r in regs if within(r.module, path)}
        early = sorted(t for t in tensors if t in holder and not within(holder[t], path))
        if early:
            raise RankDependentCount(f"counting {path or 'the root'} meets {early}, already sharded by "
                                     f"{[holder[t] or ROOT for t in early]}")  # fmt: skip
        return sum(tensors.values())

    def recurse(path: str, module: Module, only_children: bool) -> int:
        visits.append(path)
        nonwrapped = count(path)
        if not decide(policy, path, module, True, nonwrapped):
            return 0
        taken = sum(recurse(join(path, c.name), c, False) for c in module.children if c.alias_of is None)
        if only_children or not decide(policy, path, module, False, nonwrapped - taken):
            return taken
        built[path] = NO_MIXED_PRECISION if ignore is not None and module.is_a(ignore) else ()
        for r in regs:
            if within(r.module, path):
                holder.setdefault(r.tensor, path)
        return nonwrapped

    recurse("", tree, True)
    return built


def _with(kwargs: Kwargs, extra: Kwargs) -> Kwargs:
    return tuple(sorted({**dict(kwargs), **dict(extra)}.items()))


def _build(path: str, module: Module, regs: list[Registration], taken: dict[str, str], kwargs: Kwargs) -> Unit:
    """The unit at ``path``: the tensors registered in its subtree that no earlier unit took, named by their first
    registration there; ``taken`` (tensor -> unit) is updated."""
    params: list[tuple[str, int]] = []
    shared: list[str] = []
    mine: set[str] = set()
    for r in regs:
        if not within(r.module, path):
            continue
        if r.tensor in mine:
            shared.append(relative(r.fqn, path))
        elif r.tensor not in taken:
            mine.add(r.tensor)
            taken[r.tensor] = path
            params.append((relative(r.fqn, path), r.numel))
    return Unit(path, module.type, tuple(params), tuple(shared), kwargs)


def _split_ties(regs: list[Registration], taken: Mapping[str, str], units: Sequence[str]) -> tuple[SplitTie, ...]:
    """Tensors registered outside the unit that flattened them (the innermost unit holding each registration is
    the one whose path is the longest prefix)."""
    ties = []
    for tensor, holder in taken.items():
        outside = tuple(r.fqn for r in regs if r.tensor == tensor and _unit_of(r.module, units) != holder)
        if outside:
            ties.append(SplitTie(tensor, holder, outside))
    return tuple(ties)


def _unit_of(module_path: str, units: Iterable[str]) -> str:
    return max((u for u in units if within(module_path, u)), key=len, default="")


# -- FSDP2 ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """What one ``fully_shard(module)`` call manages: its parameters (names relative to the module, elements, in
    FSDP2's order) and those an earlier call had already sharded."""

    path: str
    params: tuple[tuple[str, int], ...]
    already_sharded: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.path or ROOT


def fsdp2_groups(tree: Module, calls: Sequence[str]) -> list[Group]:
    """``fully_shard`` on the module at each path of ``calls``, in that order."""
    regs = registrations(tree)
    modules = dict(walk(tree))
    sharded: set[str] = set()  # modules an earlier call sharded
    owner: dict[str, str] = {}  # tensor -> the call that sharded it
    groups = []
    for call in calls:
        managed = list(_managed(modules[call], call, sharded))
        params, already, seen = [], [], set()
        for path in managed:
            for r in regs:
                if r.module != path or r.tensor in seen:
                    continue
                seen.add(r.tensor)
                params.append((relative(r.fqn, call), r.numel))
                if r.tensor in owner:
                    already.append(relative(r.fqn, call))
                else:
                    owner[r.tensor] = call
        sharded.add(call)
        groups.append(Group(call, tuple(params), tuple(already)))
    return groups


def _managed(module: Module, path: str, sharded: set[str], top: bool = True,
             visited: set[str] | None = None) -> Iterator[str]:  # fmt: skip
    """``_get_managed_modules``: the subtree in post-order, not entering a module an earlier call sharded, nor a
    module object this call already met (a second registration: ``visited_modules``)."""
    visited = set() if visited is None else visited
    identity = module.alias_of or path  # one module object, whatever name it is met under
    if not top and (identity in sharded or identity in visited):
        return
    visited.add(identity)
    for child in module.children:
        yield from _managed(child, join(path, child.name), sharded, top=False, visited=visited)
    yield path


# -- what a granularity costs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cost:
    """One FULL_SHARD step (``use_orig_params=True``, BACKWARD_PRE, no forward prefetch) on N ranks."""

    padded: dict[str, int] = field(default_factory=dict)  # each unit's padded unsharded flat parameter, elements
    largest_all_gather: int = 0  # elements
    unsharded_peak: int = 0  # bytes of unsharded flat parameters alive at once
    collectives: dict[str, int] = field(default_factory=dict)  # per step, by op
    padding: int = 0  # elements the flat parameters add, all units

    @property
    def collectives_per_step(self) -> int:
        return sum(self.collectives.values())


def cost(wrap_: Wrap, world_size: int, element_bytes: int = 4, post_forward: Sequence[str] | None = None) -> Cost:
    """What the units of ``wrap_`` cost. ``element_bytes``: the dtype the units compute in (alignment and
    unsharded bytes); ``post_forward``: the inner units in the order their forwards end, by default the order they
    were built (children before parents, siblings in registration order), as in a model that runs its children in
    registration order. A unit left without parameters (a root whose every parameter a wrapped child holds) has
    no flat parameter and no handle: it communicates nothing and is not in the post-forward order."""
    with_params = [u for u in wrap_.units if u.params]
    if not with_params:
        raise ValueError("no unit holds a parameter: there is nothing to shard")
    padded = {u.name: padded_numel(u.numels, element_bytes, world_size) for u in with_params}
    root_params = ROOT in padded
    inner = list(post_forward) if post_forward is not None else [u.name for u in with_params if u.name != ROOT]
    if unknown := [u for u in inner if u not in padded]:
        raise ValueError(f"post_forward names units that hold no parameters or do not exist: {unknown}")
    order = [*inner, ROOT] if root_params else inner
    step = sharded_step(padded, freed_after_forward("full-shard", padded, ROOT), element_bytes, world_size,
                        backward_order=list(reversed(order)))  # fmt: skip
    counts: dict[str, int] = {}
    for op in step.ops:
        counts[op.op] = counts.get(op.op, 0) + 1
    return Cost(
        padded=padded,
        largest_all_gather=max(padded.values()),
        unsharded_peak=unsharded_peak(step_events(order, root_params=root_params), padded, element_bytes),
        collectives=counts,
        padding=sum(padded[u.name] - u.numel for u in with_params),
    )


def step_events(post_forward: Sequence[str], *, root_params: bool = True) -> list[str]:
    """When each unit's unsharded flat parameter exists over a FULL_SHARD step, as ``wait_unshard U`` / ``free U``:
    forward keeps the root's from its pre-forward to the end of backward and each inner unit's over its own
    forward; backward follows the prefetch model (BACKWARD_PRE), each unit freed by its post-backward.
    ``root_params=False``: ``post_forward`` holds inner units only, and there is no root flat parameter."""
    *inner, root = post_forward if root_params else [*post_forward, None]
    events = [f"wait_unshard {root}"] if root is not None else []
    for unit in inner:
        events += [f"wait_unshard {unit}", f"free {unit}"]
    for line in backward_sequence(post_forward, "BACKWARD_PRE", root_params=root_params):
        kind, _, rest = line.partition(" ")
        if kind == "pre_backward":
            events.append(f"wait_unshard {rest}")
        elif kind == "prefetch":
            events.append(f"wait_unshard {rest.split('→')[1]}")
        else:
            events.append(f"free {rest}")
    return events
