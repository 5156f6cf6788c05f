"""The run directory's files: their names, the manifest's format, atomic JSON writes.

`collector.storage.local.LocalRunStore` is the one writer of a run directory; this module is what a
reader needs to find the committed data without it (`committed_shard_paths`,
`read_manifest`), and the file-level primitives the store builds its commits from.

Layout (``RUN_DIR``), chosen so that every standard reader opens the run dir itself in one
line and sees committed data only (measured: pandas, pyarrow, polars, DuckDB, Hugging Face
datasets and Ray Data)::

    data/part-000042-1a2b3c4d.arrow      committed shards only, flat (model and budget are columns)
    .collector/manifest.json             the committed shards as of its `log_through` (the base)
    .collector/commit-000000043.json     one record per commit since then (append-only log)
    .collector/config.resolved.json      the resolved config and its fingerprint
    .collector/run.lock                  held (flock) while a LocalRunStore is open
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

The commit log. Rewriting one manifest listing every shard made each commit cost O(shards)
(10 ms empty, 110 ms at 20,000 shards): quadratic over a run. So a commit writes one small
record, ``.collector/commit-<seq>.json`` (temp, fsync, rename: a record is either whole or
absent), naming the shards it adds and those it removes (a forget). The committed state is
the base manifest with every record of a seq above its ``log_through`` applied in order
(`read_manifest` does it). Now and then the writer compacts: it writes the folded state as
the new base (``log_through`` = the last seq), then deletes the records it folded in; a
crash in between leaves records at or below ``log_through``, which every reader skips and
the next open deletes. Seqs are contiguous, so a reader that sees a gap (a compaction
between its read of the base and its listing of the records) reads again.

Run dirs written before this layout (``manifest.json`` at the top, shards under
``model=<m>/budget=<b>/``) are still read by every collector reader (`read_manifest`
falls back to `LEGACY_MANIFEST`); the store refuses to continue them.

Tests: tests/storage/test_commit_log.py, test_integrity.py, test_store.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from collector.errors import OutputError
from collector.record.episode import SCHEMA_VERSION
from collector.record.shards import EXTENSIONS

__all__ = [
    "CHECKSUM_ALGORITHM",
    "COMMIT_RECORD_PREFIX",
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
    "check_continuable",
    "commit_record_path",
    "commit_record_seqs",
    "committed_shard_paths",
    "entry_problem",
    "file_digest",
    "fold_records",
    "fsync_dir",
    "is_legacy",
    "new_manifest",
    "now_iso",
    "partition_dir",
    "pending_path",
    "read_manifest",
    "read_manifest_and_base",
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
#: The commit log's records: ``.collector/commit-<seq, 9 digits>.json``.
COMMIT_RECORD_PREFIX = f"{META_DIR}/commit-"
_RECORD_NAME = re.compile(r"commit-(\d{9,})\.json")
#: How often a reader reads the base and the log again when a compaction ran in between.
_FOLD_ATTEMPTS = 20
#: Where the manifest lived before the `.collector/` layout (manifest version 1).
LEGACY_MANIFEST = "manifest.json"
#: 2: the `.collector/` + flat `data/` layout; 3: plus the commit log (`log_through`).
MANIFEST_VERSION = 3
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
    """The committed state of `run_dir`: its manifest with the commit log applied (raises
    OutputError when missing or unreadable).

    ``shards`` lists every committed shard, ``log_through`` is the last commit record folded
    in. A legacy run dir's top-level manifest is read too: its entry paths are relative to
    the run dir like ours, so every reader works on both layouts unchanged. Missing (no such
    directory, or no manifest in it) is a `NotARunDirectory`.
    """
    return read_manifest_and_base(run_dir)[0]


def read_manifest_and_base(run_dir: Path) -> tuple[dict[str, Any], int]:
    """`read_manifest`, and the ``log_through`` of the base manifest: the records above it are
    the ones not yet compacted (the store's writer counts them, and deletes those below)."""
    if is_legacy(run_dir):
        return _read_base(run_dir / LEGACY_MANIFEST, run_dir)[0], 0
    path = run_dir / MANIFEST
    for _ in range(_FOLD_ATTEMPTS):
        base, identity = _read_base(path, run_dir)
        through = base.get("log_through", 0)
        if not isinstance(through, int) or isinstance(through, bool) or through < 0:
            raise OutputError(f'{path}: invalid "log_through": {through!r}')
        seqs = [seq for seq in commit_record_seqs(run_dir) if seq > through]
        if _identity(path) != identity:
            continue  # compacted between the two reads: the records we need are in the newer base
        if seqs != list(range(through + 1, through + 1 + len(seqs))):
            continue  # (cannot happen once the base is unchanged, but for a deleted record)
        try:
            records = [_read_record(run_dir, seq) for seq in seqs]
        except FileNotFoundError:
            continue  # the same race, one record later
        return fold_records(base, records), through
    raise OutputError(
        f"{run_dir / META_DIR}: the commit log has a gap after record {through} "
        f"(records {seqs[:3]}...): a commit record was deleted; the manifest cannot be trusted"
    )


def commit_record_path(run_dir: Path, seq: int) -> Path:
    """Where the commit record `seq` lives (1 is the first commit of a run dir)."""
    return run_dir / f"{COMMIT_RECORD_PREFIX}{seq:09d}.json"


def commit_record_seqs(run_dir: Path) -> list[int]:
    """The seqs of the commit records present, ascending (temp files are not records)."""
    try:
        names = os.listdir(run_dir / META_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for name in names if (m := _RECORD_NAME.fullmatch(name)))


def _read_json(path: Path) -> tuple[Any, tuple[int, int, int, int]]:
    """The JSON in `path` and the identity of the file read (FileNotFoundError passes)."""
    try:
        with open(path, "rb") as f:
            identity = _identity_of(os.fstat(f.fileno()))
            return json.loads(f.read()), identity
    except (FileNotFoundError, NotADirectoryError):
        raise
    except (OSError, ValueError) as e:
        raise OutputError(f"{path} is unreadable: {e}") from e


def _identity_of(st: os.stat_result) -> tuple[int, int, int, int]:
    # A compaction replaces the base by rename: a new inode, usually a new size and mtime too
    # (all four, since a freed inode number can be reused at once).
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        return _identity_of(os.stat(path))
    except OSError:
        return None


def _read_base(path: Path, run_dir: Path) -> tuple[dict[str, Any], tuple[int, int, int, int]]:
    try:
        manifest, identity = _read_json(path)
    except (FileNotFoundError, NotADirectoryError):
        raise NotARunDirectory(f"{run_dir} is not a run directory (no {MANIFEST})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise OutputError(f"{path} is not a collector manifest")
    _check_entries(path, manifest["shards"])
    return manifest, identity


def _check_entries(path: Path, entries: list[Any]) -> None:
    for i, entry in enumerate(entries):
        problem = entry_problem(entry)
        if problem is not None:
            shown = json.dumps(entry, default=str)
            shown = shown if len(shown) <= 160 else shown[:157] + "..."
            raise OutputError(f"{path}: shard entry {i} {problem}: {shown}")


def _read_record(run_dir: Path, seq: int) -> dict[str, Any]:
    """One commit record, checked like the base manifest's entries (FileNotFoundError passes)."""
    path = commit_record_path(run_dir, seq)
    record, _ = _read_json(path)
    if (not isinstance(record, dict) or record.get("seq") != seq or not isinstance(record.get("add"), list)
            or not isinstance(record.get("remove"), list)
            or not all(isinstance(rel, str) for rel in record["remove"])
            or not isinstance(record.get("next_part"), int)):
        raise OutputError(f"{path} is not a collector commit record")
    _check_entries(path, record["add"])
    return record


def fold_records(base: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """The base manifest with `records` applied in order: removals, then additions."""
    folded = dict(base)
    shards = list(base["shards"])
    for record in records:
        if record["remove"]:
            gone = set(record["remove"])
            shards = [entry for entry in shards if entry["path"] not in gone]
        shards.extend(record["add"])
        folded["next_part"] = max(int(folded.get("next_part", 0)), record["next_part"])
        folded["updated"] = record.get("at", folded.get("updated"))
        folded["log_through"] = record["seq"]
    folded["shards"] = shards
    return folded


def entry_problem(entry: Any) -> str | None:
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


def new_manifest(fingerprint: str, fmt: str) -> dict[str, Any]:
    """The base manifest of a new run (either store's): no shards, an empty commit log."""
    return {
        "manifest_version": MANIFEST_VERSION,
        "schema_version": SCHEMA_VERSION,
        "fingerprint": fingerprint,
        "format": fmt,
        # Which store this is, whatever its path (the episodes' run_id comes from the config,
        # so two runs of one config share it): a follower's cursor carries it, so that a
        # cursor of another run (or of a run deleted and made again there) is refused.
        "store_id": uuid.uuid4().hex,
        "created": now_iso(),
        "updated": now_iso(),
        "next_part": 0,
        "log_through": 0,
        "shards": [],
    }


def check_continuable(manifest: dict[str, Any], where: str, fingerprint: str, fmt: str) -> None:
    """Refuse (OutputError, one line naming `where`) to continue a run written by another
    config, of another schema version or in another shard format."""
    if manifest.get("fingerprint") != fingerprint:
        old = str(manifest.get("fingerprint"))[:12]
        raise OutputError(
            f"{where} was written by a different config (fingerprint {old}, this config "
            f"{fingerprint[:12]}); choose another output.path or delete the run"
        )
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise OutputError(
            f"{where} holds shards of schema version {manifest.get('schema_version')}; "
            f"this collector writes version {SCHEMA_VERSION}: choose another output.path"
        )
    if manifest.get("format") != fmt:
        raise OutputError(
            f"{where} holds {manifest.get('format')} shards; set output.format = "
            f"\"{manifest.get('format')}\" to continue it, or choose another output.path"
        )
