"""A stand-in for the Hugging Face Hub on 127.0.0.1, serving one checkpoint folder, so that a
test can make a real first start (download, conversion, loading) with no network and decide
when the download ends: the server is started with HF_ENDPOINT pointing here, and the bytes of
the checkpoint's weights are sent only once `release()` is called.

It answers what huggingface_hub asks for a download: the repo's info (/api/models/REPO and
/api/models/REPO/revision/REV: sha and files with sizes) and each file (HEAD and GET of
/REPO/resolve/REV/PATH, with the X-Repo-Commit and ETag headers that name its revision and
content).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HELD = "model.safetensors"  # the file whose bytes wait for release()


class Hub:
    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id = repo_id
        self.files = {
            p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()
        }
        self._released = asyncio.Event()
        self.held_requests = 0  # GETs of HELD that arrived (the download has begun)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def release(self) -> None:
        self._released.set()

    async def start(self) -> Hub:
        app = web.Application()
        app.router.add_get(f"/api/models/{self.repo_id}", self._info)
        app.router.add_get(f"/api/models/{self.repo_id}/revision/{{rev}}", self._info)
        app.router.add_route("*", f"/{self.repo_id}/resolve/{{rev}}/{{path:.+}}", self._file)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        self.release()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _info(self, request: web.Request) -> web.Response:
        siblings = [{"rfilename": name, "size": p.stat().st_size} for name, p in self.files.items()]
        return web.json_response(
            {"id": self.repo_id, "modelId": self.repo_id, "sha": COMMIT, "private": False,
             "siblings": siblings}
        )  # fmt: skip

    async def _file(self, request: web.Request) -> web.StreamResponse:
        path = self.files.get(request.match_info["path"])
        if path is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        data = path.read_bytes()
        headers = {
            "X-Repo-Commit": COMMIT,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Content-Length": str(len(data)),
        }
        if request.method == "HEAD":
            return web.Response(headers=headers)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        if request.match_info["path"] == HELD:
            self.held_requests += 1
            await response.write(data[:1024])  # the download has begun, then waits
            await self._released.wait()
            data = data[1024:]
        await response.write(data)
        await response.write_eof()
        return response
