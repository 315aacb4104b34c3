"""Draw docs/assets/reset_semantics.png: how the carry flows through a sequence with resets.

    python docs/make_reset_figure.py
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "assets" / "reset_semantics.png"
T = 8
IS_INIT = {0, 3, 6}  # t = 0 starts the first trajectory; 3 and 6 start new ones
SEGMENT_COLORS = ["#cfe2f3", "#d9ead3", "#fce5cd"]


def main() -> None:
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.set_xlim(-1.6, T + 0.2)
    ax.set_ylim(-2.3, 2.6)
    ax.axis("off")
    seg = -1
    for t in range(T):
        if t in IS_INIT:
            seg += 1
        # the step box: one cell update from carry_{t-1} (or its reset) and x_t
        ax.add_patch(FancyBboxPatch((t - 0.32, -0.3), 0.64, 0.6, boxstyle="round,pad=0.02",
                                    fc=SEGMENT_COLORS[seg], ec="black"))
        ax.text(t, 0, f"step {t}", ha="center", va="center", fontsize=9)
        ax.text(t, -1.05, f"x[{t}]", ha="center", va="center", fontsize=9)
        ax.add_patch(FancyArrowPatch((t, -0.85), (t, -0.33), arrowstyle="-|>", mutation_scale=10))
        ax.text(t, 1.0, f"y[{t}]", ha="center", va="center", fontsize=9)
        ax.add_patch(FancyArrowPatch((t, 0.33), (t, 0.85), arrowstyle="-|>", mutation_scale=10))
        ax.text(t, -1.75, "True" if t in IS_INIT else "False", ha="center", va="center", fontsize=9,
                color="crimson" if t in IS_INIT else "gray", weight="bold" if t in IS_INIT else "normal")
        if t in IS_INIT:
            # the carry entering this step is replaced: reset_state[t] if given, else zeros
            src = f"reset_state[{t}]\nor zeros"
            ax.text(t - 0.5, 1.9, src, ha="center", va="center", fontsize=8, color="crimson")
            ax.add_patch(FancyArrowPatch((t - 0.5, 1.55), (t - 0.34, 0.2), arrowstyle="-|>",
                                         mutation_scale=10, color="crimson"))
            if t > 0:  # the carry of the previous segment stops here
                ax.plot([t - 0.68, t - 0.52], [0, 0], color="gray", lw=1.5)
                ax.text(t - 0.5, -0.05, "x", color="gray", ha="center", va="center", fontsize=14)
        if t + 1 < T and t + 1 not in IS_INIT:
            ax.add_patch(FancyArrowPatch((t + 0.33, 0), (t + 0.67, 0), arrowstyle="-|>", mutation_scale=10))
        if t + 1 < T and t + 1 in IS_INIT:
            ax.add_patch(FancyArrowPatch((t + 0.33, 0), (t + 0.52, 0), arrowstyle="-", color="gray"))
        if t + 1 == T or t + 1 in IS_INIT:  # segment end: kept by return_segment_states
            ax.text(t + 0.05, 1.6, "segment\nstate", ha="center", va="center", fontsize=7, color="navy")
    ax.add_patch(FancyArrowPatch((T - 0.67, 0), (T - 0.1, 0), arrowstyle="-|>", mutation_scale=10))
    ax.text(T - 0.05, 0.35, "state_T", ha="center", fontsize=9)
    ax.text(-1.55, -1.75, "is_init[t]", ha="left", va="center", fontsize=9)
    ax.text(-1.55, 0.25, "carry", ha="left", va="center", fontsize=9)
    ax.text(-1.55, -0.2, "(from state)", ha="left", va="center", fontsize=7, color="gray")
    ax.set_title("One row of lstm_sequence / gru_sequence: the carry never crosses an is_init step",
                 fontsize=11)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
