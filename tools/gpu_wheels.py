"""The wheels a CUDA machine without network needs to run `make gpu-check`, fetched where there is one.

    python tools/gpu_wheels.py download          # here (PyPI reachable): fill .whl/ and verify it
    python tools/gpu_wheels.py download --all    # also the optional packages (W&B, datasets, zstd)
    python tools/gpu_wheels.py verify            # check .whl/ again
    python tools/gpu_wheels.py missing           # there: the distributions this interpreter lacks or has too old
    python tools/gpu_wheels.py install DIR       # there: install just those from .whl/ into DIR (offline)

Target: CPython 3.12 on manylinux x86_64 with the GPU image's PyTorch and CUDA (docs/development.md, Versions), the packages of
``IMAGE_PACKAGES`` installed, no network. The set is resolved from ``ROOTS`` (DeepSpeed, built here
as a pure-Python wheel because it is published as a source archive only, and megatron-core): each
wheel's ``Requires-Dist`` (markers evaluated for the target, extras ignored) adds every requirement
the image does not provide, recursively. Every version is the one installed in this environment,
where the project's tests run, so the machine gets a tested combination and one version of each.
``verify`` re-reads the folder: one wheel per distribution, each installable on the target (a
``pip install --dry-run`` for that platform), and every requirement met by a wheel here or by the
image.

The image's own packages are not fetched, except where a wheel asks for a version of one
(``typing-extensions>=4.16`` for pydantic, ``packaging>=24.2`` for megatron-core): those are
fetched too, as *conditional* wheels. On the target, ``missing`` compares versions: it lists what
the interpreter lacks and what it has in a version some wheel's requirement refuses, and
``install`` puts only those into a folder with ``pip install --no-index --no-deps --target`` (a
conditional wheel whose package the image already has in a good version is left out, so it never
shadows the image's). ``tools/gpu_check.py`` calls :func:`install` itself (the image may lack make).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the GPU image's python3 runs this file without the project installed

from kerple.errors import KerpleError, UsageError, entry_point  # noqa: E402  (the standard library only)
WHEELS = REPO / ".whl"
CONSTRAINTS = ("-c", str(REPO / "requirements/constraints.txt"))  # every pip call: nothing may replace torch
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")
MARKERS = {"python_version": PYTHON_VERSION, "python_full_version": f"{PYTHON_VERSION}.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
ROOTS = ("deepspeed", "megatron-core")
# Imported by the project but not by the check: W&B (use_wandb), datasets (no import), zstandard (.zst input).
OPTIONAL = ("wandb", "datasets", "zstandard")
NEVER_CARRIED = frozenset({"torch", "triton", "numpy"})  # the image's own build must be used, whatever a wheel asks
BUILT_HERE = {"deepspeed"}  # source archive only: `pip wheel --no-deps --no-build-isolation` (needs torch here)
# Distributions the CUDA image ships (its pip list as read on 2026-11-17).
IMAGE_PACKAGES = frozenset(canonicalize_name(name) for name in """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
    certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
    jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
    onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
    pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning
    pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
    tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers
    toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
    triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
    xxhash yarl zipp
    """.split())


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def requirements_of(wheel: Path) -> list[Requirement]:
    """``Requires-Dist`` of ``wheel`` that apply to the target (no extras)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if re.match(r"[^/]+\.dist-info/METADATA$", n))
        lines = archive.read(metadata).decode().splitlines()
    found = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or requirement.marker.evaluate(MARKERS):
                found.append(requirement)
    return found


def fetch(name: str, version: str, folder: Path) -> Path:
    """Download (or build) one wheel of ``name==version`` for the target into ``folder``."""
    before = set(folder.glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    if canonicalize_name(name) in BUILT_HERE:
        command = [*pip, "wheel", "--no-deps", "--no-build-isolation", *CONSTRAINTS, "-w", str(folder), f"{name}=={version}"]
    else:
        command = [*pip, "download", *CONSTRAINTS, "--no-deps", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
                   "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", str(folder)]
        command += [arg for platform in PLATFORMS for arg in ("--platform", platform)] + [f"{name}=={version}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu_wheels.py: error: fetching {name}=={version} failed:\n{done.stderr.strip()[-1500:]}")
    new = sorted(set(folder.glob("*.whl")) - before) or [
        w for w in folder.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) == canonicalize_name(name)]
    return new[0]


def download(include_optional: bool) -> list[Path]:
    """Resolve and fetch the closure of ``ROOTS`` (and ``OPTIONAL``) minus the image's packages."""
    WHEELS.mkdir(exist_ok=True)
    queue = list(ROOTS) + (list(OPTIONAL) if include_optional else [])
    done: dict[str, Path] = {}
    conditional = set()
    while queue:
        name = canonicalize_name(queue.pop(0))
        if name in done or (name in IMAGE_PACKAGES and name not in conditional):
            continue
        version = installed_version(name)
        if version is None:
            raise SystemExit(f"gpu_wheels.py: error: {name} is not installed here; install it pinned "
                             "(requirements/*.txt) so its version is tested, then run again")
        existing = [w for w in WHEELS.glob("*.whl") if canonicalize_name(parse_wheel_filename(w.name)[0]) == name]
        for stale in (w for w in existing if str(parse_wheel_filename(w.name)[1]) != version):
            stale.unlink()  # one version per distribution
        current = [w for w in existing if w.exists()]
        done[name] = current[0] if current else fetch(name, version, WHEELS)
        print(f"  {done[name].name} ({done[name].stat().st_size / 2**20:.1f} MiB)", flush=True)
        for requirement in requirements_of(done[name]):
            needed = canonicalize_name(requirement.name)
            if needed in IMAGE_PACKAGES and str(requirement.specifier) and needed not in NEVER_CARRIED:
                conditional.add(needed)  # the image has it, perhaps in a version this wheel refuses
            queue.append(needed)
    for extra in set(WHEELS.glob("*.whl")) - set(done.values()):
        print(f"  removing {extra.name} (no longer needed)", flush=True)
        extra.unlink()
    return sorted(done.values())


