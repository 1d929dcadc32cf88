"""Helpers every test tier shares: manifests (manifests.py) and waits on the world (waits.py)."""
