"""A proxy that fails to start stops what it had started: no engine child is left behind.
One that starts takes what start-up built out of the cyclic collector's sight, and gives it
back when it stops."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import httpx
import pytest

from kernel.threaded import free_port, serve
from proxy.app import create_app
from proxy.settings import Settings
from tests.cli.conftest import children_of, is_running
from tests.proxy.conftest import running_proxy


# uvicorn ends its thread with SystemExit when the lifespan fails: that failure is the test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_start_stops_the_engine_it_started(tmp_path: Path, tiny_model_dir: Path) -> None:
    # The bad scheme is found only after the embedded engine is up (opening the store).
    settings = Settings(
        data_dir=tmp_path,
        port=free_port(),
        tokenizer_path=tiny_model_dir,
        database_url="postgresql://lego@127.0.0.1/lego",
    )
    before = set(children_of(os.getpid()))
    with pytest.raises(RuntimeError, match="died during start-up"), serve(create_app(settings)):
        pass
    left = [pid for pid in set(children_of(os.getpid())) - before if is_running(pid)]
    assert left == [], "the embedded engine outlived the failed start"


def test_the_start_up_heap_is_frozen_and_full_collections_are_reported(
    tmp_path: Path, tiny_model_dir: Path, scripted_engine_url: str
) -> None:
    """A full collection over everything start-up built (the modules, the tokenizer, the
    schemas) paused every turn in flight for 150-260 ms; frozen, it scans what turns made."""
    with running_proxy(scripted_engine_url, tiny_model_dir, tmp_path, None) as proxy:
        session = proxy.new_session()
        assert session["key"]
        frozen = gc.get_freeze_count()
        assert frozen > 10_000, frozen  # the tokenizer and the modules, not a handful
        gc.collect()  # a full pass of the process's collector, which the proxy reports
        scraped = httpx.get(f"{proxy.url}/metrics").raise_for_status().text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in scraped.splitlines()
        if line.startswith("lego_gc_")
    }
    assert values["lego_gc_full_collections"] >= 1
    longest = values["lego_gc_longest_full_collection_seconds"]
    assert 0 < longest <= values["lego_gc_full_collection_seconds"]
    assert gc.get_freeze_count() == 0  # given back: the process collects them again
