"""`gpufed policy set`'s warnings: quotas for GPU models no spoke has.

A quota key is the model's name as spokes report it, case and all: `h100` is another model
than `H100`, and a team given `h100: {guaranteed: 16}` has no H100 guarantee. The hub cannot
refuse it (a model may be on order, or come only with cloud instances), so the command that
sets the policy says so. Pure: the policy as the hub answered it and the models in the fleet.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from schemas.common import nearest_name

#: The quota key that stands for every model not named.
ANY_MODEL = "*"


def unknown_models(document: Mapping[str, Any], fleet: Collection[str]) -> list[str]:
    """One line per model the policy's quotas name that no spoke in `fleet` has, naming where
    it is used and the model it was likely meant to be; none when the fleet is empty."""
    if not fleet:
        return []
    used: dict[str, list[str]] = {}
    _collect(document, "", used)
    lines = []
    for model in sorted(used.keys() - set(fleet) - {ANY_MODEL}):
        line = f"no spoke has GPU model {model} now (quotas of {', '.join(used[model])})"
        near = nearest_name(model, fleet)
        lines.append(f"{line}; did you mean {near}?" if near else line)
    return lines


def _collect(node: Any, owner: str, used: dict[str, list[str]]) -> None:
    if not isinstance(node, Mapping):
        return
    quotas = node.get("quotas")
    if isinstance(quotas, Mapping) and owner:
        for model in quotas:
            used.setdefault(str(model), []).append(owner)
    for key, kind in (("departments", "department"), ("teams", "team")):
        entries = node.get(key)
        if isinstance(entries, list):  # [{name: ..., quotas: ...}]
            named = [(e.get("name"), e) for e in entries if isinstance(e, Mapping)]
        elif isinstance(entries, Mapping):  # a window's {name: {quotas: ...}}
            named = list(entries.items())
        else:
            continue
        for name, entry in named:
            _collect(entry, _within(owner, f"{kind} {name}"), used)
    if isinstance(node.get("default_team"), Mapping):
        _collect(node["default_team"], _within(owner, "the default team"), used)
    for window in node.get("windows") or ():
        if isinstance(window, Mapping):
            _collect(window, f"window {window.get('name')}", used)


def _within(owner: str, part: str) -> str:
    return f"{part} in {owner}" if owner else part
