"""Client side: the ClientApp (:mod:`pflower.client_app.app`) and one module per method."""
