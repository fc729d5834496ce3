"""Base of every wire model."""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, model_validator

SCHEMA_VERSION = 1

#: RFC 1123 DNS label: what Kubernetes accepts as a namespace or Job name part.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=63)]

#: Identifiers we mint (workload ids, decision ids): also usable as NATS subject tokens.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]

#: A spoke id is part of ids derived from it (event ids `<spoke>-<workload>-e<epoch>-<phase>`,
#: the consumer `spoke-<id>`, NATS user names): at most SPOKE_ID_MAX characters, so they fit.
SPOKE_ID_MAX = 48
SPOKE_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{SPOKE_ID_MAX - 1}}}$"
SpokeId = Annotated[str, StringConstraints(pattern=SPOKE_ID_PATTERN)]

#: Event ids are derived (spoke id, workload id, epoch, phase): 48 + 1 + 63 + 2 + 10 + 1 + 9
#: characters at most, longer than one Identifier.
EVENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,159}$"
EventId = Annotated[str, StringConstraints(pattern=EVENT_ID_PATTERN)]

#: The start of every burst id (`<prefix>-<seq>-<n>-<digest>`, a spoke id: 48 at most).
BURST_ID_PREFIX_MAX = 16
BURST_ID_PREFIX_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{BURST_ID_PREFIX_MAX - 1}}}$"

#: A GPU model's name as the fleet reports it (H100, A100-80GB, nvidia_l4).
GPU_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"

#: What each pattern a person types against asks for, in words: a refusal says this, not the
#: regular expression.
PATTERN_MEANINGS = {
    DNS_LABEL_PATTERN: (
        "lower-case letters, digits and '-', starting and ending with a letter or digit"
    ),
    ID_PATTERN: "letters, digits, '_' and '-', starting with a letter or digit (at most 63)",
    SPOKE_ID_PATTERN: (
        f"letters, digits, '_' and '-', starting with a letter or digit (at most {SPOKE_ID_MAX})"
    ),
    BURST_ID_PREFIX_PATTERN: (
        "letters, digits, '_' and '-', starting with a letter or digit "
        f"(at most {BURST_ID_PREFIX_MAX})"
    ),
    GPU_MODEL_PATTERN: (
        "letters, digits, '_', '.' and '-', starting with a letter or digit (such as H100)"
    ),
}

#: Largest assignment epoch (so a derived id stays bounded).
MAX_EPOCH = 2**31 - 1

#: C0 control characters and DEL, except tab, newline and carriage return.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def refuse_control(value: str) -> str:
    """`value` unchanged, or ValueError when it holds a NUL byte or another control character
    (tab, newline and carriage return are allowed: scripts have them)."""
    found = _CONTROL.search(value)
    if found is not None:
        raise ValueError(
            f"contains control character {found.group()!r} at {found.start()} (NUL bytes and "
            "control characters other than tab and newline are refused)"
        )
    return value


def clean_text(value: str, max_length: int) -> str:
    """`value` made fit for a bounded text field: control characters replaced, then cut."""
    cleaned = _CONTROL.sub("\ufffd", value)
    return cleaned if len(cleaned) <= max_length else cleaned[: max_length - 3] + "..."


#: Free text on the wire: reasons, messages, incarnations.
ShortText = Annotated[str, StringConstraints(max_length=256), AfterValidator(refuse_control)]
LongText = Annotated[str, StringConstraints(max_length=4096), AfterValidator(refuse_control)]
#: A label key (Kubernetes syntax, optional DNS prefix) and value.
LabelKey = Annotated[
    str,
    StringConstraints(
        max_length=253,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    ),
]
LabelValue = Annotated[str, StringConstraints(max_length=63), AfterValidator(refuse_control)]
MAX_LABELS = 64


class WireModel(BaseModel):
    """Every message on the bus.

    Unknown fields are ignored so an older reader accepts a newer writer's message; every field
    added after v1 must have a default so a newer reader accepts an older writer's message.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION


def json_runs(payloads: Sequence[bytes], most: int, most_bytes: int) -> list[slice]:
    """Where to cut `payloads`, in order, into runs that go one JSON array each: at most `most`
    documents and about `most_bytes` a run (a document larger than that is a run of its own)."""
    runs: list[slice] = []
    start, size = 0, 0
    for i, payload in enumerate(payloads):
        if i > start and (i - start == most or size + len(payload) > most_bytes):
            runs.append(slice(start, i))
            start, size = i, 0
        size += len(payload) + 1
    if start < len(payloads):
        runs.append(slice(start, len(payloads)))
    return runs


def json_array(items: Sequence[bytes]) -> bytes:
    """One message's payload for these JSON documents, in order: the document itself when it
    is alone, else a JSON array of them (events and commands go several to a message)."""
    return items[0] if len(items) == 1 else b"[" + b",".join(items) + b"]"


def is_json_array(data: bytes) -> bool:
    """Whether `data` holds a JSON array (several documents) rather than one document."""
    return data.lstrip()[:1] == b"["


def nearest_name(name: str, known: Collection[str]) -> str | None:
    """The known name `name` was likely meant to be: the same but for case, a close spelling,
    or one it begins; None when none is near."""
    by_lower = {k.lower(): k for k in known}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else next((k for k in known if k.startswith(name)), None)


#: A spec a person writes that is also a wire model keeps the fields its class does not define
#: (a reader still ignores them) so that the hub can refuse a writer's typo (`gpus: 8`) instead
#: of running one GPU (`extra_fields`).
KEEPS_UNKNOWN = ConfigDict(extra="allow", frozen=True)


#: The parts of a spec whose fields are checked: each with the key it is under, with a dot
#: (`""` for the spec itself, `"affinity."` for its `affinity`), and its model.
SpecParts = Sequence[tuple[str, type[BaseModel]]]


def extra_fields(spec: BaseModel, parts: SpecParts) -> list[tuple[str, str | None]]:
    """The fields a writer named that these `parts` of a KEEPS_UNKNOWN `spec` do not have,
    each prefixed and with the nearest one it has, if any. Empty for none."""
    found: list[tuple[str, str | None]] = []
    for prefix, model in parts:
        extra = (getattr(spec, prefix[:-1]) if prefix else spec).model_extra
        if not extra:
            continue  # nearly every spec: checked on every submission
        found += unknown_names(extra, model.model_fields, prefix)
    return found


def unknown_names(
    names: Iterable[str], known: Collection[str], prefix: str = ""
) -> list[tuple[str, str | None]]:
    """Those of `names` not `known`, prefixed, each with the nearest known one, if any."""
    found: list[tuple[str, str | None]] = []
    for name in names:
        if name not in known:
            near = nearest_name(name, known)
            found.append((prefix + name, prefix + near if near else None))
    return found


def unknown_text(pairs: Sequence[tuple[str, str | None]]) -> str:
    """'unknown fields: gpus (did you mean gpus_per_node?), x' for (name, nearest) pairs."""
    named = [f"{name} (did you mean {near}?)" if near else name for name, near in pairs]
    return f"unknown field{'s' if len(named) > 1 else ''}: {', '.join(named)}"


class StrictDoc(BaseModel):
    """A document a person writes (the policy, its idle rules): frozen, no inf or NaN, and a
    field it does not define refused naming the one it likely meant (a typo never silently
    does nothing)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            known = cls.model_fields
            unknown = [str(key) for key in data if key not in known]
            if unknown:
                raise ValueError(unknown_text([(n, nearest_name(n, known)) for n in unknown]))
        return data
