"""User data: a spoke command line nobody can inject into."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from burst.providers.userdata import (
    DEFAULT_TEMPLATE,
    MAX_USER_DATA_BYTES,
    SpokeBoot,
    render_user_data,
)
from gpufed.cli import _parser

BOOT = SpokeBoot(
    burst_id="burst-3-0-abcd1234",
    region="us-east-1",
    nats_url="tls://hub.example.com:4222",
    creds="-----BEGIN NATS USER JWT-----\neyJ0eXAi.eyJzdWIi.sig-_\n------END NATS USER JWT------\n",
    labels={"burst-team": "vision", "instance-type": "p5.48xlarge"},
    package="gpufed[nvml]==0.1.0",
    price_per_gpu_hour=5.625,
)


def test_default_template_runs_a_cloud_spoke() -> None:
    script = render_user_data(DEFAULT_TEMPLATE, BOOT)
    assert script.startswith("#!/bin/bash\n")
    assert (
        "ExecStart=/opt/gpufed/venv/bin/gpufed spoke --id burst-3-0-abcd1234 --region us-east-1"
        " --kind cloud --nats-url tls://hub.example.com:4222 --nats-creds /etc/gpufed/nats.creds"
        " --inventory nvml --runtime local --price 5.625"
        " --label burst-team=vision --label instance-type=p5.48xlarge\n"
    ) in script
    assert "pip install --quiet 'gpufed[nvml]==0.1.0'" in script
    assert "{{" not in script
    # the credential goes to a file only root reads, never on the command line
    assert "(umask 077; cat > /etc/gpufed/nats.creds <<'CREDS'\n-----BEGIN NATS USER JWT" in script
    assert "chmod 0600 /etc/gpufed/nats.creds" in script
    assert "eyJ0eXAi" not in script.split("ExecStart=")[1]


def test_the_command_is_one_gpufed_spoke_accepts() -> None:
    args = _parser().parse_args(BOOT.command().split()[1:])
    assert (args.id, args.kind, str(args.nats_creds), args.price) == (
        "burst-3-0-abcd1234",
        "cloud",
        "/etc/gpufed/nats.creds",
        5.625,
    )
    assert args.label == ["burst-team=vision", "instance-type=p5.48xlarge"]
    assert args.interruption_imds is None
    spot = dataclasses.replace(BOOT, interruption_imds="http://169.254.169.254")
    args = _parser().parse_args(spot.command().split()[1:])
    assert args.interruption_imds == "http://169.254.169.254"


@pytest.mark.parametrize(
    "change",
    [
        {"creds": "x\nCREDS\nrm -rf /"},
        {"creds": "$(rm -rf /)"},
        {"nats_url": "nats://$(id)"},
        {"labels": {"a": "b c"}},
        {"burst_id": "a\nExecStartPre=/bin/evil"},
        {"region": "us-east-1%n"},
    ],
)
def test_unsafe_values_are_refused_without_echoing_them(change: dict[str, object]) -> None:
    fields: dict[str, Any] = {
        "burst_id": BOOT.burst_id,
        "region": BOOT.region,
        "nats_url": BOOT.nats_url,
        "creds": BOOT.creds,
        "labels": BOOT.labels,
    }
    fields.update(change)
    boot = SpokeBoot(**fields)
    with pytest.raises(ValueError, match=r"outside|characters") as caught:
        render_user_data(DEFAULT_TEMPLATE, boot)
    assert "rm -rf" not in str(caught.value)


CA = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU+/AbC=\n-----END CERTIFICATE-----\n"


def test_a_private_ca_reaches_the_instance_as_a_file_the_spoke_checks_the_hub_with() -> None:
    boot = dataclasses.replace(BOOT, nats_ca=CA)
    script = render_user_data(DEFAULT_TEMPLATE, boot)
    assert (
        "(umask 077; cat > /etc/gpufed/nats-ca.crt <<'PEM'\n-----BEGIN CERTIFICATE-----\n"
        "MIIBszCCAVmgAwIBAgIU+/AbC=\n-----END CERTIFICATE-----\nPEM\n)\n"
    ) in script
    args = _parser().parse_args(boot.command().split()[1:])
    assert (str(args.nats_ca), str(args.nats_creds)) == (
        "/etc/gpufed/nats-ca.crt",
        "/etc/gpufed/nats.creds",
    )
    assert "--nats-ca" not in BOOT.command()  # none given: the system's CAs, as before
    for bad in ("-----BEGIN CERTIFICATE-----\n$(reboot)\n", "x\nPEM\nrm -rf /\n"):
        with pytest.raises(ValueError, match="not a PEM certificate"):
            render_user_data(DEFAULT_TEMPLATE, dataclasses.replace(BOOT, nats_ca=bad))


def test_unknown_placeholder_and_size_limit() -> None:
    with pytest.raises(ValueError, match="unknown placeholders: nope"):
        render_user_data("{{ nope }} {{ command }}", BOOT)
    with pytest.raises(ValueError, match="at most"):
        render_user_data("#" * MAX_USER_DATA_BYTES + "{{ creds_file }}{{ command }}", BOOT)


def test_custom_template() -> None:
    template = "echo {{burst_id}} {{ region }} > /etc/gpufed-id"
    script = render_user_data(template, dataclasses.replace(BOOT, creds=None))
    assert script == "echo burst-3-0-abcd1234 us-east-1 > /etc/gpufed-id"
    # with a credential, a template that would not write it is refused
    with pytest.raises(ValueError, match="creds_file"):
        render_user_data(template, BOOT)
