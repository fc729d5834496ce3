"""OIDC bearer tokens: JWTs verified against an issuer's JWKS, groups mapped to team roles.

Verification is PyJWT's (signature, `exp`/`nbf`/`iat`, `iss`, `aud`); the JWKS comes from a
file (read at start) or a URL (fetched by PyJWT's `PyJWKClient`, cached, refetched for an
unknown `kid`). The configuration is a YAML file given to `gpufed hub --oidc-config`:

    issuer: https://login.example.com/realms/ml
    audience: gpufed
    jwks_url: https://login.example.com/realms/ml/protocol/openid-connect/certs
    user_claim: email            # default: sub
    groups_claim: groups         # default: groups
    admin_groups: [platform-admins]
    group_roles:                 # group -> a team and a role on it
      ml-vision: {team: vision, role: member}
      ml-vision-leads: {team: vision, role: team-admin}
    groups_are_teams: false      # true: any other group named like a team is `member` of it
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jwt
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hub.core.access import Principal, Role, merge_roles
from hub.errors import HubError
from hub.tokens import InvalidToken
from schemas.common import DNS_LABEL_PATTERN
from schemas.errors import describe_problems

#: Asymmetric algorithms only: a shared-secret HS256 token could be forged by anyone who
#: holds the JWKS.
ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA")


class InvalidOidcConfig(HubError):
    """An `--oidc-config` (or the JWKS file it names) the hub cannot use: said in one line at
    start, naming the file and what is wrong."""

    code = "invalid_oidc_config"


class GroupGrant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    team: str = Field(pattern=DNS_LABEL_PATTERN, max_length=63)
    role: Role = Role.MEMBER

    @model_validator(mode="after")
    def _not_admin(self) -> GroupGrant:
        if self.role is Role.ADMIN:
            raise ValueError("admin is not a team role: list the group in admin_groups")
        return self


class OidcSettings(BaseModel):
    """How OIDC tokens are checked and what their groups grant."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(min_length=1)
    audience: str | None = None
    jwks_file: Path | None = None
    jwks_url: str | None = None
    user_claim: str = "sub"
    groups_claim: str = "groups"
    admin_groups: frozenset[str] = frozenset()
    group_roles: dict[str, GroupGrant] = Field(default_factory=dict)
    groups_are_teams: bool = False
    leeway_s: float = Field(default=30.0, ge=0, le=300)

    @model_validator(mode="after")
    def _one_key_source(self) -> OidcSettings:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("give exactly one of jwks_file and jwks_url")
        if not self.audience:
            # Without it any token of the issuer's would do: one it made for another
            # application (a wiki, a dashboard) would act on gpufed with its groups' roles.
            raise ValueError(
                "give the audience: the `aud` the issuer puts in tokens meant for gpufed "
                "(its client id); without it a token issued to any other application would do"
            )
        return self

    @classmethod
    def load(cls, path: Path) -> OidcSettings:
        """Read the YAML configuration file; raises InvalidOidcConfig naming what is wrong."""
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise InvalidOidcConfig(f"--oidc-config {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "cannot be parsed"
            raise InvalidOidcConfig(
                f"--oidc-config {path}: not valid YAML{at}: {problem}"
            ) from None
        if not isinstance(data, dict):
            raise InvalidOidcConfig(f"--oidc-config {path}: expected a mapping")
        try:
            settings = cls.model_validate(data)
        except ValidationError as exc:
            _, problem = describe_problems(exc.errors())
            raise InvalidOidcConfig(f"--oidc-config {path}: {problem}") from None
        if settings.jwks_file is not None and not settings.jwks_file.is_absolute():
            settings = settings.model_copy(update={"jwks_file": path.parent / settings.jwks_file})
        return settings


class OidcVerifier:
    """Checks one issuer's JWTs. `verify` blocks (a JWKS URL may be fetched): run it in a thread."""

    def __init__(self, settings: OidcSettings) -> None:
        self.settings = settings
        self._jwks: jwt.PyJWKSet | None = None
        self._client: jwt.PyJWKClient | None = None
        if settings.jwks_file is not None:
            self._jwks = _read_jwks(settings.jwks_file)
        else:
            assert settings.jwks_url is not None
            self._client = jwt.PyJWKClient(settings.jwks_url, cache_keys=True, timeout=5)

    def verify(self, token: str) -> Principal:
        """The principal of a valid token; raises InvalidToken for anything else."""
        s = self.settings
        try:
            key = self._key(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=list(ALGORITHMS),
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except (jwt.PyJWTError, ValueError, KeyError) as exc:
            raise InvalidToken(f"OIDC token refused: {exc}") from None
        user = claims.get(s.user_claim)
        if not isinstance(user, str) or not user:
            raise InvalidToken(f"OIDC token has no {s.user_claim!r} claim")
        groups = claims.get(s.groups_claim) or []
        if not isinstance(groups, list):
            raise InvalidToken(f"OIDC claim {s.groups_claim!r} is not a list")
        names = [g for g in groups if isinstance(g, str)]
        admin = any(g in s.admin_groups for g in names)
        grants = []
        for group in names:
            grant = s.group_roles.get(group)
            if grant is not None:
                grants.append((grant.team, grant.role))
            elif s.groups_are_teams and re.match(DNS_LABEL_PATTERN, group):
                grants.append((group, Role.MEMBER))
        return Principal(
            user=user[:128], teams=merge_roles(grants), admin=admin, via=f"oidc:{s.issuer}"
        )

    def _key(self, token: str) -> jwt.PyJWK:
        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token)
        assert self._jwks is not None
        kid = jwt.get_unverified_header(token).get("kid")
        if kid is None:
            if len(self._jwks.keys) == 1:
                return self._jwks.keys[0]
            raise InvalidToken("OIDC token has no kid and the JWKS holds several keys")
        return self._jwks[kid]


def _read_jwks(path: Path) -> jwt.PyJWKSet:
    """The keys of a JWKS file; raises InvalidOidcConfig naming the file and the problem."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError('expected a JSON object {"keys": [...]}')
        return jwt.PyJWKSet.from_dict(data)
    except OSError as exc:
        raise InvalidOidcConfig(f"jwks_file {path}: {exc.strerror}") from None
    except (ValueError, jwt.PyJWTError) as exc:  # not JSON, or no usable key in it
        raise InvalidOidcConfig(f"jwks_file {path}: {exc}") from None


def looks_like_jwt(token: str) -> bool:
    """Three base64url parts: worth handing to the OIDC verifier."""
    return token.count(".") == 2 and len(token) < 16_384
