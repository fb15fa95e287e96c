"""The synthetic-bandit table of docs/results/baseline_accuracy.md: tests/algos/test_baseline_accuracy.py's
bandit over ten seeds, graded by the truth and by the run's own evidence. Run from the repository root."""
import statistics
import sys

sys.path[:0] = ["tests/algos", "src"]
from test_baseline_accuracy import _bandit

from streamrl.algos.baseline_accuracy import baseline_accuracy

for late in (False, True):
    for memory in ("event_time", "receipt"):
        rows = []
        for seed in range(10):
            episodes, p = _bandit(memory, late, seed)
            truth = baseline_accuracy(**episodes, truth=lambda k, v: p[k])
            est = baseline_accuracy(**episodes)
            rows.append((truth.bias, truth.mean_abs, est.bias))
        b, a, e = zip(*rows)
        se = statistics.stdev(b) / len(b) ** 0.5
        print(f"| {'failures 6 snapshots late' if late else 'order independent of outcome'} | {memory} | "
              f"{statistics.mean(b):+.3f} ± {1.96*se:.3f} | {statistics.mean(a):.3f} | {statistics.mean(e):+.3f} |")
