#!/usr/bin/env python3
"""Draws cost-growth.png (beside BENCHMARKS.md) from the cost-growth section of BENCHMARKS.md.

The section is written by `cargo bench -p sluice-sidecar --bench cost_growth`; this script only reads its
tables, so the plot always shows the numbers of record. Needs matplotlib (`pip install matplotlib`).

    python3 scripts/cost-growth-plot.py [BENCHMARKS.md] [cost-growth.png]
"""

import pathlib
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
START = "<!-- bench:cost-growth:start -->"
END = "<!-- bench:cost-growth:end -->"


def tables(text):
    """Each markdown table under a `### ` heading in the section: {heading: [row dicts]}."""
    section = text[text.index(START) : text.index(END)]
    out = {}
    for block in section.split("### ")[1:]:
        heading = block.splitlines()[0].strip()
        lines = [l for l in block.splitlines() if l.startswith("|")]
        if len(lines) < 3:
            continue
        head = [c.strip() for c in lines[0].strip("|").split("|")]
        out[heading] = [
            dict(zip(head, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]
        ]
    return out


def num(cell):
    """The number in a cell ("0.63×", "1.2", "20000")."""
    m = re.search(r"-?[0-9][0-9.,]*", cell)
    return float(m.group(0).replace(",", "")) if m else float("nan")


def main():
    md = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "BENCHMARKS.md"
    png = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else md.parent / "cost-growth.png"
    text = md.read_text()
    t = tables(text)
    nginx = num(re.search(r"Reference: nginx.*?script, ([0-9.]+) req/s", text).group(1))
    keys = next(v for k, v in t.items() if k.startswith("Sidecar"))
    queue = next(v for k, v in t.items() if k.startswith("Queue"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))

    k = [num(r["keys"]) for r in keys]
    ax = axes[0]
    ax.plot(k, [num(r["req/s"]) for r in keys], "o-", label="sidecar req/s (saturation)")
    ax.plot(
        k,
        [nginx for _ in keys],
        "k--",
        label="nginx proxy_pass (1M-key script)",
    )
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("distinct keys")
    ax.set_ylabel("requests/s")
    ax.set_title("Sidecar, fixed window in Redis")
    p99 = ax.twinx()
    p99.plot(k, [num(r["sat. p99 ms"]) for r in keys], "s:", color="tab:red", label="p99 at saturation")
    p99.plot(k, [num(r["2,000 req/s p99 ms"]) for r in keys], "^:", color="tab:orange", label="p99 at 2,000 req/s")
    p99.set_ylabel("p99 ms")
    p99.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = p99.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower left")

    n = [num(r["retained jobs"]) for r in queue]
    ax = axes[1]
    ax.plot(n, [num(r["raw SQL jobs/s"]) for r in queue], "o-", label="raw SQL limit (pgbench)")
    ax.plot(n, [num(r["in-process jobs/s"]) for r in queue], "s-", label="in-process worker")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("finished jobs retained in the table")
    ax.set_ylabel("jobs/s (burn-down)")
    ax.set_title("Queue throughput")
    ax.legend(fontsize=8, loc="lower left")

    ax = axes[2]
    ax.plot(k, [num(r["sidecar CPU µs/req"]) for r in keys], "o-", label="sidecar µs/request (x: keys)")
    ax.plot(k, [num(r["Redis CPU µs/req"]) for r in keys], "o--", label="Redis µs/request (x: keys)")
    ax.plot(n, [num(r["worker CPU µs/job"]) for r in queue], "s-", label="worker µs/job (x: retained jobs)")
    ax.plot(n, [num(r["PostgreSQL CPU µs/job"]) for r in queue], "s--", label="PostgreSQL µs/job (x: retained jobs)")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.7)  # room for the legend above the curves
    ax.set_xlabel("keys / retained jobs")
    ax.set_ylabel("CPU µs")
    ax.set_title("CPU per request and per job")
    ax.legend(fontsize=7, loc="upper left")

    fig.suptitle("Sluice: how cost grows with work (BENCHMARKS.md, 'How cost grows with work')")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
