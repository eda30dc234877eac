"""PipelineStats.to_svg(): the pipeline graph as a picture, and pipeline_graph.svg."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

import chute

SVG = "{http://www.w3.org/2000/svg}"


def slow(x: int) -> dict[str, np.ndarray]:
    total = 0
    for i in range(500):
        total += i
    return {"tokens": np.arange(x % 7 + 1, dtype=np.int32)}


def short(x: int) -> dict[str, np.ndarray]:
    return {"tokens": np.arange(3, dtype=np.int32)}


def pad(e: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = np.zeros(8, np.int32)
    out[: len(e["tokens"])] = e["tokens"]
    return {"tokens": out}


def stage_groups(root: ET.Element) -> dict[str, str]:
    """Each stage's group id -> all the text drawn in it."""
    return {
        g.attrib["id"]: " ".join(t.text or "" for t in g.iter(f"{SVG}text"))
        for g in root.iter(f"{SVG}g")
        if g.attrib.get("id", "").startswith("stage-")
    }


def test_every_stage_is_drawn_with_its_figures(debug_mode: None) -> None:
    ds = (
        chute.MapDataset.range(2000)
        .shuffle(seed=3)
        .map(slow)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .map(pad)
        .batch(32)
    )
    it = iter(ds)
    for _ in range(20):
        next(it)
    stats = chute.stats(it)
    root = ET.fromstring(stats.to_svg())
    assert root.tag == f"{SVG}svg"
    groups = stage_groups(root)
    assert sorted(groups) == sorted(f"stage-{s.id}" for s in stats.stages)
    for s in stats.stages:
        text = groups[f"stage-{s.id}"]
        title = root.find(f".//{SVG}g[@id='stage-{s.id}']/{SVG}title")
        assert title is not None and title.text == f"[{s.id}] {s.name}"
        assert f"{s.elements:,} elements" in text
        assert f"{s.wait_percent:.1f}% wait" in text
        assert "/s" in text
    batch = stats.stages[-1]
    assert "int32[32,8]" in groups[f"stage-{batch.id}"]
    # The bottleneck is marked, and the advice is written beneath.
    assert stats.bottleneck is not None
    assert "BOTTLENECK" in groups[f"stage-{stats.bottleneck.id}"]
    all_text = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "Bottleneck: stage" in all_text


def test_a_mix_has_an_arrow_from_each_input(debug_mode: None) -> None:
    a = chute.MapDataset.range(500).map(slow).to_iter_dataset()
    b = chute.MapDataset.range(500).map(short).to_iter_dataset()
    c = chute.MapDataset.range(500).map(short).to_iter_dataset()
    ds = chute.IterDataset.mix([a, b, c]).map(pad).batch(4)
    it = iter(ds)
    for _ in range(10):
        next(it)
    stats = chute.stats(it)
    root = ET.fromstring(stats.to_svg())
    edges = [p for p in root.iter(f"{SVG}path") if p.attrib.get("class") == "edge"]
    assert len(edges) == sum(len(s.inputs) for s in stats.stages)
    mix = next(s for s in stats.stages if s.name.startswith("Mixed"))
    assert len(mix.inputs) == 3
    assert len(stage_groups(root)) == len(stats.stages)


def test_names_are_escaped(debug_mode: None) -> None:
    def lt_and_amp(x: int) -> str:
        return "<&>"

    it = iter(chute.MapDataset.range(10).map(lt_and_amp).to_iter_dataset())
    list(it)
    svg = chute.stats(it).to_svg()
    ET.fromstring(svg)  # parses: the spec and names are escaped
    assert "lt_and_amp" in svg


def test_the_visualization_directory_gets_pipeline_graph_svg(tmp_path: Path) -> None:
    chute.config.update("py_dataset_visualization_output_dir", str(tmp_path))
    try:
        it = iter(chute.MapDataset.range(100).map(short).to_iter_dataset().batch(10))
        next(it)
    finally:
        chute.config.update("py_dataset_visualization_output_dir", None)
    text = (tmp_path / "pipeline_graph.txt").read_text()
    root = ET.parse(tmp_path / "pipeline_graph.svg").getroot()
    ids = {f"stage-{i}" for i in re.findall(r"\[(\d+)\] ", text)}
    assert len(ids) >= 3 and set(stage_groups(root)) == ids
