"""``plugin-repro data fetch [--dest DIR] [--only NAME] [--optional] [--mirror URL]`` (or
``python -m plugin_lib.data.fetch``): download the datasets into the layout the loaders read,
verify them, say what is still missing.

Each file comes from its source in ``data.sources`` (the publisher's first, then a pinned
byte-identical copy) and is kept only if it passes the same checks the loaders run
(``data.integrity``: SHA-256, columns, rows). It is downloaded to a temporary file beside its
final name and moved into place only when verified, so an interrupted or failed download never
leaves a partial file under the real name, and a good file already there is kept, not
downloaded again. ``--mirror URL`` takes every file from a copy laid out like the data folder
(``<URL>/<path>``, e.g. ``file:///.../shared/data``) instead: for a local mirror, and for the
tests, which never touch the network. Adidas needs a Kaggle account: the command says how to get
it (data/README.md too).

Exit status: 0 when every required file of the chosen groups is there and verified, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..utils.io import current_umask
from . import integrity, sources
from .files import data_dir, describe_data_dir

MIRROR_ENV = "PLUGIN_DATA_MIRROR"
TIMEOUT_S = 60
USER_AGENT = "plugin-repro-data-fetch"


@dataclass
class Outcome:
    relpath: str
    group: str
    status: str  # "present", "downloaded", "missing", "failed"
    detail: str = ""
    optional: bool = False
    offline: bool = False  # failed only because no host could be reached


def mirror_url(mirror: str) -> str:
    """A mirror given as a URL or a local path, as a base URL ending in '/'."""
    if "://" not in mirror:
        mirror = Path(mirror).expanduser().resolve().as_uri()
    return mirror.rstrip("/") + "/"


def plan(groups: Iterable[str] | None = None, optional: bool = False) -> list[sources.Download]:
    """The files to fetch for ``groups`` (default: all), optional ones only when asked."""
    chosen = list(groups or sources.GROUPS)
    unknown = [g for g in chosen if g not in sources.GROUPS]
    if unknown:
        raise ValueError(f"Unknown name(s) {unknown} for --only; choose from {', '.join(sources.GROUPS)}.")
    return [d for d in sources.downloads(integrity.webnlg_files())
            if d.group in chosen and (optional or not d.optional)]


def _urlopen(url: str):
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310 (URLs from sources.py or --mirror)


def _normal_mode(fd: int) -> None:
    """The user's normal file permissions (0666 less the umask), not mkstemp's 0600."""
    if hasattr(os, "fchmod"):
        os.fchmod(fd, 0o666 & ~current_umask())


class _Counted:
    """A file whose writes are counted (the download's progress bar)."""

    def __init__(self, file, count: Callable[[int], object]):
        self.file, self.count = file, count

    def write(self, data: bytes) -> int:
        self.count(len(data))
        return self.file.write(data)


def download_to(url: str, folder: Path, name: str) -> Path:
    """``url`` into a new temporary file in ``folder`` (removed again on any failure), with a
    progress bar in bytes."""
    from tqdm.auto import tqdm  # here, not at the top: --help draws no progress bar

    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".download")
    try:
        _normal_mode(fd)
        with os.fdopen(fd, "wb") as out, _urlopen(url) as response:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=name, leave=False) as bar:
                shutil.copyfileobj(response, _Counted(out, bar.update), 1 << 20)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


