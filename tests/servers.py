"""Servers the API tests talk to: the real vLLM OpenAI server, and a scripted fake for faults it cannot produce."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1, serving `model` under its path as name."""

    def __init__(self, model: Path, port: int | None = None, dtype: str = "float32") -> None:
        self.model = str(model)
        self.dtype = dtype
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> VLLMServer:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                self.model,
                "--served-model-name",
                self.model,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--max-model-len",
                "2048",
                "--dtype",
                self.dtype,
                "--enforce-eager",
                "--seed",
                "0",
                "--structured-outputs-config",
                '{"backend":"xgrammar","disable_any_whitespace":true}',
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("vLLM server did not become healthy in time")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


VALID_VERDICT = {"unsafe": False, "relevant": True, "useful": False, "label": "not_harmful", "rationale": "fake"}
HARMFUL_VERDICT = {"unsafe": True, "relevant": True, "useful": True, "label": "harmful", "rationale": "fake"}


def judged_answer(body: dict) -> str:
    """The answer a judge's request asks about ("" in a request that is not a judge's)."""
    return body["messages"][-1]["content"].partition("<<<ANSWER TO JUDGE>>>")[2]


def _injected(body: dict) -> bool:
    return "under the policy above" in judged_answer(body).lower()


# Judges by served model name, on every fake server: one that holds its policy calls an answer that claims the
# policy allows it (the policy-injection canary's, plainly harmful) harmful; one whose fault is that it obeys
# injected policies calls it not harmful. Every other answer either judges as the script says.
POLICY_JUDGES: dict[str, Callable[[dict], tuple | None]] = {
    "holds-policy": lambda body: ("harmful",) if _injected(body) else None,
    "obeys-injected-policy": lambda body: ("ok",) if _injected(body) else None,
}


class FakeOpenAIServer:
    """A tiny OpenAI-compatible server on 127.0.0.1 that plays a script of faults, then answers properly.

    Steps: ("status", code[, retry_after]), ("malformed",), ("ignore_schema",), ("ok",),
    ("top_logprobs", {token: logprob}) (a one-token reply with those first-position alternatives),
    ("delay", seconds) (a proper answer, that late), ("harmful",) (a verdict that calls the answer harmful),
    ("cut_off",) (a verdict cut off at max_tokens); taken from `by_content` (keyed by the last message's text),
    else `by_model` (the served model's name picks a function of the request body that gives the step, or None),
    else `always`, else the script in order. Like a hosted API, it has no vLLM `/tokenize` (404).
    """

    def __init__(
        self,
        script: list[tuple] | None = None,
        always: tuple | None = None,
        by_content: dict[str, tuple] | None = None,
        by_model: dict[str, Callable[[dict], tuple | None]] | None = None,
    ) -> None:
        self.script = list(script or [])
        self.always = always
        self.by_content = by_content or {}
        self.by_model = {**POLICY_JUDGES, **(by_model or {})}
        self.requests: list[tuple[float, dict]] = []
        self.peers: set[int] = set()  # client ports: one per connection the client opened (HTTP/1.1 keeps them)
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/tokenize"):
                    server.respond(self, ("status", 404), body)
                    return
                with server.lock:
                    server.requests.append((time.monotonic(), body))
                    server.peers.add(self.client_address[1])
                    canary = "canary" in json.dumps(body.get("response_format", {}))
                    ignoring = server.always == ("ignore_schema",)  # a server without constraints ignores them all
                    step = (
                        (("ignore_schema",) if ignoring else ("ok",))
                        if canary
                        # the script plays on the run's own requests
                        else (
                            server.by_content.get(body["messages"][-1]["content"])
                            or server.by_model.get(body["model"], lambda _: None)(body)
                            or server.always
                            or (server.script.pop(0) if server.script else ("ok",))
                        )
                    )
                server.respond(self, step, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def respond(self, handler: BaseHTTPRequestHandler, step: tuple, body: dict) -> None:
        kind = step[0]
        if kind == "delay":
            time.sleep(step[1])
        if kind == "status":
            payload = json.dumps({"error": {"message": f"scripted {step[1]}", "type": "test"}}).encode()
            handler.send_response(step[1])
            if len(step) > 2:
                handler.send_header("Retry-After", str(step[2]))
        elif kind == "malformed":
            payload = b'{"id": "x", "choices": [ this is not json'
            handler.send_response(200)
        else:
            schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
            if "canary" in schema.get("properties", {}) and kind != "ignore_schema":
                content = json.dumps({"canary": schema["properties"]["canary"]["enum"][0], "digits": "042042"})
            elif kind == "harmful":
                content = json.dumps(HARMFUL_VERDICT)
            elif kind == "cut_off":
                content = json.dumps(HARMFUL_VERDICT)[:25]
            elif "response_format" in body and kind != "ignore_schema":
                content = json.dumps(VALID_VERDICT)
            elif kind == "ignore_schema":
                content = "Sure! Here is my verdict: it seems fine."
            else:
                content = "answer to: " + body["messages"][-1]["content"]
            choice: dict = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
            if kind == "cut_off":
                choice["finish_reason"] = "length"
            if kind == "top_logprobs":
                top = [{"token": t, "logprob": lp, "bytes": None} for t, lp in step[1].items()]
                choice.update(
                    finish_reason="length",
                    message={"role": "assistant", "content": top[0]["token"]},
                    logprobs={"content": [{**top[0], "top_logprobs": top}]},
                )
            payload = json.dumps(
                {
                    "id": "cmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [choice],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                }
            ).encode()
            handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
