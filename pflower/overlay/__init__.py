"""Peer-sampling overlay: each client's partial, gossiped view of its peers."""

from pflower.overlay.peer_sampling import View

__all__ = ["View"]
