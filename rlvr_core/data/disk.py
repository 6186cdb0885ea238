"""Read one split of a dataset written by ``DatasetDict.save_to_disk`` (the prepare stage's output).

``load_saved_split(data_dir, split)`` returns the split's rows as dicts, or
raises one ``DataError`` naming the file and, where it applies, the row or
field, for everything that can be wrong with the folder:

- no folder, no ``dataset_dict.json``, or no such split in it;
- a JSON file (``dataset_dict.json``, ``state.json``, ``dataset_info.json``)
  that is not UTF-8 or not valid JSON (the byte offset, line and column named);
- a split with 0 rows (``save_to_disk`` writes no arrow file for it);
- a missing, truncated or corrupt ``.arrow`` file;
- a row whose text is not valid UTF-8.

``datasets`` itself answers these with IndexError, KeyError, OSError,
UnicodeDecodeError or JSONDecodeError that name neither the file nor the row.

``save_splits`` (the prepare stage's writer) records the sha256 of every
``.arrow`` file in ``digests.json``; ``load_saved_split`` checks a split's
files against it before pyarrow reads a byte of them, since a bit-flipped
arrow file can crash the process (SIGSEGV) instead of raising.

Digests or not, every arrow file is then checked whole by ``check_arrow_files``
before this process maps it: a short-lived child process reads it as an Arrow
IPC stream and validates every record batch in full (offsets, lengths, UTF-8),
and a file that fails, or whose reading kills the child (SIGSEGV), is a
DataError naming it. So a folder without ``digests.json`` (written by
``save_to_disk`` directly, a user's own data, or an earlier version) is
refused as well, and a ``digests.json`` rewritten to match an edited file does
not let it through. A file that passed is remembered for the process's life by
its device, inode, size, mtime and ctime, so a split read twice is checked
once; a file changed while this process has it mapped is not covered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from rlvr_core.data.validate import DataError
from rlvr_core.safefs import file_sha256, write_text_atomic

PREPARE = "run `python -m flows.prepare` (or `dvc repro prepare`) to regenerate it"
DIGESTS = "digests.json"
# seconds the child process that checks a split's arrow files may take (full validation reads about
# a GB a second; the prepare stage's largest split is tens of MB)
CHECK_TIMEOUT_S = 600

# run as `python -I -c _CHECK file...`: prints "checking <i>" before file i, then "ok", or "bad <i> <why>"
_CHECK = """\
import sys
import pyarrow as pa
for i, path in enumerate(sys.argv[1:]):
    print("checking", i, flush=True)
    where, rows = "", 0
    try:
        with pa.memory_map(path) as source:
            for b, batch in enumerate(pa.ipc.open_stream(source)):
                where = f"record batch {b}, rows {rows} to {rows + batch.num_rows - 1}: "
                batch.validate(full=True)
                rows += batch.num_rows
    except Exception as e:
        print("bad", i, where + e.__class__.__name__ + ": " + " ".join(str(e).split())[:200], flush=True)
        sys.exit(1)
print("ok", flush=True)
"""
# (device, inode, size, mtime_ns, ctime_ns) of each arrow file that passed check_arrow_files
_PASSED: set[tuple[str, int, int, int, int, int]] = set()


def save_splits(ds: Any, out_dir: str | Path) -> None:
    """``ds.save_to_disk(out_dir)`` (a DatasetDict), then ``digests.json``: {split: {arrow file: sha256}}."""
    out = Path(out_dir)
    ds.save_to_disk(str(out))
    digests = {split: {f.name: file_sha256(f) for f in sorted((out / split).glob("*.arrow"))} for split in ds}
    write_text_atomic(out / DIGESTS, json.dumps(digests, indent=1, sort_keys=True))  # never through a planted link


def _check_digests(root: Path, split: str, arrows: list[Path]) -> None:
    """DataError naming the first of ``arrows`` whose sha256 is not the one ``digests.json`` recorded."""
    if not (root / DIGESTS).exists():
        return
    recorded = read_json(root / DIGESTS)
    files = recorded.get(split) if isinstance(recorded, dict) else None
    if not isinstance(files, dict):
        raise DataError(f"{root / DIGESTS}: no digests for the {split!r} split; the file is corrupt; {PREPARE}")
    for arrow in arrows:
        try:
            actual = file_sha256(arrow)
        except OSError as e:
            raise DataError(f"{arrow}: cannot be read ({e.strerror or e}); {PREPARE}") from None
        if files.get(arrow.name) != actual:
            raise DataError(f"{arrow}: its content does not match the sha256 recorded in {root / DIGESTS} when "
                            f"the split was written (a corrupted or edited file); {PREPARE}")


def read_json(path: Path) -> Any:
    """The JSON document in ``path``; DataError naming the file and the position of the problem."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: missing; the dataset folder is incomplete; {PREPARE}") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                        f"the file is corrupt; {PREPARE}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                        f"the file is corrupt; {PREPARE}") from None


