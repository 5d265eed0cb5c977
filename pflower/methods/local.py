"""Local training: every client trains alone; nothing crosses the wire."""

from pflower.methods.declaration import Method

METHOD = Method(
    name="local",
    summary="every client trains alone (uploads nothing, is sent nothing)",
    client="pflower.client_app.local:LocalClient",
    strategy="pflower.strategies.local:Local",
)
