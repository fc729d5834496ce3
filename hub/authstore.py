"""Persistence of API tokens (hashed) and the audit log.

Same database and engine as `hub.store.Store` (the tables come from migration 5). Every method
is one short transaction and blocks: the hub calls them through `HubService.db`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel
from sqlalchemy import Engine, Index, insert, update
from sqlmodel import Field, Session, SQLModel, col, select


class ApiTokenRow(SQLModel, table=True):
    __tablename__ = "api_tokens"
    id: str = Field(primary_key=True)
    user_name: str
    team: str | None = None
    role: str
    secret_hash: str
    created_at: float
    created_by: str
    expires_at: float | None = None
    revoked_at: float | None = None


class AuditRow(SQLModel, table=True):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_team", "team"), Index("ix_audit_log_at", "at"))
    seq: int | None = Field(default=None, primary_key=True)
    at: float
    actor: str
    role: str
    action: str
    team: str | None = None
    target: str
    result: str
    detail: str
    via: str = Field(default="", sa_column_kwargs={"server_default": ""})


class TokenRecord(BaseModel):
    """An API token as stored: never the secret, only its SHA-256."""

    id: str
    user: str
    team: str | None
    role: str
    secret_hash: str
    created_at: float
    created_by: str
    expires_at: float | None = None
    revoked_at: float | None = None


class AuditEntry(BaseModel):
    """One mutating action: who, when, what, on which team and target, and how it ended."""

    seq: int = 0
    at: float
    actor: str
    role: str
    action: str
    team: str | None = None
    target: str = ""
    result: str
    detail: str = ""
    via: str = ""  # how the caller was authenticated: token:<id>, oidc:<issuer>, admin-token


class AuthStore:
    """Tokens and audit entries in the hub's database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- tokens ---

    def add_token(self, token: TokenRecord) -> None:
        """Insert a new token (its id is fresh: minted by `hub.tokens`)."""
        with Session(self.engine) as session:
            session.add(
                ApiTokenRow(
                    id=token.id,
                    user_name=token.user,
                    team=token.team,
                    role=token.role,
                    secret_hash=token.secret_hash,
                    created_at=token.created_at,
                    created_by=token.created_by,
                    expires_at=token.expires_at,
                )
            )
            session.commit()

    def token(self, token_id: str) -> TokenRecord | None:
        """The token with this id (revoked ones too), or None."""
        with Session(self.engine) as session:
            row = session.get(ApiTokenRow, token_id)
            return None if row is None else _token(row)

    def tokens(self) -> list[TokenRecord]:
        """Every token, oldest first."""
        with Session(self.engine) as session:
            rows = session.exec(select(ApiTokenRow).order_by(col(ApiTokenRow.created_at))).all()
            return [_token(r) for r in rows]

    def revoke_token(self, token_id: str, at: float) -> bool:
        """Revoke; False if there is no such token (revoking twice keeps the first time)."""
        table: object = ApiTokenRow.__table__  # type: ignore[attr-defined]
        with self.engine.begin() as conn:
            exists = conn.execute(select(ApiTokenRow.id).where(ApiTokenRow.id == token_id)).first()
            if exists is None:
                return False
            conn.execute(
                update(table)  # type: ignore[arg-type]
                .where(col(ApiTokenRow.id) == token_id)
                .where(col(ApiTokenRow.revoked_at).is_(None))
                .values(revoked_at=at)
            )
            return True

    # --- audit ---

    def append_audit(self, entry: AuditEntry) -> None:
        """Append one entry (never updated or deleted)."""
        self.append_audits([entry])

    def append_audits(self, entries: Iterable[AuditEntry]) -> None:
        """Append entries in their order, in one transaction (all or none)."""
        rows = [e.model_dump(exclude={"seq"}) for e in entries]
        if not rows:
            return
        table: object = AuditRow.__table__  # type: ignore[attr-defined]
        with self.engine.begin() as conn:  # one executemany: no ORM object per entry
            conn.execute(insert(table), rows)  # type: ignore[arg-type]

    def audit(
        self,
        *,
        teams: Iterable[str] | None = None,
        action: str | None = None,
        via: str | None = None,
        since: float = 0.0,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """Entries, newest first; `teams` None means all (else entries of those teams only)."""
        with Session(self.engine) as session:
            query = select(AuditRow).where(col(AuditRow.at) >= since)
            if teams is not None:
                query = query.where(col(AuditRow.team).in_(list(teams)))
            if action:
                query = query.where(AuditRow.action == action)
            if via:
                query = query.where(AuditRow.via == via)
            query = query.order_by(col(AuditRow.seq).desc()).limit(limit)
            return [AuditEntry.model_validate(r.model_dump()) for r in session.exec(query)]


def _token(row: ApiTokenRow) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        user=row.user_name,
        team=row.team,
        role=row.role,
        secret_hash=row.secret_hash,
        created_at=row.created_at,
        created_by=row.created_by,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )
