"""The viewer and the run report in headless Chromium (Debian ``chromium``): they load without a
console error, an exception or a blocked request; screenshots are not blank and show the
provenance colours; hostile tool output does not run; the toggles switch what the tokens show."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentrl.inspect import (
    PROVENANCE_COLOURS,
    RunFolder,
    RunIndex,
    token_decoder,
    write_run_report,
    write_viewer,
)
from agentrl.testing import build_tokenizer
from agentrl.testing.chromium import HeadlessChromium, chromium_path
from agentrl.testing.episodes import showcase_episode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180),
              pytest.mark.skipif(chromium_path() is None, reason="no chromium on PATH (scripts/setup/apt.sh installs it)")]


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def _pixels(png: bytes) -> Counter[tuple[int, int, int]]:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1 << 24) or []
    return Counter({rgb: n for n, rgb in colours})


def _check_screenshot(png: bytes, kinds: set[str]) -> None:
    counts = _pixels(png)
    total = sum(counts.values())
    white = counts.get((255, 255, 255), 0)
    assert total - white > 0.05 * total and len(counts) > 50, "the screenshot is (nearly) blank"
    for kind in kinds:
        border = _rgb(PROVENANCE_COLOURS[kind][1])
        assert counts.get(border, 0) >= 40, f"no {kind} colour {PROVENANCE_COLOURS[kind][1]} in the screenshot"


async def _browse(pages: dict[str, Path]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with HeadlessChromium(width=1280, height=900) as browser:
        for name, path in pages.items():
            load = await browser.load(path.resolve().as_uri())
            out[name] = {"load": load, "png": await browser.screenshot(max_height=4000)}
            if name == "showcase":
                out["pwned"] = await browser.evaluate("String(window.__pwned)")
                out["imgs"] = await browser.evaluate("document.querySelectorAll('.arl-body img').length")
                first = "document.querySelector('.arl-body .toks .t')"
                before = await browser.evaluate(f"getComputedStyle({first}, '::after').content")
                await browser.evaluate("document.querySelector('.arl .tg-i').click()")
                after = await browser.evaluate(f"getComputedStyle({first}, '::after').content")
                tid = await browser.evaluate(f"{first}.getAttribute('data-i')")
                out["toggle"] = (before, after, tid)
    return out


def test_viewer_and_report_render_in_chromium(fake_run_dir: Path, tmp_path: Path) -> None:
    folder = RunFolder(fake_run_dir)
    report = write_run_report(folder, tmp_path / "report")
    index = RunIndex.of_run(folder)
    real = write_viewer(index.episode(0), tmp_path / "real.html", decoder=folder.decoder())
    showcase = write_viewer(showcase_episode(), tmp_path / "showcase.html", decoder=token_decoder(build_tokenizer()))
    seen = asyncio.run(_browse({"report": report, "real": real, "showcase": showcase}))
    for name in ("report", "real", "showcase"):
        load = seen[name]["load"]
        assert load.errors == [], f"{name}: {load.errors}"
    _check_screenshot(seen["real"]["png"], {"prompt", "model", "tool"})
    _check_screenshot(seen["showcase"]["png"], {"prompt", "model", "tool"})
    _check_screenshot(seen["report"]["png"], {"prompt", "model", "tool"})  # the token-composition bars
    assert seen["pwned"] == "undefined" and seen["imgs"] == 0  # the hostile tool output stayed text
    before, after, tid = seen["toggle"]
    assert before in ("none", "normal") and after == f'"{tid}"'  # "token ids" shows each token's id
