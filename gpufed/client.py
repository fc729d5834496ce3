"""A small client of the hub's REST API, for the CLI and the demo."""

from __future__ import annotations

import os
from typing import Any

import httpx

DEFAULT_API = "http://127.0.0.1:8080"


class ApiError(Exception):
    """The hub refused (4xx, with its code and message) or could not be reached."""

    def __init__(self, message: str, *, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class HubClient:
    def __init__(self, base_url: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = (base_url or os.environ.get("GPUFED_API") or DEFAULT_API).rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/workloads", json=spec)  # type: ignore[no-any-return]

    def workloads(
        self, team: str | None = None, phase: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if team:
            params["team"] = team
        if phase:
            params["phase"] = phase
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

    def set_policy(self, policy: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return self._call("PUT", "/v1/policy", json=policy, headers=headers)  # type: ignore[no-any-return]

    def burst_instances(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/burst/instances")  # type: ignore[no-any-return]

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")  # type: ignore[no-any-return]

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(
                f"cannot reach the hub at {self.base_url} ({exc}); is `gpufed up` running? "
                "Set GPUFED_API or --api to its URL."
            ) from exc
        if response.status_code >= 400:
            try:
                body = response.json()
                message, code = body.get("message", response.text), body.get("code", "")
            except ValueError:
                message, code = response.text, ""
            raise ApiError(message, code=code, status=response.status_code)
        return response.json()
