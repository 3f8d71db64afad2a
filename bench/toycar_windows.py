"""Evaluation rows for MLPerf Tiny's anomaly-detection model (ad01) from one ToyCar clip's log-mel features.

MLPerf Tiny's reference submission ships one real clip's features, ``normal_id_01_00000000_hist_librosa.bin``
(200 frames x 128 mel bands, float32). ad01 reads 5 consecutive frames (640 values). This writes the clip's 196
windows as an .npz `edgedeploy verify --data` reads: a seeded random choice of --eval of them as the evaluation
split (split 1), the others as split 0.

Run: python bench/toycar_windows.py CLIP.bin OUT.npz [--eval 100] [--seed 0]
then: python bench/bench_npu_verify.py --only-given --model ad01=ad01_int8.tflite,OUT.npz
      --targets ethos-u55-128,ethos-u55-256,ethos-u65-256 --markdown
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

BANDS, FRAMES = 128, 5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("clip", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    frames = np.fromfile(args.clip, dtype="<f4").reshape(-1, BANDS)
    windows = np.stack([frames[i : i + FRAMES].reshape(-1) for i in range(len(frames) - FRAMES + 1)])
    evaluation = np.zeros(len(windows), dtype=bool)
    evaluation[np.random.default_rng(args.seed).choice(len(windows), args.eval, replace=False)] = True
    order = np.concatenate([np.flatnonzero(~evaluation), np.flatnonzero(evaluation)])
    np.savez(args.out, x=windows[order], y=np.zeros(len(order), dtype=np.int64),
             split=evaluation[order].astype(np.int64))
    print(f"{args.out}: {len(windows)} windows of {FRAMES * BANDS} values, {args.eval} in the evaluation split")


if __name__ == "__main__":
    main()
