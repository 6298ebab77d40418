"""tools/render_report.sh: headless Chromium renders a report.html (skipped without a chromium binary)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from procap.experiments.report import build_report
from tests.report_checks import make_fake_demo

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "render_report.sh"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _saturated_fraction(path: Path) -> float:
    """Share of strongly coloured pixels: the page's text and tables are grey; only its images are colourful."""
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB")).astype(np.int16)
    return float(((pixels.max(axis=-1) - pixels.min(axis=-1)) > 100).mean())


@pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_chromium_renders_the_embedded_images(tmp_path):
    folder = make_fake_demo(tmp_path / "demo")  # random-noise sample images: colourful wherever they show
    report = build_report(folder, imagine_procedures=False)
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [str(SCRIPT), str(report), str(shot), "1200", "2400"], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    with Image.open(shot) as image:
        assert image.format == "PNG" and image.size == (1200, 2400)
    with_images = _saturated_fraction(shot)
    # The same page with every image removed: the colourful pixels came from the embedded PNGs.
    bare = tmp_path / "bare.html"
    text = report.read_text(encoding="utf-8")
    bare.write_text(re.sub(r"<img [^>]*>", "", text), encoding="utf-8")
    subprocess.run([str(SCRIPT), str(bare), str(tmp_path / "bare.png"), "1200", "2400"], check=True)
    assert _saturated_fraction(tmp_path / "bare.png") < 0.001 < with_images


@pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_the_screenshot_is_as_tall_as_the_page(tmp_path):
    """The screenshot covers the whole page: a red band at the foot of a 6,000 px page is in the picture."""
    page = tmp_path / "tall.html"
    band = '<div style="height:6000px"></div><div style="height:60px;background:#ff0000"></div>'
    page.write_text(f"<!DOCTYPE html><html><body style='margin:0'>{band}</body></html>", encoding="utf-8")
    shot = tmp_path / "tall.png"
    done = subprocess.run([str(SCRIPT), str(page), str(shot), "400"], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with Image.open(shot) as image:
        assert image.height >= 6060
        foot = np.asarray(image.convert("RGB"))[6010:6050]
    assert (foot[..., 0] > 200).all() and (foot[..., 1] < 60).all()


def test_script_refuses_a_missing_report(tmp_path):
    done = subprocess.run(
        [str(SCRIPT), str(tmp_path / "none.html"), str(tmp_path / "x.png")], check=False, capture_output=True
    )
    assert done.returncode == 2 and not (tmp_path / "x.png").exists()
    assert len(done.stderr.decode().strip().splitlines()) == 1
