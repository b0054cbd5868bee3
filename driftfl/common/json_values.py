"""Values JSON can carry: NaN and infinities (an accuracy never measured) become null."""

from __future__ import annotations

import math


def json_safe(value):
    """``value`` with every non-finite float, in lists and dicts too, as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value
