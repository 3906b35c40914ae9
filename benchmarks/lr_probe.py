"""A learning-rate probe: the main job's model and token budget at one batch size, one run per
(optimizer, LR), in this process (no Ray). It chose the ``base_lr`` of the non-AdamW arms of
``sweeps/examples/shakespeare-optimizers.yaml``.

    python benchmarks/lr_probe.py adafactor:0.01 adafactor:0.03 adafactor:0.1 sgd_momentum:0.3 adamw:0.003

Prints one JSON line per run: the last four milestones' validation loss (EMA weights) and the wall time.
What it does not show: one seed, one batch size (16), LR rule ``none``; the sweep itself tunes the
multiplier and the rule per batch size around the chosen base.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="OPTIMIZER:LR, e.g. adafactor:0.1")
    ap.add_argument("--batch-size-sequences", type=int, default=16)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from sweeps.launch.trainable import trial_config
    from sweeps.spec import parse_spec
    from workloads.pretrain import train_in_process

    d = yaml.safe_load((ROOT / "sweeps" / "examples" / "shakespeare-char.yaml").read_text())
    d["data"]["path"] = str(ROOT / d["data"]["path"])
    for run in args.runs:
        name, lr = run.split(":")
        d["optimizer"]["name"] = name
        d["search"]["beta2"] = {"values": [0.99]} if name != "adamw" else d["search"]["beta2"]
        spec = parse_spec(d)
        cfg = trial_config(
            spec,
            {
                "batch_size_sequences": args.batch_size_sequences,
                "seed": 0,
                "lr": float(lr),
                "lr_rule": "none",
                "beta2": 0.99,
                "beta2_half_life_tokens": 65536.0,
            },
            "probe",
            data_path=d["data"]["path"],
        )
        r = train_in_process(cfg.to_dict(), None, None)
        print(
            json.dumps(
                {
                    "optimizer": name,
                    "lr": float(lr),
                    "status": r["status"],
                    "val_loss_last4": [round(x["val_loss"], 3) for x in r["reports"]][-4:],
                    "wall_s": round(r["wall_s"]),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
