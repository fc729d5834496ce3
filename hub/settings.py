"""The hub's one settings model, read once in main and passed down."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from hub.core.ratelimit import BURST, RATE_PER_S
from hub.core.refusals import LISTED as REFUSALS_LISTED
from hub.core.refusals import WINDOW_S as REFUSALS_WINDOW_S

#: How long an ended workload stays in the store by default (`hub.retention`).
KEEP_ENDED_S = 90 * 24 * 3600.0


class HubSettings(BaseModel):
    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds: Path | None = Field(default=None, description="NATS .creds file (0600).")
    nats_ca: Path | None = Field(default=None, description="CA of the NATS server (TLS).")
    store_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default SQLite under data_dir."
    )
    data_dir: Path = Path(".gpufed/hub")
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    advertise_url: str = Field(
        default="",
        description="The API URL other replicas name when this hub leads "
        "(default http://<api_host>:<api_port>).",
    )
    policy_file: Path | None = None
    admin_token: str | None = Field(
        default=None, description="A static admin bearer token beside the stored API tokens."
    )
    oidc_config: Path | None = Field(
        default=None, description="OIDC issuer, JWKS and group mapping (YAML, see hub.oidc)."
    )
    debounce_s: float = Field(default=0.005, ge=0)
    cycle_interval_s: float = Field(
        default=0.02, ge=0, description="Least time from one scheduling cycle's start to the next."
    )
    tick_s: float = Field(default=2.0, gt=0)
    suspect_after_s: float = Field(default=15.0, gt=0)
    lost_after_s: float = Field(default=120.0, gt=0)
    event_domains: tuple[str, ...] = Field(
        default=(),
        description="JetStream domains of regional leaf nodes whose event streams the hub sources.",
    )
    leader_poll_s: float = Field(
        default=1.0,
        gt=0,
        description="How long a standby waits on the leader's lock at a time (it takes "
        "over the moment the lock is free), and how often the leader checks it still holds it.",
    )
    missing_grace_s: float = Field(
        default=5.0, ge=0, description="How long a placement may be absent from a spoke's sync."
    )
    keep_ended_s: float = Field(
        default=KEEP_ENDED_S,
        gt=0,
        description="How long an ended workload stays in the store (and in usage reports) "
        "before the leader removes it with its attempts.",
    )
    sweep_ended_every_s: float = Field(
        default=60.0, gt=0, description="How often the leader removes what is past its keep."
    )
    audit_refusals_listed: int = Field(
        default=REFUSALS_LISTED,
        ge=0,
        description="Refusals alike (one caller, action, team and result) audited one by one "
        "per window; the rest are counted in one entry as it ends (0: every one listed).",
    )
    audit_refusals_window_s: float = Field(default=REFUSALS_WINDOW_S, gt=0)
    api_rate_per_s: float = Field(
        default=RATE_PER_S,
        ge=0,
        description="API requests a second each caller may make, sustained (admins are not "
        "limited; 0: no limit).",
    )
    api_burst: int = Field(
        default=BURST, ge=1, description="API requests a caller may make at once."
    )
    drain_s: int = Field(
        default=10,
        ge=0,
        description="On stop, how long the API lets requests in flight finish (a streamed "
        "answer through the gateway, say) before it cuts them.",
    )

    def resolved_advertise_url(self) -> str:
        return self.advertise_url or f"http://{self.api_host}:{self.api_port}"

    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{self.data_dir / 'hub.db'}"
