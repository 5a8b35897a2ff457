"""``async with`` for the combined simulations: start on entry (stopping what started if that fails half-way)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Started:
    """A simulation with ``start()`` and ``stop()``; ``stop()`` must cope with a half-done ``start()``."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()  # listeners and tasks a half-done start left behind
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
