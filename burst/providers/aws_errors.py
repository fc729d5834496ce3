"""botocore errors translated into burst errors that say what the caller should do."""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    ParamValidationError,
)

from burst.core.model import OfferKey
from burst.errors import (
    BurstError,
    InstanceLimitError,
    InsufficientCapacityError,
    PermanentBurstError,
    RetryableBurstError,
    UnauthorizedError,
)

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "SpotMaxPriceTooLow",
        "Unsupported",  # type not sold in this zone / with this configuration
    }
)
LIMIT_CODES = frozenset(
    {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"}
)
AUTH_CODES = frozenset(
    {
        "UnauthorizedOperation",
        "AuthFailure",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "OptInRequired",
    }
)
RETRY_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
    }
)


def translate_error(exc: ClientError | BotoCoreError, offer: OfferKey | None) -> BurstError:
    """The burst error for a botocore error; `offer` is the offer a launch was for, if any."""
    if isinstance(exc, NoCredentialsError):
        return UnauthorizedError("no AWS credentials found", provider_code="NoCredentials")
    if isinstance(exc, ParamValidationError):
        return PermanentBurstError(f"invalid EC2 request: {exc}", provider_code="ParamValidation")
    if isinstance(exc, BotoCoreError):
        return RetryableBurstError(f"EC2 unreachable: {exc}", provider_code=type(exc).__name__)
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    message = str(error.get("Message", "")) or str(exc)
    operation = exc.operation_name
    if offer is not None and code in CAPACITY_CODES:
        text = (
            f"no {offer.market.value} capacity for {offer.instance_type} in {offer.region} "
            f"({code}): {message}"
        )
        return InsufficientCapacityError(offer, text, provider_code=code)
    if offer is not None and code in LIMIT_CODES:
        text = (
            f"account limit reached launching {offer.instance_type} in {offer.region} ({code}): "
            f"{message}; ask AWS for a higher quota"
        )
        return InstanceLimitError(offer, text, provider_code=code)
    if code in AUTH_CODES:
        text = (
            f"AWS refused {operation} ({code}): {message}; check the credentials and the IAM "
            f"policy in docs/burst.md"
        )
        return UnauthorizedError(text, provider_code=code)
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in RETRY_CODES or status >= 500:
        return RetryableBurstError(
            f"EC2 {operation} failed ({code}): {message}", provider_code=code
        )
    return PermanentBurstError(f"EC2 {operation} failed ({code}): {message}", provider_code=code)
