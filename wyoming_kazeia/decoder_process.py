"""The subprocess placement's decoder: `kazeia-decoder --pipe`, a streaming decoder in a child
process, started with the synthesis and pushed frames as they come (as the in-process
decoder), so that its model load and its decoding overlap the generation.

Protocol (native/tools/kazeia_decoder.cpp): each push is a uint32 frame count and the frames'
int32 codes on the child's stdin; its answer is the push's samples, float32, on its stdout. The
end of stdin ends the child."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np

from .errors import EngineError


class DecoderProcess:
    """One kazeia-decoder child for one synthesis. `push` waits for the child's answer, at most
    `base_s + per_frame_s * frames` (then the child is killed: EngineError); a set `cancel`
    kills it within ~20 ms and makes `push` give None. Any error or cancel kills the child
    with its process group; `finish` ends it normally."""

    def __init__(
        self,
        command: list[str],
        decoder_path: str,
        threads: int,
        precision: str,
        hop_length: int,
        cancel: threading.Event,
        base_s: float,
        per_frame_s: float,
    ) -> None:
        self._hop = hop_length
        self._cancel = cancel
        self._base_s, self._per_frame_s = base_s, per_frame_s
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            [*command, decoder_path, "--pipe", "--threads", str(threads), "--precision", precision],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin, self._stdout = self._proc.stdin.fileno(), self._proc.stdout.fileno()
        os.set_blocking(self._stdin, False)
        os.set_blocking(self._stdout, False)

    def push(self, codes: np.ndarray) -> np.ndarray | None:
        """The samples of `codes` ([n, num_quantizers]), None when cancelled."""
        n = len(codes)
        message = np.uint32(n).astype("<u4").tobytes()
        message += np.ascontiguousarray(codes, dtype="<i4").tobytes()
        limit_s = self._base_s + self._per_frame_s * n
        answer = self._exchange(message, 4 * n * self._hop, limit_s)
        return None if answer is None else np.frombuffer(answer, dtype="<f4").astype(np.float32)

    def _exchange(self, message: bytes, expected: int, limit_s: float) -> bytes | None:
        deadline = time.monotonic() + limit_s
        answer = bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdout, selectors.EVENT_READ)
            sel.register(self._stdin, selectors.EVENT_WRITE)
            while len(answer) < expected:
                if self._cancel.is_set():
                    self.kill()
                    return None
                if time.monotonic() > deadline:
                    self.kill()
                    raise EngineError(
                        f"decoder subprocess gave no result within {limit_s:.0f} s: killed"
                    )
                for key, _ in sel.select(0.02):
                    if key.fd == self._stdin:
                        try:
                            message = message[os.write(self._stdin, message) :]
                        except BrokenPipeError:  # it died: what it said comes below
                            message = b""
                        if not message:
                            sel.unregister(self._stdin)
                    else:
                        data = os.read(self._stdout, expected - len(answer))
                        if not data:  # it ended without its answer
                            raise self._failure()
                        answer += data
        return bytes(answer)

    def finish(self) -> None:
        """Ends the child after its last push (the end of its stdin) and checks that it
        ended well."""
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.close()  # type: ignore[union-attr]
        try:
            returncode = self._proc.wait(self._base_s)
        except subprocess.TimeoutExpired as err:
            self.kill()
            raise EngineError("decoder subprocess did not end after its last push: killed") from err
        if returncode != 0:
            raise self._failure()

    def _failure(self) -> EngineError:
        self.kill()
        self._stderr.seek(0)
        said = self._stderr.read().decode("utf-8", "replace").strip().splitlines()[-1:]
        reason = said[0] if said else f"exit code {self._proc.returncode}"
        return EngineError(f"decoder subprocess failed: {reason}")

    def kill(self) -> None:
        """Kills the child and its process group (if still running) and reaps it."""
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()

    def close(self) -> None:
        """Kills the child if it still runs and releases the pipes."""
        self.kill()
        for stream in (self._proc.stdin, self._proc.stdout, self._stderr):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
