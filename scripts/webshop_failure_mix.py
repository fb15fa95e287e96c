"""Why webshop_lite episodes fail: replay a run's last evaluation (its samples.jsonl) and count.

    python scripts/webshop_failure_mix.py RUN/samples.jsonl

Each episode of the last ``eval`` step is replayed in webshop_lite (deterministic) and counted as
won; bought a wrong product type (``r_type < 1``); bought the target or another item of the right
type short on attributes, options or the price bound; or no purchase, with the target shown on a
results page or never. docs/webshop.md's failure mix comes from it.
"""

import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from streamrl.envs import make  # noqa: E402
from streamrl.envs.webshop_lite.text import shown_results  # noqa: E402


def main() -> None:
    env = make("webshop_lite")
    records = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    evaluations = [r for r in records if r["kind"] == "eval"]
    last = max(r["step"] for r in evaluations)
    mix: collections.Counter = collections.Counter()
    for episode in (r for r in evaluations if r["step"] == last):
        env.reset(task_id=episode["task_id"])
        target, shown = env.goal["asin"], False
        target_click = f"click[{target.lower()}]"
        for turn in episode["turns"]:
            result = env.step(turn["action"])
            shown |= target_click in shown_results(result.info.get("admissible_actions") or [])
            if result.terminated or result.truncated:
                break
        info = result.info
        if info.get("won"):
            mix["won"] += 1
        elif not result.terminated:
            mix[f"no purchase, target {'shown' if shown else 'never shown'}"] += 1
        elif info["r_type"] < 1:
            mix["bought a wrong product type"] += 1
        else:
            short = "+".join(k for k in ("r_att", "r_option", "r_price") if info[k] < 1)
            mix[f"bought {'the target' if info['purchased_asin'] == target else 'another item'}, short on {short}"] += 1
    total = sum(mix.values())
    for reason, count in mix.most_common():
        print(f"{count:4d} {100 * count / total:5.1f}%  {reason}")


if __name__ == "__main__":
    main()
