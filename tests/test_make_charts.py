"""scripts/make_charts.py: every gallery image is produced from the current code (at --small sizes), each a real
PNG, and every image the README shows is one the script makes."""

from __future__ import annotations

import re
import runpy
import struct
import zlib
from pathlib import Path

import pytest

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_make_charts")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "make_charts.py"

#: The eight bytes every PNG starts with (PNG specification, sec 5.2, https://www.w3.org/TR/png-3/#5PNG-file-signature).
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def script() -> dict:
    return runpy.run_path(str(SCRIPT), run_name="make_charts")


@pytest.fixture(scope="module")
def gallery(script: dict, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("gallery")
    return out, script["make_charts"](out, small=True)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature and the chunk's CRC (PNG sec 5.3)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name}: not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, f"{path.name}: first chunk is not IHDR"
    body, (crc,) = data[16:29], struct.unpack(">I", data[29:33])
    assert zlib.crc32(kind + body) == crc, f"{path.name}: IHDR CRC mismatch"
    return struct.unpack(">II", body[:8])


def test_every_chart_is_written_as_a_png(script: dict, gallery: tuple[Path, list[Path]]) -> None:
    out, written = gallery
    names = [c.name for c in script["CHARTS"]]
    assert len(set(names)) == len(names)
    assert [p.name for p in written] == names
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # nothing else left behind
    for path in written:
        width, height = png_size(path)
        assert width >= 300 and height >= 200, f"{path.name}: {width}x{height}"
        assert path.read_bytes().endswith(b"IEND\xaeB`\x82"), f"{path.name}: truncated (no IEND chunk)"


def test_pngs_decode(gallery: tuple[Path, list[Path]]) -> None:
    image = pytest.importorskip("matplotlib.image")
    for path in gallery[1]:
        pixels = image.imread(path)
        assert pixels.shape[:2] == png_size(path)[::-1]
        assert pixels.std() > 0, f"{path.name}: a blank image"


def test_readme_images_are_exactly_the_scripts(script: dict) -> None:
    """Every docs/images chart the README shows is one the script regenerates, and its gallery lists them all."""
    shown = set(re.findall(r"docs/images/([\w.-]+\.png)", (ROOT / "README.md").read_text(encoding="utf-8")))
    made = {c.name for c in script["CHARTS"]}
    assert not shown - made, f"README images the script does not regenerate: {sorted(shown - made)}"
    assert not made - shown, f"charts the README's gallery does not list: {sorted(made - shown)}"


def test_main_prints_each_file(script: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """The command line: --out and --small reach make_charts, and each path written is printed."""
    calls = []

    def fake(out: str, *, small: bool, progress) -> list[Path]:
        calls.append((out, small))
        progress("working")
        return [Path(out) / c.name for c in script["CHARTS"]]

    monkeypatch.setitem(script["main"].__globals__, "make_charts", fake)
    assert script["main"](["--small", "--out", str(tmp_path)]) == 0
    assert calls == [(str(tmp_path), True)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[:-1] == [f"wrote {tmp_path / c.name}" for c in script["CHARTS"]]
    assert lines[-1].startswith(f"{len(script['CHARTS'])} charts in ")