def load_saved_split(data_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """Rows of ``split`` in the ``save_to_disk`` folder ``data_dir``; DataError for anything unreadable."""
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"{root}: no dataset; run `python -m flows.prepare` first")
    index = read_json(root / "dataset_dict.json")
    splits = index.get("splits") if isinstance(index, dict) else None
    if not isinstance(splits, list):
        raise DataError(f"{root / 'dataset_dict.json'}: field 'splits' must be a list of split names, "
                        f"got {str(splits)[:100]}; {PREPARE}")
    if split not in splits:
        raise DataError(f"{root / 'dataset_dict.json'}: no {split!r} split (the dataset has {splits[:10]}); "
                        f"training needs 'train' and 'test'; {PREPARE}")
    folder = root / split
    state = read_json(folder / "state.json")
    read_json(folder / "dataset_info.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("filename"), str)
                                              for f in files):
        raise DataError(f"{folder / 'state.json'}: field '_data_files' must list the arrow files, "
                        f"got {str(files)[:100]}; {PREPARE}")
    if not files:
        raise DataError(f"{folder}: the {split!r} split has 0 rows; {PREPARE} with n_train / n_test >= 1")
    for f in files:
        arrow = folder / f["filename"]
        if not arrow.is_file():
            raise DataError(f"{arrow}: missing (listed in {folder / 'state.json'}); {PREPARE}")
    arrows = [folder / f["filename"] for f in files]
    _check_digests(root, split, arrows)
    check_arrow_files(arrows)
    return _rows(folder, arrows)


def _identity(path: Path) -> tuple[str, int, int, int, int, int]:
    st = os.stat(path)
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def check_arrow_files(arrows: Sequence[str | os.PathLike]) -> None:
    """DataError naming the first of ``arrows`` that is not a whole, valid Arrow IPC stream (the format
    ``datasets`` writes), checked in a child process: a corrupt file can crash the process that reads it
    (SIGSEGV) instead of raising, and a crash of the child is a DataError too. Files that passed before in
    this process, unchanged since (same inode, size, mtime and ctime), are not read again."""
    todo: list[tuple[Path, tuple[str, int, int, int, int, int]]] = []
    for a in map(Path, arrows):
        try:
            key = _identity(a)
        except OSError as e:
            raise DataError(f"{a}: cannot be read ({e.strerror or e}); {PREPARE}") from None
        if key not in _PASSED:
            todo.append((a, key))
    if not todo:
        return
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _CHECK, *(str(a) for a, _ in todo)],
                              capture_output=True, text=True, errors="replace", timeout=CHECK_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        raise DataError(f"{todo[0][0]}: checking the arrow files of {todo[0][0].parent} took more than "
                        f"{CHECK_TIMEOUT_S} s; {PREPARE}") from None
    lines = done.stdout.splitlines()
    if done.returncode == 0 and lines[-1:] == ["ok"]:
        _PASSED.update(key for _, key in todo)
        return
    last = next((ln.split() for ln in reversed(lines) if ln.startswith(("bad ", "checking "))), ["checking", "0"])
    arrow = todo[int(last[1])][0] if last[1].isdigit() and int(last[1]) < len(todo) else todo[0][0]
    if last[0] == "bad":
        why = " ".join(lines[-1].split()[2:])[:240]
        raise DataError(f"{arrow}: not a valid arrow file, it is truncated or corrupt ({why}); {PREPARE}")
    if done.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-done.returncode}"
    else:
        how = f"exited with status {done.returncode} ({' '.join(done.stderr.split())[-200:]})"
    raise DataError(f"{arrow}: the process checking it as an arrow file {how}; the file is corrupt; {PREPARE}")


def _rows(folder: Path, arrows: list[Path]) -> list[dict[str, Any]]:
    from datasets import load_from_disk

    try:
        ds = load_from_disk(str(folder))
    except Exception as e:  # noqa: BLE001 - pyarrow raises OSError / ArrowInvalid for a cut or corrupt file
        names = ", ".join(str(a) for a in arrows)
        raise DataError(f"{names}: cannot be read as an arrow table, the file is truncated or corrupt "
                        f"({e.__class__.__name__}: {str(e)[:200]}); {PREPARE}") from None
    rows: list[dict[str, Any]] = []
    offsets = _row_offsets(arrows, ds)
    try:
        for row in ds:
            rows.append(row)
    except Exception as e:  # noqa: BLE001 - bad UTF-8 in a string column, a short record batch
        i = len(rows)  # the first row that did not come back
        file, at = offsets(i)
        raise DataError(f"{file}: row {at} (row {i} of the {folder.name!r} split) cannot be read "
                        f"({e.__class__.__name__}: {str(e)[:200]}); the file is corrupt; {PREPARE}") from None
    return rows


def _row_offsets(arrows: list[Path], ds: Any) -> Any:
    """Row index of the split -> (arrow file, row inside it), from the dataset's per-file tables."""
    sizes = []
    try:
        for table in getattr(ds.data, "tables", None) or [ds.data]:
            sizes.append(len(table))
    except Exception:  # noqa: BLE001 - only used for messages
        sizes = []
    if len(sizes) != len(arrows):
        return lambda i: (arrows[0] if len(arrows) == 1 else ", ".join(map(str, arrows)), i)

    def find(i: int) -> tuple[Path, int]:
        for arrow, size in zip(arrows, sizes):
            if i < size:
                return arrow, i
            i -= size
        return arrows[-1], i

    return find
