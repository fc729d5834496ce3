"""deploy/: every overlay renders into valid Kubernetes objects (the NATS configs:
test_deploy_nats.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from spoke.runtime.kubernetes import DEFAULT_PRIORITY_CLASSES
from tests.kubernetes.deploysupport import container, env_of, one, render

OVERLAYS = ("embedded-hub", "hub-postgres", "spoke-eu", "spoke-us", "burst-aws")


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
        "--nats-creds /var/run/secrets/gpufed/nats/creds "
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
    assert "sqlite" not in args
    # The store URL holds a password: never in env. The only variable is the pod's own IP
    # (the Downward API), which the leader advertises as its API URL.
    assert hub.get("env") == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    ]
    assert "--advertise-url http://$(POD_IP):8080" in args
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


@pytest.mark.security
def test_burst_runs_the_documented_command_with_its_secrets_as_files() -> None:
    docs = render("burst-aws")
    burst = container(docs, "Deployment", "gpufed-burst")
    assert " ".join(burst["command"] + burst["args"]) == (
        "gpufed burst --nats-url-file /var/run/secrets/gpufed/nats/url "
        "--nats-creds /var/run/secrets/gpufed/nats/creds "
        "--nats-ca /var/run/secrets/gpufed/nats-ca/ca.crt "
        "--nats-issuer /var/run/secrets/gpufed/nats/issuer "
        "--metrics-host 0.0.0.0 --metrics-port 9102 --provider=aws --aws-region=us-east-1 "
        "--aws-image-id=ami-0123456789abcdef0 --aws-subnet=subnet-0123456789abcdef0 "
        "--aws-security-group=sg-0123456789abcdef0 --aws-instance-profile=gpufed-burst-spoke "
        "--aws-cluster=gpufed --spoke-nats-url=tls://nats.gpufed.example.com:4222 "
        "--max-instances=4"
    )
    # The issuer holds the account's signing keys: a mounted file, never argv or env.
    assert "env" not in burst and "envFrom" not in burst
    assert secret_mounts(docs, "gpufed-burst") == {
        "/var/run/secrets/gpufed/nats": "gpufed-burst-nats",
        "/var/run/secrets/gpufed/nats-ca": "gpufed-nats-tls",
    }
    deployment = one(docs, "Deployment", "gpufed-burst")["spec"]
    assert (deployment["replicas"], deployment["strategy"]["type"]) == (1, "Recreate")
    account = one(docs, "ServiceAccount", deployment["template"]["spec"]["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    # Instances reach NATS's client port from their network only, not from anywhere.
    opened = one(docs, "NetworkPolicy", "gpufed-nats-burst-instances")["spec"]["ingress"]
    assert opened == [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}], "ports": [{"port": 4222}]}]
    clients = one(docs, "Service", "gpufed-nats-clients")["spec"]
    assert clients["loadBalancerSourceRanges"] == ["10.0.0.0/16"]
    assert [p["port"] for p in clients["ports"]] == [4222]


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
        "--nats-creds /var/run/secrets/gpufed/nats/creds "
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
    # Its state (events owed to the hub, its lease) outlives the pod: a claim, not scratch.
    mounts = {m["name"]: m["mountPath"] for m in spoke["volumeMounts"]}
    [state] = [v for v in pod["volumes"] if v["name"] == "state"]
    assert mounts["state"] == spoke["workingDir"] == "/data"
    assert one(docs, "PersistentVolumeClaim", state["persistentVolumeClaim"]["claimName"])


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
            ("", "secrets", "create"),
            ("", "secrets", "patch"),
            ("", "secrets", "delete"),
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
    assert watched == {"jobs", "pods", "services", "secrets", "namespaces", "networkpolicies"}
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
