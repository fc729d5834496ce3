"""Short GPU model names (what users ask for) from the product names drivers and GFD report."""

from __future__ import annotations

_VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_FAMILY_WORDS = {"RTX", "GTX", "TITAN"}


def short_model(product: str) -> str:
    """'NVIDIA H200' -> 'H200', 'NVIDIA-H100-80GB-HBM3' -> 'H100', 'Tesla-T4' -> 'T4',
    'NVIDIA-GeForce-RTX-4090' -> 'RTX-4090'; an empty or unknown name stays as it is."""
    words = [w for w in product.replace("-", " ").split() if w.upper() not in _VENDOR_WORDS]
    if not words:
        return product
    if words[0].upper() in _FAMILY_WORDS and len(words) > 1:
        return f"{words[0]}-{words[1]}"
    return words[0]
