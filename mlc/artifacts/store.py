"""Artifact directories: atomic writing, loading with integrity checks, .tar.gz archives."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import shutil
import tarfile
import tempfile
import uuid
import zlib
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from mlc.artifacts.manifest import Manifest
from mlc.errors import IntegrityError, InputError
from mlc.runtime.runner import MANIFEST, ArtifactError, read_manifest, safe_member, sha256_file, verify_files


def written_by_mlc(folder: Path, marker: str = MANIFEST) -> set[str] | None:
    """The files mlc wrote in `folder`: its `marker` and the files the marker lists. None where the marker is
    missing or is not one mlc writes (a web app's manifest.json is the user's)."""
    try:
        record = json.loads((folder / marker).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return None
    if marker == MANIFEST and not isinstance(record.get("schema_version"), int):
        return None
    return {marker, f".{marker}.tmp", *record["files"]}  # .tmp: what an interrupted seal leaves


def check_replaceable(final: Path, marker: str = MANIFEST) -> None:
    """`final` may be (re)written: it does not exist, is empty, or is what mlc wrote there (`marker`:
    manifest.json for artifacts). Only the files its marker lists are replaced; publish keeps the rest."""
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        raise InputError(f"output path {final} exists and is not a directory mlc wrote; choose another -o")
    blocking = next((p for p in final.parents if p.exists() or p.is_symlink()), None)
    if blocking is not None and not blocking.is_dir():  # checked before compiling, not when writing
        raise InputError(f"output path {final} lies under {blocking}, which is a file, not a folder; choose another -o")
    if final.is_dir() and any(final.iterdir()) and written_by_mlc(final, marker) is None:
        what = f"its {marker} is not one mlc wrote" if (final / marker).exists() else f"holds no {marker}"
        raise InputError(f"output folder {final} is not empty and {what}; "
                         "mlc replaces only what it wrote: choose another path or empty it")


def _user_entries(final: Path, marker: str) -> list[str]:
    """What `final` holds that mlc did not write: files, links and empty folders, relative to it."""
    ours = written_by_mlc(final, marker) or set()
    found = []
    for folder, dirs, files in os.walk(final):
        rel = Path(folder).relative_to(final)
        found += [(rel / n).as_posix() for n in files if (rel / n).as_posix() not in ours]
        found += [(rel / d).as_posix() for d in dirs if (Path(folder) / d).is_symlink()]  # os.walk skips them
        if not dirs and not files and rel.parts:
            found.append(rel.as_posix())
    return found


def _carry_user_files(final: Path, staged: Path, marker: str) -> None:
    """Put the user's files of `final` into `staged` as hard links (a copy across filesystems), so that they are in
    the published folder and, until then, still in `final`: no moment loses them."""
    entries = _user_entries(final, marker) if final.is_dir() else []
    for rel in entries:
        src, dst = final / rel, staged / rel
        if dst.exists() or dst.is_symlink() or any(p.is_file() for p in dst.parents if p != staged and
                                                   p.is_relative_to(staged)):
            raise InputError(f"{src} is not a file mlc wrote, and the new output has one of that name; "
                             "move yours out of the way and run again")
    for rel in entries:
        src, dst = final / rel, staged / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            dst.mkdir()
        else:
            try:
                os.link(src, dst)
            except OSError:  # another filesystem mounted inside, or no hard links there
                shutil.copy2(src, dst)


@contextlib.contextmanager
def staging_dir(final: Path, marker: str = MANIFEST) -> Iterator[Path]:
    """A temporary directory beside `final` (same filesystem, so the final rename is atomic).
    Removed on any failure, Ctrl-C included; the caller publishes it with `publish`. Its name
    carries our pid so that a later run can remove what a killed run (SIGKILL) left behind."""
    check_replaceable(final, marker)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    except OSError as e:
        raise InputError(f"cannot write to {final.parent}: {e.strerror or e}") from None
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
            if kind == "old" and not final.exists() and not final.is_symlink():
                os.rename(leftover, final)  # killed between publish's two renames: the old folder, user files and all
            else:
                shutil.rmtree(leftover, ignore_errors=True)


def publish(staged: Path, final: Path, marker: str = MANIFEST) -> None:
    """Move a finished staging directory into place, replacing an older one. Concurrent
    publishers are serialised by a lock on the parent folder; if the second rename fails (or is
    interrupted) the old artifact is put back, so `final` is always the old one or the new one."""
    parent_fd = os.open(final.parent, os.O_RDONLY)
    try:
        fcntl.flock(parent_fd, fcntl.LOCK_EX)
        check_replaceable(final, marker)
        _carry_user_files(final, staged, marker)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staged, 0o777 & ~umask)  # mkdtemp made it private
        old = final.parent / f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        moved_aside = final.exists()
        if moved_aside:
            os.rename(final, old)
        try:
            os.rename(staged, final)
        except BaseException:
            if moved_aside and not final.exists():
                os.rename(old, final)
            raise
        if moved_aside:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(parent_fd)  # releases the lock


def seal(root: Path, manifest: Manifest) -> Manifest:
    """Record the sha256 of every file under `root` and write manifest.json (atomically). Sealing again (the
    manifest lists files) rehashes those only: a published folder also holds files of the user's, never listed."""
    if manifest.files:
        files = {rel: sha256_file(safe_member(root, rel)) for rel in manifest.files}
    else:
        files = {p.relative_to(root).as_posix(): sha256_file(p)
                 for p in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)}
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
        raise IntegrityError(f"{root / MANIFEST} is invalid at '{where}': {first['msg']}; "
                             "recompile the artifact") from None
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
            if final.exists():  # unpacking is for new copies; never replace a folder the user has
                raise InputError(f"{final} already exists; remove it or unpack elsewhere with -d DIR")
            with staging_dir(final) as staged:
                # 'data' filter: refuses absolute paths, '..', links leaving the tree, device files.
                tar.extractall(staged, filter="data")
                load(staged / top)
                publish(staged / top, final)
    except tarfile.ReadError:
        raise InputError(f"cannot unpack {archive_path}: not a .tar.gz archive (`mlc compile --archive` writes one)"
                         ) from None
    except tarfile.TarError as e:
        raise IntegrityError(f"cannot unpack {archive_path}: {str(e).splitlines()[0]}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:  # click would turn EOFError into a bare "Aborted."
        raise IntegrityError(f"cannot unpack {archive_path}: the archive is truncated or corrupt ({e}); "
                             "copy it again") from None
    return final
