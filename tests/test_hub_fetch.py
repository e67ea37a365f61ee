"""``hf:ORG/NAME``: the config fetched from the Hub (``config.json`` and nothing else) through
``huggingface_hub``, against a local stand-in for the Hub (``HF_ENDPOINT``): its cache, the
user's token for a gated model, and each failure as one line naming the fix."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

from click.testing import CliRunner  # noqa: E402
from huggingface_hub import constants  # noqa: E402

from ckptplan.cli.main import cli  # noqa: E402
from ckptplan.errors import CkptplanError  # noqa: E402
from ckptplan.hub import HubModel  # noqa: E402
from ckptplan.values.plan import Plan  # noqa: E402
from tests.test_cli import assert_one_line_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_test_token"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LLAMA = transformers.LlamaConfig(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=256,
    architectures=["LlamaForCausalLM"],
).to_json_string()
REPOS = {"org/tiny-llama": (LLAMA, False), "org/gated-llama": (LLAMA, True)}
"""Repository -> (its config.json, whether it is gated: read with ``TOKEN`` alone)."""
Request = tuple[str, str, str | None]
"""A request the stand-in Hub was sent: method, path, Authorization header."""


class FakeHub(BaseHTTPRequestHandler):
    """The Hub's ``resolve`` endpoint for ``REPOS``, as ``hf_hub_download`` calls it (a HEAD
    for the metadata, a GET for the file); every request is recorded."""

    requests: list[Request]

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        self.requests.append((self.command, self.path, self.headers.get("Authorization")))
        repo, _, rest = self.path.partition("/resolve/")
        found = REPOS.get(repo.lstrip("/"))
        if found is None:
            return self._refuse(404, "RepoNotFound")
        text, gated = found
        if gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._refuse(401, "GatedRepo")
        if rest != "main/config.json":
            return self._refuse(404, "EntryNotFound")
        data = text.encode()
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _refuse(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:  # no access log on stderr
        pass


def model_requests(requests: list[Request]) -> list[Request]:
    """The requests for a model's files or metadata: all but ``huggingface_hub``'s own daily
    fetch of its registry of coding agents (``/api/agent-harnesses``, for its user agent)."""
    return [r for r in requests if r[1] != "/api/agent-harnesses"]


@pytest.fixture
def hub(monkeypatch, tmp_path) -> Iterator[tuple[str, list[Request]]]:
    """A running stand-in for the Hub: its endpoint and the requests it has been sent. This
    process's ``huggingface_hub`` is pointed at it, with its cache under ``tmp_path`` and no
    token: what ``HF_ENDPOINT``, ``HF_HOME`` and ``HF_HUB_OFFLINE`` set when it is imported."""
    requests: list[Request] = []
    handler = type("Handler", (FakeHub,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    registry = str(tmp_path / "hf" / "agent_harnesses.json")  # where it has one
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", registry, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    yield endpoint, requests
    server.shutdown()
    server.server_close()


def test_solve_fetches_config_json_alone_with_the_users_token(hub, tmp_path) -> None:
    """The command a user runs, in a fresh process that takes the Hub, its cache and the
    token from the environment: the gated model solves, and only its config.json is asked
    for; then the cache answers with the Hub offline."""
    endpoint, requests = hub
    plan_path = tmp_path / "plan.json"
    env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_TOKEN": TOKEN,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    command = [sys.executable, "-m", "ckptplan", "solve", "hf:org/gated-llama", "--budget", "90%"]
    command += ["--seq-len", "32", "--batch-size", "2", "-o", str(plan_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert Plan.load(plan_path).regions, "the Llama layers are found and planned"
    asked = model_requests(requests)
    assert {path for _, path, _ in asked} == {"/org/gated-llama/resolve/main/config.json"}
    assert {auth for _, _, auth in asked} == {f"Bearer {TOKEN}"}
    assert "GET" in {method for method, _, _ in asked}, "the file itself was fetched"
    constants.HF_HUB_OFFLINE = True  # the fixture restores it
    config = HubModel("org/gated-llama").config
    assert (config.model_type, config.num_hidden_layers) == ("llama", 2)
    assert model_requests(requests) == asked, "the cached config.json was read, the Hub not asked"


def test_a_gated_model_without_a_token_is_one_line(hub) -> None:
    result = CliRunner().invoke(cli, ["solve", "hf:org/gated-llama", "--budget", "60%"])
    assert_one_line_error(result, "org/gated-llama is gated", "HF_TOKEN", "hf auth login")


def test_a_model_the_hub_does_not_have_is_one_line(hub) -> None:
    result = CliRunner().invoke(cli, ["solve", "hf:org/no-such-model", "--budget", "60%"])
    assert_one_line_error(result, "has no model org/no-such-model", "check the name")
    asked = model_requests(hub[1])
    assert asked and all(path.endswith("/config.json") for _, path, _ in asked)


def test_offline_and_not_cached_is_one_line(hub, monkeypatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    result = CliRunner().invoke(cli, ["solve", "hf:org/tiny-llama", "--budget", "60%"])
    assert_one_line_error(result, "HF_HUB_OFFLINE is set", "not in the Hugging Face cache")
    _, requests = hub
    assert model_requests(requests) == [], "offline: the Hub is not asked"


def test_an_unreachable_hub_is_one_line(hub, monkeypatch) -> None:
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens there
    monkeypatch.setattr(constants, "ENDPOINT", closed)
    template = closed + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    with pytest.raises(CkptplanError, match="cannot be reached") as raised:
        _ = HubModel("org/tiny-llama").config
    assert "pass a folder" in str(raised.value) and "\n" not in str(raised.value)


def test_a_name_that_is_neither_a_folder_nor_a_hub_name_is_one_line(hub, tmp_path) -> None:
    missing = tmp_path / "no-such-folder"
    result = CliRunner().invoke(cli, ["solve", f"hf:{missing}", "--budget", "60%"])
    assert_one_line_error(result, f"no folder {missing}", "pass a folder holding config.json")
    assert model_requests(hub[1]) == []
