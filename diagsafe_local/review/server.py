"""The local page behind `view` and `label`: a small HTTP server on 127.0.0.1 (the standard library's threading
server), its JSON endpoints and the page's three static files.

Safe with hostile text: answers and prompts go to the page as JSON and are shown with `textContent`, never as
HTML; the page loads nothing from elsewhere and a Content-Security-Policy says so (no inline script, no other
origin); every request must carry the session's random token (the `token` query parameter or the `X-Token`
header; others get 403); the server listens on loopback only and writes nothing but the annotator's label file.

Endpoints: `GET /` (the page), `GET /static/{app.js,app.css}`, `GET /api/meta`, `GET /api/rows?filters`,
`GET /api/row/N`; in labelling mode `GET /api/sample`, `GET /api/sample/K` (the answer, its verdict only once
this annotator labelled it: no anchoring) and `POST /api/label {"index": K, "label": WORD}` (under `label
--next`, the state and each label's reply say where the decision stands: `standing`).
"""

from __future__ import annotations

import hmac
import html
import json
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.review.index import RunIndex
from diagsafe_local.review.labels import LabelSample, LabelStore, SampleEntry, answer_sha256
from diagsafe_local.runs.records import AnswerKey, ResultRecord

if TYPE_CHECKING:
    from diagsafe_local.review.next_label import Standing

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
MAX_BODY = 4096
STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