def verify(folder: Path = WHEELS) -> list[str]:
    """Problems with ``folder`` as an offline install set for the target; empty when complete."""
    wheels = sorted(folder.glob("*.whl"))
    problems, versions = [], {}
    for wheel in wheels:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if name in versions:
            problems.append(f"two versions of {name}: {versions[name]} and {version}")
        versions[name] = version
    for wheel in wheels:
        for requirement in requirements_of(wheel):
            name = canonicalize_name(requirement.name)
            if name in versions and not requirement.specifier.contains(versions[name], prereleases=True):
                problems.append(f"{wheel.name} needs {requirement} but .whl has {name} {versions[name]}")
            elif name not in versions and name not in IMAGE_PACKAGES:
                problems.append(f"{wheel.name} needs {requirement}: neither in .whl nor on the image")
    if wheels:
        problems += _dry_run(folder, sorted(versions))
    return problems


def _dry_run(folder: Path, names: list[str]) -> list[str]:
    """``pip install --dry-run`` of every wheel for the target platform, from the folder alone."""
    with tempfile.TemporaryDirectory() as target:
        command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", *CONSTRAINTS, "--dry-run", "--no-index",
                   "--no-deps", "--find-links", str(folder), "--only-binary=:all:", "--python-version", PYTHON_VERSION,
                   "--implementation", "cp", "--abi", "cp312", "--target", target]
        command += [arg for platform in PLATFORMS for arg in ("--platform", platform)] + [str(n) for n in names]
        done = subprocess.run(command, capture_output=True, text=True)
    return [] if done.returncode == 0 else [f"pip --dry-run for cp312 manylinux x86_64 failed: {done.stderr.strip()[-800:]}"]


def missing(folder: Path = WHEELS) -> list[str]:
    """Distributions of the wheel folder (``ROOTS`` when it is empty) that this interpreter lacks, or has
    in a version that a requirement of a wheel in the folder refuses (e.g. an image's old typing-extensions
    under pydantic's ``>=4.16``)."""
    wheels = sorted(folder.glob("*.whl"))
    names = [canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels] or [canonicalize_name(r) for r in ROOTS]
    wanted: dict[str, list[Requirement]] = {}
    for wheel in wheels:
        for requirement in requirements_of(wheel):
            wanted.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    result = []
    for name in names:
        version = installed_version(name)
        if version is None or any(not r.specifier.contains(version, prereleases=True) for r in wanted.get(name, [])):
            result.append(name)
    return result


def install(site: Path, folder: Path = WHEELS) -> tuple[list[str], list[str]]:
    """Install the wheels of :func:`missing` from ``folder`` into ``site`` (offline, no dependency
    resolution); ``site`` must then lead ``sys.path``. Returns (installed, still missing): a
    distribution without a wheel in the folder stays missing, and the caller says what that stops."""
    needed = missing(folder)
    files = [w for w in sorted(folder.glob("*.whl")) if canonicalize_name(parse_wheel_filename(w.name)[0]) in needed]
    if files:
        command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", *CONSTRAINTS, "-q", "--no-index",
                   "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, files)]
        subprocess.run(command, check=True)
    installed = [canonicalize_name(parse_wheel_filename(w.name)[0]) for w in files]
    return installed, [name for name in needed if name not in installed]


@entry_point("gpu_wheels.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_wheels.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("command", choices=("download", "verify", "missing", "install"))
    parser.add_argument("site", nargs="?", type=Path, help="install: the folder to install into")
    parser.add_argument("--all", action="store_true", help=f"also {', '.join(OPTIONAL)}")
    args = parser.parse_args(argv)
    if args.site is not None and args.command != "install":
        raise UsageError(f"{args.command} takes no folder ({args.site}); only install does")
    if args.all and args.command != "download":
        raise UsageError(f"--all applies to download; {args.command} reads what .whl/ holds")
    try:
        return run(args, parser)
    except subprocess.CalledProcessError as error:
        raise KerpleError(f"{' '.join(map(str, error.cmd[:6]))} ... exited with status {error.returncode}; "
                          "its message is above") from None


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The command of ``args``."""
    if args.command == "missing":
        print(" ".join(missing()))
        return 0
    if args.command == "install":
        if args.site is None:
            parser.error("install needs the folder to install into, e.g. /tmp/kerple-gpu-site")
        installed, absent = install(args.site)
        print(f"installed into {args.site}: {' '.join(installed) or 'nothing (all present)'}")
        if absent:
            print(f"still missing (no wheel in {WHEELS}): {' '.join(absent)}", file=sys.stderr)
        return 1 if absent else 0
    if args.command == "download":
        print(f"fetching into {WHEELS} for CPython {PYTHON_VERSION} manylinux x86_64:", flush=True)
        download(args.all)
    problems = verify()
    total = sum(w.stat().st_size for w in WHEELS.glob("*.whl"))
    print(f"{len(list(WHEELS.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB in {WHEELS}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
