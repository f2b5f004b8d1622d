"""The report: pending before any GPU run, Table 3's layout and findings once results exist, the README section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.plan import FULL, Settings
from kerple.reproduce.report import BEGIN, END, PENDING, Outputs, check_readme, write_report
from kerple.reproduce.state import Chunk, State

# KERPLE Table 3, GitHub: the paper's own numbers, which its findings must hold on
GITHUB = {
    "kerple_log": [3.40, 3.04, 2.86, 2.74, 2.71, 2.75],
    "alibi": [3.42, 3.15, 3.13, 3.04, 3.04, 3.02],
    "rotary": [3.44, 3.86, 5.94, 11.1, 20.2, 31.3],
}
README = f"# Title\n\nintro\n\n{BEGIN}\nold text\n{END}\n\n## Next section\nkept\n"


def _setup(tmp_path: Path, names: tuple[str, ...]) -> tuple[Settings, State, Outputs]:
    settings = Settings(FULL, 600_000_000, names, tmp_path / "work")
    state = State(settings.work / "state.json", settings.fingerprint(), device="NVIDIA H100 80GB HBM3")
    readme = tmp_path / "README.md"
    readme.write_text(README)
    return settings, state, Outputs(tmp_path / "docs" / "page.md", tmp_path / "docs" / "images" / "plot.png", readme)


def _results(settings: Settings, name: str, ppl: list[float]) -> None:
    doc = {"format": "kerple-eval-1", "complete": True,
           "run": {"pos_emb": name, "dataset": "python", "seed": 1234, "train_seq_length": 512, "iteration": 36622},
           "protocol": {"name": "nonoverlap", "attention_window": None,
                        "attention_impl_per_length": {str(n): "flex" for n in FULL.lengths}},
           "results": [{"length": n, "ppl": value} for n, value in zip(FULL.lengths, ppl)]}
    path = settings.work / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_before_any_run_everything_is_pending(tmp_path: Path) -> None:
    settings, state, outputs = _setup(tmp_path, ("kerple_log", "alibi", "rotary", "none"))
    written = write_report(settings, state, None, outputs)
    assert written == [outputs.page, outputs.readme] and not outputs.plot.exists()
    page = outputs.page.read_text()
    assert f"**Status:** {PENDING}." in page and "the paper: 50,000 steps = 819.2M" in page
    rows = [line for line in page.splitlines() if line.startswith("| 512 |") or line.startswith("| 16384 |")]
    assert rows == ["| 512 | pending | pending | pending | pending |", "| 16384 | pending | pending | pending | pending |"]
    assert page.count("**pending**") == 3  # the three findings of Table 3
    readme = outputs.readme.read_text()
    assert readme.startswith("# Title\n\nintro\n\n" + BEGIN + "\n**Status:** " + PENDING)
    assert readme.endswith(f"{END}\n\n## Next section\nkept\n") and "old text" not in readme


def test_results_fill_table_3_and_its_findings_hold_on_the_papers_numbers(tmp_path: Path) -> None:
    settings, state, outputs = _setup(tmp_path, ("kerple_log", "alibi", "rotary", "none"))
    for name, ppl in GITHUB.items():
        _results(settings, name, ppl)
    record = state.run("kerple_log")
    record.chunks += [Chunk("train", 100.0, 0, 20000, "auto", "stopped"), Chunk("train", 50.0, 20000, 36622, "auto",
                      "finished"), Chunk("evaluate", 30.0, 36622, 36622, "auto", "finished")]
    state.run("rotary").chunks.append(Chunk("train", 60.0, 0, 36622, "auto", "finished"))
    logs = settings.work / "runs" / "kerple_log" / "logs"
    logs.mkdir(parents=True)
    (logs / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"step": 100, "train/tokens_per_s": 100.0}, {"step": 100, "validation/lm_loss": 3.0},
        {"step": 200, "train/tokens_per_s": 300.0}, {"step": 300, "train/tokens_per_s": 200.0})) + "\n")
    write_report(settings, state, None, outputs)
    page = outputs.page.read_text()
    assert "| Extrp. | KERPLE (log) | ALiBi | Rotary | NoPE |" in page
    assert "| 512 | 3.40 | 3.42 | 3.44 | pending |" in page and "| 16384 | 2.75 | 3.02 | 31.3 | pending |" in page
    assert page.count("**holds**") == 3 and "(3.4 at 512, 2.75 at 16384)" in page
    # CUDA, auto: a bias trains through sdpa at 512 tokens (kerple.model.attention.choose_implementation)
    assert "| KERPLE (log) | sdpa / flex | 36,622 of 36,622 | 2:30 (2) | 200 | 0:30 |" in page
    assert "| Rotary | sdpa / flex | 36,622 of 36,622 | 1:00 (1) |  |  |" in page  # no logit term: sdpa
    assert "| ALiBi | pending | | | | |" in page
    assert "**Status:** in progress: 3 of 4 runs evaluated on NVIDIA H100 80GB HBM3" in page
    assert outputs.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](images/plot.png)" in page
    assert "| 2048 | 2.86 | 3.13 | 5.94 | pending |" in outputs.readme.read_text()


def test_findings_that_do_not_hold_are_said_so(tmp_path: Path) -> None:
    settings, state, outputs = _setup(tmp_path, ("kerple_log", "alibi", "rotary"))
    _results(settings, "kerple_log", [3.40, 3.3, 3.5, 3.7, 3.9, 4.1])  # rises 1.2x: not flat, above ALiBi
    _results(settings, "alibi", GITHUB["alibi"])
    _results(settings, "rotary", [3.44, 3.5, 3.6, 3.7, 3.8, 3.9])  # does not explode
    write_report(settings, state, None, outputs)
    findings = outputs.page.read_text().split("## Against the paper's Table 3")[1].strip().splitlines()
    assert [line.split("**")[1] for line in findings] == ["does not hold"] * 3
    assert "**Status:** complete: 3 of 3 runs evaluated" in outputs.page.read_text()


@pytest.mark.parametrize("text", ["no markers\n", f"{BEGIN}\n{BEGIN}\n{END}\n", f"{END}\n{BEGIN}\n"])
def test_a_readme_without_one_marked_section_is_refused(tmp_path: Path, text: str) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(text)
    with pytest.raises(ReproduceError, match="needs one line <!-- gpu-reproduce:begin -->"):
        check_readme(readme)
    check_readme(None)
