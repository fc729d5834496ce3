"""Finding the cluster's credentials, and the small pieces of the label contract."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spoke.errors import PermanentSpokeError
from spoke.inventory.kubernetes import KubernetesInventory
from spoke.kube import dns_name, label_value, load_api_client, matches_selector
from tests.kubernetes.conftest import Cluster


def write_kubeconfig(path: Path, servers: dict[str, str], current: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": n, "cluster": {"server": s}} for n, s in servers.items()],
                "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
                "contexts": [
                    {"name": n, "context": {"cluster": n, "user": "tester"}} for n in servers
                ],
                "current-context": current,
            }
        )
    )
    return path


@pytest.fixture
def no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))


async def test_kubeconfig_context_selects_the_cluster(
    cluster: Cluster, tmp_path: Path, no_ambient_config: None
) -> None:
    cluster.add_node("gpu-a")
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"elsewhere": "http://127.0.0.1:9", "emulator": cluster.url},
        current="elsewhere",
    )

    api = load_api_client(str(config), context="emulator")
    try:
        nodes = await KubernetesInventory(api).nodes()
    finally:
        api.close()

    assert [n.name for n in nodes] == ["gpu-a"]
    assert api.configuration.host == cluster.url


async def test_in_cluster_without_a_service_account_falls_back_to_kubeconfig(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ambient_config: None
) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", {"emulator": cluster.url}, "emulator")
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    api = load_api_client()
    api.close()

    assert api.configuration.host == cluster.url


async def test_no_credentials_at_all_is_a_clear_permanent_error(
    monkeypatch: pytest.MonkeyPatch, no_ambient_config: None
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    with pytest.raises(PermanentSpokeError) as caught:
        load_api_client()

    text = str(caught.value)
    assert "in-cluster service account" in text
    assert "absent-kubeconfig" in text
    assert "--kubeconfig" in text


async def test_unknown_context_is_named_in_the_error(
    cluster: Cluster, tmp_path: Path, no_ambient_config: None
) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", {"emulator": cluster.url}, "emulator")

    with pytest.raises(PermanentSpokeError, match="'prod-eu'"):
        load_api_client(str(config), context="prod-eu")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (None, True),
        ("pool=shared", True),
        ("pool==shared,tier=gold", True),
        ("pool!=shared", False),
        ("pool", True),
        ("!pool", False),
        ("tier in (gold, silver)", True),
        ("tier notin (gold)", False),
        ("pool=shared,absent", False),
    ],
)
async def test_label_selectors_match_like_the_api_server(
    selector: str | None, expected: bool
) -> None:
    assert matches_selector({"pool": "shared", "tier": "gold"}, selector) is expected


async def test_names_and_label_values_stay_valid_and_distinct() -> None:
    assert label_value("eu-k8s-1") == "eu-k8s-1"
    assert label_value("ends-with-dash-") != "ends-with-dash-"
    assert len(label_value("x" * 80)) <= 63
    assert dns_name("gpufed-ml", 63) == "gpufed-ml"
    assert dns_name("gpufed-ML", 63) != dns_name("gpufed-ml-", 63)
    assert len(dns_name("gpufed-" + "t" * 63, 63)) == 63
