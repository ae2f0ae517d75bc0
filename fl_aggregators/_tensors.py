"""Views of parameters as an ordered list of tensors, and back, without copying."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import torch

from fl_aggregators.update import Params


def tensors_of(params: Params) -> list[torch.Tensor]:
    """The tensors of a flat tensor or a state dict, in order (the same objects, no copy)."""
    if isinstance(params, torch.Tensor):
        return [params]
    return list(params.values())


def placed_like(reference: list[torch.Tensor], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors``, each on its ``reference`` tensor's device: a result lives where the global
    model lives (a client on a GPU beside a server on the CPU, or the reverse). The same
    objects where the devices already match (no copy)."""
    return [
        t if t.device == r.device else t.to(r.device)
        for r, t in zip(reference, tensors, strict=True)
    ]


def rebuild(template: Params, tensors: list[torch.Tensor]) -> Params:
    """Put ``tensors`` back into ``template``'s form (same keys, same container type)."""
    if isinstance(template, torch.Tensor):
        return tensors[0]
    # Always an OrderedDict: FedML reads a plain dict as one model per client.
    return OrderedDict(zip(template.keys(), tensors, strict=True))


def structure_mismatch(reference: Params, params: Params) -> str | None:
    """Why ``params`` cannot be aggregated with ``reference`` (``None`` if it can)."""
    if isinstance(reference, torch.Tensor) != isinstance(params, torch.Tensor):
        return "parameters are not in the same form (flat tensor vs state dict) as the global model"
    if isinstance(reference, Mapping) and isinstance(params, Mapping):
        if list(reference.keys()) != list(params.keys()):
            missing = sorted(set(reference) - set(params))
            extra = sorted(set(params) - set(reference))
            return f"state dict keys differ (missing {missing[:3]}, unexpected {extra[:3]})"
    names = list(reference.keys()) if isinstance(reference, Mapping) else ["params"]
    for name, ref, got in zip(names, tensors_of(reference), tensors_of(params), strict=True):
        if not isinstance(got, torch.Tensor):
            return f"{name} is a {type(got).__name__}, not a tensor"
        if got.shape != ref.shape:
            return f"{name} has shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
        if got.dtype != ref.dtype:
            return f"{name} has dtype {got.dtype}, expected {ref.dtype}"
    return None
