"""Kubernetes plumbing shared by the Kubernetes inventory and runtime.

Loads an API client, runs the blocking client off the event loop, turns `ApiException` and
transport errors into SpokeErrors, and holds the label contract between gpufed and the cluster.
Everything read from the API is handled as plain JSON dicts (camelCase keys, as on the wire), so
the code does not depend on one generation of the client's model classes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import anyio
import structlog
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from spoke.errors import PermanentSpokeError, RetryableSpokeError, SpokeError

log = structlog.get_logger(__name__)

#: The label and annotation contract (see docs/kubernetes.md).
LABEL_WORKLOAD = "gpufed.io/workload-id"
LABEL_EPOCH = "gpufed.io/epoch"
LABEL_SPOKE = "gpufed.io/spoke"
LABEL_TEAM = "gpufed.io/team"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpufed"
ANNOTATION_WORKLOAD = "gpufed.io/workload-id"  # exact id, should the label need shortening
ANNOTATION_DECISION = "gpufed.io/decision-id"
ANNOTATION_REPORTED = "gpufed.io/reported"  # terminal phase already sent to the hub
#: Node labels the inventory reads.
LABEL_GPU_MODEL = "gpufed.io/gpu-model"  # set by the platform team; wins over the product
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery
LABEL_HOSTNAME = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
#: Separates a node name from a MIG profile in inventory node names ("node-a/mig-1g.10gb").
#: Kubernetes node names cannot contain "/", so the split is unambiguous.
MIG_SEPARATOR = "/"

DEFAULT_TIMEOUT_S = 30.0

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """An API client for the cluster this spoke runs workloads in.

    Inside a pod (KUBERNETES_SERVICE_HOST set) and with neither `kubeconfig` nor `context`
    given, the pod's service account is used; otherwise the kubeconfig file (`kubeconfig`, else
    $KUBECONFIG, else ~/.kube/config) and its `context` (else its current context). Raises
    PermanentSpokeError saying what was tried when neither works.
    """
    tried: list[str] = []
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            tried.append(f"in-cluster service account: {exc}")
        else:
            log.info("kubernetes_client_loaded", source="in-cluster", host=configuration.host)
            return k8s.ApiClient(configuration)
    configuration = k8s.Configuration()
    # The client reads $KUBECONFIG once, at import; read it now (it may list several files).
    config_file = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=config_file,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        where = config_file or "~/.kube/config"
        tried.append(
            f"kubeconfig {where}" + (f" context {context!r}" if context else "") + f": {exc}"
        )
        raise PermanentSpokeError(
            "cannot reach Kubernetes: no usable credentials ("
            + "; ".join(tried)
            + "). Run the spoke in a pod with a service account, or pass --kubeconfig/--context."
        ) from exc
    log.info("kubernetes_client_loaded", source="kubeconfig", host=configuration.host)
    return k8s.ApiClient(configuration)


async def request_json(
    action: str,
    method: Callable[..., Any],
    /,
    *args: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **kwargs: Any,
) -> dict[str, Any]:
    """Call a kubernetes client `method` in a worker thread and return the response's JSON.

    `action` says what was attempted ("create job gpufed-ml/train-1"); it leads every error
    message. Raises RetryableSpokeError or PermanentSpokeError (see `api_error`).
    """
    call = functools.partial(
        _call_raw, method, args, kwargs | {"_request_timeout": timeout_s, "_preload_content": False}
    )
    try:
        return await anyio.to_thread.run_sync(call)
    except ApiException as exc:
        raise api_error(action, exc) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise unreachable_error(action, exc) from exc


async def request_json_unless(
    statuses: Collection[int],
    action: str,
    method: Callable[..., Any],
    /,
    *args: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **kwargs: Any,
) -> dict[str, Any] | None:
    """`request_json`, but None instead of an error when the API answers one of `statuses`.

    For the answers that mean "already done": 404 on delete, 409 on create.
    """
    try:
        return await request_json(action, method, *args, timeout_s=timeout_s, **kwargs)
    except SpokeError as exc:
        cause = exc.__cause__
        if isinstance(cause, ApiException) and cause.status in statuses:
            return None
        raise


def api_error(action: str, exc: ApiException) -> SpokeError:
    """Translate an API answer into a SpokeError a person can act on."""
    status = int(exc.status or 0)
    detail = _status_message(exc)
    text = f"{action}: {detail} (HTTP {status})" if status else f"{action}: {detail}"
    if status in (401, 403):
        return PermanentSpokeError(
            f"{text}. The spoke's service account lacks this permission: apply the RBAC in "
            "deploy/base/spoke or check the admission policy gpufed-spoke-confine."
        )
    if status in (408, 410, 429) or status >= 500 or status == 0:
        return RetryableSpokeError(text)
    return PermanentSpokeError(text)


def unreachable_error(action: str, exc: BaseException) -> RetryableSpokeError:
    """The API server did not answer at all."""
    reason = getattr(exc, "reason", None) or exc
    return RetryableSpokeError(
        f"{action}: Kubernetes API unreachable ({type(exc).__name__}: {reason})"
    )


def label_value(value: str) -> str:
    """`value` if Kubernetes accepts it as a label value, else a stable shortened look-alike."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    return dns_name(value, 63)


def dns_name(value: str, limit: int) -> str:
    """A lowercase RFC 1123 label of at most `limit` characters derived from `value`.

    Unchanged when `value` already is one; otherwise cleaned and suffixed with a short hash of
    the original, so two different inputs never collide on the cleaned form.
    """
    if len(value) <= limit and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    cleaned = cleaned[: limit - len(digest) - 1].rstrip("-")
    return f"{cleaned}-{digest}" if cleaned else digest


def matches_selector(labels: Mapping[str, str], selector: str | None) -> bool:
    """Whether `labels` satisfy a Kubernetes label selector string.

    Supports `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)` and `k notin (a,b)`. The API server
    applies selectors too; matching again here keeps the result right against servers (and
    emulators) that ignore them.
    """
    if not selector:
        return True
    for requirement in _split_selector(selector):
        if not _matches_requirement(labels, requirement):
            return False
    return True


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's metadata (empty when absent)."""
    value = obj.get("metadata") or {}
    return value if isinstance(value, Mapping) else {}


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """An object's labels (empty when absent)."""
    return meta(obj).get("labels") or {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """An object's annotations (empty when absent)."""
    return meta(obj).get("annotations") or {}


def _call_raw(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    response = method(*args, **kwargs)
    try:
        body = response.data
    finally:
        response.release_conn()
    return json.loads(body) if body else {}


def _status_message(exc: ApiException) -> str:
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str) and body:
        try:
            status = json.loads(body)
        except ValueError:
            return body[:500]
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])[:500]
    return str(exc.reason or "no reason given")


def _split_selector(selector: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _matches_requirement(labels: Mapping[str, str], requirement: str) -> bool:
    set_based = re.fullmatch(r"(\S+)\s+(in|notin)\s*\((.*)\)", requirement)
    if set_based:
        key, operator, values = set_based.groups()
        allowed = {value.strip() for value in values.split(",")}
        if operator == "in":
            return labels.get(key) in allowed
        return labels.get(key) not in allowed
    if "!=" in requirement:
        key, value = (part.strip() for part in requirement.split("!=", 1))
        return labels.get(key) != value
    if "=" in requirement:
        key, value = (part.strip() for part in requirement.replace("==", "=").split("=", 1))
        return labels.get(key) == value
    if requirement.startswith("!"):
        return requirement[1:].strip() not in labels
    return requirement in labels
