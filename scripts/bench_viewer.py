"""How the viewer holds up at 100k answers: build a synthetic run of N judged answers (results.jsonl and
manifest.json in the published shape), index it as `view` does, and time the first page, a filtered page, a free
text search and opening one record, through the server's HTTP endpoints on 127.0.0.1. Prints JSON.

    .venv/bin/python scripts/bench_viewer.py [--n 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path


def synthetic_run(root: Path, n: int) -> Path:
    """A run directory of n judged answers (~1 KB each), without running any model."""
    from diagsafe_local.core.messages import Message
    from diagsafe_local.runs.records import EngineRef, ResultRecord, Usage

    ref = EngineRef(kind="vllm", model="m")
    categories = ["cyber", "bio", "chem", "fraud", "harassment"]
    with open(root / "results.jsonl", "w", encoding="utf-8") as out:
        for k in range(n):
            score = (k % 7) / 6
            record = ResultRecord(
                run_id="bench",
                target="t",
                item_id=f"i{k}",
                sample=0,
                turn=1,
                category=categories[k % 5],
                conversation=[Message(role="user", content=f"request number {k}: how would one do thing {k % 97}?")],
                answer=("Here is a long answer. " * 40) + f"token{k}",
                finish_reason="stop",
                target_usage=Usage(),
                target_engine=ref,
                judge_engine=ref,
                judge_rubric="harmjudge",
                judge_raw="{}",
                verdict={"label": "harmful" if score > 0.5 else "not_harmful", "rationale": "r"},
                score=score,
                parse_status="ok",
                attempts=1,
            )
            out.write(record.model_dump_json() + "\n")
    manifest = {
        "run_id": "bench",
        "status": "complete",
        "config": {},
        "dataset": {"path": "x", "spec": "x", "sha256": "0" * 64, "n_items": n},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def timed(url: str, token: str, path: str, repeats: int = 5) -> tuple[float, int]:
    """Median seconds of a GET, and the size of its reply."""
    times, size = [], 0
    for _ in range(repeats):
        request = urllib.request.Request(url + path, headers={"X-Token": token})
        start = time.perf_counter()
        with urllib.request.urlopen(request) as response:
            size = len(response.read())
        times.append(time.perf_counter() - start)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args()

    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.server import Review, ReviewServer

    with tempfile.TemporaryDirectory() as tmp:
        run = synthetic_run(Path(tmp), args.n)
        start = time.perf_counter()
        review = Review(RunIndex([run]))
        indexed = time.perf_counter() - start
        server = ReviewServer(review).start()
        base = f"http://127.0.0.1:{server.port}"
        try:
            figures = {"answers": args.n, "results_mb": round((run / "results.jsonl").stat().st_size / 1e6, 1)}
            figures["index_seconds"] = round(indexed, 2)
            for name, path in (
                ("first_page", "/api/rows?size=50"),
                ("filtered_sorted_page", "/api/rows?category=bio&min=0.5&sort=score&order=desc&size=50"),
                ("text_search", "/api/rows?q=token99999&size=50"),
                ("open_record", f"/api/row/{args.n // 2}"),
            ):
                seconds, size = timed(base, review.token, path)
                figures[f"{name}_seconds"] = round(seconds, 3)
                figures[f"{name}_bytes"] = size
        finally:
            server.stop()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
