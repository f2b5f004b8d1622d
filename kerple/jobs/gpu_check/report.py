"""The GPU check's report: step results, the machine they ran on, and the JSON / Markdown files.

``gpu-report/report.json`` holds ``{"environment": ..., "steps": {"<n>": StepResult}}``; each step
also keeps the environment it ran in, because ``make gpu-check STEPS=3,4`` replaces only those steps
and leaves the others from earlier runs (possibly another machine) in place. ``report.md`` is
rendered from the JSON. Both files are written atomically (``kerple.atomic``): a check killed
mid-write leaves the previous report whole.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kerple.atomic import write_json_atomic, write_text_atomic

STATUSES = ("passed", "failed", "skipped")


@dataclass
class Table:
    """One Markdown table: a title, column names and rows of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)


@dataclass
class StepResult:
    """What one step did. ``status`` is one of :data:`STATUSES`; ``reason`` says why (for failed and
    skipped, and for a pass that left cases out)."""

    number: int
    name: str
    status: str = "failed"
    reason: str = ""
    seconds: float = 0.0
    budget_seconds: float = 0.0
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    def table(self, title: str, columns: list[str]) -> Table:
        """A new table appended to this step (rows are added to it as cases finish)."""
        table = Table(title, columns)
        self.tables.append(table)
        return table

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        values = dict(data)
        values["tables"] = [Table(**table) for table in values.get("tables", [])]
        return cls(**values)


def _command_output(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        return ""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def environment(device_type: str) -> dict[str, Any]:
    """Device, driver, library versions, git commit and the date (UTC) of this run."""
    import torch

    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": "CPU",
        "device_type": device_type,
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "git_commit": _command_output(["git", "rev-parse", "--short", "HEAD"]),
    }
    for package in ("deepspeed", "megatron.core", "triton"):
        try:
            module = __import__(package, fromlist=["__version__"])
            info[package] = getattr(module, "__version__", "?")
        except Exception:  # a missing or broken package is itself a finding; the check goes on
            info[package] = None
    if device_type == "cuda" and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info["device"] = properties.name
        info["device_memory_gib"] = round(properties.total_memory / 2**30, 1)
        info["multiprocessors"] = properties.multi_processor_count
        info["cudnn"] = torch.backends.cudnn.version()
        driver = _command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
        info["driver"] = driver[0] if driver else None
    return info


def load(path: Path) -> dict[str, Any]:
    """The report at ``path``, or an empty one (a missing or unreadable file starts afresh)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"environment": {}, "steps": {}}
    if not isinstance(data, dict) or not isinstance(data.get("steps"), dict):
        return {"environment": {}, "steps": {}}
    return data


def merge(report: dict[str, Any], result: StepResult, env: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``result`` replacing any earlier result of the same step."""
    result.environment = env
    steps = dict(report.get("steps", {}))
    steps[str(result.number)] = result.to_dict()
    return {"environment": env, "steps": dict(sorted(steps.items(), key=lambda item: int(item[0])))}


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict[str, Any]) -> str:
    """The Markdown report: environment, a summary of the steps, then each step's tables."""
    env = report.get("environment", {})
    lines = ["# GPU check report", ""]
    lines += [f"- {key}: {_cell(value)}" for key, value in env.items() if value not in (None, "")]
    lines += ["", "| step | name | status | time (s) | budget (s) | reason |", "|---:|---|---|---:|---:|---|"]
    steps = [StepResult.from_dict(data) for data in report.get("steps", {}).values()]
    for step in steps:
        lines.append(f"| {step.number} | {step.name} | {step.status} | {step.seconds:.1f} | "
                     f"{step.budget_seconds:.0f} | {_cell(step.reason)} |")
    for step in steps:
        lines += ["", f"## {step.number}. {step.name}: {step.status}", ""]
        ran = step.environment
        if ran and (ran.get("date"), ran.get("device")) != (env.get("date"), env.get("device")):
            lines += [f"Ran {ran.get('date')} on {ran.get('device')} (torch {ran.get('torch')}).", ""]
        if step.reason:
            lines += [f"{step.status.capitalize()}: {step.reason}", ""]
        lines += [f"- {note}" for note in step.notes]
        for table in step.tables:
            lines += ["", f"**{table.title}**", "", "| " + " | ".join(map(_cell, table.columns)) + " |",
                      "|" + "---|" * len(table.columns)]
            lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in table.rows]
    return "\n".join(lines) + "\n"


def write(directory: Path, report: dict[str, Any]) -> None:
    """``report.json`` and ``report.md`` in ``directory``, each atomically."""
    write_json_atomic(directory / "report.json", report)
    write_text_atomic(directory / "report.md", render_markdown(report))
