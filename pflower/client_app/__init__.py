"""Client side: the ClientApp and one module per method."""

from pflower.client_app.app import app

__all__ = ["app"]
