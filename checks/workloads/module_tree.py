"""An ``nn.Module`` as `checks.models.wrap`'s plain tree, its modules' paths taken before wrapping, and the names a
policy may use for its classes: what guide 20's checks and ``fsdp-readings inspect`` hand the wrap model. Reads
attributes only: works on the meta device."""

from __future__ import annotations

from torch import nn

from checks.models import wrap as wm


def tree_of(model: nn.Module) -> wm.Module:
    """``model`` as the wrap model's input: each module's attribute name, class and base-class names, own
    parameters (a tied one names the first registration of its tensor) and children, in registration order; a
    module registered twice says where it was first (``alias_of``), and so do its children."""
    first: dict[int, str] = {}
    seen: dict[int, str] = {}

    def node(name: str, module: nn.Module, prefix: str) -> wm.Module:
        alias_of = seen.get(id(module))  # a module registered a second time: its parameters are ties
        seen.setdefault(id(module), prefix)
        params = []
        for param_name, param in module._parameters.items():
            if param is None:
                continue
            fqn = wm.join(prefix, param_name)
            primary = first.setdefault(id(param), fqn)
            params.append(wm.Param(param_name, param.numel(), None if primary == fqn else primary))
        children = tuple(node(child_name, child, wm.join(prefix, child_name))
                         for child_name, child in module._modules.items() if child is not None)  # fmt: skip
        bases = tuple(base.__name__ for base in type(module).__mro__[1:] if base is not object)
        return wm.Module(name, type(module).__name__, tuple(params), children, bases, alias_of)

    return node("", model, "")


def module_paths(model: nn.Module) -> dict[int, str]:
    """id(module) -> its path, taken before wrapping (wrapping inserts ``_fsdp_wrapped_module``)."""
    return {id(module): path for path, module in model.named_modules()}


def classes_of(model: nn.Module) -> dict[str, type[nn.Module]]:
    """Every class name a policy could name for this model: its modules' classes and their base classes (an
    ``isinstance`` test matches either), ``object`` aside. Two classes of one name: the first met wins."""
    out: dict[str, type[nn.Module]] = {}
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls is not object and issubclass(cls, nn.Module):
                out.setdefault(cls.__name__, cls)
    return out
