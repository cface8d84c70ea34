"""`mlxspec bench --plot`: speedup against γ, measured and predicted, one line per
temperature. matplotlib is an optional extra (`pip install 'mlxspec[plot]'`)."""

from __future__ import annotations


def plot_speedup(report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    settings = [s for s in report.settings if s.category == "all" and isinstance(s.gamma, int)]
    auto = [s for s in report.settings if s.category == "all" and s.gamma == "auto"]
    for i, temp in enumerate(sorted({s.temp for s in settings})):
        row = sorted((s for s in settings if s.temp == temp), key=lambda s: s.gamma)
        color = f"C{i}"
        gammas = [s.gamma for s in row]
        axes.plot(gammas, [s.speedup or float("nan") for s in row], "o-", color=color, label=f"measured, T={temp:g}")
        axes.plot(
            gammas,
            [s.predicted_speedup or float("nan") for s in row],
            "x--",
            color=color,
            alpha=0.7,
            label=f"predicted, T={temp:g}",
        )
        for s in (s for s in auto if s.temp == temp and s.speedup):
            axes.axhline(s.speedup, color=color, linestyle=":", linewidth=1, label=f"auto, T={temp:g}")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("γ (draft tokens per round)")
    axes.set_ylabel("speedup over standard decoding")
    axes.set_title(
        f"{_short(report.pair['target'])} + {_short(report.pair['draft'])}, {report.machine.get('device', '')}"
    )
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _short(name: str | None) -> str:
    return (name or "").rstrip("/").split("/")[-1]
