"""The run directory's files: their names, the manifest's format, atomic JSON writes.

`collector.data.store.RunStore` is the one writer of a run directory; this module is what a
reader needs to find the committed data without it (`committed_shard_paths`,
`read_manifest`), and the file-level primitives the store builds its commits from.

Layout (``RUN_DIR``), chosen so that every standard reader opens the run dir itself in one
line and sees committed data only (measured: pandas, pyarrow, polars, DuckDB, Hugging Face
datasets and Ray Data)::

    data/part-000042-1a2b3c4d.arrow      committed shards only, flat (model and budget are columns)
    .collector/manifest.json             the list of committed shards: the only source of truth
    .collector/config.resolved.json      the resolved config and its fingerprint
    .collector/run.lock                  held (flock) while a RunStore is open
    .collector/tmp/part-...arrow.tmp     shards being written, and committed ones not yet moved
    .collector/quarantine/part-...arrow.quarantined   corrupt or stray files, moved aside

Why these names. pandas and pyarrow skip path parts starting with ``.`` or ``_`` but read
any other file whatever its extension; Hugging Face skips ``.`` and ``__`` parts (not a
single ``_``); polars and DuckDB ``**`` globs enter hidden dirs and filter by extension
only. So a file is invisible to all of them only under a ``.`` directory *and* without a
shard extension: every sidecar, temp and quarantined file is both. Flat data files with
plain hex names, because Hugging Face infers splits from path words (a model named
``sim-eval`` would become a "test" split and drop the others' rows), and because a Hive
``budget=`` directory next to the int64 column clashes in pandas and pyarrow.

Run dirs written before this layout (``manifest.json`` at the top, shards under
``model=<m>/budget=<b>/``) are still read by every collector reader (`read_manifest`
falls back to `LEGACY_MANIFEST`); the store refuses to continue them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from collector.data.shards import EXTENSIONS
from collector.errors import OutputError

__all__ = [
    "CHECKSUM_ALGORITHM",
    "DATA_DIR",
    "LEGACY_MANIFEST",
    "LOCK",
    "MANIFEST",
    "MANIFEST_VERSION",
    "META_DIR",
    "QUARANTINE",
    "QUARANTINE_SUFFIX",
    "RESOLVED_CONFIG",
    "TMP_DIR",
    "TMP_SUFFIX",
    "NotARunDirectory",
    "ReplacedNotDurable",
    "committed_shard_paths",
    "decode_partition_value",
    "file_digest",
    "fsync_dir",
    "is_legacy",
    "now_iso",
    "partition_dir",
    "pending_path",
    "read_manifest",
    "shard_location",
    "unique_entries",
    "write_json_atomic",
]

# Every name is relative to the run dir (see the module docstring for why each lives where it does).
META_DIR = ".collector"
DATA_DIR = "data"
MANIFEST = f"{META_DIR}/manifest.json"
RESOLVED_CONFIG = f"{META_DIR}/config.resolved.json"
LOCK = f"{META_DIR}/run.lock"
TMP_DIR = f"{META_DIR}/tmp"
QUARANTINE = f"{META_DIR}/quarantine"
TMP_SUFFIX = ".tmp"
QUARANTINE_SUFFIX = ".quarantined"
#: Where the manifest lived before the `.collector/` layout (manifest version 1).
LEGACY_MANIFEST = "manifest.json"
#: 2: the `.collector/` + flat `data/` layout.
MANIFEST_VERSION = 2
#: The checksum recorded for each shard at commit, as ``"<algorithm>:<hex digest>"``.
CHECKSUM_ALGORITHM = "sha256"


#: The longest `model=...` directory name written, in bytes. 255 is the usual NAME_MAX, but
#: eCryptfs and some network filesystems allow about 143: 120 fits every one we know of.


def partition_dir(model: str, budget: int) -> str:
    """The Hive partition of a model and budget in the legacy layout, relative to the run dir
    (model names URI-escaped, as pyarrow's Hive partitioning decodes them). Today's layout
    has no per-model directories: a model name of any length is only a column value."""
    return f"model={quote(model, safe='')}/budget={int(budget)}"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _json_default(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return str(value)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ReplacedNotDurable(OSError):
    """`write_json_atomic` replaced the file, but the directory's fsync after the rename failed.

    Readers already see the new content: the replacement happened and must not be undone
    (for the manifest: the commit is done, and its shards must be kept); only its durability
    across a power loss is in doubt.
    """

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, f"{path.name} was replaced, but fsync of {path.parent} failed: "
                                      f"{cause.strerror or cause}")
        self.path = path


def write_json_atomic(path: Path, payload: Any) -> None:
    """Replace `path` with `payload` as JSON: temp file, fsync, rename, fsync the directory.

    A failure before the rename leaves the old file (an OSError); a failure of the last
    fsync, after it, is a `ReplacedNotDurable`.
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    data = json.dumps(payload, indent=1, default=_json_default).encode()
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fsync_dir(path.parent)
    except OSError as e:
        raise ReplacedNotDurable(path, e) from e


class NotARunDirectory(OutputError):
    """The path has no manifest at all: not a run directory (bad input, not damaged data)."""


def is_legacy(run_dir: Path) -> bool:
    """True for a run dir of the layout before `.collector/` (manifest at the top)."""
    return not (run_dir / MANIFEST).exists() and (run_dir / LEGACY_MANIFEST).is_file()


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest of `run_dir` (raises OutputError when missing or unreadable).

    A legacy run dir's top-level manifest is read too: its entry paths are relative to the
    run dir like ours, so every reader works on both layouts unchanged. Missing (no such
    directory, or no manifest in it) is a `NotARunDirectory`.
    """
    path = run_dir / (LEGACY_MANIFEST if is_legacy(run_dir) else MANIFEST)
    try:
        manifest = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        raise NotARunDirectory(f"{run_dir} is not a run directory (no {MANIFEST})") from None
    except (OSError, ValueError) as e:
        raise OutputError(f"{path} is unreadable: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise OutputError(f"{path} is not a collector manifest")
    for i, entry in enumerate(manifest["shards"]):
        problem = _entry_problem(entry)
        if problem is not None:
            shown = json.dumps(entry, default=str)
            shown = shown if len(shown) <= 160 else shown[:157] + "..."
            raise OutputError(f"{path}: shard entry {i} {problem}: {shown}")
    return manifest


def _entry_problem(entry: Any) -> str | None:
    """Why a manifest shard entry cannot be trusted, or None.

    Checked before any entry is used, so that a hand-edited or damaged manifest is one
    line naming it instead of a KeyError deep in a reader, and so that no entry can point
    outside the run dir (the store moves and deletes the files it names).
    """
    if not isinstance(entry, dict):
        return "is not an object"
    rel = entry.get("path")
    if not isinstance(rel, str) or not rel:
        return 'has no "path"'
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        return "has a path outside the run dir"
    if not any(rel.endswith(ext) for ext in EXTENSIONS.values()):
        return "names a file that is not a shard"
    for key, kind in (("rows", int), ("budget", int), ("model", str)):
        value = entry.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f'has no valid "{key}"'
    if entry["rows"] < 0:
        return 'has a negative "rows"'
    # Absent in manifests written before checksums were recorded: the full decode stands in.
    size = entry.get("size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        return 'has an invalid "size"'
    checksum = entry.get("checksum")
    if checksum is not None and (not isinstance(checksum, str) or ":" not in checksum):
        return 'has an invalid "checksum"'
    return None


def file_digest(path: Path) -> tuple[int, str]:
    """The size of the file at `path` and its checksum, ``"sha256:<hex>"``."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, CHECKSUM_ALGORITHM)
        size = os.fstat(f.fileno()).st_size
    return size, f"{CHECKSUM_ALGORITHM}:{digest.hexdigest()}"


def unique_entries(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The shard entries with each path kept once (the first entry naming it), and the paths
    that were repeated. A damaged or hand-merged manifest can name one file twice; its rows
    are still committed once, so every reader counts them once (the store repairs it)."""
    seen: set[str] = set()
    kept, repeated = [], []
    for entry in entries:
        if entry["path"] in seen:
            repeated.append(entry["path"])
            continue
        seen.add(entry["path"])
        kept.append(entry)
    return kept, repeated
def pending_path(root: Path, rel: str) -> Path:
    """Where the shard the manifest names `rel` sits until it is moved into `data/`.

    A commit writes ``.collector/tmp/<name>.tmp``, names ``data/<name>`` in the manifest,
    then renames: a crash in between leaves a committed shard here, which the next open
    moves into place (and readers going through the manifest find here meanwhile).
    """
    return root / TMP_DIR / (rel.rsplit("/", 1)[-1] + TMP_SUFFIX)


def shard_location(root: Path, rel: str) -> Path:
    """The file holding the committed shard `rel`: in `data/`, or still pending after a crash."""
    final = root / rel
    if not final.exists():
        pending = pending_path(root, rel)
        if pending.exists():
            return pending
    return final


def committed_shard_paths(run_dir: str | Path) -> list[Path]:
    """Absolute paths of the shards the manifest names (committed data only), each once."""
    root = Path(run_dir)
    kept, _ = unique_entries(read_manifest(root)["shards"])
    return [shard_location(root, entry["path"]) for entry in kept]


def decode_partition_value(segment: str) -> str:
    """Inverse of the escaping in `partition_dir` for one ``key=value`` segment's value."""
    return unquote(segment.split("=", 1)[1])
