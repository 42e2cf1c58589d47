"""Artifact directories: atomic writing, loading with integrity checks, .tar.gz archives."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from mlc.artifacts.manifest import Manifest
from mlc.errors import IntegrityError, InputError
from mlc.runtime.runner import MANIFEST, ArtifactError, read_manifest, sha256_file, verify_files


@contextlib.contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """A temporary directory beside `final` (same filesystem, so the final rename is atomic).
    Removed on any failure, Ctrl-C included; the caller publishes it with `publish`. Its name
    carries our pid so that a later run can remove what a killed run (SIGKILL) left behind."""
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_stale(final: Path) -> None:
    """Remove staging and replaced-artifact directories of `final` whose process is gone."""
    for leftover in final.parent.glob(f".{final.name}.*-*"):
        kind, _, rest = leftover.name[len(final.name) + 2:].partition("-")
        pid = rest.split("-", 1)[0]
        if kind in ("tmp", "old") and pid.isdigit() and not _pid_alive(int(pid)) and leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


def publish(staged: Path, final: Path) -> None:
    """Move a finished staging directory into place, replacing an older artifact. Readers see
    the old artifact or the new one; an exclusive lock serialises concurrent publishers."""
    lock_path = final.parent / f".{final.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = final.parent / f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if final.exists() or final.is_symlink():
            if not final.is_dir() or final.is_symlink():
                raise InputError(f"output path {final} exists and is not an artifact directory; choose another -o")
            os.rename(final, old)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staged, 0o777 & ~umask)  # mkdtemp made it private
        os.rename(staged, final)
        shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(OSError):
        lock_path.unlink()


def seal(root: Path, manifest: Manifest) -> Manifest:
    """Record the sha256 of every file under `root` and write manifest.json (atomically)."""
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(root).as_posix()] = sha256_file(path)
    manifest = manifest.model_copy(update={"files": files})
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n")
    os.replace(tmp, root / MANIFEST)
    return manifest


def load(path: str | os.PathLike, verify: bool = True) -> Manifest:
    """Validate an artifact directory: manifest schema, then every file's sha256."""
    root = Path(path)
    if not root.exists():
        raise InputError(f"artifact not found: {root}")
    if root.is_file():
        raise InputError(f"{root} is a file; pass the artifact directory (unpack archives with `mlc unpack`)")
    try:
        raw = read_manifest(root)
        manifest = Manifest.model_validate(raw)
        if verify:
            verify_files(root, raw)
    except ArtifactError as e:
        raise IntegrityError(str(e)) from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise IntegrityError(f"{root / MANIFEST} is invalid at '{where}': {first['msg']}; recompile the artifact") from None
    return manifest


def archive(root: Path) -> Path:
    """Pack an artifact directory into `<root>.tar.gz` beside it (written atomically)."""
    out = root.with_name(root.name + ".tar.gz")
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(root, arcname=root.name)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def unpack(archive_path: Path, dest: Path) -> Path:
    """Extract an artifact archive safely (no paths outside `dest`, no links, no devices)."""
    if not archive_path.is_file():
        raise InputError(f"archive not found: {archive_path}")
    try:
        with tarfile.open(archive_path, "r:*") as tar:
            members = tar.getmembers()
            tops = {Path(m.name).parts[0] for m in members if Path(m.name).parts}
            if len(tops) != 1:
                raise IntegrityError(f"{archive_path} is not an mlc artifact archive (expected one top-level folder)")
            top = tops.pop()
            final = dest / top
            with staging_dir(final) as staged:
                # 'data' filter: refuses absolute paths, '..', links leaving the tree, device files.
                tar.extractall(staged, filter="data")
                load(staged / top)
                publish(staged / top, final)
    except tarfile.TarError as e:
        raise IntegrityError(f"cannot unpack {archive_path}: {e}") from None
    return final
