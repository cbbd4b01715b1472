"""Noise stubs for deterministic releases in the release tests."""

from __future__ import annotations

import dataclasses

from dpproxy.policy import Mechanism
from dpproxy.privacy import NoiseSpec


@dataclasses.dataclass(frozen=True)
class NoNoise:
    """A component's noise that is always 0, with the real spec's mechanism, scale and error bounds
    (what the release reads to bound it)."""

    spec: NoiseSpec

    def sample(self, n: int) -> list[int]:
        return [0] * n

    def error_at(self, alpha: float) -> float:
        return self.spec.error_at(alpha)

    @property
    def mechanism(self) -> Mechanism:
        return self.spec.mechanism

    @property
    def scale(self) -> float:
        return self.spec.scale
