"""GPU model names as people type them: taken in the fleet's spelling, whatever the case.

Spokes report their GPUs' models (`H100`, `A100-SXM4-80GB`), and placement matches a
workload's `gpu_models` to them exactly. A data scientist who types `--gpu-model h100` means
`H100`; taken as typed, the workload would wait for ever behind "no schedulable node has h100
GPUs" while H100s idle, and burst (which matches models whatever their case) could rent an
H100 it cannot use. So the hub takes a submitted model the fleet spells otherwise only in case
in the fleet's spelling; one no spoke has reported is kept as typed until one does (a cloud
spoke burst rented for it, a spoke that joins later), when the queued work that asked for it
is spelt as the fleet spells it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from schemas import WorkloadSpec


def learn(known: dict[str, str], models: Iterable[str]) -> list[str]:
    """Note the models a spoke reports in `known` (case-folded name -> the spelling first
    reported); a spelling once learnt stays, so one workload's model never moves between two.
    Returns the models new to `known`."""
    new = []
    for model in models:
        key = model.casefold()
        if key not in known:
            known[key] = model
            new.append(model)
    return new


def canonical(models: tuple[str, ...], known: Mapping[str, str]) -> tuple[str, ...]:
    """`models`, each in the fleet's spelling where the fleet knows it under another case; the
    very tuple when none changes."""
    spelt = tuple(known.get(model.casefold(), model) for model in models)
    return models if spelt == models else spelt


def respelt(spec: WorkloadSpec, known: Mapping[str, str]) -> WorkloadSpec:
    """`spec` asking for its models in the fleet's spelling (`canonical`); the very spec when
    nothing changes."""
    if not spec.gpu_models:
        return spec
    models = canonical(spec.gpu_models, known)
    return spec if models is spec.gpu_models else spec.model_copy(update={"gpu_models": models})
