"""Server side: the ServerApp."""

from pflower.server_app.app import app

__all__ = ["app"]
