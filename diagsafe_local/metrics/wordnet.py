"""Find WordNet for METEOR: NLTK's own data where users are online, else Debian's `wordnet-base` offline.

NLTK's WordNet reader needs a `lexnames` file that Debian's package lacks; we regenerate it from the
table in the package's `lexnames(5WN)` man page and copy the database into our cache, owned by the
running user (NLTK refuses symlinks that leave its data root and skips foreign-owned data dirs).
METEOR never runs silently without synonyms: if no WordNet is found, the error says how to get one.
"""

from __future__ import annotations

import gzip
import re
import shutil
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from diagsafe_local.core import pack
from diagsafe_local.core.cache import cache_dir
from diagsafe_local.core.errors import DiagsafeError

DEBIAN_WORDNET = Path("/usr/share/wordnet")
DEBIAN_LEXNAMES_MAN = Path("/usr/share/man/man5/lexnames.5WN.gz")
_DB_FILES = re.compile(r"^(data|index)\.(noun|verb|adj|adv)$|^(noun|verb|adj|adv)\.exc$|^index\.sense$")
_SYNTACTIC = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


class WordNetMissingError(DiagsafeError):
    """No WordNet database could be found or prepared."""


def lexnames_from_man(man_page: Path = DEBIAN_LEXNAMES_MAN) -> str:
    """The `lexnames` file (number, name, syntactic category) rebuilt from the lexnames(5WN) man page."""
    rows = []
    for line in gzip.open(man_page, "rt", encoding="utf-8", errors="replace"):
        match = re.match(r"^(\d\d)\t\s*((noun|verb|adj|adv)\.\w+)", line)
        if match:
            rows.append(f"{match.group(1)}\t{match.group(2)}\t{_SYNTACTIC[match.group(3)]}\n")
    if len(rows) != 45:
        raise WordNetMissingError(f"{man_page}: expected 45 lexicographer files in the table, found {len(rows)}")
    return "".join(rows)


def prepare_debian_wordnet(target_root: Path, source: Path = DEBIAN_WORDNET) -> Path:
    """Copy Debian's WordNet 3.0 into `target_root/corpora/wordnet` with a lexnames file; idempotent."""
    target = target_root / "corpora" / "wordnet"
    if (target / "lexnames").is_file() and (target / "data.noun").is_file():
        return target_root
    if not (source / "data.noun").is_file():
        raise WordNetMissingError(
            "METEOR needs WordNet synonyms and none was found. Online: python -m nltk.downloader wordnet. "
            "Offline on Debian/Ubuntu: apt-get install wordnet-base wordnet-sense-index "
            "(scripts/setup.sh does this)."
        )
    staging = target.with_name("wordnet.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in source.iterdir():
        if _DB_FILES.match(path.name):
            shutil.copyfile(path, staging / path.name)
    (staging / "lexnames").write_text(lexnames_from_man())
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target_root


def wordnet_directory() -> Path:
    """Where METEOR's WordNet lies (ROOT/corpora/wordnet): the pack's under `run --pack` (`core.pack`), else
    NLTK's data (a folder, or NLTK's zip of it), else Debian's database prepared into the cache."""
    packed = pack.part("wordnet", "wordnet")
    if packed is not None:
        return packed
    import nltk
    from nltk.data import ZipFilePathPointer

    for resource in ("corpora/wordnet", "corpora/wordnet.zip"):
        try:
            found = nltk.data.find(resource)
        except LookupError:
            continue
        return Path(found.zipfile.filename if isinstance(found, ZipFilePathPointer) else str(found))
    return prepare_debian_wordnet(cache_dir() / "nltk_data") / "corpora" / "wordnet"


@lru_cache(maxsize=1)
def load_wordnet() -> Any:
    """A loaded NLTK WordNet reader over `wordnet_directory`."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader
    from nltk.data import ZipFilePathPointer

    where = wordnet_directory()
    data_root = str(where.parent.parent)  # NLTK reads a corpus only below a data root, as ROOT/corpora/wordnet
    if data_root not in nltk.data.path:
        nltk.data.path.insert(0, data_root)  # first: a pack's is the one read
    root = ZipFilePathPointer(str(where), "wordnet/") if where.suffix == ".zip" else str(where)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "multilingual functions are not available": we need English only
        reader = WordNetCorpusReader(root, None)
    reader.synsets("dog")  # fail here, not in the middle of a benchmark
    return reader
