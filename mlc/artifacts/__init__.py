"""Artifacts: the manifest schema (manifest.py), staged atomic publishing, integrity checks and archives (store.py)."""

from mlc.artifacts.store import (archive, check_replaceable, load, publish, seal, staging_dir, sweep_stale, unpack)

__all__ = ["archive", "check_replaceable", "load", "publish", "seal", "staging_dir", "sweep_stale", "unpack"]
