"""A small client of the hub's REST API, for the CLI and the demo."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

DEFAULT_API = "http://127.0.0.1:8080"
#: Where `gpufed up` (default --data-dir) writes its admin token.
DEFAULT_TOKEN_FILE = Path(".gpufed/admin.token")
#: A request refused for the caller's rate (429 rate_limited) is sent again after the wait
#: the hub names, this many times at most, when that wait is at most RATE_WAIT_MAX_S.
RATE_WAITS = 10
RATE_WAIT_MAX_S = 10.0
#: A request under an Idempotency-Key that no hub answered is sent again, after 0.25 s, 0.5 s,
#: 1 s ... (at most 4 s apart), for this long: a hub that `gpufed up` starts again is back in
#: seconds, a standby takes over in about one, and the hub takes the request at most once.
KEYED_RESEND_S = 30.0


def default_token() -> str | None:
    """The bearer token the CLI sends: $GPUFED_TOKEN, else the file $GPUFED_TOKEN_FILE names,
    else `gpufed up`'s `.gpufed/admin.token` when it exists, else none."""
    for name in ("GPUFED_TOKEN", "GPUFED_ADMIN_TOKEN"):  # the second: older hubs' name
        token = os.environ.get(name, "").strip()
        if token:
            return token
    named = os.environ.get("GPUFED_TOKEN_FILE")
    path = Path(named) if named else DEFAULT_TOKEN_FILE
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class ApiError(Exception):
    """The hub refused (4xx, with its code and message) or could not be reached."""

    def __init__(
        self, message: str, *, code: str = "", status: int = 0, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.field = field  # the request's field it names, where the hub named one


class HubClient:
    """The hub's REST API. `base_url` (default $GPUFED_API) may list several hub replicas,
    comma-separated: requests go to the one that answered last; when it cannot be reached, or
    it is a standby refusing a write (503 not_leader), the same request goes to the leader it
    names, else to the next replica. A request refused for the caller's rate (429
    rate_limited) is sent again after the `Retry-After` the hub names (RATE_WAITS times at
    most), as Kubernetes' clients do. Nothing is sent twice: a refused request did nothing, and
    a request is tried elsewhere only when the connection could not be made at all, unless it
    carries an Idempotency-Key (`submit`): that one is sent again wherever and whenever no
    hub answered it (a broken connection, a timeout, every replica away or standing by, the
    hub's store not answering: 503 store_unavailable), for KEYED_RESEND_S, as the hub takes
    it at most once."""

    def __init__(
        self,
        base_url: str | None = None,
        timeout_s: float = 10.0,
        token: str | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """`say`: told, once a request, when no hub answered it and it will be sent again."""
        self._say = say
        raw = base_url or os.environ.get("GPUFED_API") or DEFAULT_API
        self.urls = [u.strip().rstrip("/") for u in raw.split(",") if u.strip()] or [DEFAULT_API]
        token = token or default_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers)

    @property
    def base_url(self) -> str:
        """The replica requests go to now."""
        return self.urls[0]

    def close(self) -> None:
        self._http.close()

    def submit(self, spec: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """The workload made of `spec`; under `key` (an Idempotency-Key) sent again until a hub
        answers, and the same workload for the same key, however often it is sent."""
        headers = {"Idempotency-Key": key} if key is not None else None
        return self._call("POST", "/v1/workloads", json=spec, headers=headers)  # type: ignore[no-any-return]

    def workloads(
        self,
        team: str | None = None,
        phase: str | None = None,
        limit: int = 500,
        since: float | None = None,
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if team:
            params["team"] = team
        if phase:
            params["phase"] = phase
        if since is not None:
            params["since"] = since
        return self._call("GET", "/v1/workloads", params=params)  # type: ignore[no-any-return]

    def workload(self, workload_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/workloads/{workload_id}")  # type: ignore[no-any-return]

    def cancel(self, workload_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/workloads/{workload_id}")  # type: ignore[no-any-return]

    def spokes(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/spokes")  # type: ignore[no-any-return]

    def usage(
        self, since: float = 0.0, until: float | None = None, by: str = "team"
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"since": since, "by": by}
        if until is not None:
            params["until"] = until
        return self._call("GET", "/v1/usage", params=params)  # type: ignore[no-any-return]

    def log(self, workload_id: str, offset: int | None = None, max_bytes: int = 65536) -> Any:
        """A chunk of the workload's log from its spoke: data, offset (next), size, eof."""
        params: dict[str, Any] = {"max_bytes": max_bytes}
        if offset is not None:
            params["offset"] = offset
        return self._call("GET", f"/v1/workloads/{workload_id}/log", params=params)

    def teams(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/teams")  # type: ignore[no-any-return]

    def policy(self) -> dict[str, Any]:
        return self._call("GET", "/v1/policy")  # type: ignore[no-any-return]

    def set_policy(self, policy: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", "/v1/policy", json=policy)  # type: ignore[no-any-return]

    def create_token(
        self, user: str, role: str, team: str | None, ttl_s: float | None = None
    ) -> dict[str, Any]:
        body = {"user": user, "role": role, "team": team, "ttl_s": ttl_s}
        return self._call("POST", "/v1/tokens", json=body)  # type: ignore[no-any-return]

    def tokens(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens")  # type: ignore[no-any-return]

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/tokens/{token_id}")  # type: ignore[no-any-return]

    def audit(
        self,
        team: str | None = None,
        action: str | None = None,
        limit: int = 100,
        since: float = 0.0,
        via: str | None = None,
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, "since": since}
        if team:
            params["team"] = team
        if action:
            params["action"] = action
        if via:
            params["via"] = via
        return self._call("GET", "/v1/audit", params=params)  # type: ignore[no-any-return]

    def whoami(self) -> dict[str, Any]:
        return self._call("GET", "/v1/whoami")  # type: ignore[no-any-return]

    def burst_instances(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/burst/instances")  # type: ignore[no-any-return]

    def services(self, team: str | None = None) -> list[dict[str, Any]]:
        params = {"team": team} if team else {}
        return self._call("GET", "/v1/services", params=params)  # type: ignore[no-any-return]

    def service(self, team: str, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/services/{team}/{name}")  # type: ignore[no-any-return]

    def create_service(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/services", json=spec)  # type: ignore[no-any-return]

    def update_service(self, spec: dict[str, Any]) -> dict[str, Any]:
        path = f"/v1/services/{spec.get('team')}/{spec.get('name')}"
        return self._call("PUT", path, json=spec)  # type: ignore[no-any-return]

    def delete_service(self, team: str, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/services/{team}/{name}")  # type: ignore[no-any-return]

    def cordon(self, spoke_id: str, reason: str = "") -> dict[str, Any]:
        path = f"/v1/spokes/{spoke_id}/cordon"
        return self._call("PUT", path, json={"reason": reason})  # type: ignore[no-any-return]

    def uncordon(self, spoke_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/spokes/{spoke_id}/cordon")  # type: ignore[no-any-return]

    def drain(self, spoke_id: str, reason: str = "") -> dict[str, Any]:
        path = f"/v1/spokes/{spoke_id}/drain"
        return self._call("POST", path, json={"reason": reason})  # type: ignore[no-any-return]

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")  # type: ignore[no-any-return]

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if response.status_code >= 400:
            field = None
            try:
                body = response.json()
                message, code = body.get("message", response.text), body.get("code", "")
                field = body.get("field")
            except ValueError:
                message, code = response.text, ""
            if response.status_code == 401:
                message += (
                    " (set GPUFED_TOKEN to an API token, or GPUFED_TOKEN_FILE to a file holding"
                    " one; `gpufed up` writes its admin token to <data-dir>/admin.token)"
                )
            raise ApiError(message, code=code, status=response.status_code, field=field)
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                f"{response.url} did not answer as gpufed's API does (is another program on its"
                f" port?): {response.text[:60]!r}",
                status=response.status_code,
            ) from exc

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        keyed = "Idempotency-Key" in (kwargs.get("headers") or {})
        deadline, pause = time.monotonic() + KEYED_RESEND_S, 0.25
        while True:
            try:
                response = self._send_once(method, path, **kwargs)
            except ApiError as exc:
                if not keyed or time.monotonic() + pause > deadline:
                    raise
                why = str(exc)
            else:
                why = _not_done(response)
                if not (keyed and why) or time.monotonic() + pause > deadline:
                    return response
            if self._say is not None and pause == 0.25:
                self._say(f"{why}; sending it again for up to {KEYED_RESEND_S:g} s")
            time.sleep(pause)
            pause = min(2 * pause, 4.0)

    def _send_once(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        tried: list[str] = []
        failures: list[str] = []
        response: httpx.Response | None = None
        waits = 0
        while (url := next((u for u in self.urls if u not in tried), None)) is not None:
            tried.append(url)
            try:
                response = self._http.request(method, url + path, **kwargs)
            except httpx.ConnectError as exc:  # nothing was sent: another replica may take it
                failures.append(f"{url} ({exc})")
                continue
            except httpx.TransportError as exc:  # it may have been taken: not sent elsewhere
                raise ApiError(f"no answer from the hub at {url} ({exc!r})") from exc
            if _standing_by(response):
                self._prefer(_leader_named(response, url))
                continue
            wait = _rate_wait(response)
            if wait is not None and waits < RATE_WAITS:
                waits += 1
                time.sleep(wait)
                tried.remove(url)  # the same replica again, once the wait is over
                continue
            self._prefer(url)
            return response
        if response is not None:
            return response  # every replica stands by: the standby's own message says so
        raise ApiError(
            f"cannot reach the hub at {'; '.join(failures)}; is `gpufed up` running? "
            "Set GPUFED_API or --api to its URL (several, comma-separated, for hub replicas)."
        )

    def _prefer(self, url: str | None) -> None:
        """Send the next requests to `url` first (a replica that answered, or the leader)."""
        if url is None:
            return
        self.urls = [url, *(u for u in self.urls if u != url)]


def _rate_wait(response: httpx.Response) -> float | None:
    """How long to wait before sending a request refused for the caller's rate again (None:
    not such a refusal, or a wait longer than RATE_WAIT_MAX_S, said to the caller instead)."""
    if response.status_code != 429 or _code(response) != "rate_limited":
        return None
    try:
        wait = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        wait = 1.0
    return wait if 0 <= wait <= RATE_WAIT_MAX_S else None


#: The hub's code for a request its store could not serve: not done, and may be sent again.
STORE_UNAVAILABLE = "store_unavailable"


def _not_done(response: httpx.Response) -> str:
    """Why `response` says its request was not done and may be sent again as it is ("": it
    was answered)."""
    if _standing_by(response):
        return "every hub stands by"
    if response.status_code == 503 and _code(response) == STORE_UNAVAILABLE:
        return "the hub's store is not answering"
    return ""


def _standing_by(response: httpx.Response) -> bool:
    """A standby's refusal of a write: nothing was done, and the leader may take it."""
    return response.status_code == 503 and _code(response) == "not_leader"


def _code(response: httpx.Response) -> str:
    try:
        return str(response.json().get("code", ""))
    except ValueError:
        return ""


def _leader_named(response: httpx.Response, standby: str) -> str | None:
    """The leader's URL a standby's not_leader message names, if any (and not itself)."""
    try:
        message = str(response.json().get("message", ""))
    except ValueError:
        return None
    found = re.search(r"\bat (https?://\S+?)(?=[\s)]|$)", message)
    url = found.group(1).rstrip("/") if found else None
    return url if url and url != standby else None