class LabelSession:
    """Labelling mode: one annotator, the run's sample, the label file written at every label. Under `label
    --next`, `standing` says where the decision stands after this annotator's labels (`review.next_label`): the
    state and every label's reply carry its line, and `announce` prints it at each label."""

    def __init__(
        self,
        index: RunIndex,
        sample: LabelSample,
        store: LabelStore,
        standing: Callable[[dict[AnswerKey, str]], Standing] | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.index = index
        self.sample = sample
        self.store = store
        self.standing, self.announce = standing, announce
        missing = [e for e in sample.entries if index.find(e.key) is None]
        if missing:
            raise DiagsafeError(f"labels/sample.json names answers this run does not have (e.g. {missing[0].key})")

    def state(self) -> dict[str, Any]:
        self.store.refresh()  # another server of this annotator may have labelled since
        entries = []
        for k, e in enumerate(self.sample.entries):
            labelled = self.store.current(e)
            entries.append({"index": k, "labelled": labelled.label if labelled else None})
        first_open = next((e["index"] for e in entries if e["labelled"] is None), len(entries))
        return {"annotator": self.store.annotator, "entries": entries, "next": first_open, "standing": self.line()}

    def line(self) -> str | None:
        """Where the decision stands on this annotator's current labels (None: not `label --next`)."""
        if self.standing is None:
            return None
        current = ((e.key, self.store.current(e)) for e in self.sample.entries)
        return self.standing({key: label.label for key, label in current if label is not None}).line()

    def _entry(self, k: int) -> SampleEntry:
        if not 0 <= k < len(self.sample.entries):
            raise ValueError(f"index must be 0 to {len(self.sample.entries) - 1}, got {k}")
        return self.sample.entries[k]

    def entry(self, k: int) -> dict[str, Any]:
        entry = self._entry(k)
        row = self.index.find(entry.key)
        assert row is not None
        record = self.index.record(row.index)["record"]
        if answer_sha256(ResultRecord.model_validate(record)) != entry.answer_sha256:
            raise DiagsafeError("the run changed since this sample was drawn (an answer differs): restart `label`")
        labelled = self.store.current(entry)
        shown = {
            key: record[key] for key in ("target", "item_id", "sample", "turn", "category", "conversation", "answer")
        }
        if labelled is not None:  # the verdict only after the annotator decided: no anchoring
            shown |= {key: record.get(key) for key in ("verdict", "score", "judge_rubric", "reasoning", "panel")}
            shown["decided"] = self.index.decided(row)  # a cascade's full judge's, where it decides
        return {"index": k, "of": len(self.sample.entries), "label": labelled.label if labelled else None, **shown}

    def give(self, k: int, label: str) -> dict[str, Any]:
        self.entry(k)  # the answer shown is still the one sampled
        self.store.give(self._entry(k), label)
        line = self.line()
        if line is not None and self.announce is not None:
            self.announce(line)
        return {**self.entry(k), "standing": line}


class LabelPost(BaseModel):
    """The body of `POST /api/label`: which answer of the sample, and the label."""

    model_config = ConfigDict(extra="forbid", strict=True)

    index: int = Field(ge=0)
    label: str


class Review:
    """What the server serves: the index of the runs, and a labelling session in labelling mode."""

    def __init__(self, index: RunIndex, session: LabelSession | None = None) -> None:
        self.index = index
        self.session = session
        self.token = secrets.token_urlsafe(24)

    def meta(self) -> dict[str, Any]:
        return {
            "mode": "label" if self.session else "view",
            "runs": [
                {"dir": str(d), "run_id": m.run_id, "targets": list(m.targets)}
                for d, m in zip(self.index.run_dirs, self.index.manifests)
            ],
            "facets": self.index.facets(),
            "total": len(self.index.rows),
            "notes": self.index.notes,
        }


def _handler(review: Review) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "diagsafe-local"
        sys_version = ""

        def log_message(self, *args: Any) -> None:  # the terminal shows the URL, not every request
            pass

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value, ensure_ascii=False).encode(), "application/json; charset=utf-8")

        def _authorised(self, query: dict[str, str]) -> bool:
            given = query.get("token") or self.headers.get("X-Token") or ""
            return hmac.compare_digest(given.encode(), review.token.encode())

        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            query = dict(parse_qsl(url.query))
            if not self._authorised(query):
                self._json(403, {"error": "this page needs the token printed when it started"})
                return
            try:
                self._serve(method, url.path, query)
            except (ValueError, IndexError, KeyError, DiagsafeError) as exc:  # a pydantic error is a ValueError
                self._json(400, {"error": " ".join(str(exc).split())[:500]})
            except Exception as exc:  # every request gets a reply, whatever went wrong
                self._json(500, {"error": f"{type(exc).__name__}: {exc}"[:500]})

        def _serve(self, method: str, path: str, query: dict[str, str]) -> None:
            if method == "GET" and path == "/":
                self._send(200, _page(review), "text/html; charset=utf-8")
            elif method == "GET" and path.startswith("/static/") and path.removeprefix("/static/") in STATIC:
                name = path.removeprefix("/static/")
                self._send(200, _asset(name), STATIC[name])
            elif method == "GET" and path == "/api/meta":
                self._json(200, review.meta())
            elif review.session is None and method == "GET" and path == "/api/rows":  # labelling shows no verdicts
                self._json(200, review.index.query(query))
            elif review.session is None and method == "GET" and path.startswith("/api/row/"):
                self._json(200, review.index.record(int(path.removeprefix("/api/row/"))))
            elif review.session is not None and method == "GET" and path == "/api/sample":
                self._json(200, review.session.state())
            elif review.session is not None and method == "GET" and path.startswith("/api/sample/"):
                self._json(200, review.session.entry(int(path.removeprefix("/api/sample/"))))
            elif review.session is not None and method == "POST" and path == "/api/label":
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise ValueError("request too large")
                post = LabelPost.model_validate_json(self.rfile.read(length) or b"{}")
                self._json(200, review.session.give(post.index, post.label))
            else:
                self._json(404, {"error": "no such page"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


def _asset(name: str) -> bytes:
    return resources.files("diagsafe_local.review").joinpath("static", name).read_bytes()


def _page(review: Review) -> bytes:
    """index.html with the token in the asset links (the page's script reads it from its own URL)."""
    token = html.escape(review.token, quote=True)
    text = _asset("index.html").decode().replace("{{token}}", token)
    return text.encode()


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the standard library's 5 refuses a page that asks for many rows at once


class ReviewServer:
    """The page's server on 127.0.0.1 (a free port unless given), in a thread of its own."""

    def __init__(self, review: Review, port: int = 0) -> None:
        self.review = review
        try:
            self.httpd = _Server(("127.0.0.1", port), _handler(review))
        except OSError as exc:
            raise DiagsafeError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); try another --port") from None
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/?token={review.token}"
        self._thread: threading.Thread | None = None
        self._launcher: Path | None = None

    def start(self) -> ReviewServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def launcher(self) -> Path:
        """A page only this user can read that sends the browser on to the URL: opening it keeps the token off
        the browser's command line, where any user of a shared node reads it with `ps` (Jupyter does the same)."""
        folder = Path(tempfile.mkdtemp(prefix="diagsafe-local-"))  # 0700
        page = folder / "open.html"
        fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        address = html.escape(self.url, quote=True)
        with os.fdopen(fd, "w") as handle:
            handle.write(
                f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={address}">'
                f'<p><a href="{address}">open the page</a></p>\n'
            )
        self._launcher = folder
        return page

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._launcher is not None:
            shutil.rmtree(self._launcher, ignore_errors=True)
