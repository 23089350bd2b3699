"""gpt-oss's o200k vocabulary offline: where it is, for a `vllm serve` of gpt-oss on an offline node.

Only vLLM's OpenAI-compatible server loads it: `vllm/entrypoints/openai/parser/harmony_utils.py` `get_encoding`
(`openai_harmony.load_harmony_encoding(HARMONY_GPT_OSS)`) is called by `vllm/parser/harmony.py` HarmonyParser, which
`vllm/parser/parser_manager.py` `_compose_parser(is_harmony=True)` builds for the server's chat and responses
handlers and `vllm/renderers/online_renderer.py`, at the first request. vLLM's offline `LLM`, which our local
engines use, never does: it renders through `vllm/renderers/registry.py` `renderer_from_config` (HfRenderer, the
model's own chat template and tokenizer), and gpt-oss's reasoning parser (`vllm/reasoning/gptoss_reasoning_parser.py`)
loads no encoding (vLLM 0.32). So a run is never refused for it; `pack` copies it where a run serves gpt-oss, so
that the node's own `vllm serve` of that model finds it too (`run --pack` points TIKTOKEN_ENCODINGS_BASE there).

Where the server's harmony finds the encoding's `o200k_base.tiktoken`:
- where `TIKTOKEN_ENCODINGS_BASE` is set, in `$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` and nothing else: a
  folder without the file fails at that first request ("invalid tiktoken vocab file");
- else `oss-harmony` (vLLM 0.31 and later depend on it; 0.0.11 measured here) carries the vocabulary compiled into
  its library: it loads with no file and no network (traced: no file opened, no connection), and decoding its
  199,998 ranks writes the published file byte for byte (SHA-256 below);
- else `openai-harmony` (older vLLM) downloads the file at that first request: on an offline node it fails there.

`vocabulary()` says which holds here, or raises one line naming the variable and the file (`doctor` notes it);
`vocabulary_file()` gives a verified copy of the file on disk (what `pack` copies: the variable's file, or the
package's vocabulary written out once into the cache).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import atomic
from diagsafe_local.core.cache import cache_dir
from diagsafe_local.core.errors import DiagsafeError

if TYPE_CHECKING:
    from diagsafe_local.judging.config import JudgeConfig

ENV = "TIKTOKEN_ENCODINGS_BASE"
FILE = "o200k_base.tiktoken"
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken_ext/openai_public.py o200k_base
RANKS = 199_998  # o200k_base's mergeable ranks (199,999 is <|endoftext|>)
HARMONY_JUDGES = frozenset({"gpt-oss-safeguard"})  # judges whose prompt is in the harmony format
PROVIDE = (
    f"set {ENV} to a folder holding {FILE} (SHA-256 {SHA256}; where oss-harmony is installed, `python -c "
    "'from diagsafe_local.judging.harmony_vocab import vocabulary_file; print(vocabulary_file())'` writes it), or "
    "install oss-harmony (vLLM 0.31 and later depend on it), which carries it"
)


class VocabularyMissing(DiagsafeError):
    """A `vllm serve` of gpt-oss could not start its first request offline: what is missing and how to provide it."""


class Vocabulary(BaseModel):
    """Where the o200k vocabulary comes from on this machine."""

    model_config = ConfigDict(frozen=True)

    source: Literal["variable", "package"]
    path: Path | None  # the file on disk, where it is one (the variable's)
    detail: str


def vocabulary() -> Vocabulary:
    """The vocabulary a `vllm serve` of gpt-oss (its HarmonyParser) will load here without a network, or
    VocabularyMissing (one line)."""
    base = os.environ.get(ENV)
    if base is not None:
        path = Path(base) / FILE
        if not path.is_file():
            raise VocabularyMissing(
                f"{ENV}={base} has no {FILE}: gpt-oss's harmony format fails without it ({PROVIDE})"
            )
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != SHA256:
            raise VocabularyMissing(f"{path} is not o200k_base: SHA-256 {digest}, expected {SHA256}")
        return Vocabulary(source="variable", path=path, detail=f"{path} ({ENV}), SHA-256 verified")
    version = _version("oss-harmony")
    if version is not None:
        return Vocabulary(source="package", path=None, detail=f"carried by oss-harmony {version} (needs no file)")
    other = _version("openai-harmony")
    why = f"openai-harmony {other} downloads {FILE} at the first request" if other else "no harmony package installed"
    raise VocabularyMissing(f"gpt-oss's harmony format needs {FILE} offline and {why}: {PROVIDE}")


def vocabulary_file() -> Path:
    """A verified o200k_base.tiktoken on disk: the variable's, else the package's written out once into the cache."""
    found = vocabulary()
    if found.path is not None:
        return found.path
    path = cache_dir() / "harmony" / FILE
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == SHA256:
        return path
    data = package_vocabulary()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_with(path, lambda tmp: tmp.write_bytes(data))
    return path


def package_vocabulary() -> bytes:
    """The vocabulary the installed harmony package carries, in tiktoken's file format (each rank's bytes in
    base64, a space, the rank), checked against the published SHA-256."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)._inner  # decode_bytes lives there
    data = tiktoken_file(bytes(encoding.decode_bytes([rank])) for rank in range(RANKS))
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise VocabularyMissing(f"the installed harmony package's vocabulary is not o200k_base (SHA-256 {digest})")
    return data


def tiktoken_file(tokens: Iterable[bytes]) -> bytes:
    """Tokens in rank order as a .tiktoken file."""
    return b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in enumerate(tokens))


def serves_harmony(judge: JudgeConfig, local_models: Iterable[str] = ()) -> bool:
    """Whether a run serves the harmony format here, so `pack` packs the vocabulary for a `vllm serve` of the same
    model on the node: its judge (or a juror) is named in HARMONY_JUDGES on a local engine, or a model it loads here
    (`local_models`, as configured) has a config.json that says gpt-oss."""
    from diagsafe_local.engines.kinds import capabilities
    from diagsafe_local.judging.config import judge_name

    names = {
        name
        for one in [judge, *(judge.jury.members if judge.jury else [])]
        if one.model is not None and capabilities(one.kind).local
        for name in (one.rubric_name, judge_name(one.benign_rubric), *(one.panel.names() if one.panel else []))
    }
    return bool(HARMONY_JUDGES & names) or any(_gpt_oss(Path(m)) for m in local_models)


def _gpt_oss(model: Path) -> bool:
    config = model / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "gpt_oss"
    except (OSError, ValueError, AttributeError):
        return False


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
