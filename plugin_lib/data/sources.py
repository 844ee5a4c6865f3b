"""Where each local data file comes from: its official download, the exact copy it was checked
against, and how to get the files that cannot be downloaded without an account (Adidas).

Every path is relative to the data folder (``data/`` in the repository, or ``PLUGIN_DATA_DIR``),
in the layout the loaders read. ``plugin-repro data fetch`` downloads from here; the
known SHA-256 of each file is in ``checksums.txt`` next to this module. Where a file has two
sources, the first is the publisher's and the second a byte-identical copy at a pinned commit
(``shared/data/PROVENANCE.md``), tried when the first cannot be reached or gives other bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

# The names ``--only`` accepts: the four datasets and NLTK's data (stopwords, punkt_tab).
GROUPS = ("e2e", "webnlg", "commongen", "adidas", "nltk")

E2E_COMMIT = "164acdf986146d76f18893b3de9488725deda4c2"
E2E_BASE = f"https://raw.githubusercontent.com/tuetschek/e2e-cleaning/{E2E_COMMIT}/cleaned-data/"
WEBNLG_BASE = "https://gitlab.com/shimorina/webnlg-dataset/-/raw/master/"
# A byte-identical copy of the official repository (its first commit; PROVENANCE.md section 3).
WEBNLG_COPY_BASE = ("https://raw.githubusercontent.com/OHonSam/webnlg-dataset/"
                    "f99e81e36972f94c791a0b9968750717568afc67/")
COMMONGEN_ZIP = "https://storage.googleapis.com/huggingface-nlp/datasets/common_gen/commongen_data.zip"
COMMONGEN_DEV_COPY = ("https://raw.githubusercontent.com/qkaren/COLD_decoding/"
                      "0cda54b366b4fd3c74550436a869c50593f40ee2/data/commongen/commongen.dev.jsonl")
COMMONGEN_V10_BASE = ("https://raw.githubusercontent.com/INK-USC/CommonGen/"
                      "f5a4d0140876cf862cb41ffc9aefa834d0d6d0f7/dataset/final_data/commongen/")
NLTK_STOPWORDS = ("https://raw.githubusercontent.com/nltk/nltk_data/"
                  "5db857e6f7df11eabb5e5665836db9ec8df07e28/packages/corpora/stopwords.zip")
NLTK_PUNKT_TAB = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/tokenizers/punkt_tab.zip"

KAGGLE_DATASET = "thedevastator/adidas-fashion-retail-products-dataset-9300-prod"
KAGGLE_PAGE = f"https://www.kaggle.com/datasets/{KAGGLE_DATASET}"
ADIDAS_HOWTO = (
    f"adidas_usa.csv comes from the Kaggle dataset 'Adidas Fashion Retail Products Dataset' "
    f"({KAGGLE_PAGE}), which needs a Kaggle account: download it on that page (Download button) "
    f"or with the Kaggle CLI (pip install kaggle; an API token in ~/.kaggle/kaggle.json): "
    f"`kaggle datasets download {KAGGLE_DATASET} --unzip -p <data folder>/adidas`, and keep "
    f"<data folder>/adidas/adidas_usa.csv"
)


@dataclass(frozen=True)
class Source:
    """One way to get a file: ``url``, or the member ``member`` of the zip archive at ``url``."""

    url: str
    member: str | None = None


@dataclass(frozen=True)
class Download:
    """A file of the data folder, the group it belongs to and where to get it.

    ``optional``: not in the reference data the committed results were made on; fetched only
    with ``--optional``. ``unpack``: a zip archive that is also extracted into ``unpack``
    (a folder relative to the data folder), as NLTK's own downloader does.
    """

    relpath: str
    group: str
    sources: tuple[Source, ...]
    optional: bool = False
    unpack: str | None = None
    note: str = ""


def _webnlg(relpath: str) -> Download:
    inner = relpath.removeprefix("webnlg/")
    return Download(relpath, "webnlg", (Source(WEBNLG_BASE + inner), Source(WEBNLG_COPY_BASE + inner)))


def downloads(webnlg_files: list[str]) -> list[Download]:
    """Every file the fetch command knows, in order; ``webnlg_files``: the WebNLG files (the
    ones listed in checksums.txt)."""
    return [
        Download("e2e_cleaned/devel-fixed.no-ol.csv", "e2e", (Source(E2E_BASE + "devel-fixed.no-ol.csv"),)),
        Download("e2e_cleaned/test-fixed.csv", "e2e", (Source(E2E_BASE + "test-fixed.csv"),)),
        Download("e2e_cleaned/train-fixed.no-ol.csv", "e2e", (Source(E2E_BASE + "train-fixed.no-ol.csv"),),
                 optional=True, note="about 12 MB; the paper uses the E2E train split only for ablations"),
        *[_webnlg(f) for f in webnlg_files],
        Download("commongen/hf_format/commongen.dev.jsonl", "commongen",
                 (Source(COMMONGEN_ZIP, "commongen.dev.jsonl"), Source(COMMONGEN_DEV_COPY))),
        Download("commongen/v1.0_initial_release/commongen.train.cs_str.txt", "commongen",
                 (Source(COMMONGEN_V10_BASE + "commongen.train.cs_str.txt"),)),
        Download("commongen/v1.0_initial_release/commongen.train.tgt.txt", "commongen",
                 (Source(COMMONGEN_V10_BASE + "commongen.train.tgt.txt"),)),
        Download("commongen/hf_format/commongen.train.jsonl", "commongen",
                 (Source(COMMONGEN_ZIP, "commongen.train.jsonl"),), optional=True,
                 note="the paper's v1.1 training set; with it the CommonGen train split (ablations) "
                      "is v1.1 instead of the v1.0 release the committed results used"),
        Download("adidas/adidas_usa.csv", "adidas", (), note=ADIDAS_HOWTO),
        Download("nltk_data/corpora/stopwords.zip", "nltk", (Source(NLTK_STOPWORDS),),
                 unpack="nltk_data/corpora"),
        Download("nltk_data/tokenizers/punkt_tab.zip", "nltk", (Source(NLTK_PUNKT_TAB),),
                 unpack="nltk_data/tokenizers"),
    ]


def group_of(relpath: str) -> str:
    """The ``--only`` name a data file belongs to."""
    first = relpath.split("/", 1)[0]
    return {"e2e_cleaned": "e2e", "nltk_data": "nltk"}.get(first, first)


def how_to_get(relpath: str, root=None) -> str:
    """One sentence: the command (or, for Adidas, the Kaggle steps) that gets ``relpath`` into
    the data folder ``root`` (named in the Kaggle steps when given)."""
    group = group_of(relpath)
    if group == "adidas":
        return ADIDAS_HOWTO.replace("<data folder>", str(root) if root is not None else "<data folder>") + "."
    optional = relpath in ("e2e_cleaned/train-fixed.no-ol.csv", "commongen/hf_format/commongen.train.jsonl")
    flag = " --optional" if optional else ""
    return (f"Download it with `plugin-repro data fetch --only {group}{flag}` "
            "(data/README.md lists every source).")
