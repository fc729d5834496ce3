"""What a replica's answer carries through the gateway: a sandbox, so a page a team's replica
serves on the hub's origin cannot read the API token the console keeps there."""

from __future__ import annotations

from hub.gateway import SANDBOX, answer_headers


def test_an_answer_is_sandboxed_and_names_its_replica_without_hop_headers() -> None:
    raw = [
        ("Content-Type", "text/html"),
        ("Connection", "keep-alive"),
        ("Transfer-Encoding", "chunked"),
        ("Set-Cookie", "a=1"),
    ]
    headers = answer_headers(raw, "w1")
    assert headers == {
        "content-type": "text/html",
        "set-cookie": "a=1",
        "content-security-policy": SANDBOX,
        "x-gpufed-replica": "w1",
    }
    assert "allow-same-origin" not in SANDBOX and SANDBOX.startswith("sandbox ")


def test_a_replicas_own_policy_is_kept_beside_the_sandbox() -> None:
    # A replica cannot lift the sandbox by sending a policy of its own: both apply.
    raw = [("Content-Security-Policy", "default-src 'self'"), ("X-Gpufed-Replica", "forged")]
    headers = answer_headers(raw, "w2")
    assert headers["content-security-policy"] == f"default-src 'self', {SANDBOX}"
    assert headers["x-gpufed-replica"] == "w2"
