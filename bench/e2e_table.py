"""Print the end-to-end benchmark results of pytest-benchmark JSON files as one table.

    python bench/e2e_table.py e2e-k2.bench.json [more.json ...]

One row per run: provider, k, batch, graph mode, TPS under the paper's counting (24 tokens per caption) and up to
EOS, latency per batch, peak memory, MFU, ratio to the paper's A40 TPS and speed-up over the eager fp32 reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = (
    ("provider", "{}"),
    ("k", "{}"),
    ("batch", "{}"),
    ("capture_memory", "{}"),
    ("tps_paper", "{:.0f}"),
    ("tps_up_to_eos", "{:.0f}"),
    ("latency_s_per_batch", "{:.5f}"),
    ("peak_memory_mb", "{:.0f}"),
    ("mfu", "{:.4f}"),
    ("ratio_to_paper_a40", "{:.1f}"),
    ("speedup_vs_eager_fp32", "{:.1f}"),
)


def rows(paths: list[Path]) -> list[dict]:
    out = []
    for path in paths:
        for entry in json.loads(path.read_text()).get("benchmarks", []):
            if "tps_paper" in entry.get("extra_info", {}):
                out.append(entry["extra_info"])
    return sorted(out, key=lambda r: (r.get("k", 0), r.get("provider", ""), r.get("batch", 0)))


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        print(f"e2e_table: no such benchmark file: {', '.join(missing) or '(none given)'}", file=sys.stderr)
        return 2
    print(" | ".join(name for name, _ in COLUMNS))
    for row in rows(paths):
        cells = []
        for name, fmt in COLUMNS:
            value = row.get(name)
            cells.append("-" if value is None else fmt.format(value))
        print(" | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
