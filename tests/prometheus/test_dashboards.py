"""Grafana dashboards query only what gpufed exports, in PromQL that Prometheus accepts."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from burst.catalog import load_catalog
from burst.metrics import BurstMetrics
from burst.providers.local import LocalProvider
from burst.service import BurstController
from burst.settings import BurstSettings
from bus.client import Bus, BusSettings
from hub.service import HubService
from hub.settings import HubSettings
from hub.store import Store
from spoke.agent import SpokeAgent
from spoke.inventory.static import StaticInventory
from spoke.metrics import SpokeMetrics
from spoke.ports import NodeInventory
from spoke.runtime.local import LocalRuntime
from spoke.settings import SpokeSettings
from spoke.telemetry import SimulatedTelemetry

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
#: Our metric families: gpufed's own and the DCGM exporter's field names.
OURS = re.compile(r"\b(gpufed_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b")


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry exposes (counters as _total, histograms as their parts)."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
        names |= {s.name for s in family.samples}
    return names


@pytest.fixture
def exported_names(tmp_path: Path) -> Iterator[set[str]]:
    store = Store.sqlite(tmp_path / "hub.db")
    hub = HubService(HubSettings(data_dir=tmp_path), store, Bus(BusSettings()))
    spoke_settings = SpokeSettings(id="eu-1", region="eu", state_dir=tmp_path / "spokes")
    agent = SpokeAgent(
        spoke_settings,
        Bus(BusSettings()),
        StaticInventory([NodeInventory("n0", "H100", 2)]),
        lambda sink: LocalRuntime(sink, tmp_path / "logs"),
    )
    spoke = SpokeMetrics(agent, SimulatedTelemetry(tmp_path / "load"))
    settings = BurstSettings(state_dir=tmp_path / "burst")
    catalog = load_catalog(None)
    controller = BurstController(
        settings,
        Bus(BusSettings()),
        LocalProvider(settings.state_dir, settings.spoke_url, catalog, settings.python, 1.0),
        catalog,
        settings.policy(),
    )
    burst = BurstMetrics(controller)
    try:
        yield exported(hub.metrics.registry) | exported(spoke.registry) | exported(burst.registry)
    finally:
        agent.journal.close()
        store.close()


def queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"{dashboard['uid']} / {panel['title']}", target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            yield f"{dashboard['uid']} / ${var['name']}", query


def test_the_five_dashboards_exist_and_are_provisioned() -> None:
    titles = {json.loads(p.read_text())["title"] for p in DASHBOARDS}
    assert titles == {
        "gpufed / Fleet",
        "gpufed / Teams and quotas",
        "gpufed / Queue and waits",
        "gpufed / Burst and cost",
        "gpufed / GPU utilisation",
    }
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == len(uids)
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/gpufed.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    source = yaml.safe_load((GRAFANA / "provisioning/datasources/gpufed.yaml").read_text())
    uid = source["datasources"][0]["uid"]
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            assert panel["datasource"]["uid"] == uid, (path.name, panel["title"])


def test_every_panel_queries_only_metrics_the_code_exports(exported_names: set[str]) -> None:
    assert "gpufed_queue_workloads" in exported_names  # the fixture really collected
    assert "DCGM_FI_DEV_GPU_UTIL" in exported_names
    unknown = []
    for path in DASHBOARDS:
        for where, query in queries(json.loads(path.read_text())):
            names = set(OURS.findall(query))
            assert names, f"{where}: queries none of gpufed's metrics: {query}"
            unknown += [f"{where}: {n}" for n in sorted(names - exported_names)]
    assert not unknown, "\n".join(unknown)


def test_every_panel_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    rules = []
    for path in DASHBOARDS:
        for where, query in queries(json.loads(path.read_text())):
            if query.startswith("label_values("):
                continue  # Grafana's own function, not PromQL
            expr = query.replace("$__all", ".*").replace('=~"$team"', '=~".*"')
            expr = expr.replace('=~"$spoke"', '=~".*"')
            assert "$" not in expr, f"{where}: an unknown variable in {query}"
            rules.append({"record": f"check:{len(rules)}", "expr": expr})
    file = tmp_path / "panels.rules.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(file)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout
