"""``theta0="auto"``: learn the routing threshold from the embedder's similarity scale.

θ0 = 0.4 was tuned for OpenAI's text-embedding-3-large; other models score related
texts on other scales (all-MiniLM-L6-v2 grows deep, nearly binary chains at 0.4).
While a namespace calibrates, each insert records how similar the new text is to
its nearest stored leaf; after ``calibration_samples`` inserts θ0 becomes the
``calibration_quantile`` of those scores and is frozen in the namespace's settings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memtree.config import MemTreeConfig

SAMPLES_KEY = "theta0_samples"
THETA0_KEY = "theta0"


def effective_theta0(config: MemTreeConfig, settings: dict[str, Any]) -> float:
    """The θ0 routing uses now."""
    if config.theta0 != "auto":
        return float(config.theta0)
    calibrated = settings.get(THETA0_KEY)
    return float(calibrated) if calibrated is not None else config.auto_theta0_start


def needs_sample(config: MemTreeConfig, settings: dict[str, Any]) -> bool:
    """Whether the next insert should measure its nearest-leaf similarity."""
    return config.theta0 == "auto" and settings.get(THETA0_KEY) is None


def with_sample(config: MemTreeConfig, settings: dict[str, Any], similarity: float) -> dict[str, Any]:
    """Settings after recording one sample (and calibrating once there are enough)."""
    samples = [*settings.get(SAMPLES_KEY, []), round(float(similarity), 6)]
    updated = dict(settings)
    if len(samples) >= config.calibration_samples:
        theta0 = float(np.quantile(np.asarray(samples), config.calibration_quantile))
        updated[THETA0_KEY] = round(min(max(theta0, -1.0), config.max_threshold), 6)
        updated.pop(SAMPLES_KEY, None)
    else:
        updated[SAMPLES_KEY] = samples
    return updated
