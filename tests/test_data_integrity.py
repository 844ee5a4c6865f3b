"""Data checked at the door (``data.integrity``, ``python -m plugin_lib.data.check``) and the
fetch command (``python -m plugin_lib.data.fetch``), against copies of the real data in temporary
folders and ``file://`` mirrors; no test touches the network."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from plugin_lib.data import check as check_cli
from plugin_lib.data import DataError, MissingDataError, files
from plugin_lib.data import datasets as data
from plugin_lib.data import fetch, integrity, sources

import real_data

REPO = Path(__file__).resolve().parents[1]
E2E_TEST = "e2e_cleaned/test-fixed.csv"
E2E_VAL = "e2e_cleaned/devel-fixed.no-ol.csv"
ADIDAS = "adidas/adidas_usa.csv"


@pytest.fixture
def shared() -> Path:
    """The real data folder, whose files these tests copy and damage."""
    return real_data.require()


def copy(shared: Path, folder: Path, *relpaths: str) -> Path:
    for relpath in relpaths:
        (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared / relpath, folder / relpath)
    return folder


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if p.is_file()]


# --- what is shipped --------------------------------------------------------------------------

def test_checksums_cover_every_file_the_loaders_read(shared):
    known = integrity.known_checksums()
    assert len(integrity.webnlg_files()) == 107
    for relpath in (E2E_VAL, E2E_TEST, ADIDAS, "commongen/hf_format/commongen.dev.jsonl",
                    *integrity.COMMONGEN_V10_TRAIN, "nltk_data/corpora/stopwords/english"):
        assert relpath in known
    # The lines are SHA256SUMS.txt's own: `sha256sum -c` in the shared folder accepts them.
    shared_sums = dict(line.split()[::-1] for line in (shared / "SHA256SUMS.txt").read_text().splitlines())
    assert all(shared_sums[relpath] == digest for relpath, digest in known.items())
    # The Adidas columns the check requires are the ones the loader reads.
    assert integrity.ADIDAS_COLUMNS == (*data.ADIDAS_FIELDS, "description")


def test_every_file_has_a_source_or_says_how_to_get_it():
    items = sources.downloads(integrity.webnlg_files())
    covered = {d.relpath for d in items}
    assert set(integrity.known_checksums()) - covered == {"nltk_data/corpora/stopwords/english"}  # unzipped
    for item in items:
        assert item.sources or item.group == "adidas"
        assert all(s.url.startswith("https://") for s in item.sources)
    howto = sources.how_to_get(ADIDAS, Path("/x/data"))
    assert "kaggle datasets download" in howto and "/x/data/adidas" in howto and "account" in howto
    assert "plugin-repro data fetch --only webnlg" in sources.how_to_get("webnlg/webnlg_challenge_2017/x.xml")


# --- damaged files are refused by the loaders ---------------------------------------------------

def test_truncated_csv_is_refused_with_a_clear_message(shared, tmp_path, monkeypatch):
    copy(shared, tmp_path, E2E_VAL, E2E_TEST)
    whole = (tmp_path / E2E_TEST).read_bytes()
    cut = whole[: len(whole) // 2]
    cut = cut[: cut.rindex(b",") + 5]  # mid-row, inside a reference
    (tmp_path / E2E_TEST).write_bytes(cut)
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    assert len(data.load_dataset("e2e", "validation")) == 1_484  # the intact file loads
    with pytest.raises(DataError) as err:
        data.load_dataset("e2e", "test")
    message = str(err.value)
    assert str(tmp_path / E2E_TEST) in message and "truncated or modified" in message
    assert "where 4,693 are expected" in message and "plugin-repro data fetch --only e2e" in message
    assert err.value.relpath == E2E_TEST


def test_wrong_csv_header_names_the_missing_column(shared, tmp_path, monkeypatch):
    copy(shared, tmp_path, E2E_TEST)
    text = (tmp_path / E2E_TEST).read_text(encoding="utf-8")
    (tmp_path / E2E_TEST).write_text(text.replace("mr,ref,", "meaning,ref,", 1), encoding="utf-8")
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match=r"has no column 'mr'.*meaning,ref,fixed,orig_mr"):
        data.load_dataset("e2e", "test")


def test_adidas_without_a_column_names_it(shared, tmp_path, monkeypatch):
    copy(shared, tmp_path, ADIDAS)
    text = (tmp_path / ADIDAS).read_text(encoding="utf-8")
    (tmp_path / ADIDAS).write_text(text.replace(",color,", ",colour,", 1), encoding="utf-8")
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match=rf"{tmp_path / ADIDAS} has no column 'color'"):
        data.load_dataset("adidas", "test")
    # The same check guards the CSV named by PLUGIN_ADIDAS_CSV on the Hub path.
    monkeypatch.setenv("PLUGIN_DATA_DIR", "hub")
    monkeypatch.setenv("PLUGIN_ADIDAS_CSV", str(tmp_path / ADIDAS))
    with pytest.raises(DataError, match="no column 'color'"):
        data.load_dataset("adidas", "test")


def test_a_copy_with_other_line_endings_but_the_same_rows_is_accepted(shared, tmp_path, monkeypatch):
    copy(shared, tmp_path, ADIDAS)
    raw = (tmp_path / ADIDAS).read_bytes()
    (tmp_path / ADIDAS).write_bytes(raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))  # CRLF throughout
    assert integrity.sha256_file(tmp_path / ADIDAS) != integrity.known_checksums()[ADIDAS]
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(shared))
    reference = data.load_dataset("adidas", "test")
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    assert data.load_dataset("adidas", "test") == reference
    # A changed description (same row count) is refused.
    text = (tmp_path / ADIDAS).read_text(encoding="utf-8")
    (tmp_path / ADIDAS).write_text(text.replace(" the ", " teh ", 1), encoding="utf-8")
    with pytest.raises(DataError, match="expected 845 rows, but other content"):
        data.load_dataset("adidas", "test")


def test_files_without_a_known_checksum_need_their_row_count(tmp_path, monkeypatch):
    train = tmp_path / "e2e_cleaned/train-fixed.no-ol.csv"
    train.parent.mkdir(parents=True)
    train.write_text('mr,ref\n"name[A]","A is good."\n"name[B]","B is', encoding="utf-8")
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match="incomplete: it has 2 rows where 33,525 are expected"):
        data.load_dataset("e2e", "train")
    train.write_text('mr,ref\n"name[A]","A is good."\n"name[B]"\n', encoding="utf-8")
    with pytest.raises(DataError, match="row 3 has 1 fields where the header has 2"):
        data.load_dataset("e2e", "train")


def test_an_unknown_xml_file_in_a_webnlg_folder_is_refused(shared, tmp_path, monkeypatch):
    shutil.copytree(shared / "webnlg/webnlg_challenge_2017", tmp_path / "webnlg/webnlg_challenge_2017")
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    assert len(data.load_dataset("webnlg", "train")) > 0
    extra = tmp_path / "webnlg/webnlg_challenge_2017/train/1triples/copy.xml"
    shutil.copyfile(next(extra.parent.glob("*.xml")), extra)
    with pytest.raises(DataError, match=r"Unexpected file .*copy.xml.*Move it out"):
        data.load_dataset("webnlg", "train")
    extra.unlink()
    (tmp_path / integrity.webnlg_files()[-1]).unlink()
    with pytest.raises(MissingDataError, match="7triples_University_train_challenge.xml"):
        data.load_dataset("webnlg", "train")


def test_each_file_is_hashed_once_per_process(shared, tmp_path, monkeypatch):
    copy(shared, tmp_path, E2E_TEST)
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    hashed = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: hashed.append(path) or real(path))
    data.load_dataset("e2e", "test")
    data.load_dataset("e2e", "test", rows=10)
    assert len(hashed) == 1
    (tmp_path / E2E_TEST).write_bytes((tmp_path / E2E_TEST).read_bytes()[:-10])  # changed: checked again
    with pytest.raises(DataError):
        data.load_dataset("e2e", "test")


def test_a_split_is_built_once_while_its_files_stay_the_same(shared, tmp_path, monkeypatch):
    copy(shared, tmp_path, ADIDAS)
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path))
    built = []
    build = data.LOADERS["adidas"]
    monkeypatch.setitem(data.LOADERS, "adidas", lambda split: built.append(split) or build(split))
    first = data.load_dataset("adidas", "test")
    data.load_dataset("adidas", "test").clear()  # each caller's list is its own
    assert data.load_dataset("adidas", "test") == first != [] and built == ["test"]
    # The same bytes with another modification time: other files as far as anyone can tell, built again.
    path, stat = tmp_path / ADIDAS, (tmp_path / ADIDAS).stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert data.load_dataset("adidas", "test") == first and built == ["test", "test"]
    # Another data folder is another key, even with the same files.
    copy(shared, tmp_path / "other", ADIDAS)
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(tmp_path / "other"))
    assert data.load_dataset("adidas", "test") == first and built == ["test"] * 3


# --- no data: seconds, one clear message --------------------------------------------------------

def test_default_data_folder_without_data_says_what_to_fetch(tmp_path, monkeypatch):
    monkeypatch.delenv("PLUGIN_DATA_DIR", raising=False)
    monkeypatch.setattr(files, "REPO_DATA_DIR", tmp_path)
    assert files.data_dir() == tmp_path
    with pytest.raises(MissingDataError) as err:
        data.load_dataset("e2e", "test")
    message = str(err.value)
    assert str(tmp_path / E2E_TEST) in message and "the default data folder" in message
    assert "plugin-repro data fetch --only e2e" in message and "PLUGIN_DATA_DIR=hub" in message


def test_no_data_fails_in_seconds(tmp_path):
    env = {**os.environ, "PLUGIN_DATA_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "plugin_lib.data.check", "--profile", "local"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    seconds = time.perf_counter() - started
    assert out.returncode == 2, out.stdout + out.stderr
    assert seconds < 20, seconds
    assert "e2e_cleaned/test-fixed.csv" in out.stderr and "plugin-repro data fetch" in out.stderr
    assert "Missing 107 of the 107 WebNLG files" in out.stderr and "kaggle datasets download" in out.stderr
    loader = subprocess.run([sys.executable, "-c", "from plugin_lib.data import load_dataset; load_dataset('e2e', 'test')"],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert loader.returncode == 1 and "MissingDataError: Missing data file" in loader.stderr


def test_nltk_data_elsewhere_on_nltks_path_is_accepted(shared, tmp_path, monkeypatch):
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setattr(check_cli.Path, "home", lambda: tmp_path)
    problems, _ = check_cli.run_check(empty, ["nltk"])
    assert [p.relpath for p in problems] == ["nltk_data/corpora/stopwords/english", integrity.PUNKT_TAB]
    monkeypatch.setenv("NLTK_DATA", str(shared / "nltk_data"))
    problems, notes = check_cli.run_check(empty, ["nltk"])
    assert problems == [] and str(shared / "nltk_data") in notes[0]


def test_check_passes_on_the_real_data_and_names_each_problem(shared, tmp_path, capsys):
    assert check_cli.main(["--profile", "local", "--data-dir", str(shared)]) == 0
    assert "ok: every file is there and complete" in capsys.readouterr().out
    copy(shared, tmp_path, E2E_VAL, E2E_TEST, ADIDAS)
    (tmp_path / E2E_TEST).write_bytes((tmp_path / E2E_TEST).read_bytes()[:5000])
    code = check_cli.main(["--only", "e2e", "--only", "adidas", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "1 problem with the data" in err and "test-fixed.csv is truncated or modified" in err


# --- fetch, from file:// mirrors ----------------------------------------------------------------

def test_fetch_from_a_mirror_verifies_and_keeps_good_files(shared, tmp_path):
    mirror = copy(shared, tmp_path / "mirror", E2E_VAL, E2E_TEST)
    dest = tmp_path / "data"
    lines: list[str] = []
    outcomes = fetch.fetch(dest, ["e2e"], mirror=mirror.as_uri(), say=lines.append)
    assert [o.status for o in outcomes] == ["downloaded", "downloaded"]
    for relpath in (E2E_VAL, E2E_TEST):
        assert (dest / relpath).read_bytes() == (shared / relpath).read_bytes()
        assert (dest / relpath).stat().st_mode & 0o777 == 0o666 & ~fetch.current_umask()
    assert fetch.report(outcomes, say=lines.append) == 0
    assert not temporaries(dest)
    # Again: nothing is downloaded; a damaged copy is replaced by a verified one.
    assert [o.status for o in fetch.fetch(dest, ["e2e"], mirror=str(mirror), say=lines.append)] == ["present"] * 2
    (dest / E2E_TEST).write_bytes(b"mr,ref\n")
    assert [o.status for o in fetch.fetch(dest, ["e2e"], mirror=str(mirror), say=lines.append)] == ["present", "downloaded"]
    assert (dest / E2E_TEST).read_bytes() == (shared / E2E_TEST).read_bytes()


def test_fetch_never_keeps_a_bad_or_partial_download(shared, tmp_path, monkeypatch):
    mirror = copy(shared, tmp_path / "mirror", E2E_VAL, E2E_TEST)
    (mirror / E2E_TEST).write_bytes((mirror / E2E_TEST).read_bytes()[:1000])  # a truncated mirror copy
    dest = tmp_path / "data"
    lines: list[str] = []
    outcomes = fetch.fetch(dest, ["e2e"], mirror=mirror.as_uri(), say=lines.append)
    assert [o.status for o in outcomes] == ["downloaded", "failed"]
    assert "truncated or modified" in outcomes[1].detail
    assert not (dest / E2E_TEST).exists() and not temporaries(dest)
    assert fetch.report(outcomes, say=lines.append) == 1
    assert any("still missing" in line for line in lines) and any(E2E_TEST in line for line in lines)

    def interrupted(src, dst, length=0):
        dst.write(src.read(100))
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch.shutil, "copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch(tmp_path / "data2", ["e2e"], mirror=str(shared), say=lines.append)
    assert not [p for p in (tmp_path / "data2").rglob("*") if p.is_file()]  # no half file, no orphan


def test_fetch_unpacks_nltk_data_and_reports_adidas(shared, tmp_path):
    mirror = copy(shared, tmp_path / "mirror", "nltk_data/corpora/stopwords.zip",
                  "nltk_data/tokenizers/punkt_tab.zip")
    dest = tmp_path / "data"
    lines: list[str] = []
    outcomes = fetch.fetch(dest, ["nltk", "adidas"], mirror=mirror.as_uri(), say=lines.append)
    assert [o.status for o in outcomes] == ["failed", "downloaded", "downloaded"]  # adidas: not in this mirror
    english = dest / "nltk_data/corpora/stopwords/english"
    assert len(english.read_text().split()) == 179
    assert (dest / integrity.PUNKT_TAB).is_dir()
    assert check_cli.run_check(dest, ["nltk"]) == ([], [])
    # Without a mirror Adidas has no download: the report says how to get it from Kaggle.
    item = next(d for d in fetch.plan(["adidas"]))
    outcome = fetch.fetch_one(item, dest, None, fetch._Archives(tmp_path), say=lines.append)
    assert outcome.status == "missing" and "kaggle datasets download" in outcome.detail


def test_fetch_takes_zip_members_and_falls_back_to_the_pinned_copy(shared, tmp_path):
    relpath = "commongen/hf_format/commongen.dev.jsonl"
    zipped = tmp_path / "commongen_data.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.write(shared / relpath, "commongen.dev.jsonl")
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"concept_set": "a#b", "scene": ["x"]}\n')
    lines: list[str] = []
    for first in (fetch.sources.Source(zipped.as_uri(), "commongen.dev.jsonl"), fetch.sources.Source(wrong.as_uri())):
        item = sources.Download(relpath, "commongen", (first, sources.Source((shared / relpath).as_uri())))
        dest = tmp_path / f"data-{len(lines)}"
        archives = fetch._Archives(tmp_path)
        outcome = fetch.fetch_one(item, dest, None, archives, say=lines.append)
        assert outcome.status == "downloaded" and (dest / relpath).read_bytes() == (shared / relpath).read_bytes()
        lines.append(outcome.detail)
    assert lines[0].endswith("(commongen.dev.jsonl)")  # from the zip
    assert lines[1] == (shared / relpath).as_uri()  # the first source gave other bytes


def test_fetch_gives_up_on_an_unreachable_host_at_once(tmp_path):
    items = [sources.Download(f"e2e_cleaned/{name}", "e2e", (sources.Source(f"http://127.0.0.1:9/{name}"),))
             for name in ("devel-fixed.no-ol.csv", "test-fixed.csv")]
    archives = fetch._Archives(tmp_path)
    started = time.perf_counter()
    outcomes = [fetch.fetch_one(item, tmp_path, None, archives, say=print) for item in items]
    assert time.perf_counter() - started < 10
    assert [o.status for o in outcomes] == ["failed", "failed"]
    assert "not tried, 127.0.0.1:9 was unreachable" in outcomes[1].detail
    lines: list[str] = []
    assert all(o.offline for o in outcomes) and fetch.report(outcomes, say=lines.append) == 1
    assert any(line.startswith("[fetch] no network") and "--mirror" in line for line in lines)


def test_fetch_cli_rejects_unknown_names_and_hub(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        fetch.main(["--only", "imagenet", "--dest", str(tmp_path)])
    monkeypatch.setenv("PLUGIN_DATA_DIR", "hub")
    assert fetch.main([]) == 2
    assert "pass --dest" in capsys.readouterr().err


def test_run_reads_the_hub_switch_as_the_loaders_do(monkeypatch, capsys):
    """``PLUGIN_DATA_DIR= HUB`` is the Hub to the loaders (case and spaces aside): ``run`` stops on
    data the Hub path lacks (here the Adidas CSV) without trying to download into a folder."""
    from plugin_lib.commands.run import Orchestrator, Stop, parse
    from plugin_lib.harness.profile import load_profile

    monkeypatch.setenv("PLUGIN_DATA_DIR", " HUB ")
    monkeypatch.delenv("PLUGIN_ADIDAS_CSV", raising=False)
    assert files.reads_hub() and files.data_dir() is None
    with pytest.raises(Stop, match="are not ready"):
        Orchestrator(parse(["--profile", "local"]))._data(load_profile("local"))
    said = capsys.readouterr()
    assert "PLUGIN_ADIDAS_CSV is not set" in said.out + said.err and "[fetch]" not in said.out + said.err
