"""A policy folder's record of its files: ``sha256.json``, written with the folder, checked before training.

Every policy folder the project writes (the warm start, a snapshot of a base model, an exported
``final_model``) gets ``sha256.json``: the sha256 and size of each of its other files. ``check_policy_files``
hashes the folder against it before a run loads anything, so a flipped bit in the weights, the config or the
tokenizer (which often loads without any error) is refused naming the folder and the file; a file the record
does not list is refused too (it could change what loads). ``policy_digest`` is one sha256 over the folder's
files (the record's table, or the files hashed when the folder has no record): a run stores the digest of the
policy it started from and refuses to resume on another (``rlvr_core.preflight.check_resumable``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from rlvr_core.models.tiny import PolicyLoadError
from rlvr_core.safefs import file_sha256, write_atomic

RECORD = "sha256.json"
FORMAT = 1


class PolicyFilesMismatch(PolicyLoadError):
    """A policy folder whose files are not those its ``sha256.json`` records (damaged, edited or swapped)."""


def file_hashes(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """{relative path: {sha256, bytes}} of every file under ``folder``, the record ``sha256.json`` aside."""
    folder = Path(folder)
    out = {}
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        name = p.relative_to(folder).as_posix()
        if name != RECORD:
            out[name] = {"sha256": file_sha256(p), "bytes": p.stat().st_size}
    return out


def policy_digest(files: Mapping[str, Mapping[str, Any]]) -> str:
    """One sha256 over a folder's file table (``file_hashes``): equal digests, equal files."""
    table = {str(k): {"sha256": str(v["sha256"]), "bytes": int(v["bytes"])} for k, v in files.items()}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()


def write_policy_record(folder: str | os.PathLike, files: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """Write ``folder/sha256.json`` (atomically, fsynced) with ``files`` (None: the folder's files hashed now)."""
    folder = Path(folder)
    table = dict(file_hashes(folder) if files is None else files)
    path = folder / RECORD
    write_atomic(path, (json.dumps({"format": FORMAT, "files": table}, indent=1, sort_keys=True) + "\n").encode(),
                 fsync=True)
    return path


def _read_record(folder: Path) -> dict[str, dict[str, Any]]:
    """The file table of ``folder``'s record; PolicyFilesMismatch when the record itself is damaged."""
    path = folder / RECORD
    try:
        record = json.loads(path.read_bytes())
        files = record["files"]
        if record.get("format") != FORMAT or not isinstance(files, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("sha256"), str) and type(v.get("bytes")) is int
                for v in files.values()):
            raise ValueError("not a table of sha256 and bytes per file")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise PolicyFilesMismatch(f"policy folder {str(folder)!r}: its record {RECORD} is damaged "
                                  f"({e.__class__.__name__}: {str(e)[:200]}), so its files cannot be checked; "
                                  f"{_FIX}") from None
    return files


_FIX = "write the policy folder again (models/warmstart: `python -m flows.warmstart`, or `dvc checkout " \
       "models/warmstart`)"


def _file_problem(path: Path, name: str, want: Mapping[str, Any]) -> str | None:
    """What differs between file ``name`` and its record entry, None if nothing (size first, then content)."""
    if not path.is_file():
        return f"has no {name}, which its {RECORD} lists"
    try:
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, its {RECORD} records {want['bytes']}"
        got = file_sha256(path)
    except OSError as e:
        return f"{name} is unreadable ({e.strerror or e.__class__.__name__})"
    if got != want["sha256"]:
        return f"{name} has sha256 {got[:16]}..., its {RECORD} records {want['sha256'][:16]}... (same size: " \
               "changed in place, e.g. a flipped bit)"
    return None


def require_policy_record(folder: str | os.PathLike) -> None:
    """PolicyFilesMismatch unless ``folder`` has its ``sha256.json`` (a folder this project wrote has one)."""
    if not (Path(folder) / RECORD).is_file():
        raise PolicyFilesMismatch(f"policy folder {str(folder)!r} has no {RECORD} (the sha256 of its files), "
                                  f"so a damaged file could not be told; {_FIX}")


def check_policy_files(folder: str | os.PathLike, *, required: bool = False) -> str:
    """The ``policy_digest`` of ``folder``, its files checked against its ``sha256.json`` first.

    Raises PolicyFilesMismatch naming the folder and the first file that is missing, of another size or
    content, or not in the record; or when the record is damaged, or missing while ``required``. A folder
    without a record (``required`` False: a model folder written elsewhere) is hashed, not checked.
    """
    folder = Path(folder)
    if not (folder / RECORD).is_file():
        if required:
            require_policy_record(folder)
        return policy_digest(file_hashes(folder))
    files = _read_record(folder)
    for name in sorted(files):
        if (problem := _file_problem(folder / name, name, files[name])) is not None:
            raise PolicyFilesMismatch(f"policy folder {str(folder)!r}: {problem}; the folder is damaged or was "
                                      f"changed after it was written: {_FIX}")
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {RECORD}
    if extra := sorted(present - set(files)):
        raise PolicyFilesMismatch(f"policy folder {str(folder)!r}: {extra[:5]} not in its {RECORD} (added after "
                                  f"the folder was written); remove them, or {_FIX}")
    return policy_digest(files)


__all__ = ["FORMAT", "PolicyFilesMismatch", "RECORD", "check_policy_files", "file_hashes", "policy_digest",
           "require_policy_record", "write_policy_record"]
