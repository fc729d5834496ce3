"""botocore errors become burst errors that say what the caller should do."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from burst.core import OfferKey
from burst.errors import (
    BurstError,
    InstanceLimitError,
    InsufficientCapacityError,
    PermanentBurstError,
    RetryableBurstError,
    UnauthorizedError,
)
from burst.providers.aws_errors import translate_error
from schemas.burst import Market

OFFER = OfferKey("p5.48xlarge", "us-east-1", Market.SPOT)


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} happened"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "RunInstances",
    )


@pytest.mark.parametrize(
    ("code", "status", "kind", "retryable"),
    [
        ("InsufficientInstanceCapacity", 500, InsufficientCapacityError, True),
        ("SpotMaxPriceTooLow", 400, InsufficientCapacityError, True),
        ("InstanceLimitExceeded", 400, InstanceLimitError, False),
        ("VcpuLimitExceeded", 400, InstanceLimitError, False),
        ("UnauthorizedOperation", 403, UnauthorizedError, False),
        ("AuthFailure", 401, UnauthorizedError, False),
        ("RequestLimitExceeded", 503, RetryableBurstError, True),
        ("InternalError", 500, RetryableBurstError, True),
        ("SomethingNew", 502, RetryableBurstError, True),
        ("InvalidAMIID.NotFound", 400, PermanentBurstError, False),
    ],
)
def test_codes_map_to_what_the_caller_should_do(
    code: str, status: int, kind: type[BurstError], retryable: bool
) -> None:
    error = translate_error(client_error(code, status), OFFER)
    assert type(error) is kind
    assert error.retryable is retryable
    assert error.provider_code == code
    assert code in str(error)


def test_capacity_errors_carry_the_offer() -> None:
    error = translate_error(client_error("InsufficientInstanceCapacity"), OFFER)
    assert isinstance(error, InsufficientCapacityError)
    assert error.offer == OFFER
    assert "no spot capacity for p5.48xlarge in us-east-1" in str(error)


def test_limit_error_says_what_to_do() -> None:
    assert "higher quota" in str(translate_error(client_error("VcpuLimitExceeded"), OFFER))


def test_capacity_codes_outside_a_launch_are_plain_errors() -> None:
    error = translate_error(client_error("InsufficientInstanceCapacity", 500), None)
    assert type(error) is RetryableBurstError


def test_transport_and_credential_errors() -> None:
    assert type(translate_error(NoCredentialsError(), None)) is UnauthorizedError
    unreachable = translate_error(EndpointConnectionError(endpoint_url="http://x"), None)
    assert type(unreachable) is RetryableBurstError
