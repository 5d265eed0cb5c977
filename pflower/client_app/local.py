"""Local training: every client trains alone and sends nothing."""

from __future__ import annotations

from torch import nn

from pflower.client_app.base import ClientMethod


class LocalClient(ClientMethod):
    EVALUATES = "its own model"

    def upload_keys(self, model: nn.Module) -> list[str]:
        return []
