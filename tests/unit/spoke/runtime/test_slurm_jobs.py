"""The sbatch options, batch script and environment a launch becomes (no Slurm needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from schemas import Assignment, WorkloadSpec
from spoke.errors import PermanentSpokeError
from spoke.ports import Launch
from spoke.runtime.slurm.jobs import SiteOptions, batch_script, build_batch_job, placement


def make_launch(nodes: list[str], gpus: int = 4, **spec: object) -> Launch:
    return Launch(
        workload_id="train-7",
        epoch=2,
        decision_id="d1",
        spec=WorkloadSpec.model_validate(
            {
                "name": "train",
                "team": "vision",
                "command": ["python", "-c", "print('a b')"],
                "gpus_per_node": gpus,
                "nodes": len(nodes),
                **spec,
            }
        ),
        assignments=tuple(Assignment(node=n, devices=tuple(range(gpus))) for n in nodes),
    )


def build(launch: Launch, site: SiteOptions | None = None) -> tuple[list[str], str, dict[str, str]]:
    job = build_batch_job(
        launch,
        spoke_id="hpc-eu",
        log_path=Path("/shared/gpufed/logs/train-7-e2.log"),
        exit_path=Path("/shared/gpufed/runs/train-7-e2.exit"),
        workdir=Path("/shared/gpufed/runs"),
        site=site or SiteOptions(),
        base_environment={"PATH": "/usr/bin:/bin"},
    )
    return list(job.options), job.script, job.environment


def test_a_gang_is_one_job_pinned_to_its_nodes() -> None:
    options, script, env = build(
        make_launch(["n1", "n2"], max_runtime_s=3725, env={"TOKEN": "t0ps3cret"}),
        SiteOptions(partition="gpu", account="gpufed", qos="gpufed"),
    )
    assert options == [
        "--job-name=gpufed-train-7-e2",
        "--comment=gpufed:hpc-eu:train-7:2",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--nodelist=n1,n2",
        "--gres=gpu:4",
        "--output=/shared/gpufed/logs/train-7-e2.log",
        "--open-mode=append",
        "--chdir=/shared/gpufed/runs",
        "--export=ALL",
        "--no-requeue",
        "--time=62:05",
        "--partition=gpu",
        "--account=gpufed",
        "--qos=gpufed",
    ]
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in script
    assert 'echo "$code" > /shared/gpufed/runs/train-7-e2.exit' in script
    # Secrets travel in sbatch's environment, never in its argv or the script.
    assert env["TOKEN"] == "t0ps3cret" and not any("t0ps3cret" in o for o in options)
    assert "t0ps3cret" not in script
    assert env["GPUFED_WORKLOAD_ID"] == "train-7" and env["GPUFED_NUM_NODES"] == "2"
    assert env["PATH"] == "/usr/bin:/bin"


def test_the_script_runs_the_exact_command_and_records_its_exit(tmp_path: Path) -> None:
    # The script, run with a stand-in srun that runs its command once, as rank 0.
    srun = tmp_path / "srun"
    srun.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    launch = make_launch(
        ["n1"], command=["sh", "-c", 'echo "$1 $GPUFED_NODE_RANK"; exit 3', "x", "a b"]
    )
    exit_file = tmp_path / "exit"
    result = subprocess.run(
        ["sh", "-c", batch_script(launch, exit_file)],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_NODEID": "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout) == (3, "a b 0\n")
    assert exit_file.read_text() == "3\n"


@pytest.mark.parametrize(
    ("nodes", "spec", "words"),
    [
        (["n1"], {"gpu_fraction": 0.5, "gpus_per_node": 1}, "fractional GPUs are not supported"),
        (["n1", "n1"], {}, "distinct node"),
        (["n1"], {"env": {"SLURM_NTASKS": "64"}}, "reserved"),
        (["n1"], {"kind": "session"}, "does not run a session"),
    ],
)
def test_what_one_job_cannot_express_is_refused(
    nodes: list[str], spec: dict[str, object], words: str
) -> None:
    gpus = int(spec.pop("gpus_per_node", 4))  # type: ignore[call-overload]
    with pytest.raises(PermanentSpokeError, match=words):
        build(make_launch(nodes, gpus=gpus, **spec))


def test_a_pool_of_a_node_with_several_gpu_types_asks_for_its_type() -> None:
    hosts, gres = placement(make_launch(["mix1/a100", "mix2/a100"], gpus=2))
    assert (hosts, gres) == (["mix1", "mix2"], "gpu:a100:2")
    with pytest.raises(PermanentSpokeError, match="differ in GPU type"):
        placement(make_launch(["mix1/a100", "mix2/v100"], gpus=2))
