"""The local page behind `view` and `label`: a small HTTP server on 127.0.0.1 (the standard library's threading
server), its JSON endpoints and the page's three static files.

Safe with hostile text: answers and prompts go to the page as JSON and are shown with `textContent`, never as
HTML; the page loads nothing from elsewhere and a Content-Security-Policy says so (no inline script, no other
origin); every request must carry the session's random token (the `token` query parameter or the `X-Token`
header; others get 403); the server listens on loopback only and writes nothing but the annotator's label file.

Endpoints: `GET /` (the page), `GET /static/{app.js,app.css}`, `GET /api/meta`, `GET /api/rows?filters`,
`GET /api/row/N`; in labelling mode `GET /api/sample`, `GET /api/sample/K` (the answer, its verdict only once
this annotator labelled it: no anchoring) and `POST /api/label {"index": K, "label": WORD}`.
"""

from __future__ import annotations

import hmac
import html
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.review.index import RunIndex
from diagsafe_local.review.labels import LabelSample, LabelStore

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
MAX_BODY = 4096
STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


class LabelSession:
    """Labelling mode: one annotator, the run's sample, the label file written at every label."""

    def __init__(self, index: RunIndex, sample: LabelSample, store: LabelStore) -> None:
        self.index = index
        self.sample = sample
        self.store = store
        missing = [e for e in sample.entries if index.find(e.key) is None]
        if missing:
            raise DiagsafeError(f"labels/sample.json names answers this run does not have (e.g. {missing[0].key})")

    def state(self) -> dict[str, Any]:
        labels = self.store.labels
        entries = [
            {"index": k, "labelled": labels[e.key].label if e.key in labels else None}
            for k, e in enumerate(self.sample.entries)
        ]
        first_open = next((e["index"] for e in entries if e["labelled"] is None), len(entries))
        return {"annotator": self.store.annotator, "entries": entries, "next": first_open}

    def entry(self, k: int) -> dict[str, Any]:
        entry = self.sample.entries[k]
        row = self.index.find(entry.key)
        assert row is not None
        record = self.index.record(row.index)["record"]
        labelled = self.store.labels.get(entry.key)
        shown = {
            key: record[key] for key in ("target", "item_id", "sample", "turn", "category", "conversation", "answer")
        }
        if labelled is not None:  # the verdict only after the annotator decided: no anchoring
            shown |= {key: record.get(key) for key in ("verdict", "score", "judge_rubric", "reasoning", "panel")}
        return {"index": k, "of": len(self.sample.entries), "label": labelled.label if labelled else None, **shown}

    def give(self, k: int, label: str) -> dict[str, Any]:
        self.store.give(self.sample.entries[k], label)
        return self.entry(k)


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
            except (ValueError, IndexError, KeyError) as exc:
                self._json(400, {"error": str(exc)})
            except DiagsafeError as exc:
                self._json(400, {"error": str(exc)})

        def _serve(self, method: str, path: str, query: dict[str, str]) -> None:
            if method == "GET" and path == "/":
                self._send(200, _page(review), "text/html; charset=utf-8")
            elif method == "GET" and path.startswith("/static/") and path.removeprefix("/static/") in STATIC:
                name = path.removeprefix("/static/")
                self._send(200, _asset(name), STATIC[name])
            elif method == "GET" and path == "/api/meta":
                self._json(200, review.meta())
            elif method == "GET" and path == "/api/rows":
                self._json(200, review.index.query(query))
            elif method == "GET" and path.startswith("/api/row/"):
                self._json(200, review.index.record(int(path.removeprefix("/api/row/"))))
            elif review.session is not None and method == "GET" and path == "/api/sample":
                self._json(200, review.session.state())
            elif review.session is not None and method == "GET" and path.startswith("/api/sample/"):
                self._json(200, review.session.entry(int(path.removeprefix("/api/sample/"))))
            elif review.session is not None and method == "POST" and path == "/api/label":
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise ValueError("request too large")
                body = json.loads(self.rfile.read(length) or b"{}")
                self._json(200, review.session.give(int(body["index"]), str(body["label"])))
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


class ReviewServer:
    """The page's server on 127.0.0.1 (a free port unless given), in a thread of its own."""

    def __init__(self, review: Review, port: int = 0) -> None:
        self.review = review
        try:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(review))
        except OSError as exc:
            raise DiagsafeError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); try another --port") from None
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/?token={review.token}"
        self._thread: threading.Thread | None = None

    def start(self) -> ReviewServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
