"""deploy/slurm: the systemd unit's command line, with its settings file, is a valid spoke."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufed.cli import _parser
from gpufed.compose.spoke import make_inventory, make_runtime_factory
from spoke.inventory.slurm import SlurmInventory
from spoke.runtime.slurm import SlurmRuntime
from spoke.settings import SpokeSettings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "slurm"
UNIT = DEPLOY / "gpufed-spoke@.service"
SETTINGS = DEPLOY / "spoke-gpu-h100.env"


def settings_file() -> dict[str, str]:
    pairs = {}
    for line in SETTINGS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def exec_start() -> list[str]:
    """ExecStart as systemd runs it: continuation lines joined, ${VAR} from the settings."""
    text = UNIT.read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    env = settings_file()
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line.removeprefix("ExecStart="))
    return shlex.split(expanded)


def test_the_unit_runs_a_slurm_spoke_of_the_partition_in_its_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = settings_file()
    monkeypatch.setenv("GPUFED_NATS_URL", env["GPUFED_NATS_URL"])  # from EnvironmentFile=
    argv = exec_start()
    assert argv[:2] == ["/opt/gpufed/bin/gpufed", "spoke"]
    assert not any("change-me" in arg for arg in argv)  # the NATS password is not in argv

    args = _parser().parse_args(argv[1:])

    assert args.nats_url == env["GPUFED_NATS_URL"]
    settings = SpokeSettings(
        id=args.id,
        region=args.region,
        nats_url=args.nats_url,
        inventory=args.inventory,
        runtime=args.runtime,
        state_dir=tmp_path,
        slurm_partition=args.slurm_partition,
        slurm_account=args.slurm_account,
        slurm_qos=args.slurm_qos,
    )
    assert (settings.id, settings.slurm_partition, settings.slurm_account) == (
        "hpc-eu-h100",
        "gpu-h100",
        "gpufed",
    )
    assert isinstance(make_inventory(settings), SlurmInventory)

    async def sink(event: object) -> None:
        pass

    assert isinstance(make_runtime_factory(settings)(sink), SlurmRuntime)


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    verify = shutil.which("systemd-analyze")
    if verify is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    gpufed = Path(sys.executable).parent / "gpufed"
    unit = tmp_path / "gpufed-spoke@.service"
    unit.write_text(UNIT.read_text().replace("/opt/gpufed/bin/gpufed", str(gpufed)))
    result = subprocess.run(
        [verify, "verify", "--man=no", f"{unit}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""
