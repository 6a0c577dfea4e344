"""The ``lego-proxy`` console script, run as a real subprocess the way operators run it.

``serve`` on the embedded default (tiny model, SQLite file and the local engine as a child
process, all under a temporary data directory), ``db upgrade`` on SQLite and Postgres,
``demo``, and the refusal to start in production without an admin key.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy.engine import make_url

from cli.main import build_parser
from kernel.threaded import free_port
from proxy.settings import DEV_ADMIN_KEY, Settings
from recorder.records import TurnRecord, TurnStatus
from recorder.scratch_postgres import PostgresServer
from recorder.store import Store
from tests.cli.conftest import children_of, clean_env, is_running
from tests.support.real_models import BY_NAME


@pytest.fixture
def served(lego_proxy: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    env = clean_env(LEGO_DATA_DIR=str(tmp_path / "data"), LEGO_PORT=str(port))
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [lego_proxy, "serve", "--log-level", "info"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "lego-proxy serve did not become healthy"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.2)
        yield process, url
    finally:
        if process.poll() is None:
            # The test failed before its own SIGTERM: take down the whole process group.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def recorded_turns(database: Path, session_id: str) -> list[TurnRecord]:
    async def read() -> list[TurnRecord]:
        store = await Store.open(f"sqlite+aiosqlite:///{database}")
        try:
            return await store.list_turns(session_id)
        finally:
            await store.close()

    return asyncio.run(read())


def test_serve_on_the_embedded_default(
    served: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    process, url = served
    engines = children_of(process.pid)
    assert len(engines) == 1, "the embedded engine runs as one child process"
    admin = httpx.Client(
        base_url=f"{url}/api/v1", headers={"authorization": f"Bearer {DEV_ADMIN_KEY}"}
    )
    with admin:
        run = admin.post("/runs", json={"name": "cli"}).raise_for_status().json()
        session = (
            admin.post(f"/runs/{run['id']}/sessions", json={"task_id": "t", "group_id": "g"})
            .raise_for_status()
            .json()
        )
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8, seed=7
    )
    # The untrained tiny model samples noise, so only the budget can end the answer.
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 8

    process.send_signal(signal.SIGTERM)
    returncode = process.wait(timeout=30)
    log = (tmp_path / "serve.log").read_text()
    # uvicorn shuts down gracefully, then re-raises the signal so supervisors see the cause.
    assert returncode in (0, -signal.SIGTERM), log
    assert "Application shutdown complete" in log, log
    assert "Traceback" not in log
    deadline = time.monotonic() + 5
    while any(is_running(pid) for pid in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(is_running(pid) for pid in engines), "the engine outlived the proxy"

    database = tmp_path / "data" / "lego.sqlite3"
    assert database.is_file()
    (turn,) = recorded_turns(database, session["id"])
    assert turn.status is TurnStatus.COMPLETED
    assert len(turn.output_ids) == 8
    assert len(turn.prompt_ids) == reply.usage.prompt_tokens


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_db_upgrade_is_idempotent(
    lego_proxy: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: PostgresServer | None = None
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'fresh' / 'lego.sqlite3'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = await server.create_database()
        parsed = make_url(url)
        if parsed.password is None:
            # Trust auth ignores it; it is here to prove the command never prints it.
            url = parsed.set(password="never-print-me").render_as_string(hide_password=False)
    password = make_url(url).password
    try:
        for _ in range(2):
            upgrade = await asyncio.create_subprocess_exec(
                lego_proxy,
                "db",
                "upgrade",
                env=clean_env(LEGO_DATABASE_URL=url),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            raw_out, raw_err = await asyncio.wait_for(upgrade.communicate(), 60)
            out, err = raw_out.decode(), raw_err.decode()
            assert upgrade.returncode == 0, err
            assert "current schema" in out
            if password:
                assert password not in out + err
        store = await Store.open(url)
        try:
            run = await store.create_run("after-upgrade")
            assert (await store.get_run(run.id)).name == "after-upgrade"
        finally:
            await store.close()
    finally:
        if server is not None:
            await server.drop_database(url)


def test_demo_records_a_graded_two_turn_session(lego_proxy: str, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # The demo runs on the embedded default whatever the environment points at.
    env = clean_env(
        LEGO_BACKEND_URL="http://127.0.0.1:9",
        LEGO_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'not-the-demo.sqlite3'}",
        TMPDIR=str(scratch),
    )
    done = subprocess.run(
        [lego_proxy, "demo"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "(termination=completed reward=1.0 turns=2)" in out
    turns = re.findall(r"turn \d+: completed .* sampled=\s*(\d+) ", out)
    assert len(turns) == 2
    segments = re.findall(r"segment \d+: (\d+) tokens, (\d+) sampled \(loss mask\)", out)
    # The tool loop continues the first turn token-faithfully: one training sequence.
    assert len(segments) == 1
    # Every sampled token of every turn is in exactly one segment's loss mask.
    assert sum(int(sampled) for _, sampled in segments) == sum(int(n) for n in turns)
    assert all(int(tokens) > int(sampled) > 0 for tokens, sampled in segments)
    assert not (tmp_path / "not-the-demo.sqlite3").exists()
    assert list(scratch.glob("lego-demo-*")) == []  # the demo cleans up after itself


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"LEGO_ENV": "production"}, "LEGO_ADMIN_KEY"),
        ({"LEGO_ENV": "production", "LEGO_ADMIN_KEY": DEV_ADMIN_KEY}, "LEGO_ADMIN_KEY"),
        ({"LEGO_PORT": "eighty"}, "LEGO_PORT"),
        (
            {"LEGO_ENV": "production", "LEGO_ADMIN_KEY": "s" * 32, "LEGO_HOST": "0.0.0.0"},
            "LEGO_PUBLIC_URL",
        ),
    ],
)
def test_serve_refuses_bad_settings_in_one_line(
    lego_proxy: str, tmp_path: Path, env: dict[str, str], names: str
) -> None:
    done = subprocess.run(
        [lego_proxy, "serve"],
        env=clean_env(LEGO_DATA_DIR=str(tmp_path), **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("lego-proxy: invalid settings:")
    assert names in line
    assert not (tmp_path / "lego.sqlite3").exists()  # refused before touching anything


def test_train_hands_its_arguments_to_the_trainer() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "cli.main", "train", "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "--model-path" in shown.stdout
    assert "--max-staleness" in shown.stdout


@pytest.mark.parametrize("name", ["qwen2.5", "qwen3", "qwen3-coder", "qwen3.5"])
def test_serve_starts_on_each_real_template(
    lego_proxy: str, tmp_path: Path, real_tokenizer_dirs: dict[str, Path], name: str
) -> None:
    """Issue 14: Qwen3 and Qwen3.5 were refused at start-up by the self-check."""
    port = free_port()
    env = clean_env(
        LEGO_DATA_DIR=str(tmp_path),
        LEGO_PORT=str(port),
        LEGO_TOKENIZER_PATH=str(real_tokenizer_dirs[name]),
        LEGO_BACKEND_URL=f"http://127.0.0.1:{free_port()}",  # nothing there: not needed
    )
    process = subprocess.Popen(
        [lego_proxy, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                output = process.stdout.read().decode() if process.stdout else ""
                pytest.fail(f"lego-proxy serve exited {process.returncode}: {output}")
            assert time.monotonic() < deadline, "lego-proxy serve did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)  # not listening yet
    finally:
        process.terminate()
        process.wait(30)
    output = process.stdout.read().decode() if process.stdout else ""
    expected = BY_NAME[name].tool_parser
    assert f"lego-proxy: tool calls parsed as {expected} (the chat template)" in output


@pytest.mark.parametrize(
    ("template", "says"),
    [
        (
            "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}"
            "{% if m.role != 'assistant' %}<|im_end|>{% endif %}\n{%- endfor -%}"
            "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}",
            "does not end an assistant message with the eos token",
        ),
        (
            "{%- for m in messages -%}<|im_start|>{{ m.role }} {{ loop.index0 }}\n"
            "{{ m.content }}<|im_end|>\n{%- endfor -%}"
            "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}",
            "depends on the earlier ones",
        ),
        (None, "is not a directory"),
    ],
)
def test_serve_refuses_a_template_it_cannot_serve_in_one_line(
    lego_proxy: str, tmp_path: Path, template: str | None, says: str
) -> None:
    from transformers import AutoTokenizer

    from engine.tiny import build_tokenizer

    path = tmp_path / "tokenizer"
    if template is not None:
        build_tokenizer(path)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        tokenizer.chat_template = template
        tokenizer.save_pretrained(str(path))
    done = subprocess.run(
        [lego_proxy, "serve"],
        env=clean_env(LEGO_DATA_DIR=str(tmp_path), LEGO_TOKENIZER_PATH=str(path)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("lego-proxy: ")
    assert says in line


def test_serve_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for name in Settings.model_fields:
        assert f"LEGO_{name.upper()}" in text


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["--help"], ["serve", "--help"], ["engine", "--help"], ["demo", "--help"]]
)
def test_help_reads_as_plain_text_and_every_option_says_what_it_does(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(argv, capsys)
    assert "``" not in text  # no docstring markup
    lines = text.split("options:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    entries: list[list[str]] = []
    for line in lines:
        if re.match(r"^  -", line):
            entries.append([line])
        elif entries:
            entries[-1].append(line)
    assert entries
    for entry in entries:
        flag, _, same_line = entry[0].strip().partition("  ")
        assert same_line.strip() or len(entry) > 1, f"{flag} has no help"


def test_train_help_names_the_command_it_is_run_as() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "cli", "train", "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: lego-proxy train")
    assert "(default: 1e-06)" in shown.stdout  # --lr, LEGO-RL's Table 10
