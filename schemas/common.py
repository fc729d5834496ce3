"""Base of every wire model."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

SCHEMA_VERSION = 1

#: RFC 1123 DNS label: what Kubernetes accepts as a namespace or Job name part.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=63)]

#: Identifiers we mint (workload ids, spoke ids): also usable as NATS subject tokens.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


class WireModel(BaseModel):
    """Every message on the bus.

    Unknown fields are ignored so an older reader accepts a newer writer's message; every field
    added after v1 must have a default so a newer reader accepts an older writer's message.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
