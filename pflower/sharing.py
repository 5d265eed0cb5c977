"""Gradual sharing: which of a method's upload keys a round shares, released layer by layer.

The upload keys are grouped into *units*, one per layer, shallow to deep (a layer's float
buffers, e.g. BatchNorm statistics, go with it). With ``gradual-interval`` = G > 0, round r is
in phase p(r) = min(ceil(r / G), units): the clients upload the first p(r) units and the server
aggregates exactly those; the deeper ones are trained locally and cross the wire in neither
direction. The server sends a unit only once it has aggregated it, so training messages of
round r carry the first p(r - 1) units (none in round 1, where every client starts from the
common initialization) and evaluation messages the first p(r). G = 0 shares everything
every round. Server and clients compute the same schedule from the run config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from pflower.models.layers import layers


def sharing_units(model: nn.Module, upload_keys: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """``upload_keys`` grouped by layer, shallow to deep; keys of parameterless modules go with the first unit."""
    keys = list(upload_keys)
    units = []
    for layer in layers(model):
        unit = tuple(k for k in keys if k.rpartition(".")[0] == layer.name)
        if unit:
            units.append(unit)
    placed = {k for unit in units for k in unit}
    rest = tuple(k for k in keys if k not in placed)
    if rest:
        units = [rest + units[0], *units[1:]] if units else [rest]
    return tuple(units)


@dataclass(frozen=True)
class GradualSharing:
    units: tuple[tuple[str, ...], ...]
    interval: int

    @classmethod
    def of(cls, model: nn.Module, upload_keys: Sequence[str], interval: int) -> GradualSharing:
        return cls(sharing_units(model, upload_keys), interval)

    def phase(self, server_round: int) -> int:
        """How many units round ``server_round`` shares (round 0: before the first round)."""
        if self.interval == 0:
            return len(self.units)
        return max(0, min(len(self.units), (server_round - 1) // self.interval + 1))

    def sent_phase(self, server_round: int) -> int:
        """How many units the server sends for training in ``server_round`` (those it has aggregated)."""
        return self.phase(server_round if self.interval == 0 else server_round - 1)

    def keys_of(self, units: int) -> list[str]:
        """The keys of the first ``units`` units."""
        return [k for unit in self.units[:units] for k in unit]

    def keys(self, server_round: int) -> list[str]:
        """The keys uploaded and aggregated in ``server_round``."""
        return self.keys_of(self.phase(server_round))

    def layer_name(self, unit: int) -> str:
        """The module name of unit ``unit`` (0-based)."""
        return self.units[unit][-1].rpartition(".")[0]