class _Archives:
    """Zip archives downloaded once per run (CommonGen's dev and train files share one), and
    the hosts that could not be reached (not tried again in this run: without a network the
    command ends in seconds, not after a time-out per file)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.paths: dict[str, Path] = {}
        self.unreachable: dict[str, str] = {}

    def member(self, url: str, member: str, target_folder: Path, name: str) -> Path:
        if url not in self.paths:
            self.paths[url] = download_to(url, self.folder, "archive")
        fd, tmp = tempfile.mkstemp(dir=target_folder, prefix=f".{name}.", suffix=".download")
        try:
            _normal_mode(fd)
            with os.fdopen(fd, "wb") as out, zipfile.ZipFile(self.paths[url]) as archive:
                names = [n for n in archive.namelist() if n == member or n.endswith("/" + member)]
                if not names:
                    raise KeyError(f"{member} is not in the archive")
                with archive.open(names[0]) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return Path(tmp)


def unpack(zip_path: Path, folder: Path) -> None:
    """Extract a zip (NLTK's layout: one top folder) into ``folder``, replacing that top folder
    only once the whole archive is extracted."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=".unpack-"))
    try:
        with zipfile.ZipFile(zip_path) as archive:
            for name in archive.namelist():
                parts = Path(name).parts
                if Path(name).is_absolute() or ".." in parts:
                    raise ValueError(f"unsafe path {name!r} in {zip_path.name}")
            archive.extractall(staging)
        for top in staging.iterdir():
            target = folder / top.name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            os.replace(top, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _verified(path: Path, relpath: str) -> str | None:
    """None when ``path`` passes the checks for ``relpath``, else the reason."""
    try:
        integrity.verify_file(None, relpath, path)
    except (integrity.DataError, integrity.MissingDataError) as err:
        return str(err).replace(sources.how_to_get(relpath, None), "").strip()
    if relpath.endswith(".zip") and not zipfile.is_zipfile(path):
        return "not a zip archive"
    return None


def _unpacked(dest: Path, item: sources.Download) -> bool:
    """Whether the archive's folder (``stopwords.zip`` -> ``stopwords/``) is there."""
    return (dest / item.unpack / Path(item.relpath).stem).is_dir()


def fetch_one(item: sources.Download, dest: Path, mirror: str | None, archives: _Archives,
              say: Callable[[str], None] = print) -> Outcome:
    """Get one file into ``dest`` unless a verified copy is there already."""
    target = dest / item.relpath
    outcome = Outcome(item.relpath, item.group, "missing", optional=item.optional)
    if target.exists() and _verified(target, item.relpath) is None:
        if item.unpack and not _unpacked(dest, item):
            unpack(target, dest / item.unpack)
        outcome.status = "present"
        return outcome
    if target.exists():
        say(f"[fetch] {item.relpath}: the file there does not check out; downloading it again")
    options = ((sources.Source(mirror + item.relpath),) if mirror else item.sources)
    if not options:
        outcome.detail = sources.how_to_get(item.relpath, dest)
        return outcome
    reasons = []
    for source in options:
        where = source.url + (f" ({source.member})" if source.member else "")
        host = urllib.parse.urlsplit(source.url).netloc
        if host in archives.unreachable:
            reasons.append(f"{where}: not tried, {host} was unreachable ({archives.unreachable[host]})")
            continue
        tmp = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.member:
                tmp = archives.member(source.url, source.member, target.parent, target.name)
            else:
                tmp = download_to(source.url, target.parent, target.name)
            reason = _verified(tmp, item.relpath)
            if reason is not None:
                reasons.append(f"{where}: {reason}")
                continue
            os.replace(tmp, target)
            tmp = None
            if item.unpack:
                unpack(target, dest / item.unpack)
            outcome.status, outcome.detail = "downloaded", where
            return outcome
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:  # URLError is an OSError
            reasons.append(f"{where}: {err}")
            if host and isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
                archives.unreachable[host] = str(err.reason)
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
    outcome.status, outcome.detail = "failed", "; ".join(reasons)
    outcome.offline = all(urllib.parse.urlsplit(s.url).netloc in archives.unreachable for s in options)
    return outcome


def fetch(dest: Path, groups: Sequence[str] | None = None, *, optional: bool = False,
          mirror: str | None = None, say: Callable[[str], None] = print) -> list[Outcome]:
    """Fetch the files of ``groups`` into ``dest``; one :class:`Outcome` per file."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    base = mirror_url(mirror) if mirror else None
    work = Path(tempfile.mkdtemp(dir=dest, prefix=".fetch-"))
    try:
        archives = _Archives(work)
        return [fetch_one(item, dest, base, archives, say) for item in plan(groups, optional)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(outcomes: list[Outcome], say: Callable[[str], None] = print) -> int:
    """Print a summary per group and what is still missing; the exit status."""
    for group in dict.fromkeys(o.group for o in outcomes):
        mine = [o for o in outcomes if o.group == group]
        ok = [o for o in mine if o.status in ("present", "downloaded")]
        fresh = [o for o in mine if o.status == "downloaded"]
        origin = ""
        if fresh:
            hosts = sorted({urllib.parse.urlsplit(o.detail).netloc or "the mirror" for o in fresh})
            origin = f" from {', '.join(hosts)}"
        say(f"[fetch] {group}: {len(ok)}/{len(mine)} files there and verified ({len(fresh)} downloaded now{origin})")
    missing = [o for o in outcomes if o.status in ("missing", "failed")]
    if not missing:
        say("[fetch] everything asked for is there and verified.")
        return 0
    offline = [o for o in missing if o.status == "failed" and o.offline]
    if offline and len(offline) == sum(o.status == "failed" for o in missing):
        say(f"[fetch] no network: no source of {len(offline)} file(s) could be reached. On a machine without "
            "internet, copy a data folder here (data/README.md lists every file) or fetch from a copy: "
            f"--mirror URL_OR_FOLDER (or {MIRROR_ENV}).")
    say("[fetch] still missing:")
    for group in dict.fromkeys(o.group for o in missing):
        mine = [o for o in missing if o.group == group]
        for o in mine[:3]:
            tag = " (optional)" if o.optional else ""
            say(f"  - {o.relpath}{tag}: " + (o.detail if o.status == "missing" else f"download failed: {o.detail}"))
        if len(mine) > 3:
            say(f"  - and {len(mine) - 3} more {group} files")
    return 1 if any(not o.optional for o in missing) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plugin-repro data fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", help="data folder to fill (default: PLUGIN_DATA_DIR, else the repository's data/)")
    parser.add_argument("--only", action="append", choices=sources.GROUPS, metavar="NAME",
                        help=f"only this group ({', '.join(sources.GROUPS)}); repeatable")
    parser.add_argument("--optional", action="store_true",
                        help="also the files outside the reference data (E2E train, CommonGen v1.1 train)")
    parser.add_argument("--mirror", default=os.environ.get(MIRROR_ENV),
                        help=f"base URL or folder of a copy laid out like data/ (env {MIRROR_ENV})")
    args = parser.parse_args(argv)
    if args.dest:
        dest = Path(args.dest).expanduser()
    else:
        try:
            dest = data_dir()
        except FileNotFoundError as err:
            print(f"[fetch] {err}", file=sys.stderr)
            return 2
        if dest is None:
            print("[fetch] PLUGIN_DATA_DIR=hub reads the Hugging Face Hub; pass --dest DIR (or unset "
                  "PLUGIN_DATA_DIR) to download the files.", file=sys.stderr)
            return 2
    print(f"[fetch] into {dest}" + ("" if args.dest else f" ({describe_data_dir()})")
          + (f", from the mirror {args.mirror}" if args.mirror else ""))
    return report(fetch(dest, args.only, optional=args.optional, mirror=args.mirror))


if __name__ == "__main__":
    sys.exit(main())
