"""The embedded local engine: a child process serving SGLang's protocol on loopback.

Used when ``LEGO_BACKEND_URL`` is unset. A separate process keeps model compute off the
proxy's event loop and GIL. The engine builds the tiny default model on first use. It logs
warnings only (its access log would drown the proxy's); ``LEGO_ENGINE_ARGS`` can say
``--log-level info``. On Linux the child is told to exit when the proxy dies, even by
SIGKILL (``PR_SET_PDEATHSIG``), so it is never left running on its own.
"""

from __future__ import annotations

import asyncio
import ctypes
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from kernel.errors import BackendUnavailable
from kernel.threaded import free_port


class EmbeddedEngine:
    def __init__(
        self,
        *,
        model_dir: Path | None,
        data_dir: Path,
        extra_args: str = "",
        routed_experts: bool = True,
    ) -> None:
        """``model_dir`` None: the engine builds (once) and serves the tiny default model.
        ``routed_experts``: launch it with ``--enable-return-routed-experts``, as SGLang
        must be for routing replay."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        model = ["--model", str(model_dir)] if model_dir is not None else []
        self._cmd = [
            sys.executable, "-m", "engine",
            "--host", "127.0.0.1", "--port", str(self.port),
            *model, "--data-dir", str(data_dir), "--log-level", "warning",
            *(["--enable-return-routed-experts"] if routed_experts else []),
            *shlex.split(extra_args),
        ]  # fmt: skip
        self._process: asyncio.subprocess.Process | None = None

    async def start(self, timeout_s: float = 180.0) -> None:
        self._process = await asyncio.create_subprocess_exec(
            *self._cmd, preexec_fn=_exit_with_parent()
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with httpx.AsyncClient() as client:
            while loop.time() < deadline:
                if self._process.returncode is not None:
                    raise BackendUnavailable(
                        f"the embedded engine exited with code {self._process.returncode}: "
                        f"{shlex.join(self._cmd)}"
                    )
                try:
                    if (await client.get(f"{self.url}/health", timeout=1.0)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                await asyncio.sleep(0.2)
        await self.stop()
        raise BackendUnavailable(f"the embedded engine did not become healthy in {timeout_s} s")

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


def _exit_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1

    def arm() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)

    return arm
