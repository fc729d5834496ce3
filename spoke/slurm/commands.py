"""A thin async adapter over the Slurm CLIs (sbatch, squeue, scontrol, scancel).

Each call runs one command in a subprocess and returns its output; failures become SpokeErrors:
retryable when the controller cannot be reached, permanent when Slurm refuses the request.
The commands see only a small, fixed environment (plus SLURM_CONF), so neither the spoke's
secrets nor variables like SQUEUE_FORMAT that would change what they print reach them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

import anyio
import structlog

from spoke.errors import PermanentSpokeError, RetryableSpokeError, SpokeError
from spoke.slurm.parse import SQUEUE_FORMAT, JobDetail, QueuedJob, parse_job, parse_queue

log = structlog.get_logger(__name__)

#: Variables passed from the spoke's environment to the Slurm commands (and the jobs).
PASSED_VARIABLES = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "SLURM_CONF",
)  # fmt: skip
#: Output that says the controller is unreachable or busy (worth retrying), not a refusal.
_TRANSIENT = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Transport endpoint is not connected",
    "Slurm temporarily unable",
    "Resource temporarily unavailable",
    "Zero Bytes were transmitted or received",
    "Communication connection failure",
)


def base_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The spoke's variables the Slurm commands may see: PASSED_VARIABLES and LC_*."""
    source = os.environ if environ is None else environ
    return {
        key: value
        for key, value in source.items()
        if key in PASSED_VARIABLES or key.startswith("LC_")
    }


class SlurmCli:
    """Runs the Slurm commands of one cluster.

    `environment` is what every command sees (default: base_environment() of the spoke);
    SLURM_CONF in it picks the cluster. `timeout_s` bounds each command.
    """

    def __init__(
        self, environment: Mapping[str, str] | None = None, timeout_s: float = 30.0
    ) -> None:
        self.environment = dict(base_environment() if environment is None else environment)
        self.timeout_s = timeout_s

    async def submit(
        self, options: Sequence[str], script: str, job_environment: Mapping[str, str]
    ) -> str:
        """`sbatch --parsable OPTIONS` with `script` on stdin; returns the job id.

        The job's environment is sbatch's own (`--export=ALL`): `job_environment` is passed as
        the process environment, never in argv. Not idempotent: each call submits a job.
        """
        out = await self._run(
            ["sbatch", "--parsable", *options], stdin=script, environment=job_environment
        )
        job_id = out.strip().split(";", 1)[0]
        if not job_id.isdigit():
            raise PermanentSpokeError(f"sbatch printed no job id: {out.strip()[:200]!r}")
        return job_id

    async def queue(self) -> list[QueuedJob]:
        """This user's jobs, active and recently ended (`squeue --me --states=all`)."""
        out = await self._run(["squeue", "--me", "--states=all", "--noheader", "-o", SQUEUE_FORMAT])
        return parse_queue(out)

    async def job(self, job_id: str) -> JobDetail | None:
        """`scontrol -o show job ID`; None once the controller no longer knows the job."""
        try:
            out = await self._run(["scontrol", "-o", "show", "job", job_id])
        except PermanentSpokeError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        return parse_job(out)

    async def nodes(self) -> str:
        """`scontrol -d -o show node`: every node, one line each, with GresUsed."""
        return await self._run(["scontrol", "-d", "-o", "show", "node"])

    async def cancel(self, job_id: str, signal: str | None = None, full: bool = False) -> None:
        """`scancel [--signal=SIG [--full]] ID`.

        Without a signal the job ends (a pending one at once). With one, the signal goes to the
        job's steps (and with `full` to its batch shell too) and the job decides. An unknown or
        finished job is a no-op.
        """
        args = ["scancel"]
        if signal is not None:
            args.append(f"--signal={signal}")
            if full:
                args.append("--full")
        args.append(job_id)
        try:
            await self._run(args)
        except PermanentSpokeError as exc:
            text = str(exc)
            if any(s in text for s in ("Invalid job id", "already completing", "completed")):
                return
            raise

    async def _run(
        self,
        args: list[str],
        stdin: str | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> str:
        env = dict(self.environment)
        if environment is not None:
            env |= dict(environment)
        try:
            with anyio.fail_after(self.timeout_s):
                result = await anyio.run_process(
                    args,
                    input=None if stdin is None else stdin.encode(),
                    env=env,
                    check=False,
                )
        except TimeoutError as exc:
            raise RetryableSpokeError(
                f"{args[0]} did not answer within {self.timeout_s:g} s"
            ) from exc
        except FileNotFoundError as exc:
            raise PermanentSpokeError(
                f"{args[0]} not found: install the Slurm client commands "
                "(Debian: slurm-client) on the spoke's host"
            ) from exc
        except OSError as exc:
            raise RetryableSpokeError(f"{args[0]} could not run: {exc}") from exc
        out = result.stdout.decode(errors="replace")
        if result.returncode != 0:
            raise _error(args, result)
        return out


def _error(args: list[str], result: subprocess.CompletedProcess[bytes]) -> SpokeError:
    text = (result.stderr or result.stdout).decode(errors="replace").strip()
    message = f"{args[0]} failed (exit {result.returncode}): {text[:1000]}"
    if any(marker in text for marker in _TRANSIENT):
        return RetryableSpokeError(message)
    return PermanentSpokeError(message)
